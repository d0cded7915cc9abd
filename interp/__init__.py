"""interp: mechanistic interpretability of the QKV bias in transformer attention.

Load a model (``load_model``), record per-head Q/K/V statistics (``record_qkv``), and
ask what each head's bias does: ``origin_shift``, ``score_decomposition``,
``bias_invariances``, ``frequency_profile`` / ``cluster_heads``, ``ablate_bias``; and what a model
makes for itself without a bias: ``sink_profile``, ``implicit_value_bias``, ``massive_activations``.
Analyzers return tidy long-form DataFrames; ``interp.plots`` draws them; ``interp.pipeline``
runs them all and ``interp.report`` writes ``report.html`` and ``summary.json``.

Shape glossary (TransformerLens' axis names, used in the jaxtyping annotations):

    batch        sequences or images in a batch
    pos          token positions (LMs) or prefix tokens + patches (ViTs)
    query_pos    positions that attend (rows of a pattern)
    key_pos      positions attended to (columns of a pattern)
    head_index   attention heads of a kind (kv heads for k and v under grouped-query attention)
    d_head       dimension of one head's q/k/v vector
    d_model      width of the residual stream

``blocks.{l}.attn.hook_q|hook_k|hook_v`` are ``[batch pos head_index d_head]``;
``hook_attn_scores|hook_pattern`` are ``[batch head_index query_pos key_pos]``.
Importing interp has no side effects (no backend switches, no downloads).
"""

import inspect as _inspect

from interp import errors, plots
from interp._version import __version__
from interp.ablation import ablate_bias
from interp.analysis import (
    bias_invariances,
    cluster_heads,
    frequency_profile,
    frequency_shift_under_ablation,
    implicit_value_bias,
    massive_activations,
    origin_shift,
    score_decomposition,
    sink_profile,
    sink_shares,
)
from interp.analysis.one_input import SingleInput, single_input
from interp.data import Batch, builtin_batches, iter_batches
from interp.errors import InterpError
from interp.errors import public as _public
from interp.heads import attention_weights, bias_spec, kv_group
from interp.models import (
    Family,
    InterpBridge,
    ModelInfo,
    clone_model,
    list_families,
    list_models,
    load_model,
    require_bridge,
    tiny_hf_model,
    tiny_inputs,
)
from interp.patching import bias_patch_hooks
from interp.record import record_qkv
from interp.sources import DataSource, resolve_data
from interp.stats import QKVStats

__all__ = [
    "__version__", "ablate_bias", "attention_weights", "Batch", "bias_invariances", "bias_patch_hooks",
    "bias_spec", "builtin_batches", "clone_model", "cluster_heads", "DataSource", "errors", "Family",
    "frequency_profile", "frequency_shift_under_ablation", "implicit_value_bias", "InterpBridge", "InterpError",
    "iter_batches", "kv_group", "list_families", "list_models", "load_model", "massive_activations", "ModelInfo",
    "origin_shift", "plots", "QKVStats", "record_qkv", "require_bridge", "resolve_data", "score_decomposition",
    "sink_profile", "sink_shares", "tiny_hf_model", "tiny_inputs",
]
__all__ += ["SingleInput", "single_input"]  # one input, looked at closely (interp.analysis.one_input)

# The public API's last line of defence: every function above checks its inputs with one clear
# error; what such a check misses leaves as interp.errors.InternalError (a bug to report), never raw.
for _name in __all__:
    if _inspect.isfunction(globals()[_name]):
        globals()[_name] = _public(globals()[_name])
