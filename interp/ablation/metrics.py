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

from interp.ablation.logits import wide
from interp.data import Batch
from interp.errors import InputError
from interp.record.hooks import block_hook
from interp.models.bridge import InterpBridge
from interp.record.capture import StopForward

DISTANCE_METRICS = ("embedding_cosine", "feature_cosine")
TASK_METRICS = ("next_token_ce", "cross_entropy")
Metric = Union[str, Callable[[Tensor, Batch], Tensor]]


def _has_classifier(model: InterpBridge) -> bool:
    return "unembed" in model.adapter.component_mapping


def _auto_metric(model: InterpBridge, batch: Batch) -> str:
    """The family's default metric; cross-entropy for a classifier fed labels."""
    default = model.interp.spec.default_metric
    if model.interp.modality == "vision" and _has_classifier(model) and batch.labels is not None:
        return "cross_entropy"
    return default


def metric_name(model: InterpBridge, metric: Metric, first: Batch) -> str:
    if callable(metric) and not isinstance(metric, str):
        return getattr(metric, "__name__", "custom")
    if metric == "auto":
        return _auto_metric(model, first)
    if metric not in DISTANCE_METRICS + TASK_METRICS:
        raise InputError(f"unknown metric {metric!r}; choose from {DISTANCE_METRICS + TASK_METRICS} or pass a callable")
    _check_metric_fits(model, metric)
    return metric


def _check_metric_fits(model: InterpBridge, metric: str) -> None:
    """Refuse a metric that would measure something other than what its name says on this model."""
    info = model.interp
    if metric == "next_token_ce" and not info.causal:
        raise InputError(f"metric 'next_token_ce' needs a causal language model; {info.name} is a "
                         f"{info.attention} {info.modality} model (default metric: {info.spec.default_metric})")
    if metric == "cross_entropy" and not (info.modality == "vision" and _has_classifier(model)):
        raise InputError(f"metric 'cross_entropy' needs an image classifier with its head; {info.name} has none "
                         f"(default metric: {info.spec.default_metric})")
    if metric == "feature_cosine" and info.modality == "text":
        raise InputError(f"metric 'feature_cosine' compares the output at position 0, which says nothing about a "
                         f"language model's other positions; use 'embedding_cosine' or '{info.spec.default_metric}'")


def _sentence_embedding(hidden: Tensor, mask: Optional[Tensor]) -> Tensor:
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
        ref["embedding"] = _sentence_embedding(hidden, mask)
    return ref


def metric_items(name: str, out: Tensor, hidden: Optional[Tensor], ref: dict,
                 batch: Batch) -> tuple[Tensor, Tensor]:
    """(per-item sums [batch], per-item counts [batch]) of a built-in metric: an item's summed
    next-token NLL over its predicted tokens and their number; one value and count 1 per item for
    the others. The metric over any data is sum(sums) / sum(counts), whatever the batching."""
    if name == "next_token_ce":
        ids = batch.inputs.to(out.device)
        nll = -wide(out[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        mask = None if batch.attention_mask is None else batch.attention_mask.to(out.device).bool()
        # a prediction counts when both its token and the one it predicts are real (left padding: not pad -> first)
        keep = torch.ones_like(nll) if mask is None else (mask[:, 1:] & mask[:, :-1]).to(nll.dtype)
        return (nll.double() * keep).sum(1), keep.sum(1)  # float64 sums: no rounding from aggregation
    if name == "cross_entropy":
        values = F.cross_entropy(wide(out), batch.labels.to(out.device), reduction="none")
    elif name in DISTANCE_METRICS:
        feats, intact = distance_features(name, out, hidden, ref, batch)
        values = F.cosine_similarity(wide(feats), wide(intact), dim=-1)
    else:
        raise InputError(f"unknown metric {name!r}")
    return values.double(), torch.ones_like(values)


def custom_items(value: Any, batch: Batch) -> tuple[Tensor, Tensor]:
    """(sums, counts) of a callable metric's result: a tensor [batch] of per-item values (each item
    counts once), or a scalar taken as the batch's mean over its items (one sum of weight batch size)."""
    n = batch.inputs.shape[0]
    if isinstance(value, Tensor) and value.ndim == 1 and value.shape[0] == n:
        return value.double(), torch.ones_like(value, dtype=torch.float64)
    if isinstance(value, Tensor) and value.numel() == 1 and value.is_floating_point():
        value = value.reshape(1)
        return value.double() * n, torch.full_like(value, float(n), dtype=torch.float64)
    shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
    raise InputError(f"a metric callable must return a floating tensor: a scalar (the batch's mean) or one value "
                     f"per item [{n}]; got {shape}. Return e.g. torch.as_tensor(value, dtype=torch.float32)")


def distance_features(name: str, out: Tensor, hidden: Optional[Tensor], ref: dict,
                      batch: Batch) -> tuple[Tensor, Tensor]:
    """(features of this run, the intact run's) that a distance metric compares: [batch, d]."""
    if name == "embedding_cosine":
        mask = None if batch.attention_mask is None else batch.attention_mask.to(out.device)
        return _sentence_embedding(hidden, mask), ref["embedding"]
    if name == "feature_cosine":
        return (out[:, 0] if out.ndim == 3 else out), ref["features"]
    raise InputError(f"{name!r} is not a distance metric ({', '.join(DISTANCE_METRICS)})")


def kl_weight(model: InterpBridge, batch: Batch) -> float:
    """The units ``kl_from_intact`` averages over in ``batch``: real tokens of a causal LM, items of a classifier."""
    if model.interp.causal and batch.attention_mask is not None:
        return float(batch.attention_mask.sum())
    if model.interp.causal:
        return float(batch.inputs.shape[0] * batch.inputs.shape[1])
    return float(batch.inputs.shape[0])


def kl_from_intact(model: InterpBridge, base_out: Tensor, out: Tensor, batch: Batch) -> Optional[Tensor]:
    """Mean KL(intact || ablated) of the output distribution, nats, as a 0-d tensor on the model's
    device (no host sync); None without logits."""
    if not model.interp.causal and not (out.ndim == 2 and _has_classifier(model)):
        return None
    p = wide(base_out).log_softmax(-1)
    q = wide(out).log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1)
    if batch.attention_mask is not None and kl.ndim == 2:
        m = batch.attention_mask.to(kl.device).to(kl.dtype)
        return (kl * m).sum() / m.sum().clamp(min=1)
    return kl.mean()


def run_forward(model: InterpBridge, batch: Batch, hooks: list, need_hidden: bool) -> tuple[Tensor, Optional[Tensor]]:
    """(output, final hidden states if asked) of one forward of ``batch`` with ``hooks``; the forward checks
    ``batch`` unless it is a ``CheckedBatch`` checked for this model (``iter_batches`` yields them: the sweeps
    check each batch once, on the host; ``batch_to_device`` and ``Batch.repeat`` keep it checked). With
    ``need_hidden`` the forward stops after the last block and the hidden states stand in for the output (no
    unembedding)."""
    store: dict[str, Tensor] = {}
    all_hooks = list(hooks)
    if need_hidden:  # a hidden-state metric reads nothing after the last block (e.g. MiniLM's random MLM head)
        def grab(t: Tensor, hook: Any) -> None:
            store["hidden"] = t
            raise StopForward
        all_hooks.append((block_hook(model.interp.n_layers - 1, "hook_out"), grab))
    try:
        out = model.run_with_hooks(batch, fwd_hooks=all_hooks)
    except StopForward:
        return store["hidden"], store["hidden"]
    out = out if isinstance(out, Tensor) else out[0]
    return out, store.get("hidden")


def check_labels(model: InterpBridge, name: str, batches: list[Batch]) -> None:
    """Labels ``cross_entropy`` can score: one integer class per item, each a class the classifier has
    (checked once, before the intact run: an out-of-range class would fail deep inside, or on a GPU
    abort the process)."""
    if name != "cross_entropy":
        return
    if any(b.labels is None for b in batches):
        raise InputError("metric 'cross_entropy' needs labels in every batch (e.g. the 'digits' dataset)")
    n_classes = getattr(getattr(model.hf_model, "config", None), "num_labels", None)
    for number, batch in enumerate(batches, 1):
        labels, n = batch.labels, batch.inputs.shape[0]
        if labels.ndim != 1 or labels.shape[0] != n or labels.dtype not in (torch.long, torch.uint8):
            raise InputError(f"batch {number}: cross_entropy needs labels as int64 class ids [{n}] (one per item); "
                             f"got a {labels.dtype} tensor of shape {tuple(labels.shape)} (labels.long() converts)")
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or (n_classes is not None and high >= n_classes):
            raise InputError(f"batch {number}: labels run from {low} to {high}, but {model.interp.name} has "
                             f"{n_classes} classes (0..{(n_classes or 1) - 1}): pass this model's class ids")


def call_metric(metric: Callable, out: Tensor, batch: Batch) -> Any:
    """``metric(out, batch)``; an exception inside the researcher's callable is named as theirs."""
    try:
        return metric(out, batch)
    except (KeyboardInterrupt, MemoryError, torch.cuda.OutOfMemoryError, InputError):
        raise
    except Exception as exc:
        name = getattr(metric, "__name__", type(metric).__name__)
        raise InputError(f"the metric callable {name} raised {type(exc).__name__}: {exc}. It is called as "
                         f"metric(output, batch): output the model's output tensor {tuple(out.shape)}, batch an "
                         "interp.Batch (inputs, attention_mask, labels); it must return a floating tensor") from exc
