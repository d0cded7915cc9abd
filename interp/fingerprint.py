"""Fingerprints that bind every number to what produced it.

* ``model_fingerprint``: a hash of the model's config and the exact bytes of every
  parameter (blake2b), computed once per loaded model (the library never changes weights:
  ablations are hooks).
* ``data_fingerprint``: a hash of the exact batches (inputs, masks, labels).
* ``callable_identity``: a stable name for a metric function (module, qualified name and
  a hash of its code), so two different lambdas are not the same metric.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from interp.models.bridge import InterpBridge


def _update(h: Any, t: Tensor) -> None:
    t = t.detach()
    h.update(f"{tuple(t.shape)}:{t.dtype};".encode())
    h.update(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())


def model_fingerprint(model: InterpBridge) -> str:
    """blake2b of the HF config and every parameter's bytes (16 hex digits), cached on the model."""
    cached = getattr(model, "_interp_fingerprint", None)
    if cached is not None:
        return cached
    h = hashlib.blake2b(digest_size=8)
    config = model.hf_model.config.to_dict()
    config.pop("_name_or_path", None)
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for param in model.hf_model.parameters():
        _update(h, param)
    model._interp_fingerprint = h.hexdigest()
    return model._interp_fingerprint


class DataHasher:
    """Hashes batches as they stream past (inputs, attention masks, labels, in order)."""

    def __init__(self) -> None:
        self._h = hashlib.blake2b(digest_size=8)

    def update(self, batch: Any) -> None:
        for t in (batch.inputs, batch.attention_mask, batch.labels):
            if t is None:
                self._h.update(b"none;")
            else:
                _update(self._h, t)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def data_fingerprint(batches: Iterable[Any]) -> str:
    """blake2b of the exact batches (inputs, attention masks, labels), 16 hex digits."""
    hasher = DataHasher()
    for batch in batches:
        hasher.update(batch)
    return hasher.hexdigest()


def combine(*fingerprints: str) -> str:
    """One fingerprint for data recorded in parts (order matters)."""
    return hashlib.blake2b("+".join(fingerprints).encode(), digest_size=8).hexdigest()


def callable_identity(fn: Callable) -> str:
    """``module.qualname#hash-of-code`` for a metric function."""
    code = getattr(fn, "__code__", None)
    digest = "nocode"
    if code is not None:
        parts = [code.co_code, repr(code.co_consts).encode(), repr(code.co_names).encode()]
        digest = hashlib.blake2b(b"|".join(parts), digest_size=6).hexdigest()
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return f"{getattr(fn, '__module__', '?')}.{name}#{digest}"
