"""TransformerLens adapters for the two vision families TL 4.x lacks: DINOv2 and BEiT.

Both wrap the HF modules as they are (the bridge delegates every forward to HF), so
layer-scale (DINOv2 ``layer_scale1/2``, BEiT ``lambda_1/2``) and BEiT's relative
position bias are HF's own math, untouched. Hook names are the usual ones:
``blocks.{l}.attn.hook_q|hook_k|hook_v|hook_z|hook_pattern``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
from transformer_lens.model_bridge.generalized_components import (
    AttentionBridge,
    BlockBridge,
    LinearBridge,
    MLPBridge,
    NormalizationBridge,
)
from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent
from transformer_lens.model_bridge.generalized_components.vision_classifier_head import (
    VisionClassifierHeadBridge,
)
from transformer_lens.model_bridge.supported_architectures.vit import ViTArchitectureAdapter


class PatchEmbeddingsBridge(GeneralizedComponent):
    """Embeddings whose HF forward is ``(pixel_values, bool_masked_pos=None)``.

    TL's ``VisionEmbeddingsBridge`` always passes ``interpolate_pos_encoding``, which
    ``Dinov2Embeddings`` and ``BeitEmbeddings`` do not accept.
    """

    def forward(
        self,
        pixel_values: torch.Tensor,
        bool_masked_pos: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> Any:
        return super().forward(pixel_values, bool_masked_pos=bool_masked_pos)


def _attention(cfg: Any) -> AttentionBridge:
    return AttentionBridge(
        name="attention",
        config=cfg,
        submodules={
            "q": LinearBridge(name="q_proj"),
            "k": LinearBridge(name="k_proj"),
            "v": LinearBridge(name="v_proj"),
            "o": LinearBridge(name="o_proj"),
        },
    )


def _mlp(cfg: Any) -> MLPBridge:
    return MLPBridge(
        name="mlp",
        config=cfg,
        submodules={"in": LinearBridge(name="fc1"), "out": LinearBridge(name="fc2")},
    )


def _norm(name: str, cfg: Any) -> NormalizationBridge:
    return NormalizationBridge(name=name, config=cfg, use_native_layernorm_autograd=True)


def _prefix(hf_model: Any, attr: str) -> str:
    return f"{attr}." if hasattr(hf_model, attr) else ""


class Dinov2ArchitectureAdapter(ViTArchitectureAdapter):
    """DINOv2 (``Dinov2Model`` / ``Dinov2ForImageClassification``), MLP variant.

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
                hook_alias_overrides={
                    "hook_mlp_out": "mlp.out.hook_out",
                    "hook_mlp_in": "mlp.in.hook_in",
                },
                submodules={
                    "ln1": _norm("norm1", self.cfg),
                    "ln2": _norm("norm2", self.cfg),
                    "attn": _attention(self.cfg),
                    "mlp": _mlp(self.cfg),
                },
            ),
            "ln_final": _norm(f"{p}layernorm", self.cfg),
        }
        if with_classifier:
            mapping["unembed"] = VisionClassifierHeadBridge(name="classifier")
        return mapping

    def prepare_model(self, hf_model: Any) -> None:
        if getattr(hf_model.config, "use_swiglu_ffn", False):
            raise NotImplementedError(
                "DINOv2 with SwiGLU MLP (giant variants) is not supported; "
                "the MLP variant (S/B/L) is."
            )
        self.component_mapping = self._build_component_mapping(
            prefix=_prefix(hf_model, "dinov2"), with_classifier=hasattr(hf_model, "classifier")
        )


class BeitArchitectureAdapter(ViTArchitectureAdapter):
    """BEiT (``BeitModel`` / ``BeitForImageClassification``).

    q and v have biases; k has none (``k_proj`` is built with ``bias=False``).
    Relative position bias and layer-scale ``lambda_1/2`` stay inside HF's forward.
    With ``use_mean_pooling`` the final ``layernorm`` is an identity and the norm
    lives in the pooler, so ``ln_final`` is only mapped when it is a real LayerNorm.
    """

    def _build_component_mapping(self, prefix: str, with_classifier: bool) -> dict[str, Any]:
        p = prefix
        mapping: dict[str, Any] = {
            "embed": PatchEmbeddingsBridge(name=f"{p}embeddings"),
            "blocks": BlockBridge(
                name=f"{p}layers",
                hook_alias_overrides={
                    "hook_mlp_out": "mlp.out.hook_out",
                    "hook_mlp_in": "mlp.in.hook_in",
                },
                submodules={
                    "ln1": _norm("layernorm_before", self.cfg),
                    "ln2": _norm("layernorm_after", self.cfg),
                    "attn": _attention(self.cfg),
                    "mlp": _mlp(self.cfg),
                },
            ),
        }
        if with_classifier:
            mapping["unembed"] = VisionClassifierHeadBridge(name="classifier")
        return mapping

    def prepare_model(self, hf_model: Any) -> None:
        p = _prefix(hf_model, "beit")
        self.component_mapping = self._build_component_mapping(
            prefix=p, with_classifier=hasattr(hf_model, "classifier")
        )
        base = hf_model.beit if p else hf_model
        if isinstance(base.layernorm, torch.nn.LayerNorm):
            self.component_mapping["ln_final"] = _norm(f"{p}layernorm", self.cfg)


OUR_ADAPTERS: dict[str, type] = {
    "Dinov2Model": Dinov2ArchitectureAdapter,
    "Dinov2ForImageClassification": Dinov2ArchitectureAdapter,
    "BeitModel": BeitArchitectureAdapter,
    "BeitForImageClassification": BeitArchitectureAdapter,
}


def register_adapters() -> None:
    """Register our adapters with TransformerLens' factory (idempotent)."""
    for name, adapter in OUR_ADAPTERS.items():
        ArchitectureAdapterFactory.register_adapter(name, adapter)
