"""TransformerLens adapter for BEiT (``BeitModel`` / ``BeitForImageClassification``)."""

from __future__ import annotations

from typing import Any

import torch
from transformer_lens.model_bridge.generalized_components.vision_classifier_head import (
    VisionClassifierHeadBridge,
)
from transformer_lens.model_bridge.supported_architectures.vit import ViTArchitectureAdapter

from interp.models.adapters.common import norm, vit_mapping
from interp.models.adapters.common import prefix as backbone_prefix


class BeitArchitectureAdapter(ViTArchitectureAdapter):
    """BEiT: q and v have biases, k has none (``k_proj`` is built with ``bias=False``).

    Relative position bias and layer-scale ``lambda_1/2`` stay inside HF's forward.
    With ``use_mean_pooling`` the final ``layernorm`` is an identity and the norm
    lives in the pooler, so ``ln_final`` is only mapped when it is a real LayerNorm.
    """

    def _build_component_mapping(self, prefix: str, with_classifier: bool) -> dict[str, Any]:
        mapping = vit_mapping(self.cfg, prefix, "layers", "layernorm_before", "layernorm_after")
        if with_classifier:
            mapping["unembed"] = VisionClassifierHeadBridge(name="classifier")
        return mapping

    def prepare_model(self, hf_model: Any) -> None:
        p = backbone_prefix(hf_model, "beit")
        self.component_mapping = self._build_component_mapping(p, with_classifier=hasattr(hf_model, "classifier"))
        base = hf_model.beit if p else hf_model
        if isinstance(base.layernorm, torch.nn.LayerNorm):
            self.component_mapping["ln_final"] = norm(f"{p}layernorm", self.cfg)
