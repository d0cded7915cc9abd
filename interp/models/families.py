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

from interp.errors import RegistryError
import interp.models.builders as builders
from interp.models.adapters import BeitArchitectureAdapter, Dinov2ArchitectureAdapter
from interp.types import Attention, Modality, Positions


@dataclass(frozen=True)
class Family:
    """What the library knows about one architecture family."""

    name: str
    label: str  # for people: "GPT-NeoX / Pythia"
    model_types: tuple[str, ...]  # HF config.model_type values it covers
    hf_classes: tuple[str, ...]  # HF classes the bridge wraps
    modality: Modality
    attention: Attention
    positions: Positions
    bias: str  # the attention biases the architecture has, for people ("q, v, o (no k bias)")
    default_biases: str  # the same as kinds, e.g. "qvo": what a default config of the family builds
    tiny: Callable[[builders.TinySize], nn.Module]
    default_metric: str  # the ablation metric when none is asked for
    qk_norm: bool = False
    softmax_float32: bool = False  # HF's eager attention softmaxes in float32 even for a float64 model
    prefix_tokens: int = 0  # CLS (+ distillation) tokens before the patch grid
    adapter: Optional[type] = None  # our TransformerLens adapter; None: TransformerLens' own
    promote: dict[str, str] = field(default_factory=dict)  # bare class -> head class TL wraps
    note: str = ""

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary"

    @property
    def k_bias_inert(self) -> bool:
        """Whether b_k provably cannot change the attention pattern (softmax cancels it)."""
        return self.positions != "rotary"

    def __hash__(self) -> int:
        return hash(self.name)


_REGISTRY: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add ``family`` to the registry; a second family with its name or model_type fails."""
    if family.name in _REGISTRY:
        raise RegistryError(f"model family {family.name!r} is already registered")
    for other in _REGISTRY.values():
        clash = set(other.model_types) & set(family.model_types)
        if clash:
            raise RegistryError(
                f"model_type {sorted(clash)} of family {family.name!r} is already covered by {other.name!r}"
            )
    _REGISTRY[family.name] = family
    return family


def get_family(name: str) -> Family:
    if name not in _REGISTRY:
        raise RegistryError(f"unknown model family {name!r}; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def family_for_model_type(model_type: Optional[str]) -> Optional[Family]:
    """The family covering an HF ``config.model_type``, or None."""
    for family in _REGISTRY.values():
        if model_type in family.model_types:
            return family
    return None


def list_families(**filters: Any) -> list[Family]:
    """Registered families whose fields (or properties) equal every filter.

    ``list_families(modality="vision")``, ``list_families(positions="rotary")``,
    ``list_families(k_bias_inert=True)``.
    """
    known = {f.name for f in fields(Family)} | {"rotary", "k_bias_inert"}
    unknown = set(filters) - known
    if unknown:
        raise RegistryError(f"cannot filter families by {sorted(unknown)}; fields: {sorted(known)}")
    return [f for f in _REGISTRY.values() if all(getattr(f, k) == v for k, v in filters.items())]


def adapters() -> dict[str, type]:
    """HF class name -> our TransformerLens adapter, for the families that need one."""
    return {cls: f.adapter for f in _REGISTRY.values() if f.adapter is not None for cls in f.hf_classes}


_TEXT_CAUSAL = dict(modality="text", attention="causal", default_metric="next_token_ce")
_VISION = dict(modality="vision", attention="bidirectional", default_metric="feature_cosine")
_ALL = dict(default_biases="qkvo", bias="q, k, v, o")

register_family(Family("gpt2", "GPT-2", ("gpt2",), ("GPT2LMHeadModel",), positions="learned",
                       tiny=builders.gpt2, **_ALL, **_TEXT_CAUSAL))
register_family(Family("neox", "GPT-NeoX / Pythia", ("gpt_neox",), ("GPTNeoXForCausalLM",), positions="rotary",
                       softmax_float32=True, tiny=builders.neox, **_ALL, **_TEXT_CAUSAL))
register_family(Family("opt", "OPT", ("opt",), ("OPTForCausalLM",), positions="learned",
                       softmax_float32=True, tiny=builders.opt, **_ALL, **_TEXT_CAUSAL))
register_family(Family("qwen2", "Qwen2", ("qwen2",), ("Qwen2ForCausalLM",), positions="rotary",
                       default_biases="qkv", bias="q, k, v (no o); GQA", softmax_float32=True,
                       tiny=builders.qwen2, **_TEXT_CAUSAL))
register_family(Family("llama", "LLaMA / SmolLM2", ("llama",), ("LlamaForCausalLM",), positions="rotary",
                       default_biases="", bias="none (unless `attention_bias`)", softmax_float32=True,
                       tiny=builders.llama, **_TEXT_CAUSAL))
register_family(Family(
    "bert", "BERT / MiniLM", ("bert",), ("BertForMaskedLM", "BertModel"), modality="text",
    attention="bidirectional", positions="learned", tiny=builders.bert, default_metric="embedding_cosine",
    promote={"BertModel": "BertForMaskedLM"}, **_ALL,
    note="a bare `BertModel` is wrapped in `BertForMaskedLM` with a random head: read hidden states",
))
register_family(Family("vit", "ViT", ("vit",), ("ViTModel", "ViTForImageClassification"), positions="learned",
                       prefix_tokens=1, softmax_float32=True, tiny=builders.vit, **_ALL, **_VISION))
register_family(Family("deit", "DeiT", ("deit",), ("DeiTModel", "DeiTForImageClassification"), positions="learned",
                       prefix_tokens=2, softmax_float32=True, tiny=builders.deit, note="CLS + distillation token",
                       **_ALL, **_VISION))
register_family(Family("dinov2", "DINOv2", ("dinov2",), ("Dinov2Model", "Dinov2ForImageClassification"),
                       positions="learned", prefix_tokens=1, tiny=builders.dinov2, adapter=Dinov2ArchitectureAdapter,
                       note="layer-scale", **_ALL, **_VISION))
register_family(Family("beit", "BEiT", ("beit",), ("BeitModel", "BeitForImageClassification"),
                       positions="relative", default_biases="qvo", bias="q, v, o (no k bias)", prefix_tokens=1,
                       softmax_float32=True, tiny=builders.beit, adapter=BeitArchitectureAdapter,
                       note="relative position bias, layer-scale", **_VISION))


# ----- the README's family table, generated ----------------------------------------------

README_START = "<!-- families:start (generated by `interp families --readme README.md`) -->"
README_END = "<!-- families:end -->"


def families_markdown() -> str:
    """The README's table of supported families, from the registry."""
    lines = ["| family | HF classes | QKV bias (present) | positions | attention | adapter | notes |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in _REGISTRY.values():
        classes = ", ".join(f"`{c}`" for c in f.hf_classes)
        adapter = f"ours (`{f.adapter.__module__}`)" if f.adapter else "TransformerLens"
        lines.append(f"| {f.label} | {classes} | {f.bias} | {f.positions} | {f.attention} | {adapter} | {f.note} |")
    return "\n".join(lines)


def readme_with_families(text: str) -> str:
    """``text`` with the block between the family markers replaced by ``families_markdown()``."""
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise RegistryError("README has no family-table markers")
    return pattern.sub(lambda _: f"{README_START}\n{families_markdown()}\n{README_END}", text)

