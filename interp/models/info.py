"""``ModelInfo``: what the library needs to know about one loaded model, beyond TL's cfg."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from torch import nn

from interp.errors import UnsupportedModelError
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

    @property
    def spec(self) -> Family:
        """The registry entry of this model's family."""
        return get_family(self.family)

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary"

    @property
    def causal(self) -> bool:
        return self.attention == "causal"

    def heads(self, kind: str) -> int:
        """Heads of a kind: query heads for q and o, kv heads for k and v."""
        return self.n_kv_heads if kind in ("k", "v") else self.n_heads


def require_family(model_type: Optional[str], architecture: str) -> Family:
    """The registered family of an HF ``model_type``, or ``UnsupportedModelError`` naming the supported ones."""
    family = family_for_model_type(model_type)
    if family is None:
        supported = ", ".join(sorted(t for f in list_families() for t in f.model_types))
        raise UnsupportedModelError(
            f"unsupported architecture {architecture} (model_type={model_type!r}); supported families: {supported}"
        )
    return family


def family_of(hf_model: nn.Module) -> Family:
    """The registered family of an in-memory HF model (see ``require_family``)."""
    return require_family(getattr(getattr(hf_model, "config", None), "model_type", None), type(hf_model).__name__)


def _first(cfg: Any, *names: str) -> Any:
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    return None


def model_info(hf_model: nn.Module, family: Family, name: str, random_head: bool = False) -> ModelInfo:
    """Read sizes from the HF config; family facts from the registry."""
    cfg = hf_model.config
    d_model = int(_first(cfg, "hidden_size", "n_embd"))
    n_heads = int(_first(cfg, "num_attention_heads", "n_head"))
    info = ModelInfo(
        name=name, architecture=type(hf_model).__name__, family=family.name, modality=family.modality,
        attention=family.attention, positions=family.positions,
        n_layers=int(_first(cfg, "num_hidden_layers", "n_layer")), n_heads=n_heads,
        n_kv_heads=int(_first(cfg, "num_key_value_heads") or n_heads),
        d_head=int(_first(cfg, "head_dim") or d_model // n_heads), d_model=d_model, random_head=random_head,
    )
    if family.modality == "vision":
        info.image_size, info.patch_size = int(cfg.image_size), int(cfg.patch_size)
        info.num_channels, info.n_prefix_tokens = int(cfg.num_channels), family.prefix_tokens
    else:
        info.max_positions = _first(cfg, "max_position_embeddings", "n_positions")
        info.vocab_size = _first(cfg, "vocab_size")
    if random_head:
        info.notes.append("task head freshly initialised: read hidden states, not logits")
    return info
