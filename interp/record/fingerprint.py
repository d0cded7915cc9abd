"""Fingerprints that bind every number to what produced it.

* ``model_fingerprint``: a hash of the model's config and the exact bytes of every
  parameter (blake2b). It is cached on the model with the parameters' version counters,
  storage addresses and shapes; any in-place change (an optimiser step, ``load_state_dict``,
  ``copy_`` under ``no_grad``) moves a counter, and the hash is recomputed.
* ``data_fingerprint``: a hash of the exact batches (inputs, masks, labels).
* ``callable_identity``: a stable name for a metric function: module, qualified name, a
  hash of its code and of every value it captured (closure cells, defaults, a
  ``functools.partial``'s arguments, a callable object's attributes, the global constants
  its code reads). A callable capturing something that cannot be hashed gets an identity
  that never repeats, so a sweep with it never resumes from another run's rows.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import types
import uuid
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import Tensor

from interp.models.bridge import InterpBridge


CHUNK_BYTES = 1 << 24  # 16 MiB: the most of one tensor on the host at once while it is hashed


def _update(h: Any, t: Tensor) -> None:
    """Feed ``t``'s shape, dtype and raw bytes (row-major) into ``h``, ``CHUNK_BYTES`` at a time: a CUDA
    tensor's bytes travel to the host one chunk after another, a CPU tensor's are read in place (no
    copy), so hashing a 7B model never holds more than one chunk of it on the host. blake2b is a stream:
    the digest equals that of the whole byte string at once (the fingerprints of earlier versions)."""
    t = t.detach()
    h.update(f"{tuple(t.shape)}:{t.dtype};".encode())
    raw = t.contiguous().reshape(-1).view(torch.uint8)  # a view unless ``t`` is non-contiguous
    for start in range(0, raw.numel(), CHUNK_BYTES):
        h.update(raw[start:start + CHUNK_BYTES].cpu().numpy())  # buffer protocol: no bytes() copy


def _weights_state(model: InterpBridge) -> tuple:
    """What changes when a parameter is written in place or replaced: its version counter, storage
    address, shape and dtype (cheap: no bytes read)."""
    return tuple((p._version, p.data_ptr(), tuple(p.shape), p.dtype) for p in model.hf_model.parameters())


def model_fingerprint(model: InterpBridge) -> str:
    """blake2b of the HF config and every parameter's bytes (16 hex digits); cached on the model
    while its parameters' version counters (and storages) stay where they were."""
    state = _weights_state(model)
    cached = getattr(model, "_interp_fingerprint", None)
    if cached is not None and getattr(model, "_interp_fingerprint_state", None) == state:
        return cached
    h = hashlib.blake2b(digest_size=8)
    config = model.hf_model.config.to_dict()
    config.pop("_name_or_path", None)
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for param in model.hf_model.parameters():
        _update(h, param)
    model._interp_fingerprint = h.hexdigest()
    model._interp_fingerprint_state = state
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


class _Unhashable(Exception):
    """A captured value has no stable content hash."""


_SIMPLE = (type(None), bool, int, float, complex, str, bytes)


def _value_digest(h: Any, value: Any, depth: int = 0) -> None:
    """Feed ``value``'s content into ``h``: simple values, tensors and arrays by their bytes,
    containers element by element, functions by their identity; anything else is unhashable."""
    if depth > 8:
        raise _Unhashable("nested too deeply")
    if isinstance(value, _SIMPLE):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, Tensor):
        _update(h, value)
    elif isinstance(value, np.ndarray):
        h.update(f"nd{value.shape}{value.dtype};".encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        h.update(f"{type(value).__name__}[{len(items)}];".encode())
        for item in items:
            _value_digest(h, item, depth + 1)
    elif isinstance(value, dict):
        h.update(f"dict[{len(value)}];".encode())
        for key in sorted(value, key=repr):
            _value_digest(h, key, depth + 1)
            _value_digest(h, value[key], depth + 1)
    elif isinstance(value, (types.ModuleType, type, torch.dtype, torch.device)):
        h.update(f"{value!r};".encode())
    elif callable(value):
        h.update(_callable_digest(value, depth + 1).encode())
    else:
        raise _Unhashable(f"a captured {type(value).__name__}")


def _captured(fn: Callable) -> list[Any]:
    """What a callable's result depends on besides its code."""
    if isinstance(fn, functools.partial):
        return [fn.func, fn.args, dict(fn.keywords)]
    if inspect.ismethod(fn):
        return [fn.__func__, fn.__self__]
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its class's __call__ and its attributes
        return [type(fn).__call__, dict(vars(fn)) if hasattr(fn, "__dict__") else repr(fn)]
    cells = [c.cell_contents for c in (fn.__closure__ or ()) if _cell_filled(c)]
    glob = getattr(fn, "__globals__", {})
    names = _code_parts(code)[1]  # with those read inside its comprehensions, generators and lambdas
    constants = {n: glob[n] for n in names if n in glob and not isinstance(glob[n], types.ModuleType)}
    return [cells, fn.__defaults__, fn.__kwdefaults__, constants]


def _code_parts(code: types.CodeType) -> tuple[bytes, set[str]]:
    """The bytes of a code object and of the code nested in it (comprehensions, generators, lambdas,
    inner functions: their reprs hold memory addresses, so they are read, not repr'd), and every name
    any of them reads."""
    parts, names = [code.co_code, repr(code.co_names).encode()], set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner, inner_names = _code_parts(const)
            parts.append(b"code{" + inner + b"}")
            names |= inner_names
        else:
            parts.append(repr(const).encode())
    return b"|".join(parts), names


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


_LIBRARIES = ("builtins", "torch", "numpy", "math", "einops", "transformers", "scipy", "sklearn", "pandas", "functools")


def _callable_digest(fn: Callable, depth: int = 0) -> str:
    """Code and captured values of ``fn``; a library's function (torch, numpy, ...) by its name (but a
    ``functools.partial`` by what it wraps and binds: its repr abbreviates large tensors), and
    functions reached through other functions' globals by their code only (no endless recursion)."""
    h = hashlib.blake2b(digest_size=6)
    module = str(getattr(fn, "__module__", None) or "").split(".")[0]
    if (module in _LIBRARIES or isinstance(fn, types.BuiltinFunctionType)) and not isinstance(fn, functools.partial):
        h.update(f"{module}.{getattr(fn, '__qualname__', repr(fn))}".encode())
        return h.hexdigest()
    code = getattr(fn, "__code__", None)
    if code is not None:
        h.update(_code_parts(code)[0])
    if depth < 3:
        for value in _captured(fn):
            _value_digest(h, value, depth)
    return h.hexdigest()


def callable_identity(fn: Callable) -> str:
    """``module.qualname#hash-of-code-and-captured-values`` for a metric function; a callable that
    captured something unhashable gets ``...#unfingerprintable-<random>``, which never resumes."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    name = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__name__)}"
    try:
        digest = _callable_digest(fn)
    except _Unhashable:
        digest = f"unfingerprintable-{uuid.uuid4().hex[:12]}"
    return f"{name}#{digest}"


def _hooked(fn: Callable) -> Callable:
    """The function a forward hook runs: TransformerLens wraps ``add_hook``'s function in a closure that
    also holds its HookPoint (a module, unhashable)."""
    code = getattr(fn, "__code__", None)
    cells = dict(zip(code.co_freevars, fn.__closure__ or ())) if code is not None else {}
    wrapped = cells.get("hook")
    if wrapped is not None and _cell_filled(wrapped) and callable(wrapped.cell_contents):
        return wrapped.cell_contents
    return fn


def hooks_identity(model: InterpBridge) -> str:
    """The forward hooks left on the model (a permanent hook, a run inside ``model.hooks(...)``, a hook on
    an HF module), TransformerLens' own capture hooks aside: each module's name and each hook's
    identity, hashed; "" when there are none."""
    hooked = [(f"{name}:{kind}", _hooked(hook)) for name, module in model.named_modules()
              for kind, hooks in (("pre", module._forward_pre_hooks), ("forward", module._forward_hooks))
              for hook in hooks.values()]
    found = [f"{where}:{callable_identity(fn)}" for where, fn in hooked
             if not str(getattr(fn, "__module__", "")).startswith("transformer_lens.")]
    return hashlib.blake2b("|".join(found).encode(), digest_size=8).hexdigest() if found else ""
