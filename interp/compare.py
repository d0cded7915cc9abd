"""Models side by side: the analyses run on several models over the SAME data, one tidy table.

``compare_models(models, data)`` runs each analysis on every model over the same items (texts or
images) and returns one long-form table: one row per model x analysis x quantity x layer x head x part,
in units that compare across models of different widths and depths:

* ``origin``: ``shift_ratio`` = ||b|| / RMS(XW) (the bias in units of the head's own content) and
  ``bias_share`` = ||b|| / (||b|| + ||E[X]W||), per kind (``part``: q, k, v); from ``origin_shift`` on
  ``record_qkv``'s statistics, its intervals from the per-item pass (``interp.analysis.origin_intervals``).
  A model without a bias of a kind has rows with ``present`` False (value 0: nothing is shifted).
* ``scores``: ``score_share`` = Cov(term, s) / Var(s) per term (``part``: content, query_const,
  key_prior, const), from ``score_decomposition`` with its intervals; a family that refuses the four
  terms gets one row that says why (``note``), never a silent gap.
* ``sinks``: ``sink_mass`` (the attention mass a position class receives, ``part`` the class; ``floor``
  the mass uniform attention would give it) and ``sink_mass_over_uniform`` = mass - floor, per head, pooled
  over items as ``sink_profile`` pools them (m_h = sum_t r_th m_th / sum_t r_th, r_th the item's query
  rows), its interval from resamples of the per-item profiles (``sink_profiles_by_item``); and
  ``sink_head_share`` per class (the share of heads over ``SINK_THRESHOLD``, ``sink_share_intervals``).
* ``residual``: per layer l (``blocks.{l}.hook_resid_post``, padding left out), the residual stream's
  scale in its own units, which differ by model: ``resid_max_to_rms`` = max |h_ic| / sqrt(mean h_ic^2)
  (a massive activation in RMS units of the entries) and ``resid_norm_max_to_median`` = max_i ||h_i|| /
  median_i ||h_i|| (the largest token norm in units of the median token's). Both rest on a maximum, whose
  percentile bootstrap leans low (a resample leaves the largest item out about 37% of the time): read the
  interval as the spread over items, not as a bound on the maximum.

* ``frequency`` (on request: ``analyses=(..., "frequency")``): ``hf_ratio_spread``, how differently the heads
  filter (``spread_interval``), and for each model after the first ``hf_ratio_spread_difference``, its spread
  minus the first model's with the paired interval (``spread_difference``: the same items in the same order).

Every row has ``depth`` = layer / (n_layers - 1) (0: the first block, 1: the last), so models of
different depths line up; ``lo`` / ``hi``: the 95% percentile bootstrap over items (``interp.bootstrap``,
``n_boot`` resamples fixed by ``seed``); ``model_fingerprint`` and ``data_fingerprint`` (the exact
batches that model read: token ids differ by tokenizer) and ``source_fingerprint`` (the items before any
model's tokenizer or processor: the same for every row). Text is given as text (a built-in corpus, a
.txt file, a list of strings) so that every model tokenises the same items, one item per text;
token ids are accepted only where every model has the same tokenizer. Text models and image models
cannot share data (refused), nor can tables of different data be joined (``combine_comparisons``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import matplotlib.pyplot as plt
from matplotlib.ticker import FormatStrFormatter
import numpy as np
import pandas as pd
import torch

from interp.analysis.frequency import spread_difference, spread_interval
from interp.analysis.origin import origin_shift
from interp.analysis.scores import score_decomposition
from interp.analysis.sink_intervals import sink_profiles_by_item, sink_share_intervals
from interp.analysis.sink_parts import SINK_THRESHOLD, class_masks
from interp.analysis.sinks import resid_hook
from interp.bootstrap import Resampler, check_bootstrap, item_keys
from interp.record.capture import stream_batches
from interp.figures.colours import drawn_values, limits, rule_for, tag
from interp.data import Batch, iter_batches, open_data
from interp.data.builtin import python_docs_text
from interp.data.sources import BUILTIN
from interp.errors import InputError, public
from interp.io import read_text
from interp.record.fingerprint import data_fingerprint, model_fingerprint
from interp.record.heads import bias_spec
from interp.io import write_table
from interp.models.bridge import InterpBridge
from interp.models.loading import load_model
from interp.figures.plots import save_figure
from interp.record.recording import record_qkv
from interp.io import atomic_path
from interp.report.html import begin_outputs, write_manifest
from interp.types import COMPARE_ANALYSES, COMPARE_MAX_CHARS

ANALYSES = COMPARE_ANALYSES
COLUMNS = ["model", "analysis", "quantity", "part", "layer", "depth", "head", "value", "lo", "hi", "floor", "present",
           "unit", "note", "n_layers", "n_heads", "n_items", "n_boot", "seed", "model_fingerprint", "data_fingerprint",
           "source_fingerprint"]
UNITS = {"shift_ratio": "||b|| / RMS(XW)", "bias_share": "||b|| / (||b|| + ||E[X]W||)",
         "score_share": "Cov(term, s) / Var(s)", "sink_mass": "attention mass (floor: uniform attention)",
         "sink_mass_over_uniform": "mass - uniform mass",
         "sink_head_share": f"share of heads with mass > {SINK_THRESHOLD}",
         "resid_max_to_rms": "max |h| / RMS(h)", "resid_norm_max_to_median": "max ||h_i|| / median ||h_i||",
         "hf_ratio_spread": "std over heads of hf_ratio",
         "hf_ratio_spread_difference": "spread minus the first model's (paired over the same items)"}
TEXT_MIN_CHARS, TEXT_MAX_CHARS, DEFAULT_ITEMS = 80, COMPARE_MAX_CHARS, 16


# ----- models and the shared items ---------------------------------------------------------------------


def _models(models: Any, device: Any) -> dict[str, InterpBridge]:
    """label -> loaded model: a mapping keeps its labels; a sequence is labelled by each model's name."""
    if isinstance(models, (str, os.PathLike, InterpBridge)) or not isinstance(models, (Mapping, Sequence)):
        raise InputError("models must be a list of models (zoo names, folders, loaded models) or a dict "
                         f"{{label: model}}; got {type(models).__name__}")
    pairs = list(models.items()) if isinstance(models, Mapping) else [(None, m) for m in models]
    if len(pairs) < 2:
        raise InputError(f"compare_models compares at least two models; got {len(pairs)}")
    loaded = [(label, load_model(m, device=device)) for label, m in pairs]
    labels = [str(label) if label is not None else m.interp.name for label, m in loaded]
    if len(set(labels)) < len(labels):
        raise InputError(f"two models share the label {next(x for x in labels if labels.count(x) > 1)!r}: pass a "
                         "dict {label: model} to tell them apart")
    modalities = {m.interp.modality for _, m in loaded}
    if len(modalities) > 1:
        kinds = ", ".join(f"{lb} ({m.interp.modality})" for lb, (_, m) in zip(labels, loaded))
        raise InputError(f"text models and image models cannot share data, so they cannot be compared side by side: "
                         f"{kinds}; compare the language models on text and the vision models on images, separately")
    return dict(zip(labels, (m for _, m in loaded)))


def _digest(parts: Sequence[bytes]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def _paragraphs(text: str, n_items: int, max_chars: int) -> list[str]:
    """The first ``n_items`` paragraphs of at least TEXT_MIN_CHARS characters, each cut to ``max_chars`` at a space."""
    out = []
    for para in (p.strip() for p in text.split("\n\n")):
        if len(para) >= TEXT_MIN_CHARS:
            out.append(para if len(para) <= max_chars else para[:max_chars].rsplit(" ", 1)[0])
        if len(out) == n_items:
            break
    return out


def _texts(data: Any, n_items: Optional[int], max_chars: int) -> Optional[list[str]]:
    """The texts every language model reads (one item each), or None for token ids."""
    n = n_items or DEFAULT_ITEMS
    if isinstance(data, str) and data == "python-docs":
        return _paragraphs(python_docs_text(), n, max_chars)
    if isinstance(data, (str, os.PathLike)) and str(data).endswith(".txt") and Path(data).is_file():
        return _paragraphs(read_text(data), n, max_chars)
    if isinstance(data, str) and data in BUILTIN:
        raise InputError(f"data {data!r} holds images, and these are language models: pass text (python-docs, a "
                         ".txt file or a list of strings)")
    if isinstance(data, (list, tuple)) and data and all(isinstance(t, str) for t in data):
        if max_chars != TEXT_MAX_CHARS:
            raise InputError(f"max_chars={max_chars!r} does not apply to a list of strings (each is read whole, as "
                             "given; max_chars cuts the paragraphs of python-docs or a .txt file): cut the strings "
                             "yourself, or leave it out")
        return [t for t in data if t.strip()][:n_items]
    return None


def _text_batches(models: dict[str, InterpBridge], data: Any, n_items: Optional[int], max_chars: int,
                  batch_size: int) -> tuple[dict[str, list[Batch]], str, str]:
    texts = _texts(data, n_items, max_chars)
    if texts is None and (n_items is not None or max_chars != TEXT_MAX_CHARS):  # not ignored: refused
        given = ", ".join(f"{k}={v!r}" for k, v in (("n_items", n_items), ("max_chars", max_chars))
                          if v is not None and not (k == "max_chars" and v == TEXT_MAX_CHARS))
        raise InputError(f"{given} do(es) not apply to token ids (they pick and cut paragraphs of text): every batch "
                         "given is read whole; leave it out, or pass the text itself")
    if texts is None:  # token ids: one meaning only where every model has the same tokenizer
        vocabs = {(None if m.tokenizer is None else tuple(sorted(m.tokenizer.get_vocab().items())))
                  for m in models.values()}
        if len(vocabs) > 1:
            raise InputError("token ids mean different text to models with different tokenizers: pass the text "
                             "itself (python-docs, a .txt file or a list of strings) so every model reads the same "
                             "items")
        first = next(iter(models.values()))
        batches = list(iter_batches(first, open_data(first, data)))
        return {label: batches for label in models}, data_fingerprint(batches), "token ids"
    if not texts:
        raise InputError("no text to compare on: the data held no paragraph of at least "
                         f"{TEXT_MIN_CHARS} characters")
    chunks = [texts[i:i + batch_size] for i in range(0, len(texts), batch_size)]
    out = {label: list(iter_batches(m, chunks)) for label, m in models.items()}
    for label, m in models.items():
        longest = max(int(b.attention_mask.sum(1).max()) for b in out[label])
        if m.interp.max_positions is not None and longest > m.interp.max_positions:
            raise InputError(f"{label} reads at most {m.interp.max_positions} tokens and a text gives {longest}: "
                             "pass shorter texts (max_chars=)")
    return out, _digest([t.encode() for t in texts]), f"{len(texts)} texts, one item each"


def _image_batches(models: dict[str, InterpBridge], data: Any, n_items: Optional[int],
                   batch_size: int) -> tuple[dict[str, list[Batch]], str, str]:
    if isinstance(data, str) and data in BUILTIN:
        if data == "python-docs":
            raise InputError("data 'python-docs' is text, and these are vision models: pass images (digits, "
                             "photos, mnist, a folder, or pixel tensors)")
        options = {"batch_size": batch_size, "max_items": n_items}
        out = {label: list(iter_batches(m, open_data(m, data, options))) for label, m in models.items()}
        n = len(torch.cat([b.inputs for b in next(iter(out.values()))]))
        return out, _digest([f"builtin:{data}:{n}".encode()]), f"built-in {data!r}, {n} images"
    if isinstance(data, (str, os.PathLike)):
        root = Path(data)
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        options = {"batch_size": batch_size, "max_items": n_items}
        out = {label: list(iter_batches(m, open_data(m, data, options))) for label, m in models.items()}
        return out, _digest([p.read_bytes() for p in files]), f"images from {data}"
    first = next(iter(models.values()))
    batches = list(iter_batches(first, open_data(first, data)))
    return {label: batches for label in models}, data_fingerprint(batches), "pixel tensors"


def _shared_batches(models: dict[str, InterpBridge], data: Any, *, n_items: Optional[int] = None,
                   max_chars: int = TEXT_MAX_CHARS, batch_size: int = 8) -> tuple[dict[str, list[Batch]], str, str]:
    """(label -> that model's batches of the same items, source fingerprint, description). Every model must
    read the same number of items, one per text or image; else one error."""
    text = next(iter(models.values())).interp.modality == "text"
    if not text and max_chars != TEXT_MAX_CHARS:
        raise InputError(f"max_chars={max_chars!r} does not apply to images (it cuts paragraphs of text for language "
                         "models): leave it out (--max-chars too)")
    out, source, what = (_text_batches(models, data, n_items, max_chars, batch_size) if text
                         else _image_batches(models, data, n_items, batch_size))
    counts = {label: sum(int(b.inputs.shape[0]) for b in batches) for label, batches in out.items()}
    if len(set(counts.values())) != 1:
        raise InputError(f"the same data gave different items per model ({counts}): compare on items every model "
                         "reads whole")
    return out, source, what


# ----- the analyses, each as long-form rows ------------------------------------------------------------


def _origin_rows(model: InterpBridge, batches: list[Batch], boot: tuple[int, int]) -> pd.DataFrame:
    stats = record_qkv(model, batches, progress=False)
    table = origin_shift(model, stats, data=batches, n_boot=boot[0], seed=boot[1])
    parts = [table.assign(quantity=q, value=table[q], lo=table[f"{q}_lo"], hi=table[f"{q}_hi"])
             for q in ("shift_ratio", "bias_share")]
    return pd.concat(parts).rename(columns={"kind": "part"}).assign(analysis="origin")


def _score_rows(model: InterpBridge, batches: list[Batch], boot: tuple[int, int]) -> pd.DataFrame:
    refusal = model.interp.spec.score_refusal
    if refusal:
        return pd.DataFrame([dict(analysis="scores", quantity="score_share", note=f"not computed: {refusal}")])
    table = score_decomposition(model, batches, progress=False, n_boot=boot[0], seed=boot[1])
    spec = bias_spec(model)
    has = set(spec[spec.present].kind)
    needs = {"content": set(), "key_prior": {"q"}, "query_const": {"k"}, "const": {"q", "k"}}  # the biases in each term
    return table.assign(analysis="scores", quantity="score_share", part=table.term, value=table.share,
                        lo=table.share_lo, hi=table.share_hi, present=table.term.map(lambda t: needs[t] <= has))


def pooled_sink_masses(per_item: pd.DataFrame, n_boot: int, seed: int) -> pd.DataFrame:
    """Per layer, head, position: mass and uniform_mass pooled over the items of ``sink_profiles_by_item`` as
    sink_profile pools them (weights: each item's n_query_rows), with the 95% bootstrap interval over items of
    the mass and of mass - uniform_mass (resamples of the items, ``interp.bootstrap.Resampler``)."""
    keys = list(dict.fromkeys(per_item["item"].astype(str)))
    boot, rows = Resampler(keys, n_boot, seed), []
    for position, part in per_item.groupby("position", sort=False):
        grid = part.pivot_table(index="item", columns=["layer", "head"], values=["mass", "uniform_mass",
                                                                                 "n_query_rows"], aggfunc="first")
        r = grid["n_query_rows"].reindex(keys).fillna(0.0).to_numpy(float)
        m = np.nan_to_num(grid["mass"].reindex(keys).to_numpy(float)) * r
        u = np.nan_to_num(grid["uniform_mass"].reindex(keys).to_numpy(float)) * r
        with np.errstate(divide="ignore", invalid="ignore"):
            mass, floor = m.sum(0) / r.sum(0), u.sum(0) / r.sum(0)
            b_r = boot.sums(r)
            b_mass, b_over = boot.sums(m) / b_r, (boot.sums(m) - boot.sums(u)) / b_r
        (m_lo, m_hi), (o_lo, o_hi) = boot.interval(b_mass), boot.interval(b_over)
        for i, (layer, head) in enumerate(grid["mass"].columns):
            rows.append(dict(layer=layer, head=head, position=position, mass=mass[i], mass_lo=m_lo[i],
                             mass_hi=m_hi[i], uniform_mass=floor[i], mass_over_uniform=mass[i] - floor[i],
                             mass_over_uniform_lo=o_lo[i], mass_over_uniform_hi=o_hi[i]))
    return pd.DataFrame(rows)


def _sink_rows(model: InterpBridge, batches: list[Batch], boot: tuple[int, int]) -> pd.DataFrame:
    per_item = sink_profiles_by_item(model, batches)
    pooled = pooled_sink_masses(per_item, *boot)
    mass = pooled.assign(quantity="sink_mass", value=pooled.mass, lo=pooled.mass_lo, hi=pooled.mass_hi,
                         floor=pooled.uniform_mass)
    over = pooled.assign(quantity="sink_mass_over_uniform", value=pooled.mass_over_uniform,
                         lo=pooled.mass_over_uniform_lo, hi=pooled.mass_over_uniform_hi, floor=0.0)
    shares = sink_share_intervals(per_item, n_boot=boot[0], seed=boot[1])
    shares = shares.assign(quantity="sink_head_share", value=shares.share, lo=shares.share_lo, hi=shares.share_hi)
    return pd.concat([mass, over, shares]).rename(columns={"position": "part"}).assign(analysis="sinks", present=True)


def _residual_items(model: InterpBridge, batches: list[Batch]) -> tuple[list[str], dict[int, list[tuple]]]:
    """(item keys, per layer: per item (max |h_ic|, sum h_ic^2, entries, token norms [tokens])) over real tokens."""
    info = model.interp
    hooks = {layer: resid_hook(layer, "post") for layer in range(info.n_layers)}
    keys: list[str] = []
    per_layer: dict[int, list[tuple]] = {layer: [] for layer in hooks}

    def consume(batch: Batch, store: dict) -> None:
        keys.extend(item_keys(batch))
        h0 = store[hooks[0]]
        real, _ = class_masks(model, batch, h0.shape[1], h0.device)
        for layer, name in hooks.items():
            h = store[name].detach().double()
            for row in range(h.shape[0]):
                tokens = h[row][real[row]]  # [tokens, d_model]
                per_layer[layer].append((float(tokens.abs().max()), float((tokens ** 2).sum()), tokens.numel(),
                                         tokens.norm(dim=-1).cpu().numpy()))

    stream_batches(model, batches, None, list(hooks.values()), consume, desc="residual scale", progress=False)
    return keys, per_layer


def _residual_scales(items: list[tuple], take: np.ndarray) -> tuple[float, float]:
    """(max |h| / RMS(h), max ||h_i|| / median ||h_i||) over the items ``take`` (repeats counted)."""
    chosen = [items[i] for i in take]
    rms = np.sqrt(sum(c[1] for c in chosen) / sum(c[2] for c in chosen))
    norms = np.concatenate([c[3] for c in chosen])
    return max(c[0] for c in chosen) / rms, float(norms.max() / np.median(norms))


def _residual_rows(model: InterpBridge, batches: list[Batch], boot: tuple[int, int]) -> pd.DataFrame:
    keys, per_layer = _residual_items(model, batches)
    resampler, rows = Resampler(keys, *boot), []
    for layer, items in per_layer.items():
        point = _residual_scales(items, np.arange(len(items)))
        resampled = np.stack([resampler.resampled(lambda take, k=k: _residual_scales(items, take)[k])
                              for k in range(2)], 1) if boot[0] else np.zeros((0, 2))
        lo, hi = resampler.interval(resampled)
        for k, quantity in enumerate(("resid_max_to_rms", "resid_norm_max_to_median")):
            rows.append(dict(layer=layer, quantity=quantity, value=point[k], lo=lo[k], hi=hi[k],
                             part=resid_hook(layer, "post").split(".")[-1]))
    return pd.DataFrame(rows).assign(analysis="residual", present=True)


def _frequency_rows(model: InterpBridge, batches: list[Batch], boot: tuple[int, int]) -> pd.DataFrame:
    """The spread over heads of hf_ratio with its interval (``spread_interval``); its resamples ride along in
    ``boots`` until ``_spread_differences`` pairs them with the first model's (the same items, in the same order)."""
    spread = spread_interval(model, batches, column="hf_ratio", n_boot=boot[0], seed=boot[1], progress=False)
    return pd.DataFrame([dict(analysis="frequency", quantity="hf_ratio_spread", part="all heads",
                              value=float(spread.spread.iloc[0]), lo=float(spread.spread_lo.iloc[0]),
                              hi=float(spread.spread_hi.iloc[0]), present=True,
                              boots=spread.attrs.get("boots", ()))])


def _spread_differences(table: pd.DataFrame) -> pd.DataFrame:
    """Each later model's hf_ratio spread minus the first model's, with the paired interval (``spread_difference``:
    every resample draws the same items for both, which holds here because every model reads the same items in
    the same order); appended as ``hf_ratio_spread_difference`` rows of the later model."""
    rows = table[table.quantity == "hf_ratio_spread"]
    if len(rows) < 2 or not rows.n_boot.iloc[0]:
        return table.drop(columns="boots", errors="ignore")

    def one(r: Any) -> pd.DataFrame:
        frame = pd.DataFrame([dict(model=r.model, column="hf_ratio", spread=r.value, n_items=r.n_items,
                                   n_boot=r.n_boot, seed=r.seed)])
        frame.attrs["boots"] = tuple(r.boots)
        return frame

    first, extra = rows.iloc[0], []
    for _, r in rows.iloc[1:].iterrows():
        d = spread_difference(one(r), one(first)).iloc[0]
        extra.append(r.to_dict() | dict(quantity="hf_ratio_spread_difference", part=f"{r.model} - {first.model}",
                                        value=d.difference, lo=d.difference_lo, hi=d.difference_hi,
                                        unit=UNITS["hf_ratio_spread_difference"]))
    return pd.concat([table, pd.DataFrame(extra)], ignore_index=True).drop(columns="boots")


RUNNERS = {"origin": _origin_rows, "scores": _score_rows, "sinks": _sink_rows, "residual": _residual_rows,
           "frequency": _frequency_rows}


def _check_analyses(analyses: Any) -> list[str]:
    chosen = [analyses] if isinstance(analyses, str) else list(analyses)
    unknown = [a for a in chosen if a not in RUNNERS]
    if unknown or not chosen:
        raise InputError(f"analyses must be some of {', '.join(RUNNERS)}; got {analyses!r}")
    return list(dict.fromkeys(chosen))


def _model_rows(label: str, model: InterpBridge, batches: list[Batch], analyses: list[str], boot: tuple[int, int],
                source: str) -> pd.DataFrame:
    info = model.interp
    frames = [RUNNERS[a](model, batches, boot) for a in analyses]
    table = pd.concat(frames, ignore_index=True)
    table["layer"] = table["layer"] if "layer" in table else np.nan
    table = table.assign(model=label, depth=table.layer / max(info.n_layers - 1, 1), n_layers=info.n_layers,
                         n_heads=info.n_heads, n_items=sum(int(b.inputs.shape[0]) for b in batches), n_boot=boot[0],
                         seed=boot[1], model_fingerprint=model_fingerprint(model),
                         data_fingerprint=data_fingerprint(batches), source_fingerprint=source,
                         unit=table.quantity.map(UNITS))
    for column in COLUMNS:
        if column not in table:
            table[column] = np.nan if column not in ("note",) else ""
    table["note"] = table["note"].fillna("")
    return table[COLUMNS + (["boots"] if "boots" in table else [])]


@public
def compare_models(models: Any, data: Any, *, analyses: Sequence[str] = ANALYSES, n_items: Optional[int] = None,
                   max_chars: int = TEXT_MAX_CHARS, batch_size: int = 8, n_boot: int = 200, seed: int = 0,
                   device: Any = None) -> pd.DataFrame:
    """Run ``analyses`` (of origin, scores, sinks, residual; frequency on request) on every model over the same
    ``data`` and return one long-form table in comparable units (module doc): columns model, analysis, quantity,
    part, layer, depth, head, value, lo, hi, floor, present, unit, note, n_layers, n_heads, n_items, n_boot, seed,
    model_fingerprint, data_fingerprint, source_fingerprint.

    ``models``: a list of zoo names, folders or loaded models (labelled by name), or a dict {label: model}.
    ``data``: for language models text (``"python-docs"``: its first ``n_items`` paragraphs, default 16, each
    cut to ``max_chars`` characters; a .txt file, read the same way; a list of strings), or token ids where
    every model has the same tokenizer; for vision models a built-in image set (``n_items`` images), a
    folder, or pixel tensors. ``.attrs``: source (what the items were) and source_fingerprint."""
    boot = check_bootstrap(n_boot, seed)
    analyses = _check_analyses(analyses)
    loaded = _models(models, device)
    batches, source, what = _shared_batches(loaded, data, n_items=n_items, max_chars=max_chars, batch_size=batch_size)
    table = _spread_differences(pd.concat([_model_rows(label, m, batches[label], analyses, boot, source)
                                           for label, m in loaded.items()], ignore_index=True))
    table.attrs.update(source=what, source_fingerprint=source)
    return table


@public
def combine_comparisons(*tables: pd.DataFrame) -> pd.DataFrame:
    """Tables of ``compare_models`` run apart (a model added later) as one: refused unless every row was computed
    on the same items (``source_fingerprint``) with the same resampling (n_boot, seed); a label twice is refused."""
    need = {"model", "source_fingerprint", "n_boot", "seed"}
    if not tables or any(not isinstance(t, pd.DataFrame) or not need <= set(t.columns) for t in tables):
        raise InputError("combine_comparisons takes tables of interp.compare_models (columns "
                         f"{', '.join(sorted(need))})")
    table = pd.concat(tables, ignore_index=True)
    sources = table.source_fingerprint.unique()
    if len(sources) > 1:
        raise InputError(f"these comparisons were run on different data (source fingerprints {', '.join(sources)}): "
                         "numbers of different items are not compared side by side; run compare_models on one data")
    if len(table[["n_boot", "seed"]].drop_duplicates()) > 1:
        raise InputError("these comparisons resampled differently (n_boot, seed): run them with the same ones")
    seen = [m for t in tables for m in t.model.unique()]
    if len(seen) != len(set(seen)):
        twice = sorted({m for m in seen if seen.count(m) > 1})
        raise InputError(f"model label(s) {twice} appear in more than one table: relabel one (a dict {{label: model}})")
    return table


# ----- the figure, the report and the folder -------------------------------------------------------------

# (analysis, quantity, preferred parts): the rows of the side-by-side figure
HEADLINES = (("origin", "shift_ratio", ("q",)), ("scores", "score_share", ("key_prior",)),
             ("sinks", "sink_mass_over_uniform", ("first", "cls")), ("residual", "resid_max_to_rms", ()))


def _headline_part(table: pd.DataFrame, quantity: str, preferred: Sequence[str]) -> Optional[str]:
    """The part every model has, the preferred first (None: the quantity has one part per layer)."""
    rows = table[table.quantity == quantity]
    if rows.empty or not preferred:
        return None
    common = set.intersection(*(set(g.part.dropna()) for _, g in rows.groupby("model", sort=False)))
    return next((p for p in preferred if p in common), sorted(common)[0] if common else None)


# the colour language's name (interp.figures.colours.RULES) of each quantity drawn as a heatmap
COLOUR_QUANTITY = {"score_share": "share"}


def _heatmap_row(fig: plt.Figure, axes: Sequence[plt.Axes], rows: pd.DataFrame, models: list[str], title: str) -> None:
    rule = rule_for(COLOUR_QUANTITY.get(rows.quantity.iloc[0], rows.quantity.iloc[0]), rows.value.to_numpy(float))
    vmin, vmax = limits(rule, rows.value.to_numpy(float))  # one range for every model's panel (interp.figures.colours)
    image = None
    for ax, label in zip(axes, models):
        mine = rows[rows.model == label]
        ax.set_title(f"{label}\n{title}", fontsize=8)
        if mine.empty or not mine.present.astype(bool).any():
            ax.text(0.5, 0.5, "absent (no such bias)" if not mine.empty else "not computed", ha="center",
                    va="center", transform=ax.transAxes, fontsize=8)
            ax.set_xticks([]), ax.set_yticks([])
            continue
        grid = mine.pivot_table(index="layer", columns="head", values="value", aggfunc="first")
        n = int(mine.n_layers.iloc[0])
        half = 0.5 / max(n - 1, 1)
        image = tag(ax.imshow(drawn_values(rule, grid.to_numpy(float)), cmap=rule.cmap, vmin=vmin, vmax=vmax,
                              aspect="auto", interpolation="nearest",
                              extent=(-0.5, grid.shape[1] - 0.5, 1 + half if n > 1 else 0.5, -half if n > 1 else -0.5)),
                    rule.quantity)
        ax.set_xticks(range(grid.shape[1]))
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("relative depth", fontsize=7)
        ax.tick_params(labelsize=6)
    if image is not None:
        fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02).ax.tick_params(labelsize=6)


def _line_row(axes: Sequence[plt.Axes], rows: pd.DataFrame, models: list[str], title: str) -> None:
    """Per model: the per-layer quantity against relative depth with its interval band, one log y scale for all
    (the residual scales differ by orders of magnitude between models)."""
    values = rows[["value", "lo", "hi"]].to_numpy(float)
    values = values[np.isfinite(values) & (values > 0)]
    low, top = (float(values.min()) / 1.3, float(values.max()) * 1.3) if values.size else (0.1, 10.0)
    for ax, label in zip(axes, models):
        mine = rows[rows.model == label].sort_values("depth")
        ax.set_title(f"{label}\n{title}", fontsize=8)
        ax.plot(mine.depth, mine.value, marker="o", ms=3, color="black")
        ax.fill_between(mine.depth, mine.lo, mine.hi, color="grey", alpha=0.35, lw=0, label="95% interval")
        ax.set_yscale("log")
        ax.set_ylim(low, top)
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(FormatStrFormatter("%g"))
        ax.tick_params(which="both", labelsize=6)
        ax.set_xlim(-0.03, 1.03)
        ax.set_xlabel("relative depth", fontsize=7)
        ax.tick_params(labelsize=6)


def comparison_figure(table: pd.DataFrame) -> plt.Figure:
    """Side-by-side panels, one column per model, one row per headline quantity (``HEADLINES``), each row on one
    colour (or y) scale, coloured by the library's colour language (``interp.figures.colours``: bright = large, a
    quantity of both signs diverging around 0); heatmaps are layer x head with the layers placed at their relative
    depth. Draws only."""
    models = list(dict.fromkeys(table.model))
    rows = [(q, _headline_part(table, q, parts)) for _, q, parts in HEADLINES if (table.quantity == q).any()]
    fig, grid = plt.subplots(len(rows), len(models), figsize=(3.2 * len(models) + 1, 2.6 * len(rows)),
                             squeeze=False, layout="constrained")
    for axes, (quantity, part) in zip(grid, rows):
        chosen = table[(table.quantity == quantity) & ((table.part == part) if part is not None else True)]
        title = f"{quantity}" + (f" ({part})" if part else "") + f"\n{UNITS[quantity]}"
        if chosen["head"].notna().any():
            _heatmap_row(fig, axes, chosen, models, title)
        else:
            _line_row(axes, chosen, models, title)
    n = table.n_items.iloc[0]
    fig.suptitle(f"{' vs '.join(models)}: the same {n} items ({table.attrs.get('source', 'data')}), "
                 f"95% intervals over items ({table.n_boot.iloc[0]} resamples)", fontsize=9)
    return fig


def _comparison_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per model x quantity x part: how many rows, their mean, and the largest row with its place and interval
    (a model-level quantity such as sink_head_share has one row: its value and interval)."""
    rows = []
    for (model, quantity, part), group in table[table.value.notna()].groupby(["model", "quantity", "part"],
                                                                             sort=False, dropna=False):
        top = group.loc[group.value.idxmax()]
        rows.append(dict(model=model, quantity=quantity, part=part, present=bool(group.present.astype(bool).any()),
                         n_rows=len(group), mean=float(group.value.mean()), largest=float(top.value),
                         largest_lo=float(top.lo), largest_hi=float(top.hi), largest_layer=top.layer,
                         largest_head=top["head"], largest_depth=top.depth, n_items=int(top.n_items),
                         unit=top.unit))
    return pd.DataFrame(rows)


def _fmt(x: Any) -> str:
    return "" if pd.isna(x) else f"{int(x)}" if float(x).is_integer() and abs(x) < 1e6 else f"{x:.3g}"


def _comparison_markdown(table: pd.DataFrame, summary: pd.DataFrame) -> str:
    """report.md: what was compared, on which items, and per headline quantity each model's mean and largest row."""
    models = list(dict.fromkeys(table.model))
    lines = [f"# {' vs '.join(models)}", "",
             f"The same {table.n_items.iloc[0]} items for every model ({table.attrs.get('source', 'data')}; source "
             f"fingerprint {table.source_fingerprint.iloc[0]}); intervals: 95% bootstrap over items, "
             f"{table.n_boot.iloc[0]} resamples, seed {table.seed.iloc[0]}. Depth = layer / (n_layers - 1).", "",
             "| model | layers x heads | model fingerprint | data fingerprint |", "| --- | --- | --- | --- |"]
    for label in models:
        r = table[table.model == label].iloc[0]
        lines.append(f"| {label} | {r.n_layers} x {r.n_heads} | {r.model_fingerprint} | {r.data_fingerprint} |")
    notes = table[table.note != ""].drop_duplicates(["model", "note"])
    lines += [""] + [f"- {r.model}: {r.analysis}: {r.note}" for r in notes.itertuples()]
    picks = [(q, _headline_part(table, q, p)) for _, q, p in HEADLINES] + \
        [(q, None) for q in ("sink_head_share", "hf_ratio_spread", "hf_ratio_spread_difference")]
    for quantity, part in picks:
        chosen = summary[(summary.quantity == quantity) & ((summary.part == part) if part else True)]
        if chosen.empty:
            continue
        lines += ["", f"## {quantity}" + (f" ({part})" if part else "") + f": {UNITS[quantity]}", "",
                  "| model | part | mean | largest [95% interval] | at layer, head (depth) |",
                  "| --- | --- | --- | --- | --- |"]
        for r in chosen.itertuples():
            if not r.present:
                lines.append(f"| {r.model} | {r.part} | absent (no such bias) | | |")
                continue
            place = "" if pd.isna(r.largest_layer) else \
                f"{_fmt(r.largest_layer)}, {_fmt(r.largest_head)} ({_fmt(r.largest_depth)})".replace(",  (", " (")
            lines.append(f"| {r.model} | {r.part} | {_fmt(r.mean)} | {_fmt(r.largest)} [{_fmt(r.largest_lo)}, "
                         f"{_fmt(r.largest_hi)}] | {place} |")
    return "\n".join(lines) + "\n"


def write_comparison(table: pd.DataFrame, out: Any, meta: Optional[dict] = None) -> Path:
    """``out``: compare.csv/.parquet (the table), compare_summary.csv/.parquet, compare.png, report.md and
    manifest.json (written last; ``meta`` added to it)."""
    out = Path(out)
    begin_outputs(out, "compare")
    summary = _comparison_summary(table)
    write_table(table, out / "compare")
    write_table(summary, out / "compare_summary")
    fig = comparison_figure(table)
    save_figure(fig, out / "compare.png")
    plt.close(fig)
    with atomic_path(out / "report.md") as tmp:  # recorded as written: the manifest lists it
        tmp.write_text(_comparison_markdown(table, summary))
    models = table.drop_duplicates("model")
    write_manifest(out, dict(command="compare", **(meta or {}), models=list(models.model),
                             model_fingerprints=dict(zip(models.model, models.model_fingerprint)),
                             data_fingerprints=dict(zip(models.model, models.data_fingerprint)),
                             source=table.attrs.get("source"), source_fingerprint=table.source_fingerprint.iloc[0],
                             analyses=list(dict.fromkeys(table.analysis)), n_items=int(table.n_items.iloc[0]),
                             n_boot=int(table.n_boot.iloc[0]), seed=int(table.seed.iloc[0])))
    return out
