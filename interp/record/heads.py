"""Per-head attention weights and what follows from them: ``attention_weights``, the kv
grouping, the b_v -> b_O fold vector, and the bias inventory (``bias_spec``).

Conventions (TransformerLens): for head h,

    q_h = x W_q[h] + b_q[h],  W_q: [head_index, d_model, d_head],  b_q: [head_index, d_head]
    out = sum_h z_h W_o[h] + b_o,  W_o: [head_index, d_head, d_model]

k and v have ``n_kv_heads`` heads under grouped-query attention; query head h reads kv
head ``kv_group(...)[h]``. Whether a bias is *present* comes from the architecture (does
the bridge's q/k/v/o module own a bias?), never from whether its numbers are zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from einops import einsum, rearrange
from jaxtyping import Float
from torch import Tensor, nn

from interp.checks import as_index, check_dtype, check_kind, index_selection
from interp.errors import InputError, UnsupportedModelError, public
from interp.record.hooks import attn_hook
from interp.models.bridge import InterpBridge, require_bridge
from interp.types import KINDS


@dataclass
class AttentionWeights:
    """One layer's attention parameters in per-head form (zeros stand in for absent biases), named as
    TransformerLens names them (``W_Q``, ``b_Q``, ...). The 0.1 names (``W_q``, ``b_q``, ...) still read
    the same tensors."""

    W_Q: Float[Tensor, "head_index d_model d_head"]
    b_Q: Float[Tensor, "head_index d_head"]
    W_K: Float[Tensor, "kv_head d_model d_head"]
    b_K: Float[Tensor, "kv_head d_head"]
    W_V: Float[Tensor, "kv_head d_model d_head"]
    b_V: Float[Tensor, "kv_head d_head"]
    W_O: Float[Tensor, "head_index d_head d_model"]
    b_O: Float[Tensor, " d_model"]
    present: dict[str, bool]

    def bias(self, kind: str) -> Tensor:
        """b_Q, b_K, b_V or b_O for ``kind`` q, k, v or o."""
        check_kind(kind)
        return getattr(self, f"b_{kind.upper()}")

    def weight(self, kind: str) -> Tensor:
        """W_Q, W_K, W_V or W_O for ``kind`` q, k, v or o."""
        check_kind(kind)
        return getattr(self, f"W_{kind.upper()}")

    def __getattr__(self, name: str) -> Tensor:
        # the 0.1 release's lower-case names (W_q, b_q, ...): read-only aliases of the TransformerLens names
        if len(name) == 3 and name[:2] in ("W_", "b_") and name[2] in "qkvo":
            return getattr(self, name[:2] + name[2].upper())
        raise AttributeError(f"AttentionWeights has no attribute {name!r}")


def kv_group(n_heads: int, n_kv_heads: int) -> list[int]:
    """The kv head each query head reads under grouped-query attention."""
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in (n_heads, n_kv_heads)) \
            or n_heads % n_kv_heads:
        shown = [repr(n) if isinstance(n, int) else type(n).__name__ for n in (n_heads, n_kv_heads)]
        raise InputError(f"kv_group takes two head counts, n_heads a multiple of n_kv_heads (both >= 1); got "
                         f"{', '.join(shown)}")
    return [h // (n_heads // n_kv_heads) for h in range(n_heads)]


def _projection(model: InterpBridge, layer: int, kind: str) -> nn.Module:
    """The bridge's q/k/v/o module of ``layer``: an integer (a Python int, a numpy integer, a 0-d integer
    array or tensor, as ``interp.checks.as_index`` reads one) in 0..n_layers-1."""
    index, n = as_index(layer), model.interp.n_layers
    if index is None:
        raise InputError(f"layer must be an integer in 0..{n - 1} ({model.interp.name} has {n} layers); got "
                         f"{type(layer).__name__} {layer!r}")
    if not 0 <= index < n:
        raise InputError(f"layer {index} out of range: {model.interp.name} has {n} layers (an integer in 0..{n - 1})")
    return getattr(model.blocks[index].attn, kind).original_component


def _linear(model: InterpBridge, layer: int, kind: str) -> tuple[Tensor, Tensor | None]:
    """(weight [out, in], bias [out] or None) of the q/k/v/o projection of ``layer``."""
    lin = _projection(model, layer, kind)
    bias = getattr(lin, "bias", None)
    bias = None if bias is None else bias.detach()
    if isinstance(lin, nn.Linear):
        return lin.weight.detach(), bias
    if type(lin).__name__ == "Conv1D":  # GPT-2 style: weight is [in, out]
        return lin.weight.detach().T, bias
    raise UnsupportedModelError(f"{attn_hook(layer, kind)} wraps {type(lin).__name__}, not a linear map")


def bias_present(model: InterpBridge, layer: int) -> dict[str, bool]:
    """Which of q, k, v, o own a bias parameter, read from the bridge's own modules."""
    model = require_bridge(model, "bias_present")
    return {kind: getattr(_projection(model, layer, kind), "bias", None) is not None for kind in KINDS}


@public
def attention_weights(model: InterpBridge, layer: int, dtype: torch.dtype | None = None) -> AttentionWeights:
    """The raw (unfolded) per-head weights and biases of one attention layer."""
    info = require_bridge(model, "attention_weights").interp
    check_dtype(dtype)
    out: dict[str, Tensor] = {}
    present: dict[str, bool] = {}
    for kind in ("q", "k", "v"):
        w, b = _linear(model, layer, kind)
        present[kind] = b is not None
        out[f"W_{kind.upper()}"] = rearrange(w, "(h d) m -> h m d", h=info.heads(kind))
        b = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) if b is None else b
        out[f"b_{kind.upper()}"] = rearrange(b, "(h d) -> h d", h=info.heads(kind))
    w, b = _linear(model, layer, "o")
    present["o"] = b is not None
    out["W_O"] = rearrange(w, "m (h d) -> h d m", h=info.n_heads)
    out["b_O"] = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) if b is None else b
    if dtype is not None:
        out = {k: v.to(dtype) for k, v in out.items()}
    return AttentionWeights(present=present, **out)


def v_fold_vector(model: InterpBridge, layer: int, heads: list[int] | None = None,
                  dtype: torch.dtype | None = None) -> Float[Tensor, " d_model"]:
    """sum over query heads h (of ``heads``, default all) of b_v[kv(h)] W_O[h].

    Attention rows sum to 1, so b_v adds exactly this constant to the attention output:
    removing b_v and adding this vector to b_O changes nothing.
    """
    info = require_bridge(model, "v_fold_vector").interp
    w = attention_weights(model, layer, dtype)
    group = kv_group(info.n_heads, info.n_kv_heads)
    query_heads = index_selection(heads, info.n_heads, "heads")
    b_v = w.b_V[[group[h] for h in query_heads]]
    return einsum(b_v, w.W_O[query_heads], "h d, h d m -> m")


@public
def bias_spec(model: InterpBridge) -> pd.DataFrame:
    """The bias inventory: one row per layer x kind (q, k, v, o).

    Columns: layer, kind, present, n_heads (kv heads for k, v under GQA), d_head,
    norm (L2 norm of the whole bias vector, all heads; 0.0 when absent), rotary
    (whether the model rotates q and k by position, so b_q and b_k rotate too).
    """
    info = require_bridge(model, "bias_spec").interp
    rows = []
    for layer in range(info.n_layers):
        w = attention_weights(model, layer, dtype=torch.float64)
        for kind in KINDS:
            rows.append(dict(layer=layer, kind=kind, present=w.present[kind], n_heads=info.heads(kind),
                             d_head=info.d_head, norm=float(w.bias(kind).norm()) if w.present[kind] else 0.0,
                             rotary=info.rotary))
    return pd.DataFrame(rows)
