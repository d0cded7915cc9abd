"""The config audit: what every attention-relevant config attribute of every family does to interp.

Each attribute of a family's HF config class (for timm / open_clip: each constructor argument)
whose name looks attention-relevant (``ATTENTION_RELEVANT``) has one ``Audit`` entry:

* **handled**: interp reproduces HF for non-default values; ``probe`` is such a value, and
  ``tests/models/test_audit.py`` builds a tiny model with it and compares the hooked model's
  logits and patterns with HF's, and the score decomposition's four terms with the pattern;
* **refused**: ``interp.load_model`` raises ``UnsupportedModelError`` naming the attribute, its value
  and what to do (``scope="load"``), or the model loads and the analyses that need the four score
  terms (``score_decomposition``, AtP*) refuse it (``scope="scores"``); ``probe`` is a refused value;
* **irrelevant**: the attribute does not change the attention math interp reads (a reason is given).

The test enumerates each config class and fails on an attribute with no entry. ``COMMON`` holds
the entries shared by every transformers family (and used for inferred families); ``FAMILY`` the
family's own (a variant inherits its base's). Values of timm / open_clip arguments are read from
the built modules (``read``): those libraries keep no config.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import transformers
from torch import nn

from interp.errors import UnsupportedModelError
from interp.models.builders import TinySize

ATTENTION_RELEVANT = re.compile(
    r"scale|window|softcap|norm|rotary|rope|alibi|kv|head|bias|attn|attention|multi_query|decoder|causal"
    r"|bidirectional|qk|position|clip|partial|layer_types|sink|local|global", re.I)
_MISSING = object()


@dataclass(frozen=True)
class Audit:
    """What one config attribute does to interp (see the module doc)."""

    status: str  # "handled" | "refused" | "irrelevant"
    why: str  # handled: how; refused: what would go wrong; irrelevant: why it does not touch the attention math
    probe: Mapping[str, Any] = field(default_factory=dict)  # a non-default config the tests build
    fix: str = ""  # refused: what to do
    refuse: Optional[Callable[[Any, Any], bool]] = None  # refused: (value, config) -> whether this value is refused
    read: Optional[Callable[[nn.Module], Any]] = None  # the value, read from a built model (timm, open_clip)
    scope: str = "load"  # refused at "load", or by the analyses that need the four score "terms"
    test: str = ""  # handled without a probe: the test that covers it


def handled(why: str, probe: Optional[Mapping[str, Any]] = None, test: str = "") -> Audit:
    return Audit("handled", why, dict(probe or {}), test=test)


def irrelevant(why: str, probe: Optional[Mapping[str, Any]] = None) -> Audit:
    return Audit("irrelevant", why, dict(probe or {}))


def refused(why: str, fix: str, refuse: Callable[[Any, Any], bool], probe: Mapping[str, Any], *,
            scope: str = "load", read: Optional[Callable[[nn.Module], Any]] = None) -> Audit:
    return Audit("refused", why, dict(probe), fix=fix, refuse=refuse, read=read, scope=scope)


_EVAL = irrelevant("dropout does not act in eval mode, which load_model sets")
_NORM = irrelevant("a norm's epsilon or form: HF's own norm modules run before the q/k/v hooks the analyses read")
_MLP = irrelevant("the MLP or its experts, outside attention")
_SIZES = handled("read into ModelInfo; the q projection's size is checked against heads x d_head",
                 test="test_hooks_and_biases_equal_hf_projections")
_KV = handled("kv heads are read from the k projection's size, so every name for them agrees",
              probe={"num_key_value_heads": 1})
_HEAD_DIM = handled("d_head read from the config and checked against the q projection", probe={"head_dim": 16})
_CONTEXT = handled("the context length: longer inputs are refused", test="test_lm_given_pixels")
_ROPE_WHY = "cos/sin come from the model's own rotary hooks: scaled frequencies and partial rotary follow"
_ROPE = handled(_ROPE_WHY, probe={"rope_parameters": {"rope_theta": 500.0, "rope_type": "linear", "factor": 2.0}})
_PARTIAL_ROPE = handled(_ROPE_WHY, probe={"rope_parameters": {"rope_theta": 500.0, "rope_type": "linear",
                                                              "factor": 2.0, "partial_rotary_factor": 0.5}})
_LONGROPE = handled(_ROPE_WHY + " (longrope switches factors past `original_max_position_embeddings`)",
                    probe={"rope_parameters": {"rope_type": "longrope", "rope_theta": 500.0, "short_factor": [1.0] * 4,
                                               "long_factor": [2.0] * 4, "original_max_position_embeddings": 8}})
_WINDOW = handled("each layer's window enters the decomposition's key mask (keys j with i - w < j <= i, as HF)",
                  probe={"sliding_window": 4})
_QWEN_WINDOW = handled("layers past `max_window_layers` (per `layer_types`) get the window in the key mask",
                       probe={"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1})
_QWEN_MOE_WINDOW = handled("even layers below `max_window_layers` (per `layer_types`) get the window in the key "
                           "mask", probe={"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2})
_BIAS_SWITCH = handled("bias presence is read from the modules: bias_spec says absent, never zero")


def _bias_switch(name: str, value: Any) -> Audit:
    return handled(_BIAS_SWITCH.why, probe={name: value})


COMMON: dict[str, Audit] = {
    "output_attentions": irrelevant("whether HF returns patterns; interp reads them through hooks"),
    "is_encoder_decoder": irrelevant("the model class decides the architecture; the classes interp bridges ignore it"),
    "num_attention_heads": _SIZES, "n_head": _SIZES, "num_key_value_heads": _KV, "head_dim": _HEAD_DIM,
    "attention_dropout": _EVAL, "attention_probs_dropout_prob": _EVAL, "attn_pdrop": _EVAL,
    "max_position_embeddings": _CONTEXT, "n_positions": _CONTEXT,
    "layer_norm_eps": _NORM, "layer_norm_epsilon": _NORM, "rms_norm_eps": _NORM,
    "rope_parameters": _ROPE,
    "ignore_keys_at_rope_validation": irrelevant("which rope_parameters keys HF's validation skips"),
    "mlp_bias": _MLP, "num_local_experts": _MLP, "norm_topk_prob": _MLP, "decoder_sparse_step": _MLP,
    "attention_bias": _bias_switch("attention_bias", True),
    "is_decoder": irrelevant("a causal LM class is causal whatever `is_decoder` says"),
}


def _is(expected: Any) -> Callable[[Any, Any], bool]:
    return lambda value, cfg: value == expected


def _tl_breaks(what: str) -> str:
    return f"TransformerLens 4.3's bridge {what}"


_GPT2 = {
    "scale_attn_weights": refused(
        "TransformerLens' GPT-2 bridge always divides the scores by sqrt(d_head), so the hooked model would be "
        "another model (tiny GPT-2: logits off by 1.6e-4, patterns by 0.074)",
        "fold the scale into the weights: multiply c_attn's query columns (weight and bias) by sqrt(d_head) and "
        "set scale_attn_weights=True, an exactly equivalent model (b_q is then rescaled by the same factor)",
        _is(False), {"scale_attn_weights": False}),
    "scale_attn_by_inverse_layer_idx": handled(
        "the bridge divides layer l's scores by l + 1 as HF does; so does the decomposition's score scale",
        probe={"scale_attn_by_inverse_layer_idx": True}),
    "reorder_and_upcast_attn": handled("the bridge computes the scores in float32 as HF does",
                                       probe={"reorder_and_upcast_attn": True}),
    "add_cross_attention": refused(
        _tl_breaks("fails on GPT-2 blocks with cross-attention"),
        "load it with add_cross_attention=False: interp never passes encoder states", _is(True),
        {"add_cross_attention": True}),
}
_NEOX = {
    "rope_parameters": _PARTIAL_ROPE,
    "attention_bias": refused(
        _tl_breaks("for GPT-NeoX needs the fused query_key_value bias"),
        "set attention_bias=True with zero biases for an identical forward (interp then reports the biases as "
        "present but zero)", _is(False), {"attention_bias": False}),
}
_OPT = {
    "enable_bias": _bias_switch("enable_bias", False),
    "do_layer_norm_before": refused(
        _tl_breaks("fails on post-layer-norm OPT (OPT-350m)"), "only pre-layer-norm OPT is supported",
        _is(False), {"do_layer_norm_before": False}),
    "_remove_final_layer_norm": refused(
        _tl_breaks("needs OPT's final layer norm"), "only OPT with a final layer norm is supported",
        _is(True), {"_remove_final_layer_norm": True}),
    "layer_norm_elementwise_affine": irrelevant(_NORM.why, probe={"layer_norm_elementwise_affine": False}),
}
_WINDOWS = {"sliding_window": _WINDOW}
_QWEN2 = {"sliding_window": _QWEN_WINDOW, "use_sliding_window": _QWEN_WINDOW, "max_window_layers": _QWEN_WINDOW,
          "layer_types": _QWEN_WINDOW}
_QWEN2_MOE = {"sliding_window": _QWEN_MOE_WINDOW, "use_sliding_window": _QWEN_MOE_WINDOW,
              "max_window_layers": _QWEN_MOE_WINDOW, "layer_types": _QWEN_MOE_WINDOW,
              "qkv_bias": _bias_switch("qkv_bias", False)}
_FALCON = {
    "alibi": handled("selects the registry's falcon-rw variant (ALiBi; terms_complete=False)",
                     probe={"alibi": True, "bias": True, "multi_query": False}),
    "bias": _bias_switch("bias", True),
    "multi_query": handled("kv heads are read from the k projection's size", probe={"multi_query": False}),
    "parallel_attn": irrelevant("residual wiring outside attention, run by HF's block", probe={"parallel_attn": False}),
    "new_decoder_architecture": refused(
        _tl_breaks("splits Falcon's grouped query_key_value [q.., k, v per kv group] as if it had one kv head"),
        "Falcon-40B/180B-style models with several kv heads are not supported; new_decoder_architecture with "
        "num_kv_heads=1 loads", lambda value, cfg: bool(value) and (cfg.num_kv_heads or 1) > 1,
        {"new_decoder_architecture": True, "num_kv_heads": 2}),
    "num_kv_heads": handled("kv heads are read from the k projection's size",
                            probe={"new_decoder_architecture": True, "num_kv_heads": 1}),
    "num_ln_in_parallel_attn": refused(
        _tl_breaks("expects two layer norms (ln_attn, ln_mlp) under new_decoder_architecture"),
        "use num_ln_in_parallel_attn=2 (the default) or the original architecture",
        lambda value, cfg: bool(cfg.new_decoder_architecture) and value == 1,
        {"new_decoder_architecture": True, "num_kv_heads": 1, "num_ln_in_parallel_attn": 1}),
}
_PHI = {
    "qk_layernorm": refused(
        _tl_breaks("for Phi does not wrap q_layernorm/k_layernorm (its forward would skip them)"),
        "Phi with qk_layernorm is not supported yet; load a config without it", _is(True), {"qk_layernorm": True}),
    "partial_rotary_factor": handled(_ROPE_WHY, probe={"partial_rotary_factor": 1.0}),
    "rope_parameters": _PARTIAL_ROPE,
}
_GEMMA = {"use_bidirectional_attention": handled(
    "GemmaForCausalLM's eager mask stays causal whatever the flag; the patterns are compared with HF's",
    probe={"use_bidirectional_attention": True})}
_GEMMA2 = {
    **_GEMMA, "layer_types": handled(_QWEN_WINDOW.why, probe={"sliding_window": 4}), "sliding_window": _WINDOW,
    "attn_logit_softcapping": handled("the family's score decomposition is refused (soft-capping); the hooked model "
                                      "is HF's", probe={"attn_logit_softcapping": 10.0}),
    "final_logit_softcapping": irrelevant("caps the output logits, after attention"),
    "query_pre_attn_scalar": handled("the family's score decomposition is refused; the hooked model is HF's",
                                     probe={"query_pre_attn_scalar": 4}),
}
_OLMO = {"clip_qkv": refused(
    "q, k and v are clipped to +-clip_qkv after the bias is added, so the score is not bilinear in content + bias",
    "record_qkv, frequency_profile and exact ablations still run; the score decomposition and AtP* need "
    "clip_qkv=None", lambda value, cfg: value is not None, {"clip_qkv": 0.05}, scope="terms")}
_STABLELM = {
    "qk_layernorm": handled("selects the registry's stablelm-qknorm variant: qk-norm, score decomposition refused",
                            probe={"qk_layernorm": True}),
    "use_qkv_bias": _bias_switch("use_qkv_bias", False),
    "partial_rotary_factor": handled(_ROPE_WHY, probe={"partial_rotary_factor": 0.5}),
    "rope_parameters": _PARTIAL_ROPE,
}
_ENCODER = {
    "is_decoder": refused(
        "makes the encoder causal, while interp reads this family as a bidirectional encoder (key masks, metrics)",
        "load it with is_decoder=False if it is used as an encoder", _is(True), {"is_decoder": True}),
    "add_cross_attention": refused(
        "cross-attention blocks are not bridged", "load it with add_cross_attention=False", _is(True),
        {"is_decoder": True, "add_cross_attention": True}),
}
_VIT = {"qkv_bias": _bias_switch("qkv_bias", False)}
_DINOV2 = {**_VIT, "layerscale_value": irrelevant("scales the block's output, after attention",
                                                  probe={"layerscale_value": 0.1}),
           "apply_layernorm": irrelevant("the final layer norm, after every block"),
           "use_swiglu_ffn": refused(
               "the DINOv2 bridge maps the fc1/fc2 MLP; the SwiGLU MLP (giant variants) is not bridged",
               "only DINOv2 with the fc1/fc2 MLP (S/B/L) is supported; load a config with use_swiglu_ffn=False",
               _is(True), {"use_swiglu_ffn": True})}
_BEIT = {
    "use_relative_position_bias": handled("the relative position bias is HF's; terms_complete=False says the four "
                                          "terms leave it out", probe={"use_relative_position_bias": False}),
    "use_shared_relative_position_bias": handled("as `use_relative_position_bias`",
                                                 probe={"use_shared_relative_position_bias": True}),
    "use_absolute_position_embeddings": handled("added to the input like a learned table",
                                                probe={"use_absolute_position_embeddings": True}),
    "layer_scale_init_value": irrelevant("scales the block's output, after attention"),
    "pool_scales": irrelevant("the segmentation head"), "use_auxiliary_head": irrelevant("the segmentation head"),
}


# ----- timm and open_clip: constructor arguments, read from the built modules ---------------------


def _attn(model: nn.Module) -> nn.Module:
    return model.blocks[0].attn


def _not_identity(module: Any) -> bool:
    return isinstance(module, nn.Module) and not isinstance(module, nn.Identity)


def _set(value: Any, model: Any) -> bool:
    """``refuse`` for a value ``read`` from a built model: a truthy value (a description) is refused."""
    return bool(value)


def _is_timm_attention(attn: nn.Module) -> bool:
    return type(attn).__name__ == "Attention" and type(attn).__module__ == "timm.layers.attention"


_TIMM_RUNS = "interp's timm adapter runs timm's own module for it (compared with timm's forward)"
_TIMM_COMMON = {
    "global_pool": irrelevant("pooling after the last block"),
    "num_heads": handled("read from the attention module", test="test_same_logits_and_hooks"),
    "attn_drop_rate": _EVAL,
    "norm_layer": irrelevant("norms around the blocks, run by timm before the q/k/v hooks"),
}
_TIMM_EVA_BEIT = {
    **_TIMM_COMMON,
    "head_init_scale": irrelevant("initialisation only"),
    "use_fc_norm": irrelevant("the norm after pooling"),
    "scale_mlp": irrelevant("a norm inside the MLP", probe={"scale_mlp": True}),
}
_TIMM_VIT = {
    **_TIMM_COMMON,
    "qkv_bias": handled("selects the timm-vit-nobias variant: no q, k, v bias", probe={"qkv_bias": False}),
    "qk_norm": handled("selects the qk-norm variant: score decomposition refused, b_k not inert",
                       probe={"qk_norm": True}),
    "scale_attn_norm": handled(_TIMM_RUNS + " (the norm before the output projection)",
                               probe={"scale_attn_norm": True}),
    "scale_mlp_norm": irrelevant("a norm inside the MLP"),
    "proj_bias": handled(_BIAS_SWITCH.why, probe={"proj_bias": False}),
    "pre_norm": irrelevant("a norm before the first block", probe={"pre_norm": True}),
    "final_norm": irrelevant("the norm after the last block"), "fc_norm": irrelevant("the norm after pooling"),
    "embed_norm_layer": irrelevant("a norm inside the patch embedding"),
    "attn_layer": refused(
        "the adapter reimplements timm's default `Attention`; another class (e.g. 'diff', differential attention) "
        "computes something else (output off by 0.21 on a tiny ViT)", "build the model with the default attn_layer",
        _set, {"attn_layer": "diff"},
        read=lambda m: "" if _is_timm_attention(_attn(m)) else type(_attn(m)).__name__),
}
_EVA_ROPE = handled("timm builds the rotary tensor and the adapter applies it as timm does (EVA's decomposition is "
                    "refused)", probe={"rope_temperature": 100.0})
_EVA = {
    **_TIMM_EVA_BEIT,
    "qkv_bias": handled(_BIAS_SWITCH.why, probe={"qkv_bias": False}),
    "qkv_fused": refused("the adapter splits the fused qkv projection; separate q/k/v projections are not bridged",
                         "build the model with qkv_fused=True (the same weights, concatenated)", _set,
                         {"qkv_fused": False}, read=lambda m: getattr(_attn(m), "qkv", None) is None),
    "num_kv_heads": refused("grouped kv heads need unfused q/k/v projections in timm, which are not bridged",
                            "use num_kv_heads=None", _set,
                            {"attn_type": "rope", "qkv_fused": False, "num_kv_heads": 2},
                            read=lambda m: getattr(_attn(m), "num_kv_heads", None) not in (None, _attn(m).num_heads)
                            and f"{_attn(m).num_kv_heads} kv heads"),
    "qk_norm": handled(_TIMM_RUNS + " (EVA's decomposition is refused)", probe={"qk_norm": True}),
    "scale_attn_inner": handled(_TIMM_RUNS, probe={"scale_attn_inner": True}),
    "attn_type": handled(_TIMM_RUNS, probe={"attn_type": "rope"}),
    "attn_only_layer_scale": irrelevant("scales the block's output, after attention",
                                        probe={"attn_only_layer_scale": True}),
    "rope_type": handled(_EVA_ROPE.why, probe={"rope_type": "mixed"}),
    "rope_grid_offset": _EVA_ROPE, "rope_grid_indexing": _EVA_ROPE, "rope_temperature": _EVA_ROPE,
    "rope_rotate_half": handled(_EVA_ROPE.why, probe={"rope_rotate_half": True}),
    "rope_shift_coords": irrelevant("a training-time augmentation of the rotary grid (off in eval)"),
    "rope_jitter_coords": irrelevant("a training-time augmentation of the rotary grid (off in eval)"),
    "rope_rescale_coords": irrelevant("a training-time augmentation of the rotary grid (off in eval)"),
    "rope_mrope_section": _EVA_ROPE,
    "use_post_norm": irrelevant("norms after attention, run by timm's block", probe={"use_post_norm": True}),
    "use_pre_transformer_norm": irrelevant("a norm before the first block"),
    "use_post_transformer_norm": irrelevant("the norm after the last block"),
    "attn_pool_num_heads": irrelevant("the attention-pooling head after the blocks", probe={"attn_pool_num_heads": 2}),
    "attn_pool_mlp_ratio": irrelevant("the attention-pooling head after the blocks"),
}
_TIMM_BEIT = {
    **_TIMM_EVA_BEIT, "qkv_bias": handled(_BIAS_SWITCH.why, probe={"qkv_bias": False}),
    "use_rel_pos_bias": handled(_BEIT["use_relative_position_bias"].why, probe={"use_rel_pos_bias": False}),
    "use_shared_rel_pos_bias": handled(_BEIT["use_relative_position_bias"].why,
                                       probe={"use_shared_rel_pos_bias": True}),
}


def _oc_refused(name: str, read: Callable[[nn.Module], Any], value: Any = True) -> Audit:
    return refused("open_clip builds a custom attention block for it; interp's open_clip adapter bridges "
                   "`nn.MultiheadAttention` only", f"build the tower without {name}", _set, {name: value},
                   read=read)


def _oc_block(model: nn.Module) -> nn.Module:
    return model.transformer.resblocks[0]


_OPEN_CLIP = {
    "heads": handled("read from the attention module", test="test_same_logits_and_hooks"),
    "norm_layer": irrelevant("norms around the blocks, run by open_clip before the q/k/v hooks"),
    "attentional_pool": _oc_refused("attentional_pool", lambda m: getattr(m, "attn_pool", None) is not None),
    "attn_pooler_queries": irrelevant("the attentional pooler, refused with `attentional_pool`"),
    "attn_pooler_heads": irrelevant("the attentional pooler, refused with `attentional_pool`"),
    "qk_norm": _oc_refused("qk_norm", lambda m: _not_identity(getattr(_oc_block(m).attn, "ln_q", None))),
    "scaled_cosine_attn": _oc_refused("scaled_cosine_attn",
                                      lambda m: getattr(_oc_block(m).attn, "logit_scale", None) is not None),
    "scale_heads": _oc_refused("scale_heads", lambda m: getattr(_oc_block(m).attn, "head_scale", None) is not None),
    "scale_attn_inner": _oc_refused("scale_attn_inner",
                                    lambda m: _not_identity(getattr(_oc_block(m).attn, "ln_inner", None))),
    "scale_attn": _oc_refused("scale_attn", lambda m: _not_identity(getattr(_oc_block(m), "ln_attn", None))),
    "scale_fc": _oc_refused("scale_fc", lambda m: _not_identity(getattr(_oc_block(m).mlp, "ln", None))),
    "block_type": _oc_refused("block_type", lambda m: not isinstance(_oc_block(m).attn, nn.MultiheadAttention),
                              "custom"),
}

FAMILY: dict[str, dict[str, Audit]] = {
    "gpt2": _GPT2, "neox": _NEOX, "opt": _OPT, "qwen2": _QWEN2, "qwen2-moe": _QWEN2_MOE, "qwen3": _QWEN2,
    "mistral": _WINDOWS, "mixtral": _WINDOWS, "phi3": {**_WINDOWS, "rope_parameters": _LONGROPE,
                                                       "original_max_position_embeddings": _LONGROPE},
    "gptj": {"rotary_dim": handled("GPT-J's decomposition is refused; the bridge is compared with HF",
                                   probe={"rotary_dim": 4})},
    "bloom": {"apply_residual_connection_post_layernorm": irrelevant(
        "residual wiring outside attention, run by HF's block",
        probe={"apply_residual_connection_post_layernorm": True})},
    "falcon": _FALCON, "phi": _PHI, "gemma": _GEMMA, "gemma2": _GEMMA2, "olmo": _OLMO, "stablelm": _STABLELM,
    "bert": _ENCODER, "roberta": _ENCODER, "vit": _VIT, "deit": _VIT, "dinov2": _DINOV2, "dinov2-registers": _DINOV2,
    "beit": _BEIT, "timm-vit": _TIMM_VIT, "timm-deit": _TIMM_VIT, "timm-eva": _EVA, "timm-beit": _TIMM_BEIT,
    "open-clip-vit": _OPEN_CLIP,
}


def audit_of(family: Any) -> dict[str, Audit]:
    """Attribute -> ``Audit`` for ``family`` (a ``Family``): the common entries of its library, its base's
    (for a variant) and its own."""
    base = FAMILY.get(family.variant_of, {}) if family.variant_of else {}
    common = COMMON if family.source == "transformers" else {}
    own = FAMILY.get(family.name, {}) if not family.inferred else {}
    return {**common, **base, **own}


def config_attributes(family: Any) -> list[str]:
    """Every attribute name of ``family``'s HF config class (a default instance's ``vars()`` and
    ``to_dict()``, less ``PretrainedConfig``'s bookkeeping), or its timm / open_clip constructor's arguments."""
    if family.source == "transformers":
        config = transformers.AutoConfig.for_model(family.model_types[0])
        bookkeeping = set(transformers.PretrainedConfig().to_dict())
        return sorted((set(config.to_dict()) | {k for k in vars(config) if not k.startswith("_")}) - bookkeeping)
    for cls in type(family.tiny(TinySize(1, 2, 8, 1))).__mro__:  # the first class naming its arguments
        params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"
                  and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)] if "__init__" in vars(cls) else []
        if params:
            return sorted(p.name for p in params)
    return []


def attention_attributes(family: Any) -> list[str]:
    """The attributes of ``config_attributes(family)`` whose name looks attention-relevant (``ATTENTION_RELEVANT``)."""
    return [n for n in config_attributes(family) if ATTENTION_RELEVANT.search(n)]


def summary(family: Any) -> str:
    """"h handled, i irrelevant; refused: `a`, `b`" over the family's audited attributes (README table)."""
    audit = audit_of(family)
    names = set(attention_attributes(family)) | set(FAMILY.get(family.name, {})) | set(
        FAMILY.get(family.variant_of, {}))
    entries = {n: audit[n] for n in sorted(names) if n in audit}
    count = {s: sum(a.status == s for a in entries.values()) for s in ("handled", "irrelevant")}
    refused_names = [f"`{n}`" + (" (score terms)" if a.scope != "load" else "") for n, a in entries.items()
                     if a.status == "refused"]
    return f"{count['handled']} handled, {count['irrelevant']} irrelevant" + (
        f"; refused: {', '.join(refused_names)}" if refused_names else "")


def _value(entry: Audit, name: str, model: Optional[nn.Module], config: Any) -> Any:
    if entry.read is not None:
        return entry.read(model) if model is not None else _MISSING
    return getattr(config, name, _MISSING)


def refusals(family: Any, model: Optional[nn.Module] = None, config: Any = None, scope: str = "load") -> list[str]:
    """``"`attr=value`: why; fix"`` for each of ``family``'s refused attributes that ``model`` (or ``config``) sets."""
    config = config if config is not None else getattr(model, "config", None)
    found = []
    for name, entry in audit_of(family).items():
        if entry.status != "refused" or entry.scope != scope:
            continue
        value = _value(entry, name, model, config)
        if value is not _MISSING and entry.refuse(value, config if config is not None else model):
            shown = f"{name}={value!r}" if entry.read is None else name + ("" if value is True else f" ({value})")
            found.append(f"`{shown}`: {entry.why}; {entry.fix}")
    return found


def check_config(family: Any, model: Optional[nn.Module] = None, config: Any = None) -> None:
    """Raise ``UnsupportedModelError`` naming every attribute the audit refuses at load."""
    found = refusals(family, model, config)
    if found:
        raise UnsupportedModelError(f"{family.label}: the config sets what interp cannot reproduce exactly: "
                                    + " | ".join(found))
