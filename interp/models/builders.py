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
