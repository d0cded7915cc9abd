"""Estimates of many ablations from one forward and one backward per batch.

``attribution`` (attribution patching), linear in the patched activation a = hook_q|k|v:

    delta ~ sum over batches, positions of (a' - a) . dL/da

``atp`` (AtP*, Kramar et al. 2024) for q and k: the patched head's attention pattern is
recomputed exactly, and only what follows the head's output z = A V is linearised:

    A' = softmax(log A + dS),   dS_ij = dq_i . k_j / sqrt(d)  or  q_i . dk_j / sqrt(d)
    delta ~ sum over batches, query positions of (A' - A) V . dL/dz

(every vector rotated by its position first under rotary), which stays right where the
softmax saturates and a linear estimate through it fails. v (linear in z) is estimated as
by ``attribution``. Both are weighted by batch size like the exact metric; ``fold`` is an
exact identity, so its estimated change is zero by construction.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from interp.ablation.metrics import run_forward
from interp.ablation.variants import Variant
from interp.analysis.scores import apply_rotary
from interp.data import Batch
from interp.errors import InputError
from interp.heads import kv_group
from interp.hooks import hook_name
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


def _linear_shifts(model: InterpBridge, sites: list, method: Method, stats: Optional[QKVStats],
                   bias_seed: int = 0) -> dict:
    """a' - a per site [heads, d_head]; zero for ``fold``, an exact identity."""
    shift = {(l, k): bias_shift(model, l, k, method, stats, bias_seed) for l, k in sites}
    if method == "fold":
        shift = {site: torch.zeros_like(s) for site, s in shift.items()}
    return shift


def _linear_terms(model: InterpBridge, acts: dict, batch: Batch, shift: dict) -> dict:
    """Per site: [head] sum over the batch and (real) positions of (a' - a) . dL/da."""
    out = {}
    for site, a in acts.items():
        grad = a.grad  # [batch, pos, head_index, d_head]
        if grad is None:
            continue
        if batch.attention_mask is not None and model.interp.modality == "text":
            grad = grad * batch.attention_mask.to(grad.device)[..., None, None].to(grad.dtype)
        out[site] = torch.einsum("bphd,hd->h", grad.double(), shift[site].double().to(grad.device)).cpu()
    return out


def attribution_deltas(
    model: InterpBridge, batches: Sequence[Batch], weights: Sequence[float], variants: Sequence[Variant],
    method: Method, stats: Optional[QKVStats], value: Callable, refs: Sequence[dict], need_hidden: bool,
    bias_seed: int = 0,
) -> list[float]:
    """The first-order delta of each variant (see the module doc; ``bias_seed``: ``method="random"``'s)."""
    sites = sorted({(l, k) for v in variants for l, _, k in v.targets})
    shift = _linear_shifts(model, sites, method, stats, bias_seed)
    contrib = {site: torch.zeros(shift[site].shape[0], dtype=torch.float64) for site in sites}
    total = sum(weights)
    for batch, ref, weight in zip(batches, refs, weights):
        acts: dict[tuple[int, str], Tensor] = {}
        hooks = [(hook_name(l, k), _keep_grad(acts, (l, k))) for l, k in sites]
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            out, hidden = run_forward(model, batch, hooks, need_hidden)
            value(out, hidden, ref, batch).backward()
        for site, per_head in _linear_terms(model, acts, batch, shift).items():
            contrib[site] += per_head * (weight / total)
    model.zero_grad(set_to_none=True)
    return [float(sum(contrib[(l, k)][h] for l, h, k in v.targets)) for v in variants]


def _score_shift(model: InterpBridge, cache: dict, layer: int, kind: str, shift: Tensor) -> Tensor:
    """dS [b, head, q, k] of every query head when b_kind moves by ``shift`` [heads of kind, d]."""
    info = model.interp
    q, k = cache[hook_name(layer, "q")].double(), cache[hook_name(layer, "k")].double()
    delta = shift.double().to(q.device)[None, None].expand_as(q if kind == "q" else k)
    q, k = (delta, k) if kind == "q" else (q, delta)
    if info.rotary:
        cos, sin = cache[hook_name(layer, "cos")], cache[hook_name(layer, "sin")]
        q, k = apply_rotary(q, cos.double(), sin.double()), apply_rotary(k, cos.double(), sin.double())
    k = k[:, :, kv_group(info.n_heads, info.n_kv_heads)]
    return torch.einsum("bihd,bjhd->bhij", q, k) * info.score_scale(layer)  # 1/sqrt(d), or GPT-2's 1/(sqrt(d) (l+1))


def _pattern_terms(model: InterpBridge, cache: dict, grads: dict, sites: list, shift: dict) -> dict:
    """Per (layer, kind): [head of the kind] sum over the batch of (A' - A) V . dL/dz (AtP*)."""
    info = model.interp
    out = {}
    for layer, kind in sites:
        pattern = cache[hook_name(layer, "pattern")].double()  # [b, h, q, k]
        v = cache[hook_name(layer, "v")].double()[:, :, kv_group(info.n_heads, info.n_kv_heads)]
        log_a = torch.where(pattern > 0, pattern.clamp_min(1e-300).log(), torch.full_like(pattern, -torch.inf))
        patched = (log_a + _score_shift(model, cache, layer, kind, shift[(layer, kind)])).softmax(-1)
        patched = torch.where(pattern > 0, patched, torch.zeros_like(patched))
        dz = torch.einsum("bhij,bjhd->bihd", patched - pattern, v)
        per_query_head = torch.einsum("bihd,bihd->h", dz, grads[layer].double()).cpu()
        if kind == "k":  # a kv head's b_k moves the patterns of every query head in its group
            group = torch.tensor(kv_group(info.n_heads, info.n_kv_heads))
            per_query_head = torch.zeros(info.n_kv_heads, dtype=torch.float64).index_add_(0, group, per_query_head)
        out[(layer, kind)] = per_query_head
    return out


def atp_star_deltas(
    model: InterpBridge, batches: Sequence[Batch], weights: Sequence[float], variants: Sequence[Variant],
    method: Method, stats: Optional[QKVStats], value: Callable, refs: Sequence[dict], need_hidden: bool,
    bias_seed: int = 0,
) -> list[float]:
    """The AtP* delta of each variant (see the module doc); v targets as ``attribution_deltas``,
    from the same forward and backward."""
    spec = model.interp.spec
    if spec.score_refusal:
        raise InputError(f"estimate='atp' recomputes attention scores, which {spec.label} does not allow: "
                         f"{spec.score_refusal}; use estimate='attribution' or 'exact'")
    pattern_sites = sorted({(l, k) for v in variants for l, _, k in v.targets if k in ("q", "k")})
    linear_sites = sorted({(l, k) for v in variants for l, _, k in v.targets if k not in ("q", "k")})
    shift = {site: bias_shift(model, site[0], site[1], method, stats, bias_seed) for site in pattern_sites}
    shift.update(_linear_shifts(model, linear_sites, method, stats, bias_seed))
    layers = sorted({l for l, _ in pattern_sites})
    cached = ("q", "k", "v", "pattern") + (("cos", "sin") if model.interp.rotary else ())
    names = {hook_name(l, n) for l in layers for n in cached}
    contrib = {site: torch.zeros(model.interp.heads(site[1]), dtype=torch.float64)
               for site in pattern_sites + linear_sites}
    for batch, ref, weight in zip(batches, refs, weights):
        cache: dict[str, Tensor] = {}
        grads: dict[int, Tensor] = {}
        acts: dict[tuple[int, str], Tensor] = {}
        hooks = ([(n, _store(cache, n)) for n in names]
                 + [(hook_name(l, "z"), _keep_grad(grads, l)) for l in layers]
                 + [(hook_name(l, k), _keep_grad(acts, (l, k))) for l, k in linear_sites])
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            out, hidden = run_forward(model, batch, hooks, need_hidden)
            value(out, hidden, ref, batch).backward()
        grads = {l: g.grad for l, g in grads.items()}
        terms = _pattern_terms(model, cache, grads, pattern_sites, shift)
        terms.update(_linear_terms(model, acts, batch, shift))
        for site, per_head in terms.items():
            contrib[site] += per_head * (weight / sum(weights))
    model.zero_grad(set_to_none=True)
    return [float(sum(contrib[(l, k)][h] for l, h, k in v.targets)) for v in variants]


def _store(cache: dict, name: str) -> Callable[[Tensor, Any], None]:
    def fn(t: Tensor, hook: Any) -> None:
        cache[name] = t.detach()
    return fn
