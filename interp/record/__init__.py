"""Recording: hooks named as TransformerLens names them, bias patching, the prefix cache, per-head
weights, and the streaming Q/K/V statistics (``QKVStats``) with their fingerprint.

Importing the package imports nothing else; each module loads on first use."""

import importlib as _importlib
from typing import Any as _Any


def __getattr__(name: str) -> _Any:
    """``interp.record.<module>`` imports the module on first use (nothing is imported with the package)."""
    try:
        value = _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value
