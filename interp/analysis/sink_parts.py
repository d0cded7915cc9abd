"""The parts ``interp.analysis.sinks`` is built from: position classes, a streaming forward, and
reductions that keep memory flat however much data passes.

Position classes (``position_classes``). Text: ``first`` (each sequence's first real token, also
under left padding), ``cls``, ``sep``, ``bos`` (every real token carrying the tokenizer's [CLS],
[SEP], BOS id; a class exists when the tokenizer defines that id, one class per distinct id);
vision: the prefix tokens, ``cls``, ``distillation`` (DeiT), ``register_0``..
(``model.interp.n_prefix_tokens``; whether there is a class token, per the family registry and
the model's config). ``top_content``: in each sequence (image) and head, the one real token outside
the named classes that receives the most attention (largest column sum over real query rows).

* ``stream_batches`` (``interp.record.capture``, the one capture loop, re-exported here): one hooked forward per
  batch, in eval mode without gradients, each batch checked on the host (``Batch.check``) and hashed into
  the data fingerprint as it passes; the grabbed activations are handed to a consumer and dropped, so
  memory does not grow with the data.
* ``AbsHistogram``: counts of non-negative values in bins of their float32 bit pattern, 2^10 bins
  per power of two over [2^-40, 2^40) (values below fall in the first bin, values above in the
  last). Bin edges are exact float32 numbers and the bins are ordered like the values, so the
  ``k``-th smallest value lies in a known bin; ``lower_median`` returns that bin's midpoint, within
  a relative 2^-11 (0.05%) of the exact lower median. Memory: 80 x 1,024 float64 counts (640 KiB).
* ``RunningTopK``: the ``k`` largest scores seen so far with integer payloads (sequence, position,
  channel, token), merged batch by batch on the model's device (no host sync per batch); equal
  scores are broken by data order (the earliest sequence, position, channel wins), so the
  result does not depend on how the data were batched.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.record.capture import Consumer, evaluating, stream_batches
from interp.checks import as_index, as_real
from interp.data import Batch, to_device
from interp.errors import InputError, UnsupportedModelError
from interp.record.fingerprint import model_fingerprint
from interp.record.hooks import hook_name
from interp.models.bridge import InterpBridge, require_bridge

__all__ = ["Consumer", "evaluating", "stream_batches"]  # re-exported: the one capture loop

SINK_THRESHOLD = 0.3  # Gu et al. 2024: a head sinks on a position when its mean mass there exceeds 0.3
SPECIAL_TOKENS = (("cls", "cls_token_id"), ("sep", "sep_token_id"), ("bos", "bos_token_id"))
ClassMasks = dict[str, Bool[Tensor, "batch key_pos"]]

MANTISSA_BITS = 10  # 2^10 bins per power of two
SHIFT = 23 - MANTISSA_BITS  # float32 has 23 mantissa bits
EXP_LO, EXP_HI = 127 - 40, 127 + 40  # biased float32 exponents: [2^-40, 2^40)
N_BINS = (EXP_HI - EXP_LO) << MANTISSA_BITS


def keeper(store: dict[str, Tensor], name: str) -> Callable[[Tensor, Any], None]:
    def keep(t: Tensor, hook: Any) -> None:
        store[name] = t.detach()
    return keep


class AbsHistogram:
    """Histogram of non-negative values on the float32 bit-pattern grid (see the module doc)."""

    def __init__(self, device: Any) -> None:
        self.counts: Float[Tensor, " n_bins"] = torch.zeros(N_BINS, dtype=torch.float64, device=device)

    def add(self, values: Float[Tensor, " n"], weights: Optional[Tensor] = None) -> None:
        """Count ``values`` (>= 0), each ``weights`` times (0/1: a mask); cost O(n), no host sync.
        Counts are float64, exact up to 2^53 values."""
        bits = values.detach().float().contiguous().view(torch.int32) >> SHIFT
        idx = (bits - (EXP_LO << MANTISSA_BITS)).clamp(0, N_BINS - 1).long()
        w = torch.ones_like(idx, dtype=torch.float64) if weights is None else weights.to(torch.float64)
        self.counts += torch.bincount(idx, weights=w, minlength=N_BINS)

    def total(self) -> int:
        return int(self.counts.sum())

    def lower_median(self) -> float:
        """The midpoint of the bin holding the ceil(n/2)-th smallest value (NaN when empty)."""
        return self.quantile(0.5)

    def quantile(self, q: float) -> float:
        """The midpoint of the bin holding the ceil(q n)-th smallest value (at least the first; NaN when
        empty): the lower q-quantile within a relative 2^-11."""
        n = self.total()
        if n == 0:
            return float("nan")
        k = max(1, math.ceil(q * n))
        i = int(torch.searchsorted(self.counts.cumsum(0), torch.tensor(float(k), dtype=torch.float64,
                                                                       device=self.counts.device)))
        lo, hi = (_edge(i) if i > 0 else 0.0), _edge(i + 1)
        return 0.5 * (lo + hi)


def _edge(i: int) -> float:
    """Lower edge of bin ``i`` (an exact float32 number)."""
    bits = torch.tensor([(i + (EXP_LO << MANTISSA_BITS)) << SHIFT], dtype=torch.int64).to(torch.int32)
    return float(bits.view(torch.float32)[0])


def stable_topk(score: Float[Tensor, " n"], k: int) -> Int[Tensor, " k"]:
    """Indices of the ``k`` largest scores, ties broken by the lower index (data order), largest first.

    Unlike ``torch.topk`` the choice among equal scores is fixed (the same token at the same
    position in many sequences, e.g. BOS, gives equal values), with no host sync."""
    k = min(k, score.numel())
    kth = score.topk(k).values[-1]
    n = score.numel()
    rank = n - torch.arange(n, device=score.device, dtype=torch.float64)  # earlier = larger
    key = torch.where(score > kth, 2.0 * n + rank, torch.where(score == kth, rank, torch.zeros_like(rank)))
    chosen = key.topk(k).indices.sort().values  # in data order
    return chosen[torch.sort(score[chosen], descending=True, stable=True).indices]


class RunningTopK:
    """The ``k`` largest ``score``s seen so far, each with a signed ``value`` and integer ``payload`` columns."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.score: Optional[Tensor] = None
        self.value: Optional[Tensor] = None
        self.payload: Optional[Tensor] = None

    def add(self, score: Float[Tensor, " n"], value: Float[Tensor, " n"], payload: Int[Tensor, "n fields"]) -> None:
        """Merge candidates given in data order (score -inf = never chosen); stays on their device."""
        if self.score is not None:  # the kept entries came earlier in the data: they win ties
            score = torch.cat([self.score, score])
            value = torch.cat([self.value, value])
            payload = torch.cat([self.payload, payload])
        top = stable_topk(score, self.k)
        self.score, self.value, self.payload = score[top], value[top], payload[top]

    def rows(self) -> list[tuple[float, float, list[int]]]:
        """(score, value, payload) of the kept entries, largest first, candidates with score -inf left out."""
        if self.score is None:
            return []
        s, v, p = self.score.cpu().tolist(), self.value.cpu().tolist(), self.payload.cpu().tolist()
        return [(a, b, c) for a, b, c in zip(s, v, p) if a != float("-inf")]


# ----- position classes -------------------------------------------------------------------------------


def prefix_names(model: InterpBridge) -> list[str]:
    """Names of a ViT's prefix tokens in order: ``cls``, ``distillation`` (DeiT), ``register_i``."""
    info = model.interp
    if info.modality != "vision" or info.n_prefix_tokens == 0:
        return []
    spec = info.spec
    has_cls = bool(getattr(model.hf_model.config, "class_token", spec.prefix_tokens >= 1 or spec.source == "open_clip"))
    named = (["cls"] if has_cls else []) + (["distillation"] if spec.name in ("deit", "timm-deit") else [])
    return named + [f"register_{i}" for i in range(info.n_prefix_tokens - len(named))]


def _special_token_ids(model: InterpBridge) -> list[tuple[str, int]]:
    """(class, token id) for the tokenizer's [CLS], [SEP] and BOS ids (one class per distinct id)."""
    tok, out, seen = model.tokenizer, [], set()
    for name, attr in SPECIAL_TOKENS if tok is not None else ():
        token_id = getattr(tok, attr, None)
        if token_id is not None and int(token_id) not in seen:
            out.append((name, int(token_id)))
            seen.add(int(token_id))
    return out


def position_classes(model: InterpBridge) -> list[str]:
    """The position classes ``model`` has (see the module doc), ``top_content`` last."""
    model = require_bridge(model, "position_classes")
    if model.interp.modality == "vision":
        return prefix_names(model) + ["top_content"]
    return ["first"] + [name for name, _ in _special_token_ids(model)] + ["top_content"]


def check_positions(model: InterpBridge, positions: Any) -> list[str]:
    """``positions`` (a class name or several) as a list of classes ``model`` has; None: all of them."""
    have = position_classes(model)
    if positions is None:
        return have
    names = [positions] if isinstance(positions, str) else list(positions) if isinstance(
        positions, (list, tuple, set, frozenset, np.ndarray, pd.Series)) else None  # a numpy array of names too
    if names is None or any(not isinstance(p, str) for p in names):
        first = "" if model.interp.modality == "vision" else " (position 0, the first real token, is 'first')"
        raise InputError(f"positions= names position classes (strings), not token indices; got {positions!r} "
                         f"({type(positions).__name__}). {model.interp.name}'s classes are {', '.join(have)}{first}: "
                         "pass one name or a list of them")
    names = [str(p) for p in names]  # numpy's str_ as str
    bad = [p for p in names if p not in have]
    if bad or not names:
        raise InputError(f"{model.interp.name} has no position class {bad or '(none given)'}; its classes are "
                         f"{', '.join(have)} (pass one or more of those as positions=)")
    return list(dict.fromkeys(names))


def class_masks(model: InterpBridge, batch: Batch, n_pos: int,
                device: Any) -> tuple[Bool[Tensor, "batch pos"], ClassMasks]:
    """(real tokens, key mask of each named class) of one batch, built on the host, moved to ``device``."""
    info = model.interp
    b = batch.inputs.shape[0]
    if info.modality == "vision":
        real = torch.ones(b, n_pos, dtype=torch.bool)
        masks = {name: torch.zeros(b, n_pos, dtype=torch.bool) for name in prefix_names(model)}
        for i, mask in enumerate(masks.values()):
            mask[:, i] = True
    else:
        ids = batch.inputs.cpu()
        mask = batch.attention_mask
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.cpu().bool()
        first = torch.zeros_like(real)
        first[torch.arange(b), real.int().argmax(1)] = real.any(1)  # the first real token (left padding too)
        masks = {"first": first, **{name: (ids == i) & real for name, i in _special_token_ids(model)}}
    return to_device(real, device), {name: to_device(m, device) for name, m in masks.items()}


def column_sums(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                real: Bool[Tensor, "batch pos"]) -> Float[Tensor, "batch head_index key_pos"]:
    """sum over real query rows i of A_ij, in float64."""
    return torch.einsum("bhqk,bq->bhk", pattern.double(), real.double())


def _top_content_keys(col: Float[Tensor, "batch head_index key_pos"], real: Tensor,
                     masks: ClassMasks) -> Float[Tensor, "batch head_index key_pos"]:
    """One-hot of each (sequence, head)'s most-attended real key outside the named classes."""
    content = real.clone()
    for mask in masks.values():
        content &= ~mask
    scored = col.masked_fill(~content[:, None, :], -1.0)
    onehot = torch.zeros_like(col).scatter_(-1, scored.argmax(-1, keepdim=True), 1.0)
    return onehot * content.any(-1)[:, None, None]  # a sequence with no content token has none


def sink_weights(col: Tensor, real: Tensor, masks: ClassMasks,
                 names: Sequence[str]) -> Float[Tensor, "batch head_index key_pos"]:
    """0/1 weight of each key in the union of the classes ``names`` (per head: top_content differs)."""
    union = torch.zeros(col.shape[0], col.shape[2], dtype=torch.bool, device=col.device)
    for name in names:
        if name != "top_content":
            union |= masks[name]
    out = union[:, None, :].expand_as(col).double()
    return torch.maximum(out, _top_content_keys(col, real, masks)) if "top_content" in names else out


def default_sink_positions(model: InterpBridge) -> list[str]:
    """The prefix tokens of a ViT (all of them), the first token of a language model."""
    info = model.interp
    if info.modality == "text":
        return ["first"]
    if not prefix_names(model):
        raise InputError(f"{info.name} has no prefix tokens, so it has no default sink set: pass positions= "
                         f"(its classes: {', '.join(position_classes(model))})")
    return prefix_names(model)


# ----- checks and shared pieces -----------------------------------------------------------------------


def check_threshold(threshold: Any, name: str = "threshold") -> float:
    """A share of a row's attention in (0, 1] (a numpy number too), as a Python float."""
    number = as_real(threshold)
    if number is None or not 0 < number <= 1:
        raise InputError(f"{name} must be a number in (0, 1] (a share of a row's attention; Gu et al. 2024 "
                         f"use {SINK_THRESHOLD}); got {threshold!r}")
    return number


def check_positive(value: Any, name: str) -> float:
    number = as_real(value)
    if number is None or not number > 0 or math.isinf(number):
        raise InputError(f"{name} must be a positive finite number; got {value!r}")
    return number


def patterns_of(model: InterpBridge, store: dict[str, Tensor], layers: Sequence[int]) -> dict[int, Tensor]:
    """Each layer's pattern from ``store``; a fused attention kernel (no pattern) is refused."""
    missing = [layer for layer in layers if hook_name(layer, "pattern") not in store]
    if missing:
        impl = getattr(model.hf_model.config, "_attn_implementation", "?")
        raise UnsupportedModelError(
            f"no attention pattern reached blocks.{missing[0]}.attn.hook_pattern: {model.interp.name} runs the "
            f"{impl!r} attention kernel, which never materialises the pattern. Load it with interp.load_model "
            "(eager attention), or set its config's _attn_implementation = 'eager'")
    return {layer: store[hook_name(layer, "pattern")] for layer in layers}


def add_sums(acc: dict, key: Any, sums: dict[str, Tensor]) -> None:
    into = acc.setdefault(key, {})
    for name, value in sums.items():
        into[name] = into.get(name, 0) + value


def provenance(model: InterpBridge, data_fp: str, n_batches: int, max_batches: Optional[int]) -> dict:
    return dict(model=model.interp.name, model_fingerprint=model_fingerprint(model), data_fingerprint=data_fp,
                n_batches=n_batches, max_batches=max_batches)


def rows_or_fail(n_rows: Any) -> int:
    n = int(n_rows)
    if n == 0:
        raise InputError("the data hold no real tokens (every attention mask is 0): pass sequences with at "
                         "least one unmasked token")
    return n


def check_top_k(top_k: Any) -> int:
    number = as_index(top_k)
    if number is None or number < 1:
        raise InputError(f"top_k must be a positive integer (how many of the largest values to report); got {top_k!r}")
    return number
