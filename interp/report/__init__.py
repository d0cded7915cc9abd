"""The main job: every analyzer in one run (``pipeline``), the report's sections, ``report.html`` and
``summary.json`` (``html``), the demo and the single-input run.

Importing the package imports nothing else; each module loads on first use."""

import importlib as _importlib
from typing import Any as _Any


def __getattr__(name: str) -> _Any:
    """``interp.report.<module>`` imports the module on first use (nothing is imported with the package)."""
    try:
        value = _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value
