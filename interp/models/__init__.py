"""Hooked models: loading, our TL adapters, the zoo of offline models, tiny test models."""

from interp.models.loading import InterpBridge, ModelInfo, bridge_from_hf, load_model
from interp.models.tiny import TINY_FAMILIES, tiny_hf_model, tiny_inputs
from interp.models.zoo import ZOO, list_models

__all__ = [
    "InterpBridge", "ModelInfo", "bridge_from_hf", "load_model",
    "TINY_FAMILIES", "tiny_hf_model", "tiny_inputs", "ZOO", "list_models",
]
