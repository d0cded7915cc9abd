"""What the pipeline's steps share and return: ``Context`` (the model, its data, results later steps
read) and ``Section`` (one part of the report: numbers as data, tables, figures, prose).
``interp.report.pipeline`` makes them; ``interp.report.html`` writes them out; neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
import itertools
from typing import Any, Iterable, Iterator, Optional, Union

import pandas as pd
from matplotlib.figure import Figure

from interp.data import Batch, iter_batches
from interp.figures.interactive import Heatmap, TopTable
from interp.models.bridge import InterpBridge
from interp.record.stats import QKVStats

__all__ = ["Context", "DataBatches", "Section"]


class DataBatches:
    """The data the pipeline's steps read, never held whole: a re-iterable whose every pass reads the data
    afresh as checked batches (``iter_batches``), at most ``max_batches`` of them.

    ``source`` is what ``open_data`` made of the data: a list it holds already (a built-in data set) is read
    from that list; a re-iterable (a ``DataSource`` reads its files again on each pass, a ``DataLoader``) is
    iterated again; a one-shot iterator (a generator) is read once, lazily, only as far as the passes go, and
    the batches read are kept for the next passes (it cannot be read twice). ``head(n)``: the first ``n``
    batches, as lazily; ``len``: the number of batches (counted by the first whole pass, or by one pass then)."""

    def __init__(self, model: InterpBridge, source: Iterable[Any], max_batches: Optional[int] = None) -> None:
        self.model, self.source, self.max_batches = model, source, max_batches
        self._once: Optional[Iterator[Batch]] = None  # a one-shot source's checked batches, read as far as needed
        self._kept: list[Batch] = []  # what it gave so far
        self._len: Optional[int] = None
        if iter(source) is source:
            self._once = iter_batches(model, source, max_batches)

    def __iter__(self) -> Iterator[Batch]:
        if self._once is None:
            count = 0
            for batch in iter_batches(self.model, self.source, self.max_batches):
                count += 1
                yield batch
            self._len = count  # a whole pass: counted (``list`` asks ``len`` first, which must not read again)
            return
        for i in itertools.count():
            if i == len(self._kept):
                batch = next(self._once, None)
                if batch is None:
                    self._len = i
                    return
                self._kept.append(batch)
            yield self._kept[i]

    def head(self, n: int) -> "DataBatches":
        """The first ``n`` batches (as a re-iterable of their own, read as lazily)."""
        return DataBatches(self.model, self, n if self.max_batches is None else min(n, self.max_batches))

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self)
        return self._len


@dataclass
class Section:
    """One part of the report: its numbers as data, and what is drawn and said from them."""

    key: str
    title: str
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)  # JSON-ready headline numbers
    headline: str = ""  # one sentence for the top of the report ("" = none)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    # a figure, or the path of its PNG once written and let go (``interp.report.html.write_and_release``)
    figures: dict[str, Union[Figure, Path]] = field(default_factory=dict)
    # figures drawn in report.html: those no interactive heatmap already shows (every figure is a PNG download)
    shown: list[str] = field(default_factory=list)
    stats: dict[str, QKVStats] = field(default_factory=dict)  # saved as <name>.safetensors
    seconds: float = 0.0  # time the step that made it took
    heatmaps: list[Heatmap] = field(default_factory=list)  # interactive, in report.html (from any section's tables)
    top_tables: list[TopTable] = field(default_factory=list)  # sortable, in report.html
    sample: str = ""  # the data its numbers come from, e.g. "8 images" ("" = none: the weights alone)


@dataclass
class Context:
    """What the steps share: the model, its data, and results later steps read."""

    model: InterpBridge
    dataset: str
    batches: Union[DataBatches, list[Batch]]  # ``make_context`` reads the data lazily: ``DataBatches``
    quick: bool = False
    out: Optional[Path] = None  # where steps that keep resumable logs (ablation) put them
    stats: Optional[QKVStats] = None
    ablation_estimate: str = "auto"  # one pass for every head, exact for the top_k per kind
    top_k: int = 5
    layers: Optional[list[int]] = None  # the layers and heads the analysis steps look at (None: all)
    heads: Optional[list[int]] = None
    analysed: dict[str, dict[str, int]] = field(default_factory=dict)  # per step: the items and batches it read
    step: str = ""  # the step running (``run_steps`` sets it), the key ``first`` notes its batches under

    @property
    def name(self) -> str:
        return self.model.interp.name

    def data_label(self, batches: Optional[Iterable[Batch]] = None) -> str:
        """What a figure was made from, e.g. "photos, 2,056 patches (8 images)"."""
        batches = self.batches if batches is None else batches
        vision = self.model.interp.modality == "vision"
        items = sum(int(b.inputs.shape[0]) for b in batches)
        if vision:
            info = self.model.interp
            count = items * ((info.image_size // info.patch_size) ** 2 + info.n_prefix_tokens)
        else:
            count = sum(int(b.attention_mask.sum()) if b.attention_mask is not None else b.inputs.numel()
                        for b in batches)
        unit = ("patches", "images") if vision else ("tokens", "sequences")
        return f"{self.dataset}, {count:,} {unit[0]} ({items:,} {unit[1]})"

    def sample_label(self, step: str) -> str:
        """The sample ``step`` analysed (its ``first`` calls, ``analysed``), e.g. "8 images"; "" if it read none."""
        seen = self.analysed.get(step)
        if not seen or not seen["items"]:
            return ""
        n = seen["items"]
        unit = "image" if self.model.interp.modality == "vision" else "sequence"
        return f"{n:,} {unit}{'s' if n != 1 else ''}"

    def first(self, n: Optional[int] = None) -> Union[DataBatches, list[Batch]]:
        """The batches a step analyses, noted in ``analysed`` under the running step: the sample, that is all of
        ``batches`` (the data as read, already cut to ``max_batches``: one sample for every step), or its first
        ``n`` for a step that must read fewer (say why where it is called)."""
        if n is None:
            chosen = self.batches
        else:
            chosen = self.batches.head(n) if isinstance(self.batches, DataBatches) else self.batches[:n]
        seen = self.analysed.get(self.step or "?", dict(items=0, batches=0))
        sizes = [int(b.inputs.shape[0]) for b in chosen]  # one pass: items per batch
        self.analysed[self.step or "?"] = dict(items=max(sum(sizes), seen["items"]),
                                               batches=max(len(sizes), seen["batches"]))
        return chosen
