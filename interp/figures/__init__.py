"""Figures: static (matplotlib/seaborn) and interactive (plotly) drawings of the analyzers' tables,
in one colour language. Plots compute nothing.

Importing the package imports nothing else; each module loads on first use."""

from interp._lazy import lazy_modules as _lazy_modules

__getattr__ = _lazy_modules(__name__, globals())
