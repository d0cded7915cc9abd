"""Every accepted ``data`` argument as batches: the one decision of what a ``data`` argument is
(``open_data``, used by the API, the pipeline and the CLI) and the batches it yields.

A batch is a ``Batch``: ``inputs`` (token ids ``[batch, pos]`` or pixel values
``[batch, C, H, W]``) and ``attention_mask`` (``[batch, pos]``, 1 = real token; None for
images).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from interp.checks import check_max_batches
from interp.data.batch import Batch, CheckedBatch, check_batch, model_inputs, to_device
from interp.data.builtin import builtin_batches, builtin_options
from interp.data.sources import DataSource, data_kind, empty_texts_warning, is_dataset, is_image_list, \
    is_path_list, resolve_data
from interp.errors import InputError, public
from interp.models.bridge import InterpBridge, require_bridge

__all__ = ["batch_to_device", "check_batch", "check_data_name", "iter_batches", "model_inputs", "open_data", "to_batch",
           "to_device"]


def batch_to_device(batch: Batch, device: torch.device) -> Batch:
    """``batch`` with every tensor on ``device`` (see ``to_device``); a ``CheckedBatch`` stays checked."""
    if isinstance(batch, CheckedBatch):
        return batch.to(device)

    def move(t: Optional[Tensor]) -> Optional[Tensor]:
        return None if t is None else to_device(t, device)
    return Batch(move(batch.inputs), move(batch.attention_mask), move(batch.labels))


def to_batch(model: InterpBridge, item: Any) -> Batch:
    """One item of a data iterable as a ``Batch``: a Batch, a dict with input_ids/pixel_values, an (ids, mask)
    or (pixels, labels) pair, a tensor, or text (tokenised; empty texts dropped with a warning)."""
    batch, dropped = _counted_batch(model, item)
    if dropped:
        warnings.warn(empty_texts_warning(dropped), UserWarning, stacklevel=2)
    return batch


def _counted_batch(model: InterpBridge, item: Any) -> tuple[Batch, int]:
    """(``item`` as a Batch, how many empty texts it dropped)."""
    info = model.interp
    if isinstance(item, Batch):
        return item, 0
    if isinstance(item, dict):
        key = "pixel_values" if "pixel_values" in item else "input_ids"
        if key not in item:
            raise InputError(f"a dict batch needs 'input_ids' or 'pixel_values'; got keys {sorted(item)}")
        return Batch(*(_as_tensor(item.get(k), k) for k in (key, "attention_mask", "labels"))), 0
    if _is_pil(item):  # one PIL image of an iterable of images (a generator, say): one batch of one
        if info.modality != "vision":
            raise InputError(f"an item of the data is a PIL image, but {info.name} is a language model")
        return next(iter(resolve_data(model, [item]))), 0
    if isinstance(item, np.ndarray):
        raise InputError(f"an item of the data is a numpy array {item.dtype} {tuple(item.shape)}: pass numpy data as "
                         "one array, not a list of them (np.stack(arrays): [N, H, W, C] images or [N, pos] token ids), "
                         "or each batch as a torch tensor")
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(t, Tensor) for t in item):
        return (Batch(item[0], labels=item[1]) if info.modality == "vision" else Batch(item[0], item[1])), 0
    if isinstance(item, Tensor):
        return Batch(item), 0
    texts = [item] if isinstance(item, str) else _text_list(item)
    if texts is not None:
        if info.modality != "text":
            raise InputError(f"{info.name} is a vision model: text cannot be its data")
        if model.tokenizer is None:
            raise InputError(f"{info.name} has no tokenizer, so text cannot be tokenised: pass token ids, or load it "
                             "with interp.load_model(model, tokenizer=AutoTokenizer.from_pretrained(...))")
        kept, dropped = _checked_texts(texts)
        enc = model.tokenizer(kept, return_tensors="pt", padding=True)
        return Batch(enc["input_ids"], enc["attention_mask"]), dropped
    raise InputError(
        f"cannot make a batch from {type(item).__name__}: expected a tensor, a dict with "
        "input_ids/pixel_values, text, or a built-in dataset name"
    )


def _is_pil(x: Any) -> bool:
    return hasattr(x, "convert") and hasattr(x, "mode") and hasattr(x, "size")


def _as_tensor(value: Any, key: str) -> Optional[Tensor]:
    """A dict batch's entry as a tensor: nested lists and numpy arrays converted (as a tokenizer without
    ``return_tensors`` gives them); anything else is one ``InputError``."""
    if value is None or isinstance(value, Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as exc:
        raise InputError(f"the batch's {key!r} cannot be read as a tensor ({type(value).__name__}: {exc}): pass a "
                         "tensor, or rows of equal length (pad them, with an attention_mask)") from None


def _text_list(data: Any) -> Optional[list]:
    """``data`` as a list when it is a list, tuple or pandas Series holding at least one str (texts, to be
    checked by ``_checked_texts``); None otherwise."""
    pandas = sys.modules.get("pandas")
    if isinstance(data, (list, tuple)) or (pandas is not None and isinstance(data, pandas.Series)):
        items = list(data)
        return items if any(isinstance(t, str) for t in items) else None
    return None


def _checked_texts(texts: list) -> tuple[list[str], int]:
    """(the texts analysed, how many were dropped): every item a str (else one ``InputError`` naming the
    first that is not); empty texts (nothing but whitespace) dropped, as a table's or a dataset's rows are,
    so the same texts give the same numbers through every entry point (the caller warns once,
    ``empty_texts_warning``); none left is one ``InputError``."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"item {i} of the list of texts is {type(text).__name__} {repr(text)[:40]}, not a "
                             "str: every item must be text; drop it, or convert it first (str(x))")
    kept = [t for t in texts if t.strip()]
    if not kept:
        raise InputError(f"every text given ({len(texts)}) is empty (nothing but whitespace): nothing to analyse")
    return kept, len(texts) - len(kept)


def check_data_name(data: Any) -> None:
    """A built-in data set name or an existing path; else one error naming both kinds (``data_kind``)."""
    if isinstance(data, (str, os.PathLike)):
        data_kind(data, text_ok=False)


@public
def open_data(model: InterpBridge, data: Any, options: Optional[dict[str, Any]] = None,
              n: Optional[int] = None) -> Iterable[Any]:
    """What a ``data`` argument is, decided in one place (the API, ``make_context`` and the CLI call
    this): a built-in name (its batches, built with ``options``), a sentence for a language model, a
    path (a folder of images, an image, .txt, .jsonl/.csv/.parquet: a ``DataSource``), a
    ``DataSource``, a numpy array, a ``datasets.Dataset`` or a list of PIL images (a ``DataSource``),
    a list, tuple or pandas Series of texts (one batch), a Tensor | Batch | dict
    | text | (ids, mask) (one batch), or an iterable of those (a torch ``DataLoader`` included).

    ``options``: ``resolve_data``'s keywords (``batch_size``, ``max_items``, ``text_column``, ...);
    ``n``: the item cap when ``options`` gives no ``max_items`` (None: all the data). Options given
    for data already in batches are refused, not ignored."""
    model = require_bridge(model, "open_data")
    options = {k: v for k, v in (options or {}).items() if v is not None}
    kind = data_kind(data, model.interp.modality == "text") if isinstance(data, (str, os.PathLike)) else ""
    if kind == "builtin":
        return builtin_batches(model, str(data), **builtin_options(str(data), options, n))
    if _is_pil(data):
        data = [data]  # one image: a list of one
    if isinstance(data, (set, frozenset)):
        raise InputError(f"data is a {type(data).__name__}, which has no order: batches, caps and results would "
                         "change from run to run; pass a list (sorted(data), say)")
    if kind == "path" or isinstance(data, np.ndarray) or is_dataset(data) or is_image_list(data) or \
            is_path_list(data):
        capped = {"max_items": n} if n is not None else {}
        return resolve_data(model, data, **{**capped, **options})
    if options:
        raise InputError(f"data options ({', '.join(sorted(options))}) apply to a built-in data set, a path, a "
                         f"numpy array or a datasets.Dataset; this data is already {type(data).__name__} batches: "
                         "drop the options, or pass the data as one of those")
    if kind == "text":
        return [[data]]  # a sentence for a language model: one batch of one text
    if isinstance(data, DataSource):
        return data
    if isinstance(data, (bytes, bytearray)) or (hasattr(data, "columns") and hasattr(data, "iloc")):
        what = "bytes" if isinstance(data, (bytes, bytearray)) else "a pandas DataFrame"
        raise InputError(f"data is {what}, which would be read item by item (bytes, or column names): pass text "
                         "as str or a list of str (e.g. df['text'].tolist()), or a table's path (.parquet/.csv)")
    if isinstance(data, (Tensor, Batch, dict)):
        return [data]
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        return [_one_pair(data)]  # one (input_ids, attention_mask) or (pixel_values, labels) pair, not two batches
    texts = _text_list(data)
    if texts is not None:  # a list (tuple, Series) of texts: one batch, checked here once
        kept, dropped = _checked_texts(texts)
        if dropped:
            warnings.warn(empty_texts_warning(dropped), UserWarning, stacklevel=2)
        return [kept]
    if isinstance(data, Iterable):
        return data
    raise InputError(f"data must be a dataset name, a tensor or an iterable of batches; got {type(data).__name__}")


def _one_pair(data: tuple) -> tuple:
    """A tuple of two tensors as one batch, (input_ids, attention_mask) or (pixel_values, labels); two image
    batches, or two batches of token ids whose second is no 0/1 mask, are refused (they look like two batches)."""
    first, second = data
    two = ("a tuple of two tensors is read as one batch, (input_ids, attention_mask) or (pixel_values, labels): pass "
           "a list [batch, batch] for two batches")
    if first.dim() == 4 and second.dim() == 4:
        raise InputError(f"data is a tuple of two image batches {tuple(first.shape)} and {tuple(second.shape)}, but "
                         f"{two}")
    if second.shape == first.shape and not second.is_floating_point() and second.numel() and not bool(
            ((second == 0) | (second == 1)).all()):
        raise InputError(f"data is a tuple of two tensors of token ids {tuple(first.shape)}, the second not a 0/1 "
                         f"attention mask, and {two}")
    return data


@public
def iter_batches(model: InterpBridge, data: Any, max_batches: Optional[int] = None) -> Iterator[Batch]:
    """``data`` (anything ``open_data`` takes) as batches, at most ``max_batches``, each checked for ``model``
    as it is produced (a ``CheckedBatch``: ``check_batch``; a bad batch is one ``InputError``).

    The arguments are checked at once; the batches are produced lazily.
    """
    model = require_bridge(model)
    max_batches = check_max_batches(max_batches)
    return (check_batch(model, batch) for batch in _batches(model, open_data(model, data), max_batches))


def unchecked_batches(model: InterpBridge, data: Any) -> Iterator[Batch]:
    """``data``'s batches as read, not yet checked: for a reader that makes its own batch of what it reads (one
    input of ``single_input``: a sequence of ids [pos] read as a batch of one) and checks that
    (``check_batch``)."""
    return _batches(require_bridge(model), open_data(model, data), None)


def _batches(model: InterpBridge, items: Iterable[Any], max_batches: Optional[int]) -> Iterator[Batch]:
    """Each item as a batch; an item that is one empty text (an iterable of texts) is dropped and counted."""
    count, empty = 0, 0
    for item in items:
        if isinstance(item, str) and not item.strip():
            empty += 1
            continue
        batch, dropped = _counted_batch(model, item)
        empty += dropped
        yield batch
        count += 1
        if max_batches is not None and count >= max_batches:
            break  # before reading the next item: a streamed source is read no further than the cap
    if empty:
        warnings.warn(empty_texts_warning(empty), UserWarning, stacklevel=2)
    if count == 0:
        raise InputError("data is empty: no batches to process" + (" (every text was empty)" if empty else ""))
