"""Input checks: a bad input gets one clear ``InputError`` before it reaches a model.

The bridge's forward runs them on every input but one: a ``CheckedBatch``, which ``check_batch`` makes after
running them on the host copy (the batch types live here, below the bridge that takes them; ``interp.data``
names them too). No switch turns the checks off."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from interp.errors import InputError
from interp.types import KINDS, QKV

if TYPE_CHECKING:  # annotations only: the checks sit below the models that they check inputs for
    from interp.models.info import ModelInfo


def check_pixel_values(x: Any, info: ModelInfo) -> None:
    """Raise ``InputError`` unless ``x`` is a float ``[batch, C, H, W]`` tensor for this ViT."""
    expected = f"[batch, {info.num_channels}, H, W]"
    if not isinstance(x, torch.Tensor):
        raise InputError(
            f"{info.name} is a vision model: expected pixel_values as a float tensor {expected}, "
            f"got {type(x).__name__}"
        )
    if not torch.is_floating_point(x):
        raise InputError(
            f"{info.name} is a vision model: expected pixel_values as a float tensor {expected}, "
            f"got a {x.dtype} tensor of shape {tuple(x.shape)} (token ids?)"
        )
    if x.ndim != 4 or x.shape[1] != info.num_channels or x.shape[0] == 0:
        raise InputError(f"{info.name}: pixel_values must be {expected}, got shape {tuple(x.shape)}")
    p = info.patch_size or 1
    if x.shape[2] % p or x.shape[3] % p:
        raise InputError(f"{info.name}: image size {tuple(x.shape[2:])} is not a multiple of the patch size {p}")
    size = info.image_size
    if size is not None and tuple(x.shape[2:]) != (size, size) and not info.spec.any_image_size:
        raise InputError(
            f"{info.name} takes {size} x {size} images (its position embeddings are fixed), got "
            f"{x.shape[2]} x {x.shape[3]}: resize the pixels first, or pass images as files, PIL images or "
            f"uint8 arrays, which interp resizes to {size} px (interp.resolve_data)")


def check_token_ids(x: Any, info: ModelInfo) -> None:
    """Raise ``InputError`` unless ``x`` is text, or integer token ids within context."""
    if isinstance(x, (str, list)):
        return
    if not isinstance(x, torch.Tensor):
        raise InputError(
            f"{info.name} is a language model: expected token ids (LongTensor [batch, pos]) "
            f"or text, got {type(x).__name__}"
        )
    if torch.is_floating_point(x) or x.dtype == torch.bool or torch.is_complex(x):
        raise InputError(
            f"{info.name} is a language model: expected integer token ids [batch, pos], "
            f"got a {x.dtype} tensor of shape {tuple(x.shape)}" + (" (pixel values?)" if x.is_floating_point() else "")
        )
    if x.ndim != 2 or x.numel() == 0:
        raise InputError(f"{info.name}: token ids must be a non-empty [batch, pos] tensor, got shape {tuple(x.shape)}")
    if info.vocab_size is not None and (int(x.min()) < 0 or int(x.max()) >= info.vocab_size):
        raise InputError(
            f"{info.name}: token ids must lie in 0..{info.vocab_size - 1} (the vocabulary), "
            f"got ids from {int(x.min())} to {int(x.max())}"
        )
    if info.max_positions is not None and x.shape[-1] > info.max_positions:
        raise InputError(
            f"{info.name}: sequence length {x.shape[-1]} exceeds the model's context "
            f"of {info.max_positions} positions"
        )


def _check_model_input(x: Any, attention_mask: Optional[Tensor], info: ModelInfo) -> None:
    """Shape, dtype and finiteness of one batch's input (and its mask) for this model."""
    if info.modality == "vision":
        check_pixel_values(x, info)
    else:
        check_token_ids(x, info)
    if isinstance(x, Tensor) and torch.is_floating_point(x) and not torch.isfinite(x).all():
        raise InputError("input contains NaN or inf values")
    if info.modality == "text" and attention_mask is not None and isinstance(x, Tensor):
        if attention_mask.shape != x.shape:
            raise InputError(
                f"attention_mask shape {tuple(attention_mask.shape)} does not match "
                f"input_ids shape {tuple(x.shape)}"
            )
        if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise InputError("attention_mask must hold only 0 (padding) and 1 (real token)")


@dataclass
class Batch:
    """One batch for a model: ``inputs`` (pixel_values ``[batch channels height width]`` for a vision model, token
    ids ``[batch pos]`` for a language model), the ``attention_mask`` (1 real token, 0 padding; None: no padding)
    and optional ``labels`` (the items' class ids, where the data has classes)."""

    inputs: Tensor
    attention_mask: Optional[Int[Tensor, "batch pos"]] = None
    labels: Optional[Tensor] = None

    def check(self, info: ModelInfo) -> None:
        """Reject NaN/inf inputs and malformed shapes before they reach the model."""
        _check_model_input(self.inputs, self.attention_mask, info)

    def to(self, device: Any) -> "Batch":
        return Batch(
            self.inputs.to(device),
            None if self.attention_mask is None else self.attention_mask.to(device),
            None if self.labels is None else self.labels.to(device),
        )

    def items(self, lo: int, hi: int) -> "Batch":
        """Items ``lo:hi`` of this batch (views)."""
        def part(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else t[lo:hi]
        return Batch(part(self.inputs), part(self.attention_mask), part(self.labels))

    def repeat(self, n: int) -> "Batch":
        """This batch repeated ``n`` times along the batch axis (stacked variants, variant-major)."""
        def rep(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else t.repeat(n, *([1] * (t.ndim - 1)))
        return Batch(rep(self.inputs), rep(self.attention_mask), rep(self.labels))


_WITNESS = object()  # held by this module only: what ``CheckedBatch._made`` asks for
_NOT_BUILT = ("a CheckedBatch is made by checking a batch: interp.data.check_batch(model, batch) (iter_batches "
              "yields checked batches); it cannot be built, or changed, from tensors directly")


def check_key(info: ModelInfo, dtype: torch.dtype) -> tuple:
    """What the checks of a batch depend on: the model's input sizes (``_check_model_input``) and its dtype
    (``check_fits_dtype``). A batch checked for one key holds for every model of that key."""
    return (info.modality, info.num_channels, info.patch_size, info.image_size, info.spec.any_image_size,
            info.vocab_size, info.max_positions, dtype)


def _versions(batch: Batch) -> tuple:
    """The version counters of the forward's tensors: an in-place write into one bumps its counter."""
    return tuple(None if t is None else t._version for t in (batch.inputs, batch.attention_mask))


class CheckedBatch(Batch):
    """A ``Batch`` that passed ``check_batch`` for a model's input sizes and dtype (``check_key``): the one input
    the bridge's forward runs without its own checks, which would synchronise a GPU on every forward.

    Only ``check_batch`` makes one, after the checks; ``to``, ``items`` and ``repeat`` give checked copies (moved,
    sliced or repeated values are the values checked). ``CheckedBatch(...)``, ``dataclasses.replace`` and assigning a
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

    def items(self, lo: int, hi: int) -> "CheckedBatch":
        """Items ``lo:hi`` of this batch (views of the values checked), still checked."""
        return CheckedBatch._made(super().items(lo, hi), self._key, _WITNESS)

    def repeat(self, n: int) -> "CheckedBatch":
        """This batch repeated ``n`` times along the batch axis (stacked variants), still checked."""
        return CheckedBatch._made(super().repeat(n), self._key, _WITNESS)


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


def check_batch(model: Any, batch: Batch) -> CheckedBatch:
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


def model_inputs(model: Any, batch: Batch) -> tuple[Tensor, dict]:
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


def check_kinds(kinds: Any, allowed: tuple[str, ...] = QKV) -> list[str]:
    """``kinds`` as a list of distinct names among ``allowed``."""
    if isinstance(kinds, str):
        kinds = [kinds]
    if not isinstance(kinds, (list, tuple, set, frozenset)):
        raise InputError(f"kinds must be a non-empty subset of {', '.join(allowed)} (a list or tuple); got {kinds!r}")
    kinds = list(kinds)
    bad = [k for k in kinds if k not in allowed]
    if bad or not kinds:
        raise InputError(f"kinds must be a non-empty subset of {', '.join(allowed)}; got {kinds}")
    if len(set(kinds)) != len(kinds):
        raise InputError(f"kinds must not repeat a kind; got {kinds}")
    return kinds


def _describe_selection(value: Any) -> str:
    """A short description of a selection for an error message (a tensor's dtype and shape, not its values)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        what = "a tensor" if isinstance(value, torch.Tensor) else "an array"
        return f"{what} of dtype {value.dtype} and shape {tuple(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def as_index(item: Any) -> Optional[int]:
    """``item`` as a Python int when it is an integer (a Python int, a numpy integer scalar, a 0-d integer
    array or tensor); None for everything else: bools (True is not index 1), floats, strings, masks."""
    if isinstance(item, bool) or isinstance(item, np.bool_):
        return None
    if isinstance(item, (int, np.integer)):
        return int(item)
    if isinstance(item, (torch.Tensor, np.ndarray)) and item.ndim == 0:
        return int(_values(item)) if _integer_dtype(item) else None
    return None


def _values(array: Any) -> Any:
    """``array``'s values as Python numbers; a tensor without data (on the meta device) is one InputError."""
    try:
        return array.tolist()
    except (RuntimeError, NotImplementedError) as exc:
        raise InputError(f"a tensor on {getattr(array, 'device', '?')} holds no values to read as indices "
                         f"({type(exc).__name__}): pass Python ints or a CPU tensor") from None


def _integer_dtype(array: Any) -> bool:
    """Whether a tensor or array holds integers (torch.uint8, torch's old mask dtype, does not count)."""
    if isinstance(array, torch.Tensor):
        return array.dtype in (torch.int8, torch.int16, torch.int32, torch.int64)
    return array.dtype.kind in "iu"


def _mask_hint(value: Any) -> str:
    """What to do instead, when ``value`` looks like a boolean mask."""
    if isinstance(value, (bool, np.bool_)):
        return ": True/False are not indices (a list of them is a mask); pass the indices it selects"
    if isinstance(value, torch.Tensor) and value.dtype in (torch.bool, torch.uint8):
        return ": a mask is not a list of indices; pass the indices it selects, mask.nonzero().flatten().tolist()"
    if isinstance(value, np.ndarray) and value.dtype.kind == "b":
        return ": a mask is not a list of indices; pass the indices it selects, np.flatnonzero(mask).tolist()"
    return ""


def index_selection(value: Any, n: int, what: str) -> list[int]:
    """The one parser of a selection (``layers=``, ``heads=`` of every analyzer, ``ablate_bias``,
    ``single_input``): None (all of 0..n-1), one index, or a non-empty sequence of indices, each in
    0..n-1; returned sorted, each once. An index is a Python int (a numpy integer scalar, a 0-d integer
    array or tensor count as one); a sequence is a list, tuple, range, set, a 1-d integer numpy array or
    tensor, or what numpy reads as one (a pandas Series or Index of ints). A bool, a boolean mask (a mask
    for heads [3, 7, 9] is not the indices 0 and 1; torch.uint8, torch's old mask dtype, counts as one), a
    float, a string, a generator or a tensor of more dimensions is refused with one ``InputError``."""
    if value is None:
        return list(range(n))
    fix = (f"{what} must be None (all), an index or a list of indices in 0..{n - 1} (Python ints; numpy or "
           "torch integers also do)")
    one = as_index(value)
    if one is not None:
        items = [one]
    else:
        if not isinstance(value, (torch.Tensor, np.ndarray, str, bytes, dict)) and hasattr(value, "__array__"):
            value = np.asarray(value)  # a pandas Series or Index
        if isinstance(value, (torch.Tensor, np.ndarray)):
            if not _integer_dtype(value) or value.ndim != 1:
                raise InputError(f"{fix}; got {_describe_selection(value)}{_mask_hint(value)}")
            items = [int(i) for i in _values(value)]
        elif isinstance(value, (list, tuple, range, set, frozenset)):
            items = [as_index(item) for item in value]
            if any(item is None for item in items):
                bad = next(item for item in value if as_index(item) is None)
                raise InputError(f"{fix}; got {_describe_selection(value)}, which holds {_describe_selection(bad)}"
                                 f"{_mask_hint(bad)}")
        else:
            raise InputError(f"{fix}; got {_describe_selection(value)}")
    if not items:
        raise InputError(f"{fix}; got an empty {type(value).__name__}: leave {what} out (None) for all of them")
    if any(not 0 <= i < n for i in items):
        raise InputError(f"{what} must lie in 0..{n - 1} (the model has {n}); got {sorted(set(items))}")
    return sorted(set(items))


def check_layers(layers: Any, info: ModelInfo) -> list[int]:
    """None (every layer), one layer index, or a collection of them, each in range."""
    return index_selection(layers, info.n_layers, "layers")


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")


def check_max_batches(max_batches: Any) -> Optional[int]:
    """None (all batches) or a positive number of batches (a numpy integer too)."""
    if max_batches is None:
        return None
    value = as_index(max_batches)
    if value is None or value < 1:
        raise InputError(f"max_batches must be a positive integer or None (all batches); got {max_batches!r}")
    return value


FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def check_dtype(dtype: Any) -> Optional[torch.dtype]:
    """None (keep the model's) or a floating dtype a model can run in."""
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"dtype must be a torch.dtype such as torch.float64, got {dtype!r}")
    if dtype not in FLOAT_DTYPES:
        raise InputError(f"dtype must be one of torch.float32, torch.float64, torch.float16, torch.bfloat16; got "
                         f"{dtype} (integer / quantised weights cannot run the analyses: load in floating point)")
    return dtype


def check_count(name: str, value: Any, minimum: int = 1) -> int:
    """An integer option (not a bool, not a float; a numpy integer scalar counts) of at least ``minimum``,
    as a Python int."""
    number = as_index(value)
    if number is None or number < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}; got {value!r} ({type(value).__name__})")
    return number


def as_real(value: Any) -> Optional[float]:
    """``value`` as a Python float when it is a real number (a Python or numpy int or float, a 0-d real
    array or tensor); None for a bool, a string, a complex number or anything else."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0 and (
            _integer_dtype(value) or (value.dtype.is_floating_point if isinstance(value, torch.Tensor)
                                      else value.dtype.kind == "f")):
        return float(value.item())
    return None


def check_fraction(name: str, value: Any) -> float:
    """A real number strictly between 0 and 1 (a significance level, a share), as a Python float."""
    number = as_real(value)
    if number is None or not 0 < number < 1:
        raise InputError(f"{name} must be a number in (0, 1); got {value!r} ({type(value).__name__})")
    return number


def check_heads(heads: Any, info: ModelInfo) -> list[int]:
    """None (every head), one head index, or a collection of them, each below the model's query heads."""
    return index_selection(heads, info.n_heads, "heads")


def check_not_blank(name: str, value: Any) -> None:
    """An empty path or name (``--out ""``, ``out=""``) is refused: it would silently mean the current folder
    (or, for ``demo --model``, the default model)."""
    if isinstance(value, str) and not value.strip():
        raise InputError(f"{name} is an empty string: give a folder or name, or leave the option out for its default")


def check_frames(frames: Any, columns: Any, function: str, analyzer: str) -> None:
    """Each of ``frames`` (a list of DataFrames) holds ``columns``, the key columns of ``analyzer``'s
    table, else one ``InputError`` naming the frame, what it lacks and what makes the right table (another
    analyzer's table, e.g. a sink profile given to ``merge_shards``, would fail deep in pandas)."""
    for i, frame in enumerate(frames):
        missing = [c for c in columns if c not in getattr(frame, "columns", ())]
        if missing:
            have = list(getattr(frame, "columns", []))
            shown = ", ".join(map(str, have[:12])) + (", ..." if len(have) > 12 else "")
            raise InputError(f"{function} takes tables of {analyzer}; frame {i} lacks {', '.join(missing)} (it has "
                             f"{shown or 'no columns'}): is it another analyzer's table? Pass the frames that "
                             f"{analyzer} returned")
