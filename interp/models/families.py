"""The one registry of model families: everything the library knows about an architecture.

Each family is one frozen ``Family``: the HF ``model_type`` values and classes it covers,
its modality, attention direction, position scheme, qk-norm, prefix tokens, the
TransformerLens adapter (ours, where TL lacks one), a tiny builder for tests, and the
default task metric. Loading, the bias identities, metrics, tiny models, the tests and the
README's family table all read it. Adding a family is one ``register_family`` call here
(plus an adapter file in ``interp/models/adapters/`` where TL has none).

The position scheme decides the identities: b_k cancels in the softmax under learned,
ALiBi, relative and no positions (their extra score terms do not depend on b_k and the
key), not under rotary positions (b_k is rotated with the key's position).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

from torch import nn

from interp.errors import RegistryError, public
import interp.models.builders as builders
from interp.models.audit import Audit, audit_of
from interp.models.audit import summary as audit_summary
from interp.models.adapters import (
    BeitArchitectureAdapter,
    ClipVisionArchitectureAdapter,
    Dinov2ArchitectureAdapter,
    Dinov2RegistersArchitectureAdapter,
    OpenClipVisionAdapter,
    SiglipVisionArchitectureAdapter,
    TimmVisionTransformerAdapter,
    describe_open_clip,
    describe_timm,
)
from interp.types import Attention, Modality, Positions


@dataclass(frozen=True)
class Family:
    """What the library knows about one architecture family (or one variant of it)."""

    name: str
    label: str  # for people: "GPT-NeoX / Pythia"
    model_types: tuple[str, ...]  # HF config.model_type values it covers ("timm:Eva" for timm classes)
    hf_classes: tuple[str, ...]  # HF classes the bridge wraps
    modality: Modality
    attention: Attention
    positions: Positions
    bias: str  # the attention biases the architecture has, for people ("q, v, o (no k bias)")
    default_biases: str  # the same as kinds, e.g. "qvo": what the family's tiny model (and usual checkpoint) builds
    tiny: Callable[[builders.TinySize], nn.Module]
    default_metric: str  # the ablation metric when none is asked for
    qk_norm: bool = False  # q and k are normalised after the projection (the bias enters before the norm)
    softmax_float32: bool = False  # HF's eager attention softmaxes in float32 even for a float64 model
    prefix_tokens: int = 0  # CLS (+ distillation) tokens before the patch grid
    prefix_tokens_field: str = ""  # config field counting further prefix tokens (registers; all of timm's)
    adapter: Optional[type] = None  # our TransformerLens adapter; None: TransformerLens' own
    promote: dict[str, str] = field(default_factory=dict)  # bare class -> head class TL wraps
    extra_score_term: str = ""  # a content-free additive score term the four terms leave out ("ALiBi")
    score_refusal: str = ""  # why score_decomposition refuses the family (the four terms do not make the score)
    variant_of: str = ""  # a variant shares its base's model_types and is told apart by ``matches``
    matches: Optional[Callable[[Any], bool]] = None  # config -> whether this variant describes it
    inferred: str = ""  # not registered: what was inferred, and from what
    source: str = "transformers"  # the library whose model classes the family covers (timm, open_clip)
    describe: Optional[Callable[[nn.Module], Any]] = None  # non-HF model -> an HF config of its sizes
    note: str = ""
    any_image_size: bool = False  # vision: the model itself adapts its positions to any multiple of the patch size

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary"

    @property
    def k_bias_inert(self) -> bool:
        """Whether b_k provably cannot change the attention pattern (softmax cancels it).

        True under learned, ALiBi, relative and no positions, whose extra score terms do not
        involve the key's content; false under rotary (b_k rotates with the key) and
        qk-norm (the bias is normalised with the key); never claimed for an inferred family.
        """
        return self.positions != "rotary" and not self.qk_norm and not self.inferred

    @property
    def config_audit(self) -> dict[str, Audit]:
        """Config attribute -> handled / refused / irrelevant (``interp.models.audit``)."""
        return audit_of(self)

    @property
    def score_status(self) -> str:
        """What ``score_decomposition`` gives: "exact", "exact + <term> left out" or "refused: <reason>"."""
        if self.score_refusal:
            return f"refused: {self.score_refusal}"
        return f"four terms exact; {self.extra_score_term} left out" if self.extra_score_term else "exact"

    def __hash__(self) -> int:
        return hash(self.name)


_REGISTRY: dict[str, Family] = {}


@public
def register_family(family: Family) -> Family:
    """Add ``family`` to the registry; a second family with its name or model_type fails.

    A variant (``variant_of`` its base, with ``matches``) may share its base's model_types.
    """
    if not isinstance(family, Family):
        raise RegistryError(f"register_family takes an interp.Family (e.g. dataclasses.replace(interp.get_family("
                            f"'llama'), name=..., model_types=...)); got {type(family).__name__}")
    if family.name in _REGISTRY:
        raise RegistryError(f"model family {family.name!r} is already registered")
    if family.variant_of and (family.variant_of not in _REGISTRY or family.matches is None):
        raise RegistryError(f"variant {family.name!r} needs a registered base {family.variant_of!r} and `matches`")
    for other in _REGISTRY.values():
        clash = set(other.model_types) & set(family.model_types)
        if clash and not (family.variant_of and family.variant_of in (other.name, other.variant_of)):
            raise RegistryError(
                f"model_type {sorted(clash)} of family {family.name!r} is already covered by {other.name!r}"
            )
    _REGISTRY[family.name] = family
    return family


@public
def get_family(name: str) -> Family:
    """The registered family of this name (``list_families()`` lists them); an unknown name is a RegistryError
    that lists the registered ones."""
    if name not in _REGISTRY:
        raise RegistryError(f"unknown model family {name!r}; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def family_for_model_type(model_type: Optional[str], config: Any = None) -> Optional[Family]:
    """The family covering an HF ``config.model_type`` (the variant ``config`` matches), or None."""
    covering = [f for f in _REGISTRY.values() if model_type in f.model_types]
    for family in covering:
        if family.matches is not None and config is not None and family.matches(config):
            return family
    return next((f for f in covering if not f.variant_of), None)


@public
def list_families(**filters: Any) -> list[Family]:
    """Registered families whose fields (or properties) equal every filter.

    ``list_families(modality="vision")``, ``list_families(positions="rotary")``,
    ``list_families(k_bias_inert=True)``.
    """
    known = {f.name for f in fields(Family)} | {"rotary", "k_bias_inert", "score_status", "config_audit"}
    unknown = set(filters) - known
    if unknown:
        raise RegistryError(f"cannot filter families by {sorted(unknown)}; fields: {sorted(known)}")
    return [f for f in _REGISTRY.values() if all(getattr(f, k) == v for k, v in filters.items())]


def adapters() -> dict[str, type]:
    """HF class name -> our TransformerLens adapter, for the families that need one."""
    return {cls: f.adapter for f in _REGISTRY.values() if f.adapter is not None for cls in f.hf_classes}


_TEXT_CAUSAL = dict(modality="text", attention="causal", default_metric="next_token_ce")
_ENCODER = dict(modality="text", attention="bidirectional", default_metric="embedding_cosine")
_VISION = dict(modality="vision", attention="bidirectional", default_metric="feature_cosine")
_ALL = dict(default_biases="qkvo", bias="q, k, v, o")
_QKV = dict(default_biases="qkv", bias="q, k, v (no o)")
_NONE = dict(default_biases="", bias="none")
_QK_NORM = "qk-norm: q and k are normalised after the bias is added, so the score is not bilinear in content + bias"
_ALIBI = "the ALiBi term"


def _lm(name: str, label: str, model_type: str, cls: str, positions: str, biases: dict, **extra: Any) -> Family:
    """A causal LM family; most HF LMs softmax in float32 whatever the model's dtype (say so where not)."""
    return register_family(Family(name, label, (model_type,), (cls,), positions=positions,
                                  tiny=getattr(builders, name.replace("-", "_")), **biases,
                                  **{**_TEXT_CAUSAL, "softmax_float32": True, **extra}))


_lm("gpt2", "GPT-2", "gpt2", "GPT2LMHeadModel", "learned", _ALL, softmax_float32=False)
_lm("neox", "GPT-NeoX / Pythia", "gpt_neox", "GPTNeoXForCausalLM", "rotary", _ALL)
_lm("opt", "OPT", "opt", "OPTForCausalLM", "learned", _ALL)
_lm("qwen2", "Qwen2 / Qwen2.5", "qwen2", "Qwen2ForCausalLM", "rotary",
    dict(default_biases="qkv", bias="q, k, v (no o); GQA"))
_lm("llama", "LLaMA / SmolLM2", "llama", "LlamaForCausalLM", "rotary",
    dict(default_biases="", bias="none (unless `attention_bias`)"))
_lm("gptj", "GPT-J", "gptj", "GPTJForCausalLM", "rotary", _NONE,
    score_refusal="GPT-J rotates interleaved pairs of a partial head inside HF's attention and exposes no "
                  "cos/sin hooks", note="rotary on `rotary_dim` of each head, interleaved")
_lm("bloom", "BLOOM", "bloom", "BloomForCausalLM", "alibi", _ALL, extra_score_term=_ALIBI,
    note="fused query_key_value, split per head")
_lm("falcon", "Falcon (7B style)", "falcon", "FalconForCausalLM", "rotary",
    dict(default_biases="", bias="none (unless `bias`)"), softmax_float32=False,
    note="multi-query: one kv head")
register_family(Family(
    "falcon-rw", "Falcon-RW (ALiBi)", ("falcon",), ("FalconForCausalLM",), positions="alibi", tiny=builders.falcon_rw,
    extra_score_term=_ALIBI, variant_of="falcon", matches=lambda cfg: bool(getattr(cfg, "alibi", False)),
    softmax_float32=True,  # TransformerLens' ALiBi kernel upcasts
    note="a Falcon config with `alibi=True`", **_ALL, **_TEXT_CAUSAL))
_lm("mistral", "Mistral", "mistral", "MistralForCausalLM", "rotary", _NONE, note="GQA")
_lm("mixtral", "Mixtral (MoE)", "mixtral", "MixtralForCausalLM", "rotary", _NONE, note="GQA; mixture-of-experts MLP")
_lm("phi", "Phi-1/1.5/2", "phi", "PhiForCausalLM", "rotary", _ALL, note="partial rotary")
_lm("phi3", "Phi-3", "phi3", "Phi3ForCausalLM", "rotary", _NONE, note="fused qkv_proj, split per head")
_lm("gemma", "Gemma", "gemma", "GemmaForCausalLM", "rotary", _NONE)
_lm("gemma2", "Gemma 2", "gemma2", "Gemma2ForCausalLM", "rotary", _NONE,
    score_refusal="Gemma 2 soft-caps the score with tanh and scales by `query_pre_attn_scalar`",
    note="attention-logit soft-capping")
_lm("qwen2-moe", "Qwen2-MoE", "qwen2_moe", "Qwen2MoeForCausalLM", "rotary", _QKV, note="GQA; mixture-of-experts MLP")
_lm("qwen3", "Qwen3", "qwen3", "Qwen3ForCausalLM", "rotary",
    dict(default_biases="", bias="none (unless `attention_bias`)"),
    qk_norm=True, score_refusal=_QK_NORM, note="per-head RMS qk-norm")
_lm("olmo", "OLMo", "olmo", "OlmoForCausalLM", "rotary", _NONE, note="non-parametric layer norm")
_lm("olmo2", "OLMo 2", "olmo2", "Olmo2ForCausalLM", "rotary", _NONE, qk_norm=True, score_refusal=_QK_NORM,
    note="RMS qk-norm over all heads")
_lm("stablelm", "StableLM 2", "stablelm", "StableLmForCausalLM", "rotary", _QKV,
    note="`use_qkv_bias` (on in StableLM 2 1.6B); rotary on a quarter of each head")
register_family(Family(
    "stablelm-qknorm", "StableLM, `qk_layernorm=True`", ("stablelm",), ("StableLmForCausalLM",), positions="rotary",
    tiny=builders.stablelm_qknorm, qk_norm=True, score_refusal=_QK_NORM, variant_of="stablelm",
    matches=lambda cfg: bool(getattr(cfg, "qk_layernorm", False)), softmax_float32=True,
    note="per-head LayerNorm on q and k (StableLM 2 12B)", **_QKV, **_TEXT_CAUSAL))
register_family(Family(
    "bert", "BERT / MiniLM", ("bert",), ("BertForMaskedLM", "BertModel"), positions="learned", tiny=builders.bert,
    promote={"BertModel": "BertForMaskedLM"}, **_ALL, **_ENCODER,
    note="a bare `BertModel` is wrapped in `BertForMaskedLM` with a random head: read hidden states",
))
register_family(Family(
    "roberta", "RoBERTa", ("roberta",), ("RobertaForMaskedLM", "RobertaModel"), positions="learned",
    tiny=builders.roberta, promote={"RobertaModel": "RobertaForMaskedLM"}, **_ALL, **_ENCODER,
    note="positions offset by the padding index",
))
register_family(Family("vit", "ViT", ("vit",), ("ViTModel", "ViTForImageClassification"), positions="learned",
                       prefix_tokens=1, softmax_float32=True, tiny=builders.vit, **_ALL, **_VISION))
register_family(Family("deit", "DeiT", ("deit",), ("DeiTModel", "DeiTForImageClassification"), positions="learned",
                       prefix_tokens=2, softmax_float32=True, tiny=builders.deit, note="CLS + distillation token",
                       **_ALL, **_VISION))
register_family(Family("dinov2", "DINOv2", ("dinov2",), ("Dinov2Model", "Dinov2ForImageClassification"),
                       positions="learned", prefix_tokens=1, tiny=builders.dinov2, adapter=Dinov2ArchitectureAdapter,
                       note="layer-scale", any_image_size=True, **_ALL, **_VISION))
register_family(Family(
    "dinov2-registers", "DINOv2 with registers", ("dinov2_with_registers",),
    ("Dinov2WithRegistersModel", "Dinov2WithRegistersForImageClassification"), positions="learned", prefix_tokens=1,
    prefix_tokens_field="num_register_tokens", tiny=builders.dinov2_registers,
    adapter=Dinov2RegistersArchitectureAdapter, note="CLS + register tokens; layer-scale", any_image_size=True,
    **_ALL, **_VISION))
register_family(Family("beit", "BEiT", ("beit",), ("BeitModel", "BeitForImageClassification"),
                       positions="relative", default_biases="qvo", bias="q, v, o (no k bias)", prefix_tokens=1,
                       softmax_float32=True, tiny=builders.beit, adapter=BeitArchitectureAdapter,
                       extra_score_term="the relative position bias", note="relative position bias, layer-scale",
                       any_image_size=True, **_VISION))
register_family(Family(
    "clip-vision", "CLIP vision tower", ("clip_vision_model",), ("CLIPVisionModel",), positions="learned",
    prefix_tokens=1, softmax_float32=True, tiny=builders.clip_vision, adapter=ClipVisionArchitectureAdapter,
    note="pre-LN before block 0",
    **_ALL, **_VISION))
register_family(Family(
    "siglip-vision", "SigLIP vision tower", ("siglip_vision_model",), ("SiglipVisionModel",), positions="learned",
    prefix_tokens=0, softmax_float32=True, tiny=builders.siglip_vision, adapter=SiglipVisionArchitectureAdapter,
    note="no CLS token: every position is a patch", **_ALL, **_VISION))


_TIMM = dict(source="timm", adapter=TimmVisionTransformerAdapter, describe=describe_timm,
             prefix_tokens_field="num_prefix_tokens", **_VISION)


def _timm(name: str, label: str, cls: str, positions: str, biases: dict, **extra: Any) -> Family:
    return register_family(Family(name, label, (f"timm:{cls}",), (f"timm:{cls}",), positions=positions,
                                  tiny=getattr(builders, name.replace("-", "_")), **biases, **{**_TIMM, **extra}))


_timm("timm-vit", "timm ViT", "VisionTransformer", "learned",
      dict(default_biases="qkvo", bias="q, k, v (`qkv_bias`), o"),
      note="fused `qkv`, split per head; prefix = class + register tokens, read from the model")
_timm("timm-vit-qknorm", "timm ViT, `qk_norm=True`", "VisionTransformer", "learned",
      dict(default_biases="qkvo", bias="q, k, v, o"), variant_of="timm-vit", matches=lambda cfg: cfg.qk_norm,
      qk_norm=True, score_refusal=_QK_NORM, note="LayerNorm on q and k per head: b_k is not inert without rotary")
_timm("timm-vit-nobias", "timm ViT, `qkv_bias=False`", "VisionTransformer", "learned",
      dict(default_biases="o", bias="o only"), variant_of="timm-vit",
      matches=lambda cfg: not cfg.qkv_bias, note="a timm ViT built without q, k, v bias")
_timm("timm-vit-registers", "timm ViT, registers, no class token", "VisionTransformer", "learned",
      dict(default_biases="qkvo", bias="q, k, v, o"), variant_of="timm-vit",
      matches=lambda cfg: not cfg.class_token and cfg.num_prefix_tokens > 0,
      note="`class_token=False, reg_tokens=n`: every prefix token is a register")
_timm("timm-deit", "timm DeiT (distilled)", "VisionTransformerDistilled", "learned", _ALL,
      note="class + distillation token")
_timm("timm-deit-qknorm", "timm DeiT, `qk_norm=True`", "VisionTransformerDistilled", "learned", _ALL,
      variant_of="timm-deit", matches=lambda cfg: cfg.qk_norm, qk_norm=True, score_refusal=_QK_NORM,
      note="LayerNorm on q and k per head: b_k is not inert without rotary")
_timm("timm-eva", "timm EVA-02", "Eva", "rotary", dict(default_biases="qvo", bias="q, v, o (no k bias)"),
      score_refusal="EVA's 2D rotary runs inside timm's attention, with no cos/sin hooks to rotate the terms",
      note="2D rotary on the patches (not the prefix tokens)")
_timm("timm-beit", "timm BEiT", "Beit", "relative", dict(default_biases="qvo", bias="q, v, o (no k bias)"),
      extra_score_term="the relative position bias", note="relative position bias, layer-scale")
register_family(Family(
    "open-clip-vit", "open_clip vision tower", ("open_clip:VisionTransformer",), ("open_clip:VisionTransformer",),
    positions="learned", tiny=builders.open_clip_vit, source="open_clip", adapter=OpenClipVisionAdapter,
    describe=describe_open_clip, prefix_tokens_field="num_prefix_tokens", **_ALL, **_VISION,
    note="`nn.MultiheadAttention` (fused `in_proj`), split per head; output = the projected pooled embedding"))


# ----- the family table of docs/models.md, generated -------------------------------------

README_START = "<!-- families:start (generated by `interp families --readme docs/models.md`) -->"
README_END = "<!-- families:end -->"


def families_markdown() -> str:
    """The documentation's table of supported families (docs/models.md), from the registry."""
    lines = ["| family | classes | QKV bias (present) | positions | b_k inert by identity | score decomposition "
             "| config audit | adapter | notes |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in _REGISTRY.values():
        classes = ", ".join(f"`{c}`" for c in f.hf_classes)
        adapter = f"ours (`{f.adapter.__module__}`)" if f.adapter else "TransformerLens"
        inert = "yes" if f.k_bias_inert else "no (" + ("qk-norm" if f.qk_norm else f.positions) + ")"
        lines.append(f"| {f.label} | {classes} | {f.bias} | {f.positions} | {inert} | {f.score_status} "
                     f"| {audit_summary(f)} | {adapter} | {f.note} |")
    return "\n".join(lines)


def readme_with_families(text: str) -> str:
    """``text`` with the block between the family markers replaced by ``families_markdown()``."""
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise RegistryError("the file has no family-table markers (<!-- families:start ... --> <!-- families:end -->)")
    return pattern.sub(lambda _: f"{README_START}\n{families_markdown()}\n{README_END}", text)

