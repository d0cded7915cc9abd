"""TransformerLens adapters for the CLIP and SigLIP vision towers (``CLIPVisionModel``, ``SiglipVisionModel``)."""

from __future__ import annotations

from typing import Any

from transformer_lens.model_bridge.supported_architectures.vit import ViTArchitectureAdapter

from interp.models.adapters.common import EmbeddingsBridge, norm, vit_mapping


def _tower_mapping(cfg: Any) -> dict[str, Any]:
    return vit_mapping(cfg, "", "encoder.layers", "layer_norm1", "layer_norm2", attn="self_attn", out="out_proj",
                       embed=EmbeddingsBridge)


class ClipVisionArchitectureAdapter(ViTArchitectureAdapter):
    """CLIP vision tower: CLS + patches, a layer norm before block 0 (``pre_layrnorm``), pre-LN blocks.

    The tower's output is the final hidden states; ``post_layernorm`` only normalises the pooled CLS.
    """

    def prepare_model(self, hf_model: Any) -> None:
        self.component_mapping = _tower_mapping(self.cfg)


class SiglipVisionArchitectureAdapter(ViTArchitectureAdapter):
    """SigLIP vision tower: patches only (no CLS token), pre-LN blocks, ``post_layernorm`` on every position.

    The attention-pooling head (its own ``nn.MultiheadAttention``) is not a block and is left unhooked.
    """

    def prepare_model(self, hf_model: Any) -> None:
        self.component_mapping = _tower_mapping(self.cfg)
        self.component_mapping["ln_final"] = norm("post_layernorm", self.cfg)
