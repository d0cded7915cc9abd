"""Hooked models: the family registry, the bridge, loading, the offline zoo, tiny test models.

Names are re-exported lazily (PEP 562), so importing one submodule does not import the
others: the layers below the bridge (``families``, ``info``) stay importable on their own.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Family": "families", "get_family": "families", "list_families": "families", "register_family": "families",
    "ModelInfo": "info", "InterpBridge": "bridge", "require_bridge": "bridge",
    "clone_model": "loading", "from_hf": "loading", "load_model": "loading", "untrained_copy": "loading",
    "TINY_FAMILIES": "tiny", "tiny_hf_model": "tiny", "tiny_inputs": "tiny",
    "ZOO": "zoo", "list_models": "zoo",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"interp.models.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'interp.models' has no attribute {name!r}")
