"""``Batch``, the unit every analysis consumes, ``CheckedBatch``, a batch that passed the input checks,
and the image preprocessing shared by the built-in photos and a researcher's own images.

A ``Batch`` holds ``inputs`` (token ids ``[batch, pos]`` or pixel values ``[batch, C, H, W]``),
``attention_mask`` (``[batch, pos]``, 1 = real token; None for images) and optional ``labels``.

Validation is decided by type, not by a switch: the bridge's forward checks every input it is given
(shape, dtype, vocabulary, finiteness, mask), except a ``CheckedBatch`` checked for a model of the same
input sizes and dtype, whose tensors are unchanged since (their version counters say so). That check would
synchronise a GPU on every forward; a ``CheckedBatch`` is checked once, on the host. Only ``check_batch``
makes one, after the checks (``iter_batches`` yields them), and moving or repeating one keeps it checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp.checks import check_model_input
from interp.errors import InputError
from interp.models.info import ModelInfo

if TYPE_CHECKING:  # the bridge takes batches in its forward: it imports this module, not the other way
    from interp.models.bridge import InterpBridge

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class Batch:
    inputs: Tensor
    attention_mask: Optional[Int[Tensor, "batch pos"]] = None
    labels: Optional[Tensor] = None

    def check(self, info: ModelInfo) -> None:
        """Reject NaN/inf inputs and malformed shapes before they reach the model."""
        check_model_input(self.inputs, self.attention_mask, info)

    def to(self, device: Any) -> "Batch":
        return Batch(
            self.inputs.to(device),
            None if self.attention_mask is None else self.attention_mask.to(device),
            None if self.labels is None else self.labels.to(device),
        )


_WITNESS = object()  # held by this module only: what ``CheckedBatch._made`` asks for
_NOT_BUILT = ("a CheckedBatch is made by checking a batch: interp.data.check_batch(model, batch) (iter_batches "
              "yields checked batches); it cannot be built, or changed, from tensors directly")


def check_key(info: ModelInfo, dtype: torch.dtype) -> tuple:
    """What the checks of a batch depend on: the model's input sizes (``check_model_input``) and its dtype
    (``check_fits_dtype``). A batch checked for one key holds for every model of that key."""
    return (info.modality, info.num_channels, info.patch_size, info.image_size, info.spec.any_image_size,
            info.vocab_size, info.max_positions, dtype)


def _versions(batch: Batch) -> tuple:
    """The version counters of the forward's tensors: an in-place write into one bumps its counter."""
    return tuple(None if t is None else t._version for t in (batch.inputs, batch.attention_mask))


class CheckedBatch(Batch):
    """A ``Batch`` that passed ``check_batch`` for a model's input sizes and dtype (``check_key``): the one input
    the bridge's forward runs without its own checks, which would synchronise a GPU on every forward.

    Only ``check_batch`` makes one, after the checks; ``to`` and ``repeat`` give checked copies (moved or
    repeated values are the values checked). ``CheckedBatch(...)``, ``dataclasses.replace`` and assigning a
    field raise ``InputError``; an in-place write into its tensors voids it (``holds_for`` is then False), and
    the forward checks it like any other batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise InputError(_NOT_BUILT)

    @classmethod
    def _made(cls, batch: Batch, key: tuple, witness: object) -> "CheckedBatch":
        if witness is not _WITNESS:
            raise InputError(_NOT_BUILT)
        made = object.__new__(cls)
        for name in ("inputs", "attention_mask", "labels"):
            object.__setattr__(made, name, getattr(batch, name))
        object.__setattr__(made, "_key", key)
        object.__setattr__(made, "_stamp", _versions(made))
        return made

    def __setattr__(self, name: str, value: Any) -> None:
        raise InputError(_NOT_BUILT)

    def __delattr__(self, name: str) -> None:
        raise InputError(_NOT_BUILT)

    def holds_for(self, info: ModelInfo, dtype: torch.dtype) -> bool:
        """Whether this batch was checked for a model of ``info``'s input sizes and ``dtype``, and its tensors
        are unchanged since."""
        return self._key == check_key(info, dtype) and self._stamp == _versions(self)

    def to(self, device: Any) -> "CheckedBatch":
        """This batch on ``device`` (pinned and non-blocking to a GPU: ``to_device``), still checked."""
        def move(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else to_device(t, device)
        return CheckedBatch._made(Batch(move(self.inputs), move(self.attention_mask), move(self.labels)),
                                  self._key, _WITNESS)

    def repeat(self, n: int) -> "CheckedBatch":
        """This batch repeated ``n`` times along the batch axis (stacked variants), still checked."""
        def rep(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else t.repeat(n, *([1] * (t.ndim - 1)))
        return CheckedBatch._made(Batch(rep(self.inputs), rep(self.attention_mask), rep(self.labels)),
                                  self._key, _WITNESS)


def check_fits_dtype(batch: Batch, dtype: torch.dtype) -> None:
    """Pixel values finite on the host must stay finite in the model's dtype (float64 values beyond float32's
    range become inf in the cast; a float16 model overflows past 65504). Checked on the host copy, only when
    the dtypes differ."""
    x = batch.inputs
    if isinstance(x, Tensor) and x.is_floating_point() and dtype.is_floating_point and x.dtype != dtype:
        big = float(x.abs().max()) if x.numel() else 0.0
        if big > torch.finfo(dtype).max:
            raise InputError(f"pixel values reach {big:.3g}, beyond what the model's {dtype} holds "
                             f"({torch.finfo(dtype).max:.3g}): they would become inf; normalise the images first")


def check_batch(model: "InterpBridge", batch: Batch) -> CheckedBatch:
    """``batch`` checked for ``model`` (``Batch.check``: shape, dtype, vocabulary, finiteness, mask; and
    ``check_fits_dtype`` for the model's dtype), as a ``CheckedBatch``; one ``InputError`` otherwise. Run it
    on the host copy: on a GPU tensor the checks synchronise. A batch already checked for a model of the same
    input sizes and dtype is returned as it is."""
    info, dtype = model.interp, next(model.parameters()).dtype
    if isinstance(batch, CheckedBatch) and batch.holds_for(info, dtype):
        return batch
    if not isinstance(batch, Batch) or not isinstance(batch.inputs, Tensor):
        raise InputError(f"check_batch takes an interp Batch of tensors; got {type(batch).__name__}"
                         + (f" holding {type(batch.inputs).__name__}" if isinstance(batch, Batch) else ""))
    batch.check(info)
    check_fits_dtype(batch, dtype)
    return CheckedBatch._made(batch, check_key(info, dtype), _WITNESS)


def model_inputs(model: "InterpBridge", batch: Batch) -> tuple[Tensor, dict]:
    """(input, forward kwargs) for ``model``: pixels cast to the model's dtype, or token
    ids with their attention mask, all on the model's device."""
    p = next(model.parameters())
    if model.interp.modality == "vision":
        return to_device(batch.inputs, p.device).to(p.dtype), {}
    kw = {} if batch.attention_mask is None else {"attention_mask": to_device(batch.attention_mask, p.device)}
    ids = batch.inputs if batch.inputs.dtype in (torch.int64, torch.int32) else batch.inputs.long()  # uint8, int16
    return to_device(ids, p.device), kw


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device``; a host tensor bound for a GPU goes through pinned memory without
    blocking, so that feeding a batch does not synchronise the host with the device."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def square_resize(img: np.ndarray, size: int) -> Float[Tensor, "3 size size"]:
    """Centre-crop to a square and resize to ``size`` (bilinear, antialiased); pixels in [0, 1]
    (``unit_pixels``: by the dtype's range).

    Grayscale becomes 3 channels; a 4th (alpha) channel is dropped.
    """
    if img.ndim not in (2, 3) or img.dtype.kind not in "uifb" or 0 in img.shape[:2] or \
            (img.ndim == 3 and img.shape[-1] not in (1, 3, 4)):
        raise InputError(f"an image must be an [H, W] or [H, W, C] array of numbers (C 1, 3 or 4; H, W >= 1); "
                         f"got {img.dtype} {img.shape}")
    if img.ndim == 2 or img.shape[-1] == 1:
        img = np.concatenate([img.reshape(*img.shape[:2], 1)] * 3, axis=-1)
    img = unit_pixels(img[..., :3])
    h, w = img.shape[:2]
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    t = torch.from_numpy(np.ascontiguousarray(img[top : top + s, left : left + s])).permute(2, 0, 1)
    return F.interpolate(t[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]


def unit_pixels(img: np.ndarray) -> np.ndarray:
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
