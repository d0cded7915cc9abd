"""Bootstrap intervals over items for ``origin_shift``'s shift ratio and bias share.

``QKVStats`` streams moments over tokens and keeps nothing per item, so they cannot be resampled.
The intervals therefore come from one more pass over the same data that keeps, per item (sequence or
image), per layer, kind and head: the sum of the content vectors XW over its real tokens [d_head], the
sum of their squared norms, and the token count. A resample's shift ratio is ||b|| / sqrt(sum ||XW||^2
/ sum n) and its bias share ||b|| / (||b|| + ||sum XW / sum n||) over the resampled items: the same
token-weighted statistics as the point estimate, resampled over items (``interp.bootstrap``). Memory:
items x layers x kinds x (d_model + heads) float64 numbers. The pass is checked against the statistics
(token count and mean squared norm per layer and kind): data other than what they were recorded on is
refused, never mixed.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from interp.bootstrap import Resampler, item_keys
from interp.checks import inputs_checked_on_host
from interp.data import iter_batches, model_inputs
from interp.errors import InputError
from interp.heads import attention_weights
from interp.hooks import hook_name
from interp.models.bridge import InterpBridge
from interp.stats import QKVStats

Sums = dict[tuple[int, str], dict[str, list[Tensor]]]


def _hook(sums: Sums, key: tuple[int, str], bias: Tensor, state: dict) -> Callable[[Tensor, Any], None]:
    def fn(act: Tensor, hook: Any) -> None:
        content = act.detach().double() - bias.to(act.device)  # [b, p, h, d]
        m = state["mask"]
        m = torch.ones(content.shape[:2], dtype=torch.float64, device=content.device) if m is None else m
        parts = sums.setdefault(key, {"s": [], "q": [], "n": []})
        parts["s"].append(torch.einsum("bphd,bp->bhd", content, m))
        parts["q"].append(torch.einsum("bph,bp->bh", (content ** 2).sum(-1), m))
        parts["n"].append(m.sum(1))
    return fn


def item_sums(model: InterpBridge, data: Any, layers: Sequence[int], kinds: Sequence[str],
              max_batches: Optional[int] = None) -> tuple[list[str], dict[tuple[int, str], dict[str, np.ndarray]]]:
    """(item keys, per (layer, kind): s [items, h, d], q [items, h], n [items]) over ``data``."""
    sums: Sums = {}
    state: dict[str, Any] = {"mask": None}
    hooks = [(hook_name(layer, kind), _hook(sums, (layer, kind),
                                            attention_weights(model, layer, dtype=torch.float64).bias(kind), state))
             for layer in layers for kind in kinds]
    keys: list[str] = []
    with torch.no_grad():
        for batch in iter_batches(model, data, max_batches):
            batch.check(model.interp)
            keys += item_keys(batch)
            x, kw = model_inputs(model, batch)
            mask = batch.attention_mask
            state["mask"] = None if mask is None else mask.to(x.device).double()
            with inputs_checked_on_host():
                model.run_with_hooks(x, fwd_hooks=hooks, **kw)
    return keys, {key: {name: torch.cat(v).cpu().numpy() for name, v in parts.items()} for key, parts in sums.items()}


def _check_same_data(stats: QKVStats, layer: int, kind: str, parts: dict[str, np.ndarray]) -> None:
    count, want = float(parts["n"].sum()), float(stats.count(layer))
    msq = parts["q"].sum(0) / max(count, 1.0)
    recorded = stats.mean_sq_norm(layer, kind, "content").cpu().double().numpy()
    if count != want or not np.allclose(msq, recorded, rtol=1e-6, atol=1e-12):
        raise InputError(f"origin_shift: the data given for the intervals ({count:.0f} tokens at layer {layer}) is not "
                         f"the data the statistics were recorded on ({want:.0f} tokens): pass the same data (and "
                         "max_batches) as to record_qkv, or leave data out (no intervals)")


def origin_intervals(model: InterpBridge, stats: QKVStats, data: Any, layers: Sequence[int], resample: tuple[int, int],
                     max_batches: Optional[int] = None) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """Per (layer, kind): shift_ratio_lo/hi and bias_share_lo/hi, arrays over heads (see the module doc)."""
    keys, sums = item_sums(model, data, layers, stats.kinds, max_batches)
    if not keys:
        raise InputError("origin_shift: data is empty: no items to resample for the intervals")
    resampler = Resampler(keys, *resample)
    out = {}
    for (layer, kind), parts in sums.items():
        _check_same_data(stats, layer, kind, parts)
        bias_norm = attention_weights(model, layer, dtype=torch.float64).bias(kind).norm(dim=-1).cpu().numpy()
        n = resampler.sums(parts["n"])[:, None]  # [B, 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = bias_norm / np.sqrt(resampler.sums(parts["q"]) / n)
            origin = np.linalg.norm(resampler.sums(parts["s"]) / n[..., None], axis=-1)  # [B, h]
            share = np.where(bias_norm + origin > 0, bias_norm / (bias_norm + origin), 0.0)
        (r_lo, r_hi), (s_lo, s_hi) = resampler.interval(ratio), resampler.interval(share)
        out[(layer, kind)] = dict(shift_ratio_lo=r_lo, shift_ratio_hi=r_hi, bias_share_lo=s_lo, bias_share_hi=s_hi)
    return out
