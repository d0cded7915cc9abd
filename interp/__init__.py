"""interp: mechanistic interpretability of the QKV bias in transformer attention."""

from interp.bias import attention_weights, bias_spec
from interp import errors
from interp.errors import InterpError
from interp.models import InterpBridge, ModelInfo, list_models, load_model

__version__ = "0.1.0"

__all__ = [
    "attention_weights", "bias_spec", "InterpError", "InterpBridge", "ModelInfo",
    "list_models", "load_model", "__version__",
]

from interp.record import QKVStats, record_qkv  # noqa: E402

__all__ += ["QKVStats", "record_qkv"]

from interp import plots  # noqa: E402
from interp.analysis import (  # noqa: E402
    bias_invariances, cluster_heads, frequency_profile, frequency_shift_under_ablation,
    origin_shift, score_decomposition,
)

__all__ += ["bias_invariances", "cluster_heads", "frequency_profile", "frequency_shift_under_ablation",
            "origin_shift", "score_decomposition"]

from interp.ablation import ablate_bias, bias_patch_hooks  # noqa: E402

__all__ += ["ablate_bias", "bias_patch_hooks"]
