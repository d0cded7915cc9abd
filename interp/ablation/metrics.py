"""Metrics an ablation is measured by, and the forward pass that feeds them.

Task metrics (nonzero gradient at the intact model, so attribution can estimate them):
``next_token_ce`` (causal LMs), ``cross_entropy`` (classifiers with labels).
Distance metrics (zero at the intact model, exact ablations only): ``embedding_cosine``
(mean-pooled final hidden states, e.g. sentence encoders), ``feature_cosine`` (the
model's output at position 0, e.g. a ViT's CLS feature).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from interp.checks import inputs_checked_on_host
from interp.data import Batch, model_inputs
from interp.errors import InputError
from interp.models.bridge import InterpBridge

DISTANCE_METRICS = ("embedding_cosine", "feature_cosine")
TASK_METRICS = ("next_token_ce", "cross_entropy")
Metric = Union[str, Callable[[Tensor, Batch], Tensor]]


def wide(t: Tensor) -> Tensor:
    """``t`` in float32 at least (half precision is too coarse for a metric), float64 kept: a
    float64 model's ablation deltas are then not limited by float32 rounding (~3e-8 on a cosine)."""
    return t if t.dtype == torch.float64 else t.float()


def has_classifier(model: InterpBridge) -> bool:
    return "unembed" in model.adapter.component_mapping


def auto_metric(model: InterpBridge, batch: Batch) -> str:
    """The family's default metric; cross-entropy for a classifier fed labels."""
    default = model.interp.spec.default_metric
    if model.interp.modality == "vision" and has_classifier(model) and batch.labels is not None:
        return "cross_entropy"
    return default


def metric_name(model: InterpBridge, metric: Metric, first: Batch) -> str:
    if callable(metric) and not isinstance(metric, str):
        return getattr(metric, "__name__", "custom")
    if metric == "auto":
        return auto_metric(model, first)
    if metric not in DISTANCE_METRICS + TASK_METRICS:
        raise InputError(f"unknown metric {metric!r}; choose from {DISTANCE_METRICS + TASK_METRICS} or pass a callable")
    check_metric_fits(model, metric)
    return metric


def check_metric_fits(model: InterpBridge, metric: str) -> None:
    """Refuse a metric that would measure something other than what its name says on this model."""
    info = model.interp
    if metric == "next_token_ce" and not info.causal:
        raise InputError(f"metric 'next_token_ce' needs a causal language model; {info.name} is a "
                         f"{info.attention} {info.modality} model (default metric: {info.spec.default_metric})")
    if metric == "cross_entropy" and not (info.modality == "vision" and has_classifier(model)):
        raise InputError(f"metric 'cross_entropy' needs an image classifier with its head; {info.name} has none "
                         f"(default metric: {info.spec.default_metric})")
    if metric == "feature_cosine" and info.modality == "text":
        raise InputError(f"metric 'feature_cosine' compares the output at position 0, which says nothing about a "
                         f"language model's other positions; use 'embedding_cosine' or '{info.spec.default_metric}'")


def sentence_embedding(hidden: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Mean of the final hidden states over real (unpadded) tokens."""
    if mask is None:
        return hidden.mean(1)
    m = mask[..., None].to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def reference(out: Tensor, hidden: Optional[Tensor], batch: Batch) -> dict[str, Tensor]:
    """What distance metrics compare an ablated run against: the intact run's outputs."""
    ref = {"output": out, "features": out[:, 0] if out.ndim == 3 else out}
    if hidden is not None:
        mask = None if batch.attention_mask is None else batch.attention_mask.to(out.device)
        ref["embedding"] = sentence_embedding(hidden, mask)
    return ref


def metric_value(name: str, out: Tensor, hidden: Optional[Tensor], ref: dict, batch: Batch) -> Tensor:
    if name == "next_token_ce":
        ids = batch.inputs.to(out.device)
        nll = -wide(out[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        if batch.attention_mask is not None:
            keep = batch.attention_mask[:, 1:].to(out.device).float()
            return (nll * keep).sum() / keep.sum().clamp(min=1)
        return nll.mean()
    if name == "cross_entropy":
        return F.cross_entropy(wide(out), batch.labels.to(out.device))
    if name in DISTANCE_METRICS:
        feats, intact = distance_features(name, out, hidden, ref, batch)
        return F.cosine_similarity(wide(feats), wide(intact), dim=-1).mean()
    raise InputError(f"unknown metric {name!r}")


def distance_features(name: str, out: Tensor, hidden: Optional[Tensor], ref: dict,
                      batch: Batch) -> tuple[Tensor, Tensor]:
    """(features of this run, the intact run's) that a distance metric compares: [batch, d]."""
    if name == "embedding_cosine":
        mask = None if batch.attention_mask is None else batch.attention_mask.to(out.device)
        return sentence_embedding(hidden, mask), ref["embedding"]
    if name == "feature_cosine":
        return (out[:, 0] if out.ndim == 3 else out), ref["features"]
    raise InputError(f"{name!r} is not a distance metric ({', '.join(DISTANCE_METRICS)})")


def kl_from_intact(model: InterpBridge, base_out: Tensor, out: Tensor, batch: Batch) -> Optional[Tensor]:
    """Mean KL(intact || ablated) of the output distribution, nats, as a 0-d tensor on the model's
    device (no host sync); None without logits."""
    if not model.interp.causal and not (out.ndim == 2 and has_classifier(model)):
        return None
    p = wide(base_out).log_softmax(-1)
    q = wide(out).log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1)
    if batch.attention_mask is not None and kl.ndim == 2:
        m = batch.attention_mask.to(kl.device).to(kl.dtype)
        return (kl * m).sum() / m.sum().clamp(min=1)
    return kl.mean()


def run_forward(model: InterpBridge, batch: Batch, hooks: list, need_hidden: bool) -> tuple[Tensor, Optional[Tensor]]:
    """(output, final hidden states if asked) of one forward with ``hooks``; ``batch`` must have
    passed ``Batch.check`` (the forward skips its checks, which would sync a GPU)."""
    x, kw = model_inputs(model, batch)
    store: dict[str, Tensor] = {}
    all_hooks = list(hooks)
    if need_hidden:
        def grab(t: Tensor, hook: Any) -> None:
            store["hidden"] = t
        all_hooks.append((f"blocks.{model.interp.n_layers - 1}.hook_out", grab))
    with inputs_checked_on_host():  # every sweep checks its batches on the host first (Batch.check)
        out = model.run_with_hooks(x, fwd_hooks=all_hooks, **kw)
    out = out if isinstance(out, Tensor) else out[0]
    return out, store.get("hidden")
