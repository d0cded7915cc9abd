"""TransformerLens adapters for timm vision transformers: ``VisionTransformer`` (ViT, with or
without ``qkv_bias``, class token, register tokens), ``VisionTransformerDistilled`` (DeiT),
``Eva`` (EVA-02: q and v bias, 2D rotary) and ``Beit`` (q and v bias, relative position bias).

timm fuses q, k and v into one ``qkv`` linear ([3 * heads * d_head, d_model]); EVA and BEiT
keep b_q and b_v as their own parameters and b_k as a zero buffer (absent, not zero). The
fused projection is split into three linears once, at load, so the hooks are the usual
``blocks.{l}.attn.hook_q|hook_k|hook_v`` with the usual shapes; attention then runs timm's
own math on them (scale, qk-norm modules, EVA's rotary, BEiT's relative position bias).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import transformers
from torch import Tensor, nn
from transformer_lens.model_bridge.generalized_components import (
    BlockBridge,
    LinearBridge,
    MLPBridge,
)
from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import JointQKVAttentionBridge
from transformer_lens.model_bridge.supported_architectures.vit import ViTArchitectureAdapter

from interp.errors import UnsupportedModelError
from interp.models.adapters.common import MLP_HOOK_ALIASES, EmbeddingsBridge, norm, split_linears


def _split_fused_qkv(attn: nn.Module) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """timm's fused ``qkv`` as three linears [heads * d_head, d_model] carrying the biases the module has."""
    if attn.qkv.bias is not None:
        biases: tuple[Optional[Tensor], ...] = tuple(attn.qkv.bias.chunk(3))
    elif getattr(attn, "q_bias", None) is not None:  # EVA / BEiT: k_bias is a zero buffer, not a parameter
        biases = (attn.q_bias, None, attn.v_bias)
    else:
        biases = (None, None, None)
    return split_linears(attn.qkv.weight, biases)


class FusedQKVAttentionBridge(JointQKVAttentionBridge):
    """timm attention over the split q/k/v linears, computed as timm computes it.

    scores = (q * scale) @ k^T (+ BEiT's relative position bias), softmax, @ v, then ``proj``;
    q and k pass timm's ``q_norm``/``k_norm`` (identity unless qk-norm) and, for EVA, its
    rotary embedding on the patch tokens (prefix tokens are not rotated).
    """

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        out = super().forward(*args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def _reconstruct_attention(self, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        attn = self.original_component
        if kwargs.get("attn_mask") is not None or kwargs.get("is_causal"):
            raise UnsupportedModelError("timm attention masks are not supported: run the model on whole images")
        batch, n_pos = q.shape[0], q.shape[1]
        q, k, v = (t.reshape(batch, n_pos, attn.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        if hasattr(attn, "q_norm"):  # timm's qk-norm modules (identity unless qk_norm=True)
            q, k = attn.q_norm(q), attn.k_norm(k)
        scale = getattr(attn, "scale", None) or q.shape[-1] ** -0.5  # nn.MultiheadAttention: 1/sqrt(d_head)
        rope = kwargs.get("rope")
        if rope is not None:
            q, k = _rotate_patches(attn, q, rope), _rotate_patches(attn, k, rope)
        scores = (q * scale) @ k.transpose(-2, -1)
        if getattr(attn, "relative_position_bias_table", None) is not None:
            scores = scores + attn._get_rel_pos_bias()  # timm's own table lookup, [1, heads, pos, pos]
        if kwargs.get("shared_rel_pos_bias") is not None:
            scores = scores + kwargs["shared_rel_pos_bias"]
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        z = (pattern @ v).transpose(1, 2).reshape(batch, n_pos, -1)
        norm_out = getattr(attn, "norm", None)  # timm's scale_norm (identity by default)
        return self.o(norm_out(z) if isinstance(norm_out, nn.Module) else z), pattern


def _rotate_patches(attn: nn.Module, x: Tensor, rope: Tensor) -> Tensor:
    """EVA's rotary on the patch tokens of x [b, heads, pos, d]; the prefix tokens stay as they are."""
    from timm.layers import apply_rot_embed_cat  # timm is optional: imported where an EVA model runs

    n_prefix = attn.num_prefix_tokens
    rotated = apply_rot_embed_cat(x[:, :, n_prefix:, :], rope, half=getattr(attn, "rotate_half", False))
    return torch.cat([x[:, :, :n_prefix, :], rotated], dim=2).type_as(x)


class _BlockSequence(nn.ModuleList):
    """The bridged blocks, callable as timm's ``nn.Sequential`` of blocks (``self.blocks(x)``)."""

    def forward(self, x: Tensor) -> Tensor:
        for block in self:
            x = block(x)
            x = x[0] if isinstance(x, tuple) else x
        return x


def _check_timm_attention(model: nn.Module) -> None:
    attn = model.blocks[0].attn
    if getattr(attn, "qkv", None) is None:
        raise UnsupportedModelError(f"{type(model).__name__} with unfused q/k/v projections is not supported yet")
    if getattr(attn, "gate", None) is not None:
        raise UnsupportedModelError(f"{type(model).__name__} with gated attention is not supported")


class TimmVisionTransformerAdapter(ViTArchitectureAdapter):
    """timm ViT / DeiT / EVA / BEiT: ``patch_embed``, pre-LN ``blocks`` (norm1, attn, norm2, mlp), ``norm``."""

    def prepare_model(self, model: Any) -> None:
        _check_timm_attention(model)
        attn = FusedQKVAttentionBridge(
            name="attn", config=self.cfg, split_qkv_matrix=_split_fused_qkv,
            submodules={"qkv": LinearBridge(name="qkv"), "o": LinearBridge(name="proj")},
        )
        mlp = MLPBridge(name="mlp", config=self.cfg,
                        submodules={"in": LinearBridge(name="fc1"), "out": LinearBridge(name="fc2")})
        self.component_mapping = {
            "embed": EmbeddingsBridge(name="patch_embed"),
            "blocks": BlockBridge(name="blocks", hook_alias_overrides=dict(MLP_HOOK_ALIASES), submodules={
                "ln1": norm("norm1", self.cfg), "ln2": norm("norm2", self.cfg), "attn": attn, "mlp": mlp}),
        }
        if isinstance(getattr(model, "norm", None), nn.LayerNorm):
            self.component_mapping["ln_final"] = norm("norm", self.cfg)

    @staticmethod
    def finalize(model: nn.Module) -> None:
        """timm runs ``self.blocks(x)``: the bridged blocks must stay callable as one sequence."""
        if not isinstance(model.blocks, _BlockSequence):
            blocks = _BlockSequence(list(model.blocks))
            blocks.training = model.blocks.training  # a new module starts in training mode: take the replaced one's
            model.blocks = blocks


def describe_timm(model: nn.Module) -> transformers.PretrainedConfig:
    """An HF config with the sizes of a timm vision transformer (TransformerLens and ``ModelInfo`` read it)."""
    attn = model.blocks[0].attn
    patch = model.patch_embed.patch_size
    image = model.patch_embed.img_size
    if image[0] != image[1] or patch[0] != patch[1]:
        raise UnsupportedModelError(f"non-square images or patches ({image}, {patch}) are not supported")
    config = transformers.ViTConfig(
        hidden_size=model.embed_dim, num_hidden_layers=len(model.blocks), num_attention_heads=attn.num_heads,
        intermediate_size=model.blocks[0].mlp.fc1.out_features, image_size=image[0], patch_size=patch[0],
        num_channels=model.patch_embed.proj.in_channels, qkv_bias=attn.qkv.bias is not None
        or getattr(attn, "q_bias", None) is not None,
    )
    config.head_dim = attn.qkv.weight.shape[0] // (3 * attn.num_heads)
    config.num_prefix_tokens = int(model.num_prefix_tokens)
    config.class_token = getattr(model, "cls_token", None) is not None
    config.qk_norm = not isinstance(getattr(attn, "q_norm", nn.Identity()), nn.Identity)
    config.name_or_path = f"{type(model).__module__}.{type(model).__name__}"
    return config
