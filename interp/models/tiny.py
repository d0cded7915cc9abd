"""Small random-init HF models of every supported family, built offline.

Used by the tests (parametrised over ``TINY_FAMILIES``) and handy for trying the API
without weights. Every bias the architecture has is given random nonzero values, so
no check can pass by accident on zeros.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers as tf
from torch import nn

TINY_FAMILIES = ("gpt2", "neox", "opt", "qwen2", "llama", "bert", "vit", "deit", "dinov2", "beit")
VOCAB = 97
IMAGE = 32
PATCH = 8


def _build(family: str, n_layers: int, n_heads: int, d_head: int, n_kv_heads: int) -> nn.Module:
    d = n_heads * d_head
    eager = dict(attn_implementation="eager")
    text = dict(vocab_size=VOCAB)
    vision = dict(image_size=IMAGE, patch_size=PATCH, num_channels=3)
    if family == "gpt2":
        return tf.GPT2LMHeadModel(
            tf.GPT2Config(n_layer=n_layers, n_head=n_heads, n_embd=d, n_positions=64, **text, **eager)
        )
    if family == "neox":
        return tf.GPTNeoXForCausalLM(
            tf.GPTNeoXConfig(
                hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                intermediate_size=2 * d, max_position_embeddings=64, **text, **eager,
            )
        )
    if family == "opt":
        return tf.OPTForCausalLM(
            tf.OPTConfig(
                hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                ffn_dim=2 * d, max_position_embeddings=64, word_embed_proj_dim=d, **text, **eager,
            )
        )
    if family in ("qwen2", "llama"):
        cfg_cls, model_cls = (
            (tf.Qwen2Config, tf.Qwen2ForCausalLM)
            if family == "qwen2"
            else (tf.LlamaConfig, tf.LlamaForCausalLM)
        )
        return model_cls(
            cfg_cls(
                hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                num_key_value_heads=n_kv_heads, intermediate_size=2 * d,
                max_position_embeddings=64, **text, **eager,
            )
        )
    if family == "bert":
        return tf.BertForMaskedLM(
            tf.BertConfig(
                hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                intermediate_size=2 * d, max_position_embeddings=64, **text, **eager,
            )
        )
    if family in ("vit", "deit"):
        cfg_cls, model_cls = (
            (tf.ViTConfig, tf.ViTModel) if family == "vit" else (tf.DeiTConfig, tf.DeiTModel)
        )
        return model_cls(
            cfg_cls(
                hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                intermediate_size=2 * d, qkv_bias=True, **vision, **eager,
            ),
            add_pooling_layer=False,
        )
    if family == "dinov2":
        return tf.Dinov2Model(
            tf.Dinov2Config(
                hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                mlp_ratio=2, layerscale_value=0.5, qkv_bias=True, **vision, **eager,
            )
        )
    if family == "beit":
        return tf.BeitModel(
            tf.BeitConfig(
                hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                intermediate_size=2 * d, use_relative_position_bias=True,
                use_mean_pooling=False, layer_scale_init_value=0.5, **vision, **eager,
            ),
            add_pooling_layer=False,
        )
    raise ValueError(f"unknown tiny family {family!r}; expected one of {TINY_FAMILIES}")


def tiny_hf_model(
    family: str,
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    d_head: int = 8,
    n_kv_heads: int | None = None,
    seed: int = 0,
    bias_scale: float = 0.5,
) -> nn.Module:
    """A random-init HF model of ``family`` with random nonzero biases, in eval mode.

    ``n_kv_heads`` applies to the GQA families (qwen2, llama); default n_heads // 2.
    """
    if n_kv_heads is None:
        n_kv_heads = max(1, n_heads // 2)
    torch.manual_seed(seed)
    model = _build(family, n_layers, n_heads, d_head, n_kv_heads)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "lambda" in name or "layer_scale" in name:
                param.add_(bias_scale * torch.randn(param.shape, generator=gen))
            if "relative_position_bias_table" in name:
                param.normal_(0.0, 0.5, generator=gen)
    return model.eval()


def tiny_inputs(model_or_family: Any, batch: int = 2, pos: int = 7, seed: int = 0) -> torch.Tensor:
    """Random token ids ``[batch, pos]`` or pixel values ``[batch, 3, 32, 32]``."""
    family = model_or_family if isinstance(model_or_family, str) else None
    if family is None:
        info = getattr(model_or_family, "interp", None)
        family = info.family if info is not None else model_or_family.config.model_type
    gen = torch.Generator().manual_seed(seed)
    if family in ("vit", "deit", "dinov2", "beit"):
        return torch.randn(batch, 3, IMAGE, IMAGE, generator=gen)
    return torch.randint(0, VOCAB, (batch, pos), generator=gen)
