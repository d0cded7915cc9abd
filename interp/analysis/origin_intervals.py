"""Bootstrap intervals over items for ``origin_shift``'s shift ratio and bias share.

``QKVStats`` streams moments over tokens and keeps nothing per item, so they cannot be resampled.
The intervals therefore come from one more pass over the same data that keeps, per item (sequence or
image), per layer, kind and head: the sum of the content vectors XW over its real tokens [d_head], the
sum of their squared norms, and the token count. A resample's shift ratio is ||b|| / sqrt(sum ||XW||^2
/ sum n) and its bias share ||b|| / (||b|| + ||sum XW / sum n||) over the resampled items: the same
token-weighted statistics as the point estimate, resampled over items (``interp.bootstrap``). Memory:
items x layers x kinds x (d_model + heads) float64 numbers. The pass (``interp.record.capture.stream_batches``)
hashes the batches it reads; data whose fingerprint is not the statistics' ``data_fingerprint`` is
refused, never mixed.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from interp.bootstrap import Resampler, item_keys
from interp.record.capture import off_heap, stream_batches, tensors
from interp.data import Batch
from interp.errors import InputError
from interp.record.heads import attention_weights
from interp.record.hooks import hook_name
from interp.models.bridge import InterpBridge
from interp.record.stats import QKVStats

Sums = dict[tuple[int, str], dict[str, list[Any]]]


def _hook(sums: Sums, key: tuple[int, str], bias: Tensor, state: dict) -> Callable[[Tensor, Any], None]:
    def fn(act: Tensor, hook: Any) -> None:
        content = act.detach().double() - bias.to(act.device)  # [b, p, h, d]
        m = state["mask"]
        m = torch.ones(content.shape[:2], dtype=torch.float64, device=content.device) if m is None else m
        parts = sums.setdefault(key, {"s": [], "q": [], "n": []})
        parts["s"].append(off_heap(torch.einsum("bphd,bp->bhd", content, m)))  # kept across the pass: off_heap
        parts["q"].append(off_heap(torch.einsum("bph,bp->bh", (content ** 2).sum(-1), m)))
        parts["n"].append(off_heap(m.sum(1)))
    return fn


def item_sums(model: InterpBridge, data: Any, layers: Sequence[int], kinds: Sequence[str],
              max_batches: Optional[int] = None) -> tuple[list[str], dict[tuple[int, str], dict[str, np.ndarray]], str]:
    """(item keys, per (layer, kind): s [items, h, d], q [items, h], n [items], data fingerprint) over ``data``."""
    sums: Sums = {}
    state: dict[str, Any] = {"mask": None}
    hooks = [(hook_name(layer, kind), _hook(sums, (layer, kind),
                                            attention_weights(model, layer, dtype=torch.float64).bias(kind), state))
             for layer in layers for kind in kinds]
    device = next(model.parameters()).device
    keys: list[str] = []

    def batch_hooks(batch: Batch) -> list:
        mask = batch.attention_mask
        state["mask"] = None if mask is None else mask.to(device).double()
        keys.extend(item_keys(batch))
        return hooks

    _, data_fp = stream_batches(model, data, max_batches, [], hooks=batch_hooks, desc="origin intervals",
                                progress=False)
    return keys, {key: {name: torch.cat(tensors(v)).cpu().numpy() for name, v in parts.items()}
                  for key, parts in sums.items()}, data_fp


def _check_same_data(stats: QKVStats, data_fp: str) -> None:
    """The intervals' pass must read the batches the statistics were recorded on: decided by the data
    fingerprint (a hash of the exact batches, ``interp.record.fingerprint.DataHasher``), never by summaries."""
    if stats.data_fingerprint is None or data_fp != stats.data_fingerprint:
        recorded = "no data fingerprint" if stats.data_fingerprint is None else \
            f"data fingerprint {stats.data_fingerprint}"
        raise InputError(f"origin_shift: the data given for the intervals (data fingerprint {data_fp}) is not the "
                         f"data the statistics were recorded on ({recorded}): pass the same data (and max_batches) "
                         "as to record_qkv, or leave data out (no intervals). Statistics merged from shards carry "
                         "a combined fingerprint that no single pass reproduces: intervals need one recording")


def origin_intervals(model: InterpBridge, stats: QKVStats, data: Any, layers: Sequence[int], resample: tuple[int, int],
                     max_batches: Optional[int] = None) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """Per (layer, kind): shift_ratio_lo/hi and bias_share_lo/hi, arrays over heads (see the module doc)."""
    keys, sums, data_fp = item_sums(model, data, layers, stats.kinds, max_batches)
    _check_same_data(stats, data_fp)
    resampler = Resampler(keys, *resample)
    out = {}
    for (layer, kind), parts in sums.items():
        bias_norm = attention_weights(model, layer, dtype=torch.float64).bias(kind).norm(dim=-1).cpu().numpy()
        n = resampler.sums(parts["n"])[:, None]  # [B, 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = bias_norm / np.sqrt(resampler.sums(parts["q"]) / n)
            origin = np.linalg.norm(resampler.sums(parts["s"]) / n[..., None], axis=-1)  # [B, h]
            share = np.where(bias_norm + origin > 0, bias_norm / (bias_norm + origin), 0.0)
        (r_lo, r_hi), (s_lo, s_hi) = resampler.interval(ratio), resampler.interval(share)
        out[(layer, kind)] = dict(shift_ratio_lo=r_lo, shift_ratio_hi=r_hi, bias_share_lo=s_lo, bias_share_hi=s_hi)
    return out
