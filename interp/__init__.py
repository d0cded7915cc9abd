"""interp: mechanistic interpretability of the QKV bias in transformer attention.

Load a model (``load_model``), record per-head Q/K/V statistics (``record_qkv``), and
ask what each head's bias does: ``origin_shift``, ``score_decomposition``,
``bias_invariances``, ``frequency_profile`` / ``cluster_heads``, ``ablate_bias``; and what a model
makes for itself without a bias: ``sink_profile``, ``implicit_value_bias``, ``massive_activations``,
``high_norm_tokens``; and several models side by side over the same data: ``compare_models``.
Analyzers return tidy long-form DataFrames; ``interp.plots`` draws them; ``interp.pipeline``
runs them all and ``interp.report`` writes ``report.html`` and ``summary.json``.

The package, bottom up: ``errors``/``types``; ``models`` (registry, loading); ``data`` (built-ins,
sources, batches); ``record`` (hooks, patching, streaming Q/K/V statistics); ``analysis``;
``ablation``; ``figures`` (static and interactive plots); ``report`` (the main job, report.html, the
demo); ``cli``.

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
Importing interp has no side effects (no backend switches, no downloads) and is cheap: each
name is imported on first use (PEP 562), so ``interp --help`` answers without loading torch.
"""

import importlib as _importlib
import inspect as _inspect
from typing import Any as _Any

from interp._version import __version__
from interp.errors import InterpError
from interp.errors import public as _public

# name -> module that defines it: the public API, imported on first use
_PUBLIC = {
    "ablate_bias": "interp.ablation.sweep", "merge_shards": "interp.ablation.sweep",
    "SweepOptions": "interp.ablation.options",
    "bias_invariances": "interp.analysis.scores", "score_decomposition": "interp.analysis.scores",
    "cluster_heads": "interp.analysis.frequency", "family_test": "interp.analysis.frequency",
    "frequency_profile": "interp.analysis.frequency", "spread_interval": "interp.analysis.frequency",
    "spread_difference": "interp.analysis.frequency", "specialisation_test": "interp.analysis.frequency",
    "frequency_shift_under_ablation": "interp.analysis.frequency", "origin_shift": "interp.analysis.origin",
    "implicit_value_bias": "interp.analysis.sinks", "massive_activations": "interp.analysis.sinks",
    "sink_profile": "interp.analysis.sinks", "sink_shares": "interp.analysis.sinks",
    "high_norm_tokens": "interp.analysis.high_norm",
    "sink_profiles_by_item": "interp.analysis.sink_intervals", "sink_share_intervals": "interp.analysis.sink_intervals",
    "sink_share_difference": "interp.analysis.sink_intervals",
    "sink_pass": "interp.analysis.sinks", "sink_counts": "interp.analysis.sinks",
    "SingleInput": "interp.analysis.single_input", "single_input": "interp.analysis.single_input",
    "Batch": "interp.data", "builtin_batches": "interp.data", "iter_batches": "interp.data",
    "attention_weights": "interp.record.heads", "bias_spec": "interp.record.heads",
    "Family": "interp.models", "InterpBridge": "interp.models", "ModelInfo": "interp.models",
    "clone_model": "interp.models", "untrained_copy": "interp.models", "list_families": "interp.models",
    "list_models": "interp.models",
    "load_model": "interp.models", "register_family": "interp.models.families", "get_family": "interp.models.families",
    "bias_patch_hooks": "interp.record.patching", "record_qkv": "interp.record.recording",
    "compare_models": "interp.compare", "combine_comparisons": "interp.compare",
    "DataSource": "interp.data", "resolve_data": "interp.data", "open_data": "interp.data",
    "QKVStats": "interp.record.stats",
}
# reachable as interp.<name> for tests and notebooks, but not the public face (not in __all__)
_EXTRAS = {"tiny_hf_model": "interp.testing", "tiny_inputs": "interp.testing", "require_bridge": "interp.models",
           "kv_group": "interp.record.heads"}
# submodules reachable as interp.<name>; the short names are the ones users know
_SUBMODULES = {name: f"interp.{name}" for name in ("errors", "models", "data", "analysis", "ablation", "testing",
                                                   "compare", "record", "figures", "report")}
_SUBMODULES.update({"plots": "interp.figures.plots", "interactive": "interp.figures.interactive",
                    "pipeline": "interp.report.pipeline", "fingerprint": "interp.record.fingerprint"})

__all__ = ["__version__", "errors", "plots", "InterpError", *sorted(_PUBLIC, key=str.lower)]


def __getattr__(name: str) -> _Any:
    """Import a public name (or submodule) on first use; functions get the public-API guard."""
    module = _PUBLIC.get(name) or _EXTRAS.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(module), name)
        # the last line of defence: every function checks its inputs with one clear error; what
        # such a check misses leaves as interp.errors.InternalError (a bug to report), never raw. The
        # public functions carry the guard where they are defined (@public); the extras get it here
        value = _public(value) if _inspect.isfunction(value) else value
    elif name in _SUBMODULES:
        value = _importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'interp' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC) | set(_EXTRAS) | set(_SUBMODULES))
