"""``record_qkv``: stream per-head Q/K/V statistics over data, never keeping activations.

Hooks on ``blocks.{l}.attn.hook_q|hook_k|hook_v`` reduce each batch to per-head
(count, mean, centred co-moment) on the model's device and fold it into float64
``Moments`` (``interp.record.stats``). Nothing is copied to the host per batch (counts stay
tensors; non-finite values set a device-side flag that is checked once at the end).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from einops import rearrange
from torch import Tensor

from interp.record.capture import stream_batches
from interp.checks import check_kinds, check_layers
from interp.data import Batch, to_device
from interp.errors import InputError, InterpError, public
from interp.record.fingerprint import model_fingerprint
from interp.record.heads import attention_weights
from interp.record.hooks import attn_hook, hook_name
from interp.models.bridge import InterpBridge, require_bridge
from interp.record.stats import Moments, QKVStats, batch_moments
from interp.types import QKV


def _empty_stats(model: InterpBridge, layers: list[int], kinds: list[str], capture: bool) -> QKVStats:
    info = model.interp
    device = next(model.parameters()).device
    biases, moments, nonfinite = {}, {}, {}
    for layer in layers:
        w = attention_weights(model, layer, dtype=torch.float64)
        for kind in kinds:
            biases[(layer, kind)] = w.bias(kind).to(device)
            moments[(layer, kind)] = Moments.zeros(info.heads(kind), info.d_head, device)
            nonfinite[(layer, kind)] = torch.zeros(info.heads(kind), dtype=torch.bool, device=device)
    # only E[x] is needed downstream: skip the d_model x d_model co-moment (costly)
    inputs = {layer: Moments.zeros(1, info.d_model, device, means_only=True) for layer in layers}
    return QKVStats(
        model_name=info.name, n_layers=info.n_layers, layers=layers, kinds=kinds,
        heads={k: info.heads(k) for k in kinds}, d_head=info.d_head, d_model=info.d_model,
        biases=biases, moments=moments, input_moments=inputs, nonfinite=nonfinite,
        captured={key: [] for key in moments} if capture else None, model_fingerprint=model_fingerprint(model),
    )


def _flat(t: Tensor) -> Tensor:
    return rearrange(t, "b p ... -> (b p) ...")


def _hooks(stats: QKVStats, state: dict, capture_limit_mb: float) -> list[tuple[str, Callable]]:
    limit = capture_limit_mb * 2**20

    def stat_hook(layer: int, kind: str) -> Callable:
        def fn(act: Tensor, hook: Any) -> None:
            x = _flat(act.detach())
            stats.nonfinite[(layer, kind)] |= ~torch.isfinite(x).all(dim=-1).all(dim=0)
            stats.moments[(layer, kind)].add(*batch_moments(x, state["weight"]))
            if stats.captured is not None:
                keep = x if state["weight"] is None else x[state["weight"].bool()]
                state["captured_bytes"] += keep.numel() * 8
                if state["captured_bytes"] > limit:
                    raise InterpError(
                        f"capture exceeded capture_limit_mb={capture_limit_mb}: record fewer "
                        "batches or layers, or use the streaming statistics (capture=False)"
                    )
                stats.captured[(layer, kind)].append(keep.to("cpu", torch.float64))
        return fn

    def input_hook(layer: int) -> Callable:
        def fn(act: Tensor, hook: Any) -> None:
            x = _flat(act.detach())[:, None, :]
            stats.input_moments[layer].add(*batch_moments(x, state["weight"], with_m2=False))
        return fn

    hooks = [(hook_name(layer, kind), stat_hook(layer, kind))
             for layer in stats.layers for kind in stats.kinds]
    return hooks + [(attn_hook(layer, "q.hook_in"), input_hook(layer)) for layer in stats.layers]


def readable_again(data: Any) -> bool:
    """Whether ``data`` is in memory and reads the same batches again: a list, tuple, tensor or array, or a string
    that names no file or folder (a built-in data set or a text), not a stream or a path (re-reading a folder would
    cost a second full pass unasked)."""
    if isinstance(data, (list, tuple, torch.Tensor, np.ndarray)):
        return True
    return isinstance(data, str) and not os.path.exists(data)


@public
def record_qkv(
    model: InterpBridge,
    data: Any,
    *,
    layers: Optional[Sequence[int]] = None,
    kinds: Sequence[str] = QKV,
    max_batches: Optional[int] = None,
    progress: bool = True,
    capture: bool = False,
    capture_limit_mb: float = 256.0,
) -> QKVStats:
    """Record per-head Q/K/V statistics over ``data`` without keeping activations.

    ``capture=True`` also keeps the (unpadded) activations, ``[tokens, head_index, d_head]``
    per layer and kind, in ``stats.captured``; it raises once they would exceed
    ``capture_limit_mb``.
    """
    model = require_bridge(model, "record_qkv")
    info = model.interp
    stats = _empty_stats(model, check_layers(layers, info), check_kinds(kinds), capture)
    state: dict[str, Any] = {"weight": None, "captured_bytes": 0}
    hooks = _hooks(stats, state, capture_limit_mb)
    device = next(model.parameters()).device

    def batch_hooks(batch: Batch) -> list[tuple[str, Callable]]:
        """The statistics' hooks, weighting this batch's rows by its mask (set before its forward)."""
        mask = batch.attention_mask
        state["weight"] = None if mask is None else _flat(to_device(mask, device))
        return hooks

    _, data_fp = stream_batches(model, data, max_batches, [], hooks=batch_hooks, desc=f"record {info.name}",
                                progress=progress)
    if stats.count(stats.layers[0]) == 0:
        raise InputError("no real tokens to record: every position of every batch is masked out (attention_mask all 0)")
    stats.check_finite()
    stats.data_fingerprint = data_fp
    stats.recorded_data = (data, max_batches) if readable_again(data) else None
    if stats.captured is not None:
        stats.captured = {k: [torch.cat(v)] if v else [] for k, v in stats.captured.items()}
    return stats
