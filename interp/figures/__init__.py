"""Figures: static (matplotlib/seaborn) and interactive (plotly) drawings of the analyzers' tables,
in one colour language. Plots compute nothing.

Importing the package imports nothing else; each module loads on first use."""

import importlib as _importlib
from typing import Any as _Any


def __getattr__(name: str) -> _Any:
    """``interp.figures.<module>`` imports the module on first use (nothing is imported with the package)."""
    try:
        value = _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value
