"""Per-head attention weights and the bias inventory (``bias_spec``).

Conventions (TransformerLens): for head h,

    q_h = x W_q[h] + b_q[h],  W_q: [head, d_model, d_head],  b_q: [head, d_head]
    out = sum_h z_h W_o[h] + b_o,  W_o: [head, d_head, d_model]

k and v have ``n_kv_heads`` heads under grouped-query attention.
Whether a bias is *present* comes from the architecture (does the HF module own a
bias parameter?), never from whether its numbers are zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor, nn

from interp.errors import InputError

KINDS = ("q", "k", "v", "o")

# Bias parameter names, relative to the HF attention module, for each kind.
_BIAS_NAMES: dict[str, tuple[str, ...]] = {
    "q": ("q_proj.bias", "self.query.bias", "query_key_value.bias", "c_attn.bias"),
    "k": ("k_proj.bias", "self.key.bias", "query_key_value.bias", "c_attn.bias"),
    "v": ("v_proj.bias", "self.value.bias", "query_key_value.bias", "c_attn.bias"),
    "o": ("o_proj.bias", "out_proj.bias", "output.dense.bias", "dense.bias", "c_proj.bias"),
}


@dataclass
class AttentionWeights:
    """One layer's attention parameters in per-head form (zeros stand in for absent biases)."""

    W_q: Float[Tensor, "head d_model d_head"]
    b_q: Float[Tensor, "head d_head"]
    W_k: Float[Tensor, "kv_head d_model d_head"]
    b_k: Float[Tensor, "kv_head d_head"]
    W_v: Float[Tensor, "kv_head d_model d_head"]
    b_v: Float[Tensor, "kv_head d_head"]
    W_o: Float[Tensor, "head d_head d_model"]
    b_o: Float[Tensor, "d_model"]
    present: dict[str, bool]

    def bias(self, kind: str) -> Tensor:
        return {"q": self.b_q, "k": self.b_k, "v": self.b_v, "o": self.b_o}[kind]

    def weight(self, kind: str) -> Tensor:
        return {"q": self.W_q, "k": self.W_k, "v": self.W_v, "o": self.W_o}[kind]


def _info(model: nn.Module):
    info = getattr(model, "__dict__", {}).get("interp")
    if info is None:
        raise InputError(
            f"expected a model from interp.load_model, got {type(model).__name__}; "
            "wrap it with interp.load_model(model) first"
        )
    return info


def _hf_attention(model: nn.Module, layer: int) -> nn.Module:
    info = _info(model)
    if not 0 <= layer < info.n_layers:
        raise InputError(f"layer {layer} out of range: {info.name} has {info.n_layers} layers")
    return model.blocks[layer].attn.original_component


def bias_present(model: nn.Module, layer: int) -> dict[str, bool]:
    """Which of q, k, v, o own a bias parameter in the HF module of ``layer``."""
    names = {
        n.replace("._original_component", "") for n, _ in _hf_attention(model, layer).named_parameters()
    }
    return {kind: any(c in names for c in _BIAS_NAMES[kind]) for kind in KINDS}


def _linear(model: nn.Module, layer: int, kind: str) -> tuple[Tensor, Tensor | None]:
    """(weight [out, in], bias [out] or None) of the q/k/v/o projection of ``layer``."""
    lin = getattr(model.blocks[layer].attn, kind).original_component
    if isinstance(lin, nn.Linear):
        return lin.weight.detach(), None if lin.bias is None else lin.bias.detach()
    if type(lin).__name__ == "Conv1D":  # GPT-2 style: weight is [in, out]
        return lin.weight.detach().T, lin.bias.detach()
    raise TypeError(f"blocks.{layer}.attn.{kind} wraps {type(lin).__name__}, not a linear map")


def attention_weights(
    model: nn.Module, layer: int, dtype: torch.dtype | None = None
) -> AttentionWeights:
    """The raw (unfolded) per-head weights and biases of one attention layer."""
    info = _info(model)
    present = bias_present(model, layer)
    out: dict[str, Tensor] = {}
    for kind, n in (("q", info.n_heads), ("k", info.n_kv_heads), ("v", info.n_kv_heads)):
        w, b = _linear(model, layer, kind)
        out[f"W_{kind}"] = rearrange(w, "(h d) m -> h m d", h=n)
        if not present[kind] or b is None:
            b = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
        out[f"b_{kind}"] = rearrange(b, "(h d) -> h d", h=n)
    w, b = _linear(model, layer, "o")
    out["W_o"] = rearrange(w, "m (h d) -> h d m", h=info.n_heads)
    if not present["o"] or b is None:
        b = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    out["b_o"] = b
    if dtype is not None:
        out = {k: v.to(dtype) for k, v in out.items()}
    return AttentionWeights(present=present, **out)


def bias_spec(model: nn.Module) -> pd.DataFrame:
    """The bias inventory: one row per layer x kind (q, k, v, o).

    Columns: layer, kind, present, n_heads (kv heads for k, v under GQA), d_head,
    norm (L2 norm of the whole bias vector, all heads; 0.0 when absent), rotary
    (whether the model rotates q and k by position, so b_q and b_k rotate too).
    """
    info = _info(model)
    rows = []
    for layer in range(info.n_layers):
        w = attention_weights(model, layer, dtype=torch.float64)
        for kind in KINDS:
            n = info.n_kv_heads if kind in ("k", "v") else info.n_heads
            rows.append(
                dict(
                    layer=layer,
                    kind=kind,
                    present=w.present[kind],
                    n_heads=n,
                    d_head=info.d_head,
                    norm=float(w.bias(kind).norm()) if w.present[kind] else 0.0,
                    rotary=info.rotary,
                )
            )
    return pd.DataFrame(rows)
