"""The main job: every analyzer in one run (``pipeline``), the report's sections, ``report.html`` and
``summary.json`` (``html``), the demo and the single-input run.

Importing the package imports nothing else; each module loads on first use."""

from interp._lazy import lazy_modules as _lazy_modules

__getattr__ = _lazy_modules(__name__, globals())
