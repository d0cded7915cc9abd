"""TransformerLens adapter for DINOv2 (``Dinov2Model`` / ``Dinov2ForImageClassification``)."""

from __future__ import annotations

from typing import Any

from transformer_lens.model_bridge.generalized_components import BlockBridge
from transformer_lens.model_bridge.generalized_components.vision_classifier_head import (
    VisionClassifierHeadBridge,
)
from transformer_lens.model_bridge.supported_architectures.vit import ViTArchitectureAdapter

from interp.models.adapters.common import MLP_HOOK_ALIASES, PatchEmbeddingsBridge, attention, mlp, norm
from interp.models.adapters.common import prefix as backbone_prefix


class Dinov2ArchitectureAdapter(ViTArchitectureAdapter):
    """DINOv2, MLP variant (S/B/L).

    Pre-LN blocks with layer-scale: ``h + ls1 * attn(norm1(h))`` then
    ``h + ls2 * mlp(norm2(h))``; the bridge runs HF's ``Dinov2Layer.forward``, so the
    layer-scale is applied exactly as HF does.
    """

    def _build_component_mapping(self, prefix: str, with_classifier: bool) -> dict[str, Any]:
        p = prefix
        mapping: dict[str, Any] = {
            "embed": PatchEmbeddingsBridge(name=f"{p}embeddings"),
            "blocks": BlockBridge(
                name=f"{p}encoder.layer",
                hook_alias_overrides=dict(MLP_HOOK_ALIASES),
                submodules={
                    "ln1": norm("norm1", self.cfg),
                    "ln2": norm("norm2", self.cfg),
                    "attn": attention(self.cfg),
                    "mlp": mlp(self.cfg),
                },
            ),
            "ln_final": norm(f"{p}layernorm", self.cfg),
        }
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
