"""TransformerLens adapter for open_clip's vision tower (``open_clip.transformer.VisionTransformer``).

Its blocks use ``nn.MultiheadAttention``, whose q, k and v live in one ``in_proj_weight``
[3 * d_model, d_model] and ``in_proj_bias``; they are split into three linears at load, so the
hooks are the usual ``blocks.{l}.attn.hook_q|hook_k|hook_v``, and attention runs on them as
PyTorch computes it (scale 1/sqrt(d_head), softmax, ``out_proj``).
"""

from __future__ import annotations

from typing import Any, Optional

import transformers
from torch import Tensor, nn
from transformer_lens.model_bridge.generalized_components import BlockBridge, LinearBridge, MLPBridge
from transformer_lens.model_bridge.supported_architectures.vit import ViTArchitectureAdapter

from interp.errors import UnsupportedModelError
from interp.models.adapters.common import MLP_HOOK_ALIASES, EmbeddingsBridge, norm, split_linears
from interp.models.adapters.timm_vit import FusedQKVAttentionBridge


def _split_in_proj(attn: nn.MultiheadAttention) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """``in_proj_weight`` / ``in_proj_bias`` as three linears [d_model, d_model]."""
    if attn.in_proj_weight is None:
        raise UnsupportedModelError("nn.MultiheadAttention with separate q/k/v weights (kdim != vdim) is not supported")
    biases = (None,) * 3 if attn.in_proj_bias is None else tuple(attn.in_proj_bias.chunk(3))
    return split_linears(attn.in_proj_weight, biases)


class _MultiheadAttentionBridge(FusedQKVAttentionBridge):
    """``nn.MultiheadAttention`` as self-attention: ``(query, key, value, need_weights, attn_mask)`` in,
    ``(output, None)`` out, as its callers expect."""

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                *args: Any, **kwargs: Any) -> tuple[Tensor, None]:
        mha = self.original_component
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise UnsupportedModelError("cross-attention (key or value other than the query) is not supported")
        if kwargs.get("attn_mask") is not None or kwargs.get("key_padding_mask") is not None:
            raise UnsupportedModelError("attention masks in open_clip's vision tower are not supported")
        x = query if mha.batch_first else query.transpose(0, 1)
        out = super().forward(x)
        return (out if mha.batch_first else out.transpose(0, 1)), None


class OpenClipVisionAdapter(ViTArchitectureAdapter):
    """open_clip vision tower: ``conv1`` patches + class embedding, ``ln_pre``, pre-LN ``resblocks``."""

    def prepare_model(self, model: Any) -> None:
        attn = _MultiheadAttentionBridge(name="attn", config=self.cfg, split_qkv_matrix=_split_in_proj,
                                        submodules={"o": LinearBridge(name="out_proj")})
        mlp = MLPBridge(name="mlp", config=self.cfg,
                        submodules={"in": LinearBridge(name="c_fc"), "out": LinearBridge(name="c_proj")})
        self.component_mapping = {
            "embed": EmbeddingsBridge(name="conv1"),
            "blocks": BlockBridge(
                name="transformer.resblocks", hook_alias_overrides=dict(MLP_HOOK_ALIASES),
                submodules={"ln1": norm("ln_1", self.cfg), "ln2": norm("ln_2", self.cfg), "attn": attn, "mlp": mlp}),
        }


def describe_open_clip(model: nn.Module) -> transformers.PretrainedConfig:
    """An HF config with the sizes of an open_clip vision tower."""
    block = model.transformer.resblocks[0]
    image, patch = model.image_size, model.patch_size
    if image[0] != image[1] or patch[0] != patch[1]:
        raise UnsupportedModelError(f"non-square images or patches ({image}, {patch}) are not supported")
    if getattr(model, "attn_pool", None) is not None:
        raise UnsupportedModelError("open_clip towers with an attentional pooler are not supported yet")
    config = transformers.ViTConfig(
        hidden_size=model.transformer.width, num_hidden_layers=len(model.transformer.resblocks),
        num_attention_heads=block.attn.num_heads, intermediate_size=block.mlp.c_fc.out_features,
        image_size=image[0], patch_size=patch[0], num_channels=model.conv1.in_channels,
        qkv_bias=block.attn.in_proj_bias is not None)
    config.num_prefix_tokens = 1  # the class embedding
    config.name_or_path = f"{type(model).__module__}.{type(model).__name__}"
    return config
