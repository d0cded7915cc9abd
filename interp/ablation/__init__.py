"""Patching biases out at inference time and measuring the task: ``ablate_bias``.

By job: ``variants`` (what one ablation patches), ``metrics`` (what it is measured by),
``options`` (``SweepOptions``: every option, declared once), ``log`` (the resumable sweep log), ``logits``
(next-token metrics a chunk of positions at a time), ``attribution`` (first-order and AtP* estimates), ``sweep``
(``ablate_bias`` itself). The bias-patching hooks, which the analyses use too, are in ``interp.record.patching``;
the intact layers below a patch are replayed by ``interp.record.capture``. Names are imported on first use
(PEP 562), so the command line reads ``options`` without loading torch.
"""

import importlib as _importlib
from typing import Any as _Any

_WHERE = {"ablate_bias": "interp.ablation.sweep", "SweepOptions": "interp.ablation.options",
          "Variant": "interp.ablation.variants", "make_variants": "interp.ablation.variants"}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> _Any:
    if name in _WHERE:
        return getattr(_importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'interp.ablation' has no attribute {name!r}")
