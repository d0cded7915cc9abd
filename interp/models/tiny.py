"""Small random-init HF models of every registered family, built offline.

Used by the tests (parametrised over ``TINY_FAMILIES``, read from the registry) and handy
for trying the API without weights. Every bias the architecture has is given random
nonzero values, so no check can pass by accident on zeros.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp.errors import RegistryError
from interp.models.builders import IMAGE, VOCAB, TinySize
from interp.models.families import get_family, list_families
from interp.models.info import family_of

TINY_FAMILIES: tuple[str, ...] = tuple(f.name for f in list_families())


def tiny_hf_model(
    family: str,
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    d_head: int = 8,
    n_kv_heads: int | None = None,
    seed: int = 0,
    bias_scale: float = 0.5,
    config: Optional[dict[str, Any]] = None,
) -> nn.Module:
    """A random-init HF model of ``family`` with random nonzero biases, in eval mode.

    ``n_kv_heads`` applies to the grouped-query families (qwen2, llama); default n_heads // 2.
    ``config`` overrides HF config fields (``{"sliding_window": 4}``; the config is built again
    with them, so fields it derives, such as ``layer_types``, follow), or a timm / open_clip
    model's constructor arguments.
    """
    size = TinySize(n_layers, n_heads, d_head, max(1, n_heads // 2) if n_kv_heads is None else n_kv_heads)
    torch.manual_seed(seed)
    spec = get_family(family)
    if spec.source != "transformers":  # timm / open_clip: ``config`` are constructor arguments
        model = spec.tiny(size, **(config or {}))
    else:
        model = spec.tiny(size)
        if config:
            model = _rebuilt(model, config, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "lambda" in name or "layer_scale" in name:
                param.add_(bias_scale * torch.randn(param.shape, generator=gen))
            if "relative_position_bias_table" in name:
                param.normal_(0.0, 0.5, generator=gen)
    return model.eval()


_DERIVED = ("layer_types", "rope_scaling", "transformers_version", "architectures")


def _rebuilt(model: nn.Module, overrides: dict[str, Any], seed: int) -> nn.Module:
    """``model``'s class built again from its config with ``overrides`` (derived fields recomputed)."""
    if not hasattr(model, "config") or not hasattr(model.config, "to_dict"):
        raise RegistryError(f"{type(model).__name__} has no HF config to override")
    fields = {k: v for k, v in model.config.to_dict().items() if k not in _DERIVED}
    config = type(model.config)(**{**fields, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return type(model)(config)


def tiny_inputs(
    model_or_family: Any, batch: int = 2, pos: int = 7, seed: int = 0
) -> Int[Tensor, "batch pos"] | Float[Tensor, "batch 3 32 32"]:
    """Random token ids ``[batch, pos]`` or pixel values ``[batch, 3, 32, 32]``."""
    if isinstance(model_or_family, str):
        family = get_family(model_or_family)
    else:
        info = getattr(model_or_family, "interp", None)
        family = info.spec if info is not None else family_of(model_or_family)
    gen = torch.Generator().manual_seed(seed)
    if family.modality == "vision":
        return torch.randn(batch, 3, IMAGE, IMAGE, generator=gen)
    return torch.randint(0, VOCAB, (batch, pos), generator=gen)
