"""The shipped digits ViTs (``digits-vit``, ``digits-vit-nobias``): their config, their preprocessing, and the
same trained weights as a timm ``VisionTransformer`` (timm's hub weights do not download offline). The training
recipe lives in ``experiments/training/digits.py``."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from interp.models.builders import small_vit_classifier_config
from interp.models.zoo import ZOO

IMAGE, PATCH = 8, 2


def digits_vit_config(qkv_bias: bool) -> ViTConfig:
    return small_vit_classifier_config(IMAGE, PATCH, qkv_bias)


def digits_processor() -> ViTImageProcessor:
    """The pair's preprocessing: 8x8, pixels / 255, standardised with mean 0.5, std 0.5."""
    return ViTImageProcessor(size={"height": IMAGE, "width": IMAGE}, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def digits_vit_as_timm(name: str = "digits-vit") -> nn.Module:
    """A shipped digits ViT (``digits-vit`` or ``digits-vit-nobias``) as a timm ``VisionTransformer``
    with the same trained weights: q, k and v fused into timm's ``qkv``, the rest one to one.

    Offline, so timm paths can be tried on a trained model (timm's hub weights do not download
    here); the HF and the timm model give the same logits.
    """
    from timm.models.vision_transformer import VisionTransformer  # timm: the `vision` extra

    hf = ViTForImageClassification.from_pretrained(ZOO[name].folder(), use_safetensors=True).eval()
    cfg, vit = hf.config, hf.vit
    model = VisionTransformer(
        img_size=cfg.image_size, patch_size=cfg.patch_size, in_chans=cfg.num_channels, embed_dim=cfg.hidden_size,
        depth=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
        mlp_ratio=cfg.intermediate_size / cfg.hidden_size, qkv_bias=cfg.qkv_bias, num_classes=cfg.num_labels,
        norm_layer=partial(nn.LayerNorm, eps=cfg.layer_norm_eps))
    state = {"cls_token": vit.embeddings.cls_token, "pos_embed": vit.embeddings.position_embeddings,
             "patch_embed.proj.weight": vit.embeddings.patch_embeddings.projection.weight,
             "patch_embed.proj.bias": vit.embeddings.patch_embeddings.projection.bias,
             "norm.weight": vit.layernorm.weight, "norm.bias": vit.layernorm.bias,
             "head.weight": hf.classifier.weight, "head.bias": hf.classifier.bias}
    for i, layer in enumerate(vit.layers):
        attn, pre = layer.attention, f"blocks.{i}."
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        state[pre + "attn.qkv.weight"] = torch.cat([p.weight for p in projections])
        if cfg.qkv_bias:
            state[pre + "attn.qkv.bias"] = torch.cat([p.bias for p in projections])
        for ours, theirs in (("norm1", layer.layernorm_before), ("norm2", layer.layernorm_after),
                             ("attn.proj", attn.o_proj), ("mlp.fc1", layer.mlp.fc1), ("mlp.fc2", layer.mlp.fc2)):
            state[f"{pre}{ours}.weight"], state[f"{pre}{ours}.bias"] = theirs.weight, theirs.bias
    model.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)
    return model.eval()
