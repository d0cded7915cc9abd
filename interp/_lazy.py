"""A package whose modules load on first use (PEP 562): ``interp.record``, ``interp.figures``, ``interp.report``."""

import importlib
from typing import Any, Callable


def lazy_modules(package: str, namespace: dict) -> Callable[[str], Any]:
    """The package's ``__getattr__``: ``package.<module>`` imports the module on first use and keeps it in
    ``namespace`` (the package's globals); any other name is an ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        try:
            value = importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        namespace[name] = value
        return value

    return __getattr__
