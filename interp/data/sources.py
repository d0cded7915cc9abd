"""Bring your own data: image folders, text files, JSONL / CSV / Parquet tables, HF
``datasets``, numpy arrays and torch ``DataLoader``s, resolved for one model into batches
produced lazily (nothing is held in a list).

``resolve_data(model, data, ...)`` returns a ``DataSource``: iterate it for ``Batch``es;
``description`` says in one line what was understood ("412 images from photos/, ...");
``skipped`` counts items that could not be read (a corrupt or truncated image), which are
warned about and never dropped silently (``strict=True`` makes the first one an error).

Preprocessing comes from the model: images are converted to RGB (grayscale and RGBA
too), centre-cropped to a square, resized to the model's image size (bilinear,
antialiased) and normalised with the mean / std of the model's image processor, else
timm's ``pretrained_cfg``, else ImageNet's (``normalize="imagenet"`` or ``"none"``
overrides). Text is tokenised with the model's tokenizer into windows of ``seq_len``
tokens, right-padded with a correct attention mask (statistics exclude padding); a text
longer than a window is chunked into several windows, a ``seq_len`` longer than the
model's positions is refused.

Under torchrun, ``rank`` / ``world`` make each process read only the items whose index
is congruent to its rank (images, rows, text windows), never the others' pixels.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from interp.data.batch import Batch, image_norm, normalise, pil_pixels, square_resize
from interp.types import NORMALIZE
from interp.errors import InputError, boundary, public
from interp.io import text_lines
from interp.models.bridge import InterpBridge, require_bridge

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
TABLE_SUFFIXES = (".jsonl", ".csv", ".parquet")
TEXT_SUFFIXES = (".txt",)
DEFAULT_SEQ_LEN = 128
BUILTIN = ("photos", "digits", "mnist", "python-docs")
# a string ending in one of these names a file, never a sentence (even with spaces in it)
FILE_SUFFIXES = (*IMAGE_SUFFIXES, *TABLE_SUFFIXES, *TEXT_SUFFIXES, ".json", ".tsv", ".gif", ".bmp", ".tif", ".tiff",
                 ".npy", ".npz", ".arrow", ".pt", ".pth", ".safetensors", ".gz", ".zip", ".tar", ".md")
KNOWN_DATA = ("built-in datasets are photos, digits, mnist, python-docs; or pass a folder of images, an image, a "
              ".txt file or a .jsonl/.csv/.parquet table")


def _looks_like_path(text: str) -> bool:
    """One line with a path separator, or ending in a file suffix: a path, even with spaces in it."""
    one = text.strip()
    return "\n" not in one and ("/" in one or "\\" in one or one.lower().endswith(FILE_SUFFIXES))


def _exists(text: str) -> bool:
    try:
        return Path(text).expanduser().exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte: not a file
        return False


def data_kind(data: Any, text_ok: bool) -> str:
    """What a ``data`` string means, decided in this one place for every entry point (the API, the
    pipeline, the CLI): "builtin" (a built-in data set), "path" (an existing file or folder) or "text"
    (a sentence, only where ``text_ok``: a language model's own API). Anything else is one clear error:
    a missing path is never read as a sentence."""
    text = str(data)
    if isinstance(data, str) and text in BUILTIN:
        return "builtin"
    if not text.strip():
        raise InputError(f"data is an empty string: pass a built-in dataset name ({', '.join(BUILTIN)}), a path, "
                         "or text as a list of strings")
    if _exists(text):
        return "path"
    if isinstance(data, os.PathLike) or _looks_like_path(text):
        raise InputError(f"no such file or folder: {text!r} (it looks like a path, so it is not read as text): "
                         "check the path; to pass text that looks like one, wrap it in a list: [text]")
    if text_ok and any(c.isspace() for c in text.strip()):
        return "text"
    one_word = "; text without a space is read as a name: pass it in a list, [text]" if text_ok else ""
    raise InputError(f"unknown dataset or path {text!r}: {KNOWN_DATA}{one_word}")


@dataclass
class DataSource:
    """Batches for one model, produced lazily; what was understood and what could not be read."""

    description: str
    items: Callable[[], Iterator[Any]]  # this rank's items: image tensors [C, H, W] or token-id windows
    collate: Callable[[list], Batch]
    batch_size: int
    skipped: int = 0
    skipped_items: list[str] = field(default_factory=list)  # the first few, named
    max_tokens: Optional[int] = None
    empty_texts: int = 0  # texts of only whitespace, dropped (empty_texts_warning)

    def __iter__(self) -> Iterator[Batch]:
        tokens, self.skipped, self.skipped_items, produced = 0, 0, [], False  # counted afresh on every pass
        self.empty_texts = 0
        items = self.items()
        while True:
            chunk = list(itertools.islice(items, self.batch_size))
            if not chunk:
                break
            batch = self.collate(chunk)
            produced = True
            yield batch
            tokens += int(batch.attention_mask.sum()) if batch.attention_mask is not None else 0
            if self.max_tokens is not None and tokens >= self.max_tokens:
                break
        if self.skipped and not produced:
            raise InputError(f"no item of the data could be read, so there is nothing to run on: "
                             f"{self._skipped_list()}; check those files (are they images / text?)")
        if self.skipped:
            warnings.warn(f"{self.skipped} item(s) could not be read and were skipped: {self._skipped_list()}",
                          UserWarning, stacklevel=2)
        if self.empty_texts:
            warnings.warn(empty_texts_warning(self.empty_texts), UserWarning, stacklevel=2)

    def _skipped_list(self) -> str:
        return f"{', '.join(self.skipped_items)}{' ...' if self.skipped > len(self.skipped_items) else ''}"

    def skip(self, name: str, why: str, strict: bool) -> None:
        if strict:
            raise InputError(f"could not read {name}: {why} (strict: pass strict=False / drop --strict to skip it)")
        self.skipped += 1
        if len(self.skipped_items) < 10:
            self.skipped_items.append(f"{name} ({why})")


def _shard(items: Iterable[Any], opts: "Options") -> Iterator[Any]:
    """This rank's items, at most ``max_items`` in all ranks together.

    Items are dealt out a batch at a time (item i goes to rank (i // batch_size) mod world), so
    the ranks' batches are exactly one process's batches and merged statistics equal its own.
    """
    for index, item in enumerate(items):
        if opts.max_items is not None and index >= opts.max_items:
            return
        if (index // opts.batch_size) % opts.world == opts.rank:
            yield item


# ----- images -------------------------------------------------------------------------


def _image_files(root: Path) -> list[Path]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise InputError(f"no images ({'/'.join(s[1:] for s in IMAGE_SUFFIXES)}) in {root} (searched recursively)")
    return files


def _class_labels(root: Path, files: list[Path]) -> Optional[dict[Path, int]]:
    """Class subfolders as labels (sorted names -> 0, 1, ...) when every image sits in one."""
    parents = {f.parent for f in files}
    if any(f.parent == root for f in files) or any(p.parent != root for p in parents) or len(parents) < 2:
        return None
    index = {p: i for i, p in enumerate(sorted(parents))}
    return {f: index[f.parent] for f in files}


def _image_reader(model: InterpBridge, normalize: str) -> Callable[[Any], Tensor]:
    from PIL import Image

    info = model.interp
    mean, std = image_norm(model, normalize)

    def read(source: Any) -> Tensor:
        if isinstance(source, np.ndarray):  # uint8 [H, W] or [H, W, C]
            pixels = source
        else:
            img = source if isinstance(source, Image.Image) else Image.open(source)
            img.load()  # a truncated file fails here, not later
            pixels = pil_pixels(img)
        x = square_resize(pixels, info.image_size)
        return x if mean is None else normalise(x, mean, std)
    return read


def _image_items(src: DataSource, paths: Iterable[tuple[Any, Any]], read: Callable, strict: bool) -> Iterator:
    """(image, label) pairs for readable images; the rest skipped and counted."""
    for source, label in paths:
        try:
            yield read(source), label
        except InputError:  # a readable image whose pixels cannot be read as pixels: said, not skipped
            raise
        except (OSError, ValueError, SyntaxError) as exc:  # PIL: unidentified, truncated, decompression bomb
            src.skip(str(source), type(exc).__name__, strict)


def _collate_images(chunk: list) -> Batch:
    labels = [label for _, label in chunk]
    y = torch.tensor(labels) if all(label is not None for label in labels) else None
    return Batch(torch.stack([x for x, _ in chunk]), labels=y)


# ----- text ---------------------------------------------------------------------------


def _windows(token_lists: Iterable[list[int]], seq_len: int) -> Iterator[list[int]]:
    """Each text's tokens cut into windows of ``seq_len`` (a long text becomes several)."""
    for ids in token_lists:
        for start in range(0, len(ids), seq_len):
            window = ids[start : start + seq_len]
            if window:
                yield window


def _collate_text(pad_id: int) -> Callable[[list], Batch]:
    def collate(chunk: list) -> Batch:
        width = max(len(w) for w in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, window in enumerate(chunk):
            ids[row, : len(window)] = torch.tensor(window)
            mask[row, : len(window)] = 1
        return Batch(ids, mask)
    return collate


def empty_texts_warning(n: int) -> str:
    """What every entry point (a list of texts, a table, a dataset) says when it drops ``n`` empty texts."""
    return (f"{n} empty text(s) (nothing but whitespace) were dropped: an empty text has no tokens to analyse (the "
            "tokenizer would give its special tokens alone, a row that puts all its mass on the first token)")


def _tokenise(model: InterpBridge, texts: Iterable[str], src: Optional[DataSource] = None) -> Iterator[list[int]]:
    """Each text's token ids; an empty text (only whitespace) is dropped and counted in ``src.empty_texts``."""
    if model.tokenizer is None:
        raise InputError(f"{model.interp.name} has no tokenizer, so text cannot be tokenised: load it with "
                         "interp.load_model(model, tokenizer=AutoTokenizer.from_pretrained(...))")
    for text in texts:
        if text and text.strip():
            yield model.tokenizer(text, add_special_tokens=True)["input_ids"]
        elif src is not None:
            src.empty_texts += 1


def _text_file(path: Path) -> Iterator[str]:
    """Paragraphs (blank-line separated) of a UTF-8 text file, read as a stream (``interp.io.text_lines``)."""
    paragraph: list[str] = []
    for line in text_lines(path):
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            yield "".join(paragraph)
            paragraph = []
    if paragraph:
        yield "".join(paragraph)


# ----- tables ---------------------------------------------------------------------------


def _missing_column(path: Path, column: Optional[str], columns: list[str], what: str) -> InputError:
    hint = f"--{what}-column / {what}_column="
    return InputError(f"{path} has no column {column!r}; its columns: {', '.join(map(str, columns))} "
                      f"(name one with {hint})")


def _check_column(path: Path, column: Optional[str], names: list[str], what: str, where: str = "") -> None:
    """``column`` is among the table's column ``names`` exactly once: a name held twice is refused (a
    reader would silently take one of the two columns: the CSV reader the last, Parquet the first)."""
    if column not in names:
        raise _missing_column(path, column, names, what)
    at = [i + 1 for i, name in enumerate(names) if name == column]
    if len(at) > 1:
        raise InputError(f"{path}{where} has {len(at)} columns named {column!r} (columns {', '.join(map(str, at))}), "
                         f"so which one holds the {what} is ambiguous: rename all but one, or name another column "
                         f"with {what}_column= / --{what}-column")


def _parquet_rows(path: Path, column: Optional[str], what: str) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    damaged = ("check that the file is whole and is Parquet (pandas.read_parquet reads it), or write it again "
               "(df.to_parquet(path))")
    with boundary(f"reading {path} as a Parquet table", damaged):
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    _check_column(path, column, names, what)
    row = 0
    with boundary(f"reading column {column!r} of {path}", damaged):
        batches = pf.iter_batches(columns=[column], batch_size=256)
    while True:
        with boundary(f"reading column {column!r} of {path} after row {row}", damaged):
            record_batch = next(batches, None)
            values = None if record_batch is None else record_batch.column(0).to_pylist()
        if values is None:
            return
        for value in values:
            row += 1
            yield f"row {row}", value


def _csv_rows(path: Path, column: Optional[str], what: str) -> Iterator[tuple[str, Any]]:
    reader = csv.reader(text_lines(path, newline=""))
    header = next(reader, None) or []
    _check_column(path, column, header, what)
    at = header.index(column)
    for row in reader:
        if not row:
            continue
        if len(row) != len(header):
            raise InputError(f"{path} line {reader.line_num} has {len(row)} fields where its header has {len(header)}"
                             " (a comma inside a text that is not quoted?): quote fields that hold commas, "
                             '"like, this" (csv.writer and DataFrame.to_csv do), or write the table as Parquet')
        yield f"line {reader.line_num}", row[at]


def _jsonl_rows(path: Path, column: Optional[str], what: str) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(text_lines(path), 1):
        if not line.strip():
            continue
        try:
            row, keys = _json_line(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path} line {number} is not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path} line {number} is a JSON {type(row).__name__}, not an object: each line "
                             f"must be an object with a {column!r} field")
        _check_column(path, column, keys, what, f" line {number}")
        yield f"line {number}", row[column]


def _json_line(line: str) -> tuple[Any, list[str]]:
    """(the line's JSON value, the keys of its top-level object with repeats kept: ``json`` keeps only a
    repeated key's last value)."""
    seen: list[list[str]] = []

    def pairs_hook(pairs: list) -> dict:
        seen.append([key for key, _ in pairs])
        return dict(pairs)

    value = json.loads(line, object_pairs_hook=pairs_hook)
    return value, seen[-1] if seen else []  # the top-level object closes last


def _table_rows(path: Path, column: Optional[str], what: str) -> Iterator[tuple[str, Any]]:
    """(where, value) of one column, row by row, without loading the table."""
    suffix = path.suffix.lower()
    read = _parquet_rows if suffix == ".parquet" else _csv_rows if suffix == ".csv" else _jsonl_rows
    try:
        yield from read(path, column, what)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start} of a chunk): "
                         "re-encode it as UTF-8") from None


def _checked_value(value: Any, where: str, column: Optional[str], what: str) -> Any:
    """A table or dataset cell as the text or image it must be; anything else is one error naming
    the column and the row (an integer or a list is never tokenised as its string form)."""
    if what == "text" and isinstance(value, str):
        return value
    if what == "image" and (isinstance(value, (str, os.PathLike, np.ndarray)) or hasattr(value, "convert")):
        return value
    expected = "text (a string)" if what == "text" else "an image (a path, a PIL image or a uint8 array)"
    kind = type(value).__name__
    found = "empty (null)" if value is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({str(value)[:40]!r})"
    fix = "drop or fill the empty rows first" if value is None else f"convert the column to {expected.split(' (')[0]}"
    raise InputError(f"{where} of column {column!r} is {found}, not {expected}: {fix}, or name another column "
                     f"with {what}_column= / --{what}-column")


# ----- resolving ------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How to read data for one model (the CLI flags of the same names)."""

    text_column: Optional[str] = None  # default "text"
    image_column: Optional[str] = None  # default "image"
    batch_size: int = 8
    seq_len: Optional[int] = None  # default: 128, or the model's positions when fewer
    max_items: Optional[int] = None  # images, rows or text windows, over all ranks
    max_tokens: Optional[int] = None  # stop once this many real tokens were produced (this rank)
    normalize: str = "model"  # "model" | "imagenet" | "none"
    rank: int = 0
    world: int = 1
    strict: bool = False  # an unreadable item is an error, not a skip


def _check_options(model: InterpBridge, opts: Options) -> None:
    info = model.interp
    for name in ("batch_size", "seq_len", "world", "max_items", "max_tokens"):
        value = getattr(opts, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            none = {"seq_len": " (or None: the default)", "max_items": " (or None: no limit)",
                    "max_tokens": " (or None: no limit)"}.get(name, "")
            raise InputError(f"{name} must be an integer >= 1{none}, got {value!r}")
    for name in ("text_column", "image_column"):
        if getattr(opts, name) is not None and not isinstance(getattr(opts, name), str):
            raise InputError(f"{name} must be a column name (a string), got {getattr(opts, name)!r}")
    if isinstance(opts.rank, bool) or not isinstance(opts.rank, int) or not 0 <= opts.rank < opts.world:
        raise InputError(f"rank must be an integer in 0..{opts.world - 1} (this process's place among world="
                         f"{opts.world}); got {opts.rank!r}")
    if opts.normalize not in NORMALIZE:
        raise InputError(f"normalize must be one of {', '.join(NORMALIZE)}, got {opts.normalize!r}")
    if info.modality == "text" and None not in (info.max_positions, opts.seq_len) and opts.seq_len > info.max_positions:
        raise InputError(f"seq_len {opts.seq_len} is longer than {info.name}'s {info.max_positions} positions: "
                         f"pass --seq-len {info.max_positions} or less (longer texts are chunked into windows)")


def _need(model: InterpBridge, modality: str, what: str) -> None:
    info = model.interp
    if info.modality != modality:
        kind = "language" if info.modality == "text" else "vision"
        raise InputError(f"{what} holds {'images' if modality == 'vision' else 'text'}, but {info.name} is a "
                         f"{kind} model")


def _rank_note(opts: Options) -> str:
    return "" if opts.world == 1 else (f"; this process (rank {opts.rank} of {opts.world}) reads every "
                                       f"{opts.world}th batch of them")


def _image_source(model: InterpBridge, pairs: Callable[[], Iterable], count: Optional[int], where: str,
                  opts: Options) -> DataSource:
    _need(model, "vision", where)
    read = _image_reader(model, opts.normalize)
    norm = {"model": "the model's mean/std", "imagenet": "ImageNet's mean/std", "none": "no normalisation"}
    n = "" if count is None else f"{min(count, opts.max_items or count)} "
    text = (f"{n}images from {where}, converted to RGB, centre-cropped and resized to {model.interp.image_size} "
            f"px, normalised with {norm[opts.normalize]}{_rank_note(opts)}")
    src = DataSource(text, lambda: iter(()), _collate_images, opts.batch_size)
    src.items = lambda: _image_items(src, _shard(pairs(), opts), read, opts.strict)
    return src


def _text_source(model: InterpBridge, texts: Callable[[], Iterable[str]], where: str, opts: Options) -> DataSource:
    _need(model, "text", where)
    tok = model.tokenizer
    pad = 0 if tok is None else (tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id or 0)
    text = (f"text from {where}, tokenised with the model's tokenizer into windows of {opts.seq_len} tokens "
            f"(longer texts chunked), right-padded with attention masks{_rank_note(opts)}")
    src = DataSource(text, lambda: iter(()), _collate_text(pad), opts.batch_size, max_tokens=opts.max_tokens)
    src.items = lambda: _shard(_windows(_tokenise(model, texts(), src), opts.seq_len), opts)
    return src


def _folder(model: InterpBridge, root: Path, opts: Options) -> DataSource:
    files = _image_files(root)
    labels = _class_labels(root, files)
    where = f"{root}/" + (f" ({len(set(labels.values()))} classes from subfolders)" if labels else "")
    return _image_source(model, lambda: ((f, None if labels is None else labels[f]) for f in files), len(files),
                         where, opts)


def _table(model: InterpBridge, path: Path, opts: Options) -> DataSource:
    vision = model.interp.modality == "vision"
    what = "image" if vision else "text"
    column = (opts.image_column or "image") if vision else (opts.text_column or "text")
    first = next(iter(_table_rows(path, column, what)), None)  # a missing column fails now, not mid-run
    if first is not None:
        _checked_value(first[1], f"{path} {first[0]}", column, what)
    values = lambda: (_checked_value(v, f"{path} {where}", column, what)  # noqa: E731
                      for where, v in _table_rows(path, column, what))
    if vision:
        rows = lambda: ((path.parent / v if isinstance(v, str) else v, None) for v in values())  # noqa: E731
        return _image_source(model, rows, None, f"column {column!r} of {path} (paths)", opts)
    return _text_source(model, values, f"column {column!r} of {path}", opts)


def _path_source(model: InterpBridge, path: Path, opts: Options) -> DataSource:
    if path.is_dir():
        return _folder(model, path, opts)
    suffix = path.suffix.lower()
    if path.stat().st_size == 0:
        raise InputError(f"{path} is empty")
    if suffix in TEXT_SUFFIXES:
        return _text_source(model, lambda: _text_file(path), str(path), opts)
    if suffix in TABLE_SUFFIXES:
        return _table(model, path, opts)
    if suffix in IMAGE_SUFFIXES:
        return _image_source(model, lambda: iter([(path, None)]), 1, str(path), opts)
    raise InputError(f"cannot read {path}: expected a folder of images, an image, a .txt file, or a "
                     f".jsonl/.csv/.parquet table")


def _check_feature(ds: Any, column: str, what: str) -> None:
    """A ``datasets`` column whose declared type cannot hold text (or images) is refused before any row."""
    feature = (getattr(ds, "features", None) or {}).get(column)
    if feature is None:
        return
    kind = type(feature).__name__
    dtype = getattr(feature, "dtype", None)
    fits = dtype in ("string", "large_string") if what == "text" else kind == "Image" or dtype == "string"
    if not fits:
        raise InputError(f"the dataset's column {column!r} holds {dtype or kind} values (its feature type), not "
                         f"{what}s: name {'an image' if what == 'image' else 'a text'} column with {what}_column= / "
                         f"--{what}-column, or convert it (ds.cast_column / ds.map)")


def _dataset_rows(ds: Any, column: str, what: str, opts: Options) -> tuple[Callable[[], Iterator], Optional[int]]:
    """(this rank's cells, checked; the row count when the dataset knows it)."""
    if hasattr(ds, "__len__"):  # a Dataset: read only this rank's rows, by index
        n = len(ds) if opts.max_items is None else min(len(ds), opts.max_items)
        mine = [i for i in range(n) if (i // opts.batch_size) % opts.world == opts.rank]
        return lambda: (_checked_value(ds[i][column], f"dataset row {i + 1}", column, what) for i in mine), n

    def stream() -> Iterator:  # an IterableDataset: streamed, this rank's rows kept
        for i, row in _shard(enumerate(ds), opts):
            if column not in row:
                raise InputError(f"dataset row {i + 1} has no column {column!r}; its columns: {', '.join(row)} "
                                 f"(name one with {what}_column= / --{what}-column)")
            yield _checked_value(row[column], f"dataset row {i + 1}", column, what)
    return stream, None


def _dataset_source(model: InterpBridge, ds: Any, opts: Options) -> DataSource:
    """An HF ``datasets.Dataset`` (this rank's rows, by index) or ``IterableDataset`` (streamed)."""
    if isinstance(getattr(ds, "column_names", None), dict):
        raise InputError(f"a DatasetDict holds splits ({', '.join(ds.column_names)}), not rows: pass one split, "
                         f"e.g. ds[{next(iter(ds.column_names), 'train')!r}]")
    vision = model.interp.modality == "vision"
    what = "image" if vision else "text"
    column = (opts.image_column or "image") if vision else (opts.text_column or "text")
    if ds.column_names is not None and column not in ds.column_names:
        raise InputError(f"the dataset has no column {column!r}; its columns: {', '.join(ds.column_names)} "
                         f"(name one with {what}_column= / --{what}-column)")
    if hasattr(ds, "__len__") and len(ds) == 0:
        raise InputError("the dataset has no rows: data is empty")
    _check_feature(ds, column, what)
    rows, n = _dataset_rows(ds, column, what, opts)
    shard = replace(opts, rank=0, world=1, max_items=None)  # the rows are already this rank's
    kind = "datasets.Dataset" if n is not None else "datasets.IterableDataset, streamed"
    if vision:
        return _image_source(model, lambda: ((img, None) for img in rows()), n, f"a {kind} ({column!r})", shard)
    return _text_source(model, rows, f"a {kind} ({column!r}{'' if n is None else f', {n} rows'})", shard)


def _pad_id(model: InterpBridge) -> tuple[Optional[int], bool]:
    """(the tokenizer's pad id or None, whether eos or bos shares it: then it is also a real token)."""
    tok = model.tokenizer
    pad = None if tok is None else tok.pad_token_id
    return pad, pad is not None and pad in (tok.eos_token_id, tok.bos_token_id)


def _unpadded(array: np.ndarray, pad: Optional[int], shared: bool) -> Iterator[list[int]]:
    """Each row without its trailing run of ``pad`` (right padding, masked out); a row that is all
    padding is skipped. A pad id before real tokens is refused, unless eos or bos shares it."""
    for number, row in enumerate(array.tolist(), 1):
        if pad is None:
            yield row
            continue
        end = len(row)
        while end and row[end - 1] == pad:
            end -= 1
        if not shared and pad in row[:end]:
            raise InputError(f"token row {number} holds the pad id {pad} before real tokens (left padding, or "
                             "padding inside the text): only trailing padding can be read from bare ids; pass "
                             "{'input_ids': ..., 'attention_mask': ...} batches instead")
        if end:
            yield row[:end]


def _array_source(model: InterpBridge, array: np.ndarray, opts: Options) -> DataSource:
    """uint8 / uint16 images [N, H, W(, C)], float pixel values [N, C, H, W], or integer token ids [N, pos]."""
    if model.interp.modality == "text":
        if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
            texts = "; texts go in a list: array.tolist()" if array.dtype.kind in "UO" else ""
            raise InputError(f"a numpy array for a language model must be integer token ids [N, pos]; got "
                             f"{array.dtype} {array.shape}{texts}")
        pad, shared = _pad_id(model)
        rows = lambda: _shard(_unpadded(array, pad, shared), opts)  # noqa: E731
        note = "" if pad is None else f", trailing pad id {pad} masked out"
        return DataSource(f"a numpy array of {len(array)} token-id rows{note}", rows, _collate_text(pad or 0),
                          opts.batch_size, max_tokens=opts.max_tokens)
    if array.dtype in (np.uint8, np.uint16) and array.ndim == 3 and array.shape[-1] in (3, 4):
        # [N, H, W] gray images 3 or 4 pixels wide are implausible; one H x W x C colour image is not
        raise InputError(f"a numpy {array.dtype} array {array.shape} is read as [N, H, W] gray images, but it looks "
                         f"like one colour image [H, W, C]: pass array[None] for one image [1, H, W, C], or "
                         "np.stack(images) for several")
    if array.dtype in (np.uint8, np.uint16) and array.ndim in (3, 4):
        return _image_source(model, lambda: ((img, None) for img in array), len(array),
                             f"a numpy {array.dtype} array {array.shape}", opts)
    if array.ndim == 4 and np.issubdtype(array.dtype, np.floating):
        rows = lambda: ((torch.from_numpy(x), None) for x in  # noqa: E731
                        _shard(iter(array), opts))
        return DataSource(f"a numpy float array {array.shape}, taken as pixel values as they are", rows,
                          _collate_images, opts.batch_size)
    raise InputError(f"a numpy array for a vision model must be uint8 or uint16 images [N, H, W(, C)] or float pixel "
                     f"values [N, C, H, W]; got {array.dtype} {array.shape}")


def is_dataset(data: Any) -> bool:
    """An HF ``datasets`` object: a Dataset, an IterableDataset or a DatasetDict of splits."""
    return hasattr(data, "column_names") and (hasattr(data, "features") or isinstance(data.column_names, dict))


@public
def resolve_data(model: InterpBridge, data: Any, **options: Any) -> DataSource:
    """A folder of images, an image, a .txt file, a .jsonl/.csv/.parquet table, a ``datasets.Dataset``,
    a numpy array or a list of PIL images, resolved for ``model`` (see the module doc; ``options``:
    ``Options`` fields)."""
    require_bridge(model, "resolve_data")
    unknown = set(options) - set(Options.__dataclass_fields__)
    if unknown:
        raise InputError(f"unknown data option(s) {sorted(unknown)}; known: {', '.join(Options.__dataclass_fields__)}")
    opts = Options(**options)
    _check_options(model, opts)
    if opts.seq_len is None:
        opts = replace(opts, seq_len=min(DEFAULT_SEQ_LEN, model.interp.max_positions or DEFAULT_SEQ_LEN))
    if isinstance(data, (str, os.PathLike)):
        if data_kind(data, text_ok=False) == "builtin":
            raise InputError(f"{data!r} is a built-in dataset: pass it to record_qkv / the analyses as it is; "
                             "resolve_data reads your own files")
        return _path_source(model, Path(data).expanduser(), opts)
    if isinstance(data, np.ndarray):
        return _array_source(model, data, opts)
    if is_dataset(data):
        return _dataset_source(model, data, opts)
    if is_image_list(data):
        return _image_source(model, lambda: ((img, None) for img in data), len(data),
                             f"a {type(data).__name__} of {len(data)} PIL images", opts)
    if is_path_list(data):
        files = [Path(x).expanduser() for x in data]
        if model.interp.modality != "vision":
            raise InputError(f"data is a {type(data).__name__} of {len(files)} file paths, and {model.interp.name} is "
                             "a language model: pass one file (.txt, .jsonl/.csv/.parquet) or read the files into a "
                             "list of texts")
        return _image_source(model, lambda: ((f, None) for f in files), len(files),
                             f"a {type(data).__name__} of {len(files)} image paths", opts)
    raise InputError(f"cannot resolve {type(data).__name__} as data")


def is_path_list(data: Any) -> bool:
    """A non-empty list or tuple of existing files (``os.PathLike`` or str), read as files, never as text."""
    return isinstance(data, (list, tuple)) and bool(data) and all(
        isinstance(x, (str, os.PathLike)) and (isinstance(x, os.PathLike) or _looks_like_path(x)) and _exists(str(x))
        and Path(x).expanduser().is_file() for x in data)


def is_image_list(data: Any) -> bool:
    """A non-empty list or tuple of PIL images (read like a folder of them)."""
    return isinstance(data, (list, tuple)) and bool(data) and all(hasattr(x, "convert") and hasattr(x, "mode")
                                                                    for x in data)
