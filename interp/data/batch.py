"""``Batch``, the unit every analysis consumes, ``CheckedBatch``, a batch that passed the input checks (both
defined in ``interp.checks``, below the bridge, whose forward takes them), and the image preprocessing shared
by the built-in photos and a researcher's own images.

A ``Batch`` holds ``inputs`` (token ids ``[batch, pos]`` or pixel values ``[batch, C, H, W]``),
``attention_mask`` (``[batch, pos]``, 1 = real token; None for images) and optional ``labels``.

Validation is decided by type, not by a switch: the bridge's forward checks every input it is given
(shape, dtype, vocabulary, finiteness, mask), except a ``CheckedBatch`` checked for a model of the same
input sizes and dtype, whose tensors are unchanged since (their version counters say so). That check would
synchronise a GPU on every forward; a ``CheckedBatch`` is checked once, on the host. Only ``check_batch``
makes one, after the checks (``iter_batches`` yields them), and moving or repeating one keeps it checked.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

# the batch types sit below the bridge (its forward takes them): defined in interp.checks, named here too
from interp.checks import (  # noqa: F401 - re-exported
    Batch, CheckedBatch, check_batch, check_fits_dtype, check_key, model_inputs, to_device,
)
from interp.errors import InputError
from interp.models.bridge import InterpBridge

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def square_resize(img: np.ndarray, size: int) -> Float[Tensor, "3 size size"]:
    """Centre-crop to a square and resize to ``size`` (bilinear, antialiased); pixels in [0, 1]
    (``_unit_pixels``: by the dtype's range).

    Grayscale becomes 3 channels; a 4th (alpha) channel is dropped.
    """
    if img.ndim not in (2, 3) or img.dtype.kind not in "uifb" or 0 in img.shape[:2] or \
            (img.ndim == 3 and img.shape[-1] not in (1, 3, 4)):
        raise InputError(f"an image must be an [H, W] or [H, W, C] array of numbers (C 1, 3 or 4; H, W >= 1); "
                         f"got {img.dtype} {img.shape}")
    if img.ndim == 2 or img.shape[-1] == 1:
        img = np.concatenate([img.reshape(*img.shape[:2], 1)] * 3, axis=-1)
    img = _unit_pixels(img[..., :3])
    h, w = img.shape[:2]
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    t = torch.from_numpy(np.ascontiguousarray(img[top : top + s, left : left + s])).permute(2, 0, 1)
    return F.interpolate(t[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]


def _unit_pixels(img: np.ndarray) -> np.ndarray:
    """``img`` as float32 pixels in [0, 1], scaled by what its dtype's values mean, never by the image's own
    range (which gave one picture other pixels as uint8 and as int64): uint8 / 255; uint16 / 65535 (a
    16-bit PNG); another integer type / 255 when its values lie in 0..255 (8-bit values in a wider type),
    / 65535 in 0..65535; bool 0 / 1; floats in [0, 1] as they are. Anything else is one ``InputError``."""
    if img.dtype == np.uint8 or img.dtype == np.uint16:
        return img.astype(np.float32) / float(np.iinfo(img.dtype).max)
    if img.dtype.kind == "b":
        return img.astype(np.float32)
    lo, hi = float(img.min()), float(img.max())
    if img.dtype.kind in "iu" and lo >= 0 and hi <= 65535:
        return img.astype(np.float32) / (255.0 if hi <= 255 else 65535.0)
    if img.dtype.kind == "f" and 0.0 <= lo and hi <= 1.0:
        return img.astype(np.float32)
    raise InputError(f"image pixels must be uint8 (0-255), uint16 (0-65535) or floats in [0, 1]; got {img.dtype} "
                     f"values in {lo:g}..{hi:g}: scale them to [0, 1] first (e.g. x / 255 for 8-bit values)"
                     + (" (NaN or inf among them)" if not np.isfinite([lo, hi]).all() else ""))


def pil_pixels(img: Any) -> np.ndarray:
    """A PIL image's pixels as an array for ``square_resize``: 16-bit, 32-bit integer and float images
    (modes I;16*, I, F) keep their values (``convert("RGB")`` clips them at 255: a 16-bit PNG came out
    white); every other mode (RGBA, LA, P, CMYK, 1, ...) is converted to RGB (alpha dropped)."""
    return np.asarray(img) if img.mode.startswith("I") or img.mode == "F" else np.asarray(img.convert("RGB"))


def normalise(x: Tensor, mean: tuple = IMAGENET_MEAN, std: tuple = IMAGENET_STD) -> Tensor:
    m = torch.tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(-1, 1, 1)
    return (x - m) / s


def image_norm(model: InterpBridge, normalize: str = "model") -> tuple[Optional[tuple], Optional[tuple]]:
    """(mean, std) for ``model``: its image processor's, else timm's ``pretrained_cfg``, else ImageNet's;
    ``normalize="imagenet"`` forces ImageNet's, ``"none"`` gives (None, None)."""
    if normalize == "none":
        return None, None
    proc = model.processor
    if normalize == "model" and proc is not None and getattr(proc, "image_mean", None) is not None:
        return tuple(proc.image_mean), tuple(proc.image_std)
    timm_cfg = getattr(model.hf_model, "pretrained_cfg", None)
    if normalize == "model" and isinstance(timm_cfg, dict) and timm_cfg.get("mean") is not None:
        return tuple(timm_cfg["mean"]), tuple(timm_cfg["std"])
    return IMAGENET_MEAN, IMAGENET_STD
