"""Our TransformerLens adapters for families TL 4.x lacks, one file each.

They wrap the HF modules as they are (the bridge delegates every forward to HF), so
layer-scale and relative position bias stay HF's own math. Hook names are the usual
``blocks.{l}.attn.hook_q|hook_k|hook_v|hook_z|hook_pattern``. The family registry
(``interp.models.families``) says which architectures use which adapter; the bridge
registers them with TL's factory when it is built.
"""

from interp.models.adapters.beit import BeitArchitectureAdapter
from interp.models.adapters.clip import ClipVisionArchitectureAdapter, SiglipVisionArchitectureAdapter
from interp.models.adapters.dinov2 import Dinov2ArchitectureAdapter, Dinov2RegistersArchitectureAdapter
from interp.models.adapters.open_clip_vit import OpenClipVisionAdapter, describe_open_clip
from interp.models.adapters.timm_vit import TimmVisionTransformerAdapter, describe_timm

__all__ = ["BeitArchitectureAdapter", "ClipVisionArchitectureAdapter", "Dinov2ArchitectureAdapter",
           "Dinov2RegistersArchitectureAdapter", "OpenClipVisionAdapter", "SiglipVisionArchitectureAdapter",
           "TimmVisionTransformerAdapter", "describe_open_clip", "describe_timm"]
