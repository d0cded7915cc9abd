"""Building blocks shared by our TransformerLens adapters (one adapter per file beside this)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn
from transformer_lens.model_bridge.generalized_components import (
    AttentionBridge,
    BlockBridge,
    LinearBridge,
    MLPBridge,
    NormalizationBridge,
)
from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent


class _PatchEmbeddingsBridge(GeneralizedComponent):
    """Embeddings whose HF forward is ``(pixel_values, bool_masked_pos=None)``.

    TL's ``VisionEmbeddingsBridge`` always passes ``interpolate_pos_encoding``, which
    ``Dinov2Embeddings`` and ``BeitEmbeddings`` do not accept.
    """

    def forward(
        self,
        pixel_values: torch.Tensor,
        bool_masked_pos: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> Any:
        return super().forward(pixel_values, bool_masked_pos=bool_masked_pos)


class EmbeddingsBridge(GeneralizedComponent):
    """Embeddings called exactly as HF calls them (CLIP and SigLIP take ``interpolate_pos_encoding``)."""


def attention(cfg: Any, name: str = "attention", out: str = "o_proj") -> AttentionBridge:
    """HF attention with separate ``q_proj/k_proj/v_proj`` linears and the output linear ``out``."""
    return AttentionBridge(
        name=name,
        config=cfg,
        submodules={
            "q": LinearBridge(name="q_proj"),
            "k": LinearBridge(name="k_proj"),
            "v": LinearBridge(name="v_proj"),
            "o": LinearBridge(name=out),
        },
    )


def mlp(cfg: Any) -> MLPBridge:
    """HF MLP with ``fc1`` / ``fc2`` linears."""
    return MLPBridge(
        name="mlp",
        config=cfg,
        submodules={"in": LinearBridge(name="fc1"), "out": LinearBridge(name="fc2")},
    )


def norm(name: str, cfg: Any) -> NormalizationBridge:
    return NormalizationBridge(name=name, config=cfg, use_native_layernorm_autograd=True)


def prefix(hf_model: Any, attr: str) -> str:
    """``"attr."`` when the backbone sits under ``hf_model.attr`` (a head class), else ``""``."""
    return f"{attr}." if hasattr(hf_model, attr) else ""


MLP_HOOK_ALIASES = {"hook_mlp_out": "mlp.out.hook_out", "hook_mlp_in": "mlp.in.hook_in"}


def vit_mapping(cfg: Any, prefix: str, layers: str, ln1: str, ln2: str, *, attn: str = "attention",
                out: str = "o_proj", embed: type = _PatchEmbeddingsBridge) -> dict[str, Any]:
    """Embeddings and pre-LN blocks (``ln1``, attention ``attn``, ``ln2``, MLP) of an HF ViT-like encoder."""
    return {
        "embed": embed(name=f"{prefix}embeddings"),
        "blocks": BlockBridge(
            name=f"{prefix}{layers}",
            hook_alias_overrides=dict(MLP_HOOK_ALIASES),
            submodules={"ln1": norm(ln1, cfg), "ln2": norm(ln2, cfg), "attn": attention(cfg, attn, out),
                        "mlp": mlp(cfg)},
        ),
    }


def split_linears(weight: torch.Tensor, biases: tuple) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """A fused [3 * out, in] weight (and per-part biases, None where absent) as three independent linears."""
    linears = []
    for part, bias in zip(weight.detach().chunk(3, dim=0), biases):
        linear = nn.Linear(part.shape[1], part.shape[0], bias=bias is not None, device=part.device, dtype=part.dtype)
        with torch.no_grad():
            linear.weight.copy_(part)
            if bias is not None:
                linear.bias.copy_(bias.detach())
        linears.append(linear)
    return linears[0], linears[1], linears[2]
