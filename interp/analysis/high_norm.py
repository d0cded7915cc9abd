"""High-norm tokens per layer (Darcet et al. 2023, "Vision Transformers Need Registers"): the token-norm
distribution, the tokens whose norm exceeds ``k`` x the layer's median, and the attention they receive.

Layer l names a residual point (``interp.analysis.sinks.RESID_POINTS``, the convention
``massive_activations`` shares): by default (``point="post"``) the stream after block l
(``blocks.{l}.hook_resid_post``; for a post-LN model such as BERT, after the block's output layer norm),
with ``point="pre"`` the stream entering block l (``blocks.{l}.hook_resid_pre``: the embeddings for
l = 0). ``mass`` is what the attention of the block that reads that point pays the token: block l + 1
for ``post`` (none after the last block: NaN), block l for ``pre``; ``mass_hook`` names its pattern:

    norm_i   = ||x_i||  (x_i the token's residual vector, float64)
    mass_j   = mean over heads h of (1/|R_s|) sum_{i in R_s} A^h_ij   (R_s: the real query rows of j's sequence)
    outlier  = norm_j > k x median_i norm_i   (median over every real token of the data)

Two streaming passes over the data (memory flat): the first counts the norms into a histogram
(``interp.analysis.sink_parts.AbsHistogram``: quantiles within a relative 2^-11), the second keeps the
``top`` largest outliers (ties broken by data order) and counts all of them.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import pandas as pd
import torch
from torch import Tensor

from interp.analysis.sink_parts import (
    AbsHistogram,
    RunningTopK,
    check_positive,
    check_top_k,
    class_masks,
    column_sums,
    patterns_of,
    provenance,
    rows_or_fail,
    stable_topk,
    stream_batches,
)
from interp.analysis.sinks import _token_label, check_resid_point, resid_hook
from interp.checks import check_layers
from interp.data import Batch, to_device
from interp.errors import public
from interp.record.hooks import hook_name
from interp.models.bridge import InterpBridge, require_bridge

QUANTILES = {"norm_q05": 0.05, "norm_q25": 0.25, "norm_median": 0.5, "norm_q75": 0.75, "norm_q95": 0.95}


def _readers(layers: Sequence[int], point: str, n_layers: int) -> dict[int, Optional[int]]:
    """Per layer: the block whose attention reads that residual point (None after the last block)."""
    offset = 1 if point == "post" else 0
    return {layer: layer + offset if layer + offset < n_layers else None for layer in layers}


def _payload(model: InterpBridge, batch: Batch, real: Tensor, first_sequence: int) -> Tensor:
    """[batch, pos, 3]: sequence index in the data, position among real tokens, token id (-1 for pixels)."""
    ids = batch.inputs if model.interp.modality == "text" else torch.full(real.shape, -1)
    seq = torch.arange(real.shape[0], device=real.device)[:, None].expand_as(real) + first_sequence
    return torch.stack([seq, real.long().cumsum(1) - 1, to_device(ids, real.device).long()], -1)


@public
def high_norm_tokens(model: InterpBridge, data: Any, *, k: float = 5.0, layers: Optional[Sequence[int]] = None,
                     top: int = 20, point: str = "post", max_batches: Optional[int] = None,
                     progress: bool = True) -> pd.DataFrame:
    """Per layer: the token-norm distribution and the tokens with norm > ``k`` x median (module doc).

    One row per layer and kept outlier (the ``top`` largest; ``n_outliers`` counts them all), or one row
    with empty token columns for a layer without outliers. Columns: model, layer, hook (the residual
    point: ``blocks.{l}.hook_resid_post`` by default, ``hook_resid_pre`` with ``point="pre"``), rank, norm,
    ratio_to_median, sequence, position (among the sequence's real tokens), token_id, token, mass (mean
    over heads of the attention the reading block pays the token per real query row), mass_hook (that
    block's pattern; None after the last block), n_outliers, n_tokens, k, norm_q05, norm_q25,
    norm_median, norm_q75, norm_q95, norm_max, mass_mean (the same mass averaged over every real token:
    1 / the mean sequence length for a uniform pattern), n_batches, max_batches, model_fingerprint,
    data_fingerprint.
    """
    info = require_bridge(model, "high_norm_tokens").interp
    layers, top = check_layers(layers, info), check_top_k(top)
    k, point = check_positive(k, "k"), check_resid_point(point)
    hooks = {layer: resid_hook(layer, point) for layer in layers}
    readers = _readers(layers, point, info.n_layers)
    hists = _norm_histograms(model, data, hooks, max_batches, progress)
    cutoff = {layer: k * hists[layer].lower_median() for layer in layers}
    acc: dict = {"sequences": 0}

    def collect(batch: Batch, store: dict) -> None:
        patterns = patterns_of(model, store, [r for r in readers.values() if r is not None])
        real, _ = class_masks(model, batch, store[hooks[layers[0]]].shape[1], store[hooks[layers[0]]].device)
        payload = _payload(model, batch, real, acc["sequences"])
        acc["sequences"] += real.shape[0]
        rows = real.sum(1, keepdim=True).clamp(min=1).double()  # real query rows per sequence
        for layer, reader in readers.items():
            norms = store[hooks[layer]].double().norm(dim=-1)
            mass = (torch.full_like(norms, float("nan")) if reader is None else
                    column_sums(patterns[reader], real).mean(1) / rows)  # [batch, key_pos], mean over heads
            _add_outliers(acc.setdefault(layer, _Outliers(top)), norms, mass, real, cutoff[layer], payload)

    names = list(hooks.values()) + [hook_name(r, "pattern") for r in dict.fromkeys(readers.values()) if r is not None]
    n_batches, data_fp = stream_batches(model, data, max_batches, names, collect, desc="high-norm tokens",
                                        progress=progress, stop_at_layer=_blocks(layers, readers))
    meta = dict(k=k, **provenance(model, data_fp, n_batches, max_batches))
    return _table(model, acc, hists, hooks, readers, meta)


def _blocks(layers: Sequence[int], readers: dict[int, Optional[int]]) -> int:
    """How many blocks a pass must run to reach every residual point and reading pattern."""
    return max([*layers, *(r for r in readers.values() if r is not None)]) + 1


def _norm_histograms(model: InterpBridge, data: Any, hooks: dict[int, str], max_batches: Optional[int],
                     progress: bool) -> dict[int, AbsHistogram]:
    """First pass: per layer, a histogram of every real token's norm ||x_i||."""
    hists: dict[int, AbsHistogram] = {}
    first = next(iter(hooks.values()))

    def count(batch: Batch, store: dict) -> None:
        real, _ = class_masks(model, batch, store[first].shape[1], store[first].device)
        for layer, name in hooks.items():
            norms = store[name].double().norm(dim=-1)
            hists.setdefault(layer, AbsHistogram(real.device)).add(norms.flatten(), real.flatten())

    stream_batches(model, data, max_batches, list(hooks.values()), count, desc="token norms", progress=progress,
                   stop_at_layer=max(hooks) + 1)
    rows_or_fail(hists[next(iter(hooks))].total())
    return hists


class _Outliers:
    def __init__(self, top: int) -> None:
        self.top = RunningTopK(top)
        self.count: Any = 0
        self.max = RunningTopK(1)
        self.mass_sum: Any = 0
        self.n: Any = 0


def _add_outliers(out: _Outliers, norms: Tensor, mass: Tensor, real: Tensor, cutoff: float, payload: Tensor) -> None:
    flat = payload.flatten(0, 1)
    outlier = (norms > cutoff) & real
    out.count = out.count + outlier.sum()
    out.mass_sum, out.n = out.mass_sum + (mass * real).sum(), out.n + real.sum()
    score = norms.masked_fill(~outlier, float("-inf")).flatten()
    chosen = stable_topk(score, out.top.k)
    out.top.add(score[chosen], mass.flatten()[chosen], flat[chosen])
    best = stable_topk(norms.masked_fill(~real, float("-inf")).flatten(), 1)
    out.max.add(norms.flatten()[best], norms.flatten()[best], flat[best])


def _table(model: InterpBridge, acc: dict, hists: dict, hooks: dict[int, str], readers: dict[int, Optional[int]],
           meta: dict) -> pd.DataFrame:
    rows = []
    for layer, hook in hooks.items():
        hist, out = hists[layer], acc[layer]
        median = hist.lower_median()
        reader = readers[layer]
        per_layer = dict(mass_hook=None if reader is None else hook_name(reader, "pattern"),
                         n_outliers=int(out.count), n_tokens=int(hist.total()), k=meta["k"],
                         **{name: hist.quantile(q) for name, q in QUANTILES.items()},
                         norm_max=out.max.rows()[0][0], mass_mean=float(out.mass_sum) / max(int(out.n), 1))
        found = out.top.rows()
        for rank, (norm, mass, (seq, pos, token_id)) in enumerate(found, start=1):
            rows.append(dict(model=meta["model"], layer=layer, hook=hook, rank=rank, norm=norm,
                             ratio_to_median=norm / median, sequence=seq, position=pos,
                             token_id=token_id if token_id >= 0 else None, token=_token_label(model, pos, token_id),
                             mass=mass, **per_layer))
        if not found:
            rows.append(dict(model=meta["model"], layer=layer, hook=hook, rank=None, norm=None, ratio_to_median=None,
                             sequence=None, position=None, token_id=None, token=None, mass=None, **per_layer))
    frame = pd.DataFrame(rows).assign(**{key: meta[key] for key in ("n_batches", "max_batches", "model_fingerprint",
                                                                     "data_fingerprint")})
    return frame.astype({"rank": "Int64", "sequence": "Int64", "position": "Int64", "token_id": "Int64",
                         "norm": float, "ratio_to_median": float, "mass": float})
