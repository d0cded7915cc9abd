"""TransformerLens adapter for DINOv2 (``Dinov2Model`` / ``Dinov2ForImageClassification``)."""

from __future__ import annotations

from typing import Any

from transformer_lens.model_bridge.generalized_components.vision_classifier_head import (
    VisionClassifierHeadBridge,
)
from transformer_lens.model_bridge.supported_architectures.vit import ViTArchitectureAdapter

from interp.models.adapters.common import norm, vit_mapping
from interp.models.adapters.common import prefix as backbone_prefix


class Dinov2ArchitectureAdapter(ViTArchitectureAdapter):
    """DINOv2, MLP variant (S/B/L).

    Pre-LN blocks with layer-scale: ``h + ls1 * attn(norm1(h))`` then
    ``h + ls2 * mlp(norm2(h))``; the bridge runs HF's ``Dinov2Layer.forward``, so the
    layer-scale is applied exactly as HF does.
    """

    def _build_component_mapping(self, prefix: str, with_classifier: bool) -> dict[str, Any]:
        mapping = vit_mapping(self.cfg, prefix, "encoder.layer", "norm1", "norm2")
        mapping["ln_final"] = norm(f"{prefix}layernorm", self.cfg)
        if with_classifier:
            mapping["unembed"] = VisionClassifierHeadBridge(name="classifier")
        return mapping

    def prepare_model(self, hf_model: Any) -> None:
        if getattr(hf_model.config, "use_swiglu_ffn", False):
            raise NotImplementedError(
                "DINOv2 with SwiGLU MLP (giant variants) is not supported; the MLP variant (S/B/L) is."
            )
        self.component_mapping = self._build_component_mapping(
            backbone_prefix(hf_model, "dinov2"), with_classifier=hasattr(hf_model, "classifier")
        )


class Dinov2RegistersArchitectureAdapter(Dinov2ArchitectureAdapter):
    """DINOv2 with registers: the same blocks; CLS + ``num_register_tokens`` before the patches."""

    def prepare_model(self, hf_model: Any) -> None:
        self.component_mapping = self._build_component_mapping(
            backbone_prefix(hf_model, "dinov2_with_registers"), with_classifier=hasattr(hf_model, "classifier")
        )
