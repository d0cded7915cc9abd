"""Small random-init HF models, one builder per family (the registry points at them).

Offline: every model is built from a config, nothing is downloaded. ``interp.models.tiny``
adds random nonzero biases on top, so no check passes by accident on zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import transformers as tf
from torch import nn

VOCAB = 97
IMAGE = 32
PATCH = 8
MAX_POSITIONS = 64


@dataclass(frozen=True)
class TinySize:
    n_layers: int = 2
    n_heads: int = 4
    d_head: int = 8
    n_kv_heads: int = 2

    @property
    def d_model(self) -> int:
        return self.n_heads * self.d_head


def _text(s: TinySize) -> dict:
    return dict(hidden_size=s.d_model, num_hidden_layers=s.n_layers, num_attention_heads=s.n_heads,
                max_position_embeddings=MAX_POSITIONS, vocab_size=VOCAB, attn_implementation="eager")


def _vision(s: TinySize) -> dict:
    return dict(hidden_size=s.d_model, num_hidden_layers=s.n_layers, num_attention_heads=s.n_heads,
                image_size=IMAGE, patch_size=PATCH, num_channels=3, attn_implementation="eager")


def gpt2(s: TinySize) -> nn.Module:
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=s.n_layers, n_head=s.n_heads, n_embd=s.d_model, n_positions=MAX_POSITIONS,
        vocab_size=VOCAB, attn_implementation="eager"))


def neox(s: TinySize) -> nn.Module:
    return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(intermediate_size=2 * s.d_model, **_text(s)))


def opt(s: TinySize) -> nn.Module:
    return tf.OPTForCausalLM(tf.OPTConfig(ffn_dim=2 * s.d_model, word_embed_proj_dim=s.d_model, **_text(s)))


def qwen2(s: TinySize) -> nn.Module:
    return tf.Qwen2ForCausalLM(tf.Qwen2Config(
        num_key_value_heads=s.n_kv_heads, intermediate_size=2 * s.d_model, **_text(s)))


def llama(s: TinySize) -> nn.Module:
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        num_key_value_heads=s.n_kv_heads, intermediate_size=2 * s.d_model, **_text(s)))


def bert(s: TinySize) -> nn.Module:
    return tf.BertForMaskedLM(tf.BertConfig(intermediate_size=2 * s.d_model, **_text(s)))


def small_vit_classifier_config(image_size: int, patch_size: int, qkv_bias: bool) -> tf.ViTConfig:
    """The shipped ViTs' architecture (digits and MNIST): 4 layers x 4 heads, d_model 64, MLP 128,
    10 classes, 3 channels, no dropout, eager attention (patterns are recorded)."""
    return tf.ViTConfig(
        image_size=image_size, patch_size=patch_size, num_channels=3, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, intermediate_size=128, qkv_bias=qkv_bias, num_labels=10,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager",
        architectures=["ViTForImageClassification"],
    )


def vit(s: TinySize) -> nn.Module:
    return tf.ViTModel(tf.ViTConfig(intermediate_size=2 * s.d_model, qkv_bias=True, **_vision(s)),
                       add_pooling_layer=False)


def deit(s: TinySize) -> nn.Module:
    return tf.DeiTModel(tf.DeiTConfig(intermediate_size=2 * s.d_model, qkv_bias=True, **_vision(s)),
                        add_pooling_layer=False)


def dinov2(s: TinySize) -> nn.Module:
    return tf.Dinov2Model(tf.Dinov2Config(mlp_ratio=2, layerscale_value=0.5, qkv_bias=True, **_vision(s)))


def beit(s: TinySize) -> nn.Module:
    return tf.BeitModel(tf.BeitConfig(
        intermediate_size=2 * s.d_model, use_relative_position_bias=True, use_mean_pooling=False,
        layer_scale_init_value=0.5, **_vision(s)), add_pooling_layer=False)


def _lm(s: TinySize, **extra) -> dict:
    return dict(intermediate_size=2 * s.d_model, num_key_value_heads=s.n_kv_heads, **_text(s), **extra)


def gptj(s: TinySize) -> nn.Module:
    return tf.GPTJForCausalLM(tf.GPTJConfig(
        n_layer=s.n_layers, n_head=s.n_heads, n_embd=s.d_model, n_positions=MAX_POSITIONS, vocab_size=VOCAB,
        rotary_dim=s.d_head // 2, attn_implementation="eager"))


def bloom(s: TinySize) -> nn.Module:
    return tf.BloomForCausalLM(tf.BloomConfig(
        hidden_size=s.d_model, n_layer=s.n_layers, n_head=s.n_heads, vocab_size=VOCAB, attn_implementation="eager"))


def falcon(s: TinySize) -> nn.Module:
    """Falcon-7B style: rotary, multi-query (one kv head), no biases."""
    return tf.FalconForCausalLM(tf.FalconConfig(**_text(s), multi_query=True, alibi=False, bias=False))


def falcon_rw(s: TinySize) -> nn.Module:
    """Falcon-RW style: ALiBi, one kv head per query head, q/k/v/o biases."""
    return tf.FalconForCausalLM(tf.FalconConfig(**_text(s), multi_query=False, alibi=True, bias=True))


def mistral(s: TinySize) -> nn.Module:
    return tf.MistralForCausalLM(tf.MistralConfig(**_lm(s), sliding_window=None))


def mixtral(s: TinySize) -> nn.Module:
    return tf.MixtralForCausalLM(tf.MixtralConfig(**_lm(s), num_local_experts=2, num_experts_per_tok=1))


def phi(s: TinySize) -> nn.Module:
    return tf.PhiForCausalLM(tf.PhiConfig(**_lm(s), partial_rotary_factor=0.5))


def phi3(s: TinySize) -> nn.Module:
    return tf.Phi3ForCausalLM(tf.Phi3Config(**_lm(s), pad_token_id=0))


def gemma(s: TinySize) -> nn.Module:
    return tf.GemmaForCausalLM(tf.GemmaConfig(**_lm(s), head_dim=s.d_head))


def gemma2(s: TinySize) -> nn.Module:
    return tf.Gemma2ForCausalLM(tf.Gemma2Config(**_lm(s), head_dim=s.d_head, sliding_window=MAX_POSITIONS))


def qwen2_moe(s: TinySize) -> nn.Module:
    return tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
        **_lm(s), moe_intermediate_size=s.d_model, shared_expert_intermediate_size=s.d_model, num_experts=2,
        num_experts_per_tok=1))


def qwen3(s: TinySize) -> nn.Module:
    return tf.Qwen3ForCausalLM(tf.Qwen3Config(**_lm(s), head_dim=s.d_head))


def olmo(s: TinySize) -> nn.Module:
    return tf.OlmoForCausalLM(tf.OlmoConfig(**_lm(s), pad_token_id=0))


def olmo2(s: TinySize) -> nn.Module:
    return tf.Olmo2ForCausalLM(tf.Olmo2Config(**_lm(s), pad_token_id=0))


def stablelm(s: TinySize) -> nn.Module:
    """StableLM 2 1.6B style: q/k/v biases, rotary on a quarter of each head."""
    return tf.StableLmForCausalLM(tf.StableLmConfig(**_lm(s), use_qkv_bias=True, partial_rotary_factor=0.25))


def stablelm_qknorm(s: TinySize) -> nn.Module:
    """StableLM 2 12B style: per-head LayerNorm on q and k, q/k/v biases, partial rotary."""
    return tf.StableLmForCausalLM(tf.StableLmConfig(**_lm(s), use_qkv_bias=True, partial_rotary_factor=0.25,
                                                    qk_layernorm=True))


def roberta(s: TinySize) -> nn.Module:
    return tf.RobertaForMaskedLM(tf.RobertaConfig(
        intermediate_size=2 * s.d_model, **{**_text(s), "max_position_embeddings": MAX_POSITIONS + 2}, pad_token_id=1))


def dinov2_registers(s: TinySize) -> nn.Module:
    return tf.Dinov2WithRegistersModel(tf.Dinov2WithRegistersConfig(
        mlp_ratio=2, layerscale_value=0.5, qkv_bias=True, num_register_tokens=2, **_vision(s)))


def clip_vision(s: TinySize) -> nn.Module:
    return tf.CLIPVisionModel(tf.CLIPVisionConfig(intermediate_size=2 * s.d_model, **_vision(s)))


def siglip_vision(s: TinySize) -> nn.Module:
    return tf.SiglipVisionModel(tf.SiglipVisionConfig(intermediate_size=2 * s.d_model, **_vision(s)))


# ----- timm and open_clip (imported when built: optional for users who never use them) ----
# ``extra`` overrides constructor arguments (the config audit's probes).


def _timm_size(s: TinySize) -> dict:
    return dict(img_size=IMAGE, patch_size=PATCH, embed_dim=s.d_model, depth=s.n_layers, num_heads=s.n_heads,
                mlp_ratio=2.0, num_classes=0)


def timm_vit(s: TinySize, **extra) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**{**_timm_size(s), "qkv_bias": True, **extra})


def timm_vit_qknorm(s: TinySize, **extra) -> nn.Module:
    """timm ViT with ``qk_norm=True``: q and k pass a LayerNorm per head after the bias is added."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**{**_timm_size(s), "qkv_bias": True, "qk_norm": True, **extra})


def timm_vit_nobias(s: TinySize, **extra) -> nn.Module:
    """timm ViT built with ``qkv_bias=False`` (as in some ViT-22B-style recipes): no q, k, v bias at all."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**{**_timm_size(s), "qkv_bias": False, **extra})


def timm_vit_registers(s: TinySize, **extra) -> nn.Module:
    """timm ViT without a class token, with 4 register tokens, average-pooled."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**{**_timm_size(s), "qkv_bias": True, "class_token": False, "reg_tokens": 4,
                                "global_pool": "avg", **extra})


def timm_deit(s: TinySize, **extra) -> nn.Module:
    from timm.models.deit import VisionTransformerDistilled

    return VisionTransformerDistilled(**{**_timm_size(s), "qkv_bias": True, **extra})


def timm_deit_qknorm(s: TinySize, **extra) -> nn.Module:
    from timm.models.deit import VisionTransformerDistilled

    return VisionTransformerDistilled(**{**_timm_size(s), "qkv_bias": True, "qk_norm": True, **extra})


def timm_eva(s: TinySize, **extra) -> nn.Module:
    """EVA-02 style: q and v bias (no k bias), 2D rotary on the patches, SwiGLU-free MLP for size."""
    from timm.models.eva import Eva

    return Eva(**{**_timm_size(s), "qkv_bias": True, "use_rot_pos_emb": True, "use_abs_pos_emb": True,
                  "ref_feat_shape": (4, 4), **extra})


def timm_beit(s: TinySize, **extra) -> nn.Module:
    from timm.models.beit import Beit

    return Beit(**{**_timm_size(s), "qkv_bias": True, "use_rel_pos_bias": True, "use_abs_pos_emb": False,
                   "init_values": 0.5, **extra})


def open_clip_vit(s: TinySize, **extra) -> nn.Module:
    from open_clip.transformer import VisionTransformer

    return VisionTransformer(**{**dict(image_size=IMAGE, patch_size=PATCH, width=s.d_model, layers=s.n_layers,
                                       heads=s.n_heads, mlp_ratio=2.0, output_dim=s.d_model), **extra})
