"""Patching biases out at inference time and measuring the task: ``ablate_bias``.

By job: ``variants`` (what one ablation patches), ``metrics`` (what it is measured by),
``log`` (the resumable sweep log), ``prefix`` (replaying the intact layers below a patch),
``attribution`` (first-order and AtP* estimates), ``sweep``
(``ablate_bias`` itself). The hooks are in ``interp.patching``.
"""

from interp.ablation.sweep import ablate_bias
from interp.ablation.variants import Variant, make_variants

__all__ = ["Variant", "ablate_bias", "make_variants"]
