"""What the pipeline's steps share and return: ``Context`` (the model, its data, results later steps
read) and ``Section`` (one part of the report: numbers as data, tables, figures, prose).
``interp.pipeline`` makes them; ``interp.report`` writes them out; neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from matplotlib.figure import Figure

from interp.data import Batch
from interp.interactive import Heatmap, TopTable
from interp.models.bridge import InterpBridge
from interp.stats import QKVStats

__all__ = ["Context", "Section"]


@dataclass
class Section:
    """One part of the report: its numbers as data, and what is drawn and said from them."""

    key: str
    title: str
    text: str
    numbers: dict[str, Any] = field(default_factory=dict)  # JSON-ready headline numbers
    headline: str = ""  # one sentence for the top of the report ("" = none)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    shown: list[str] = field(default_factory=list)  # figures embedded in report.html
    stats: dict[str, QKVStats] = field(default_factory=dict)  # saved as <name>.safetensors
    seconds: float = 0.0  # time the step that made it took
    heatmaps: list[Heatmap] = field(default_factory=list)  # interactive, in report.html (from any section's tables)
    top_tables: list[TopTable] = field(default_factory=list)  # sortable, in report.html


@dataclass
class Context:
    """What the steps share: the model, its data, and results later steps read."""

    model: InterpBridge
    dataset: str
    batches: list[Batch]
    quick: bool = False
    out: Optional[Path] = None  # where steps that keep resumable logs (ablation) put them
    stats: Optional[QKVStats] = None
    ablation_estimate: str = "auto"  # one pass for every head, exact for the top_k per kind
    top_k: int = 5
    layers: Optional[list[int]] = None  # the layers and heads the analysis steps look at (None: all)
    heads: Optional[list[int]] = None

    @property
    def name(self) -> str:
        return self.model.interp.name

    def data_label(self, batches: Optional[list[Batch]] = None) -> str:
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

    def first(self, n_full: int) -> list[Batch]:
        """The first batches an expensive step uses: 1 in quick mode, else ``n_full``."""
        return self.batches[:1] if self.quick else self.batches[:n_full]
