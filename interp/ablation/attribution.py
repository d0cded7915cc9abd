"""First-order (attribution patching) estimates of many ablations from one backward per batch:

    delta ~ sum over batches, positions of (a' - a) . dL/da

weighted by batch size like the exact metric. ``fold`` is an exact identity, so its
first-order change is zero by construction.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from interp.ablation.metrics import run_forward
from interp.ablation.variants import Variant
from interp.data import Batch
from interp.models.bridge import InterpBridge
from interp.patching import bias_shift
from interp.stats import QKVStats
from interp.types import Method


def _keep_grad(acts: dict, site: tuple[int, str]) -> Callable[[Tensor, Any], Tensor]:
    def fn(t: Tensor, hook: Any) -> Tensor:
        # a fresh node that the bridge computes *from*, so its gradient is populated
        t = t.clone()
        t.retain_grad()
        acts[site] = t
        return t
    return fn


def attribution_deltas(
    model: InterpBridge, batches: Sequence[Batch], weights: Sequence[float], variants: Sequence[Variant],
    method: Method, stats: Optional[QKVStats], value: Callable, refs: Sequence[dict], need_hidden: bool,
) -> list[float]:
    """The first-order delta of each variant (see the module doc)."""
    sites = sorted({(l, k) for v in variants for l, _, k in v.targets})
    shift = {(l, k): bias_shift(model, l, k, method, stats) for l, k in sites}
    if method == "fold":
        shift = {site: torch.zeros_like(s) for site, s in shift.items()}
    contrib = {site: torch.zeros(shift[site].shape[0], dtype=torch.float64) for site in sites}
    total = sum(weights)
    for batch, ref, weight in zip(batches, refs, weights):
        acts: dict[tuple[int, str], Tensor] = {}
        hooks = [(f"blocks.{l}.attn.hook_{k}", _keep_grad(acts, (l, k))) for l, k in sites]
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            out, hidden = run_forward(model, batch, hooks, need_hidden)
            value(out, hidden, ref, batch).backward()
        for site, a in acts.items():
            grad = a.grad  # [batch, pos, head_index, d_head]
            if grad is None:
                continue
            if batch.attention_mask is not None and model.interp.modality == "text":
                grad = grad * batch.attention_mask.to(grad.device)[..., None, None].to(grad.dtype)
            per_head = torch.einsum("bphd,hd->h", grad.double(), shift[site].double().to(grad.device))
            contrib[site] += per_head.cpu() * (weight / total)
    model.zero_grad(set_to_none=True)
    return [float(sum(contrib[(l, k)][h] for l, h, k in v.targets)) for v in variants]
