"""``ModelInfo``: what the library needs to know about one loaded model, beyond TL's cfg."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import transformers
from torch import nn
from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

from interp.errors import RegistryError, UnknownSourceError, UnsupportedModelError
from interp.models.audit import ATTENTION_RELEVANT, COMMON, check_config, refusals
from interp.models.families import Family, family_for_model_type, get_family, list_families
from interp.types import Attention, Modality, Positions


@dataclass
class ModelInfo:
    """Sizes and the family facts of a loaded model (``model.interp``)."""

    name: str
    architecture: str  # the HF class the bridge wraps
    family: str  # a name in the family registry
    modality: Modality
    attention: Attention
    positions: Positions
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    image_size: Optional[int] = None
    patch_size: Optional[int] = None
    num_channels: Optional[int] = None
    n_prefix_tokens: int = 0  # CLS (+ distillation) tokens before the patch grid
    max_positions: Optional[int] = None
    vocab_size: Optional[int] = None
    random_head: bool = False  # True when the task head was freshly initialised by us
    notes: list[str] = field(default_factory=list)
    inferred_family: Optional[Family] = None  # an architecture outside the registry: what was inferred
    windows: tuple[Optional[int], ...] = ()  # per layer: HF's sliding window (keys j with i - w < j <= i), or None
    score_scales: tuple[float, ...] = ()  # per layer: the factor on q.k (1/sqrt(d_head), GPT-2's 1/(layer + 1))
    config_refusal: str = ""  # why this model's config refuses the four score terms (the config audit)

    @property
    def spec(self) -> Family:
        """The registry entry of this model's family (or the family inferred for an unregistered one); a
        config the audit refuses for the score terms (``clip_qkv``) says so in its ``score_refusal``."""
        family = self.inferred_family or get_family(self.family)
        if self.config_refusal and not family.score_refusal:
            return replace(family, score_refusal=self.config_refusal)
        return family

    def window(self, layer: int) -> Optional[int]:
        """The sliding window of ``layer`` (None: every earlier key)."""
        return self.windows[layer] if self.windows else None

    def score_scale(self, layer: int) -> float:
        """The factor HF puts on q.k at ``layer``."""
        return self.score_scales[layer] if self.score_scales else self.d_head ** -0.5

    @property
    def rotary(self) -> bool:
        """Whether q and k rotate by position (so b_q and b_k rotate too): the family's fact, said once."""
        return self.spec.rotary

    @property
    def causal(self) -> bool:
        return self.attention == "causal"

    def heads(self, kind: str) -> int:
        """Heads of a kind: query heads for q and o, kv heads for k and v."""
        return self.n_kv_heads if kind in ("k", "v") else self.n_heads


def require_family(model_type: Optional[str], architecture: str, config: Any = None) -> Family:
    """The registered family of an HF ``model_type``, or ``UnsupportedModelError`` naming the nearest ones.

    An architecture TransformerLens bridges but the registry does not describe passes here
    (``family_of`` infers its facts once the model is built).
    """
    family = family_for_model_type(model_type, config)
    if family is not None:
        return family
    if architecture in SUPPORTED_ARCHITECTURES:
        return _UNDESCRIBED
    known = {t: f.label for f in list_families() for t in (*f.model_types, f.name)}
    near = difflib.get_close_matches(str(model_type).lower(), list(known), n=3, cutoff=0.4)
    near += [a for a in difflib.get_close_matches(architecture, list(SUPPORTED_ARCHITECTURES), n=3, cutoff=0.6)]
    raise UnsupportedModelError(
        f"unsupported architecture {architecture} (model_type={model_type!r}): neither interp's family registry nor "
        f"TransformerLens' bridge describes it. Nearest supported: {', '.join(dict.fromkeys(near)) or 'none close'}; "
        "`interp families` lists all"
    )


def _source_key(model: nn.Module) -> tuple[str, str]:
    """(model_type, architecture) naming ``model`` in the registry: the HF config's model_type and
    class, or ``"<package>:<class>"`` for other libraries' models ("timm:Eva")."""
    if isinstance(model, transformers.PreTrainedModel):
        return str(getattr(model.config, "model_type", None)), type(model).__name__
    package = type(model).__module__.split(".")[0]
    if package not in {f.source for f in list_families()}:
        raise UnknownSourceError(f"expected a transformers, timm or open_clip model, got {type(model).__name__} "
                                 f"({type(model).__module__})")
    key = f"{package}:{type(model).__name__}"
    return key, key


def family_of(hf_model: nn.Module) -> Family:
    """The family of an in-memory model: registered (with the variant its config matches), or
    inferred for an HF architecture TransformerLens bridges."""
    model_type, architecture = _source_key(hf_model)
    family = require_family(model_type, architecture)
    if family is _UNDESCRIBED:
        family = _infer_family(hf_model)
        check_config(family, hf_model)
        return family
    check_config(family, hf_model)  # before ``describe``, which reads the modules the audit may refuse
    config = family.describe(hf_model) if family.describe is not None else getattr(hf_model, "config", None)
    family = family_for_model_type(model_type, config) or family
    check_config(family, hf_model)  # the variant's own entries
    return family


def _no_tiny(size: Any) -> nn.Module:
    raise RegistryError("an inferred family has no tiny builder: register a Family to get one")


_UNDESCRIBED = Family("undescribed", "undescribed", (), (), modality="text", attention="causal", positions="none",
                      bias="", default_biases="", tiny=_no_tiny, default_metric="", inferred="undescribed")
_ROTARY_FIELDS = ("rope_theta", "rotary_dim", "rotary_pct", "rope_scaling", "rope_parameters", "partial_rotary_factor",
                  "rotary_emb_base")


def _infer_positions(hf_model: nn.Module, cfg: Any) -> tuple[str, str]:
    """(position scheme, what it was read from) for an architecture the registry does not describe."""
    attn_config = getattr(cfg, "attn_config", None)
    if getattr(cfg, "alibi", False) or getattr(attn_config, "alibi", False) or (
            isinstance(attn_config, dict) and attn_config.get("alibi")):
        return "alibi", "the config's `alibi`"
    rotary = [f for f in _ROTARY_FIELDS if getattr(cfg, f, None) is not None]
    rotary += [n for n, _ in hf_model.named_modules() if "rotary" in n.lower()][:1]
    if rotary:
        return "rotary", f"`{rotary[0]}`"
    learned = [n for n, m in hf_model.named_modules() if isinstance(m, nn.Embedding)
               and n.rsplit(".", 1)[-1] in ("wpe", "embed_positions", "position_embeddings")]
    if learned:
        return "learned", f"the embedding `{learned[0]}`"
    absolute = [(n, type(m).__name__) for n, m in hf_model.named_modules()
                if n.rsplit(".", 1)[-1] in ("wpe", "embed_positions", "position_embeddings")]
    if absolute:  # e.g. sinusoidal: added to the input like a learned table
        return "learned", f"the absolute position module `{absolute[0][0]}` ({absolute[0][1]})"
    return "none", "no position embedding, rotary or ALiBi field found"


def _infer_family(hf_model: nn.Module) -> Family:
    """Facts for an architecture TransformerLens bridges but the registry does not describe, read
    from its config and module names. No identity is claimed for it (``k_bias_inert`` is False)
    and the score decomposition refuses it: its scale and extra score terms are not known."""
    cfg, arch = hf_model.config, type(hf_model).__name__
    positions, source = _infer_positions(hf_model, cfg)
    causal = arch.endswith("ForCausalLM")
    qk_norm = any(n.rsplit(".", 1)[-1] in ("q_norm", "k_norm", "q_layernorm", "k_layernorm")
                  for n, _ in hf_model.named_modules())
    what = (f"positions={positions} (from {source}), attention={'causal' if causal else 'bidirectional'} "
            f"(from the class name), qk-norm={'yes' if qk_norm else 'no'} (from module names); "
            "bias presence is read from the modules") + _unaudited(cfg)
    return Family(
        f"inferred:{cfg.model_type}", f"{arch} (inferred)", (cfg.model_type,), (arch,), modality="text",
        attention="causal" if causal else "bidirectional", positions=positions, bias="read from the modules",
        default_biases="", tiny=_no_tiny, default_metric="next_token_ce" if causal else "embedding_cosine",
        qk_norm=qk_norm, inferred=what,
        score_refusal="the registry does not describe this architecture, so its score scale and extra score "
                      "terms (ALiBi, soft-capping, norms) are not known",
    )


def _unaudited(cfg: Any) -> str:
    """The attention-relevant config attributes that differ from the class's defaults and that the common
    audit does not cover, for the inferred family's note: TransformerLens' bridge gets them unverified."""
    try:
        default = type(cfg)()
    except Exception:  # noqa: BLE001 - a config class that needs arguments: compare with nothing
        default = None
    covered = {name for name, entry in COMMON.items() if entry.status != "refused"}
    differ = [f"{k}={v!r}" for k, v in sorted(vars(cfg).items()) if not k.startswith("_") and k not in covered
              and ATTENTION_RELEVANT.search(k) and (default is None or getattr(default, k, None) != v)]
    return ("; attention settings not in the config audit, taken as TransformerLens' bridge runs them: "
            + ", ".join(differ)) if differ else ""


def _first(cfg: Any, *names: str) -> Any:
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    return None


def _max_positions(hf_model: nn.Module, cfg: Any) -> Optional[int]:
    """The longest sequence the model can embed. A position table with a padding index (RoBERTa and
    its kin) numbers positions from padding_idx + 1, so it holds padding_idx + 1 fewer."""
    n = _first(cfg, "max_position_embeddings", "n_positions")
    for name, module in hf_model.named_modules():
        if (name.rsplit(".", 1)[-1] == "position_embeddings" and isinstance(module, nn.Embedding)
                and module.padding_idx is not None):
            return min(int(n or module.num_embeddings), module.num_embeddings) - module.padding_idx - 1
    return None if n is None else int(n)


def _windows(cfg: Any, n_layers: int) -> tuple[Optional[int], ...]:
    """Each layer's sliding window as HF's masks apply it: ``sliding_window`` on the layers ``layer_types``
    marks "sliding_attention" (Qwen2, Qwen3, Gemma 2), on every layer without ``layer_types`` (Mistral,
    Mixtral, Phi-3); () when there is none (None, or Qwen2-MoE's 0)."""
    window = getattr(cfg, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return ()
    types = getattr(cfg, "layer_types", None)
    if types:
        return tuple(window if t == "sliding_attention" else None for t in list(types)[:n_layers])
    return (window,) * n_layers


def model_info(hf_model: nn.Module, family: Family, name: str, random_head: bool = False) -> ModelInfo:
    """Read sizes from the HF config; family facts from the registry."""
    cfg = hf_model.config
    d_model = int(_first(cfg, "hidden_size", "n_embd"))
    architecture = _source_key(hf_model)[1]
    n_heads = int(_first(cfg, "num_attention_heads", "n_head"))
    info = ModelInfo(
        name=name, architecture=architecture, family=family.name, modality=family.modality,
        attention=family.attention, positions=family.positions,
        n_layers=int(_first(cfg, "num_hidden_layers", "n_layer")), n_heads=n_heads,
        n_kv_heads=int(_first(cfg, "num_key_value_heads") or n_heads),
        d_head=int(_first(cfg, "head_dim") or d_model // n_heads), d_model=d_model, random_head=random_head,
    )
    if family.modality == "vision":
        info.image_size, info.patch_size = int(cfg.image_size), int(cfg.patch_size)
        info.num_channels = int(cfg.num_channels)
        registers = int(getattr(cfg, family.prefix_tokens_field, 0) or 0) if family.prefix_tokens_field else 0
        info.n_prefix_tokens = family.prefix_tokens + registers
    else:
        info.max_positions = _max_positions(hf_model, cfg)
        info.vocab_size = _first(cfg, "vocab_size")
    info.windows = _windows(cfg, info.n_layers)
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):  # GPT-2: layer l's scores divided by l + 1
        info.score_scales = tuple(info.d_head ** -0.5 / (layer + 1) for layer in range(info.n_layers))
    info.config_refusal = "; ".join(refusals(family, hf_model, scope="terms"))
    if random_head:
        info.notes.append("task head freshly initialised: read hidden states, not logits")
    if family.inferred:
        info.inferred_family = family
        info.notes.append(f"family inferred: {family.inferred}")
    return info
