"""The statistics file format: ``QKVStats`` as (JSON metadata, named float64 tensors) in one
safetensors file, written atomically and read back only after every field, shape and value is checked
(no pickle). ``QKVStats.save`` / ``QKVStats.load`` call these; so does ``interp.record.stats_dist``, which
ships the same state between ranks.

Tensor names: ``L{layer}.{kind}.count|mean|m2|bias|nonfinite`` and ``L{layer}.x.count|mean``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from interp.errors import InputError, InterpError
from interp.io import atomic_path
from interp.record.moments import Moments
from interp.types import QKV

__all__ = ["STATS_FORMAT", "fields_from_state", "read_state", "state_of", "write_state"]

STATS_FORMAT = 2
READABLE_FORMATS = (1, 2)  # format 1 also stored a placeholder input co-moment, ignored


def state_of(stats: Any) -> dict:
    """``{"meta": ..., "tensors": ...}`` of a ``QKVStats`` (tensors detached, on the host)."""
    meta = dict(format=STATS_FORMAT, model_name=stats.model_name, model_fingerprint=stats.model_fingerprint,
                data_fingerprint=stats.data_fingerprint, n_layers=stats.n_layers, layers=stats.layers,
                kinds=stats.kinds, heads=stats.heads, d_head=stats.d_head, d_model=stats.d_model)
    out: dict[str, Tensor] = {}
    for (layer, kind), mom in stats.moments.items():
        p = f"L{layer}.{kind}"
        out[f"{p}.count"] = mom.count.reshape(1)
        out[f"{p}.mean"], out[f"{p}.m2"] = mom.mean, mom.m2
        out[f"{p}.bias"] = stats.biases[(layer, kind)]
        out[f"{p}.nonfinite"] = stats.nonfinite[(layer, kind)].to(torch.uint8)
    for layer, mom in stats.input_moments.items():
        out[f"L{layer}.x.count"] = mom.count.reshape(1)
        out[f"L{layer}.x.mean"] = mom.mean
    return {"meta": meta, "tensors": {k: v.detach().cpu().contiguous() for k, v in out.items()}}


def fields_from_state(state: dict, device: Any = "cpu") -> dict[str, Any]:
    """``QKVStats``' constructor keywords from a state (``state_of``, ``read_state``)."""
    meta, t = state["meta"], {k: v.to(device) for k, v in state["tensors"].items()}
    if meta.get("format") not in READABLE_FORMATS:
        raise InterpError(f"statistics file format {meta.get('format')} is not {STATS_FORMAT}: "
                          "re-record with this version of interp")
    _check_shapes(meta, t)
    moments, biases, nonfinite, inputs = {}, {}, {}, {}
    for layer in meta["layers"]:
        for kind in meta["kinds"]:
            p = f"L{layer}.{kind}"
            moments[(layer, kind)] = Moments(t[f"{p}.count"][0], t[f"{p}.mean"], t[f"{p}.m2"])
            biases[(layer, kind)] = t[f"{p}.bias"]
            nonfinite[(layer, kind)] = t[f"{p}.nonfinite"].bool()
        inputs[layer] = Moments(t[f"L{layer}.x.count"][0], t[f"L{layer}.x.mean"], None, means_only=True)
    return dict(model_name=meta["model_name"], n_layers=meta["n_layers"], layers=list(meta["layers"]),
                kinds=list(meta["kinds"]), heads={k: int(v) for k, v in meta["heads"].items()},
                d_head=meta["d_head"], d_model=meta["d_model"], biases=biases, moments=moments,
                input_moments=inputs, nonfinite=nonfinite, model_fingerprint=meta.get("model_fingerprint"),
                data_fingerprint=meta.get("data_fingerprint"))


def write_state(state: dict, path: str | Path) -> Path:
    """One safetensors file (float64 tensors + JSON metadata), written atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(state["tensors"], str(tmp), metadata={"interp": json.dumps(state["meta"])})
    return path


def read_state(path: Any) -> dict:
    """The state in a file ``write_state`` wrote, every field, shape and value checked."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"QKVStats.load takes the path of a file stats.save wrote; got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise InterpError(f"no statistics file at {path}" + (" (a folder)" if path.is_dir() else ""))
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = json.loads((fh.metadata() or {})["interp"])
        tensors = load_file(str(path))
    except Exception as exc:
        raise InterpError(f"{path} is not a readable interp statistics file ({exc})") from None
    _check_meta(meta, path)
    _check_shapes(meta, tensors)
    _check_values(tensors, path)
    return {"meta": meta, "tensors": tensors}


def _check_shapes(meta: dict, t: dict[str, Tensor]) -> None:
    """Every tensor a statistics file must hold, with the shape its metadata implies."""
    d, dm = int(meta["d_head"]), int(meta["d_model"])
    expected: dict[str, tuple[int, ...]] = {}
    for layer in meta["layers"]:
        for kind in meta["kinds"]:
            h, p = int(meta["heads"][kind]), f"L{layer}.{kind}"
            expected.update({f"{p}.count": (1,), f"{p}.mean": (h, d), f"{p}.m2": (h, d, d), f"{p}.bias": (h, d),
                             f"{p}.nonfinite": (h,)})
        expected.update({f"L{layer}.x.count": (1,), f"L{layer}.x.mean": (1, dm)})
    for name, shape in expected.items():
        if name not in t:
            raise InterpError(f"statistics file lacks tensor {name!r}: it is damaged or not an interp file")
        if tuple(t[name].shape) != shape:
            raise InterpError(f"statistics file tensor {name!r} has shape {tuple(t[name].shape)}, expected {shape}: "
                              "the file is damaged")


META_FIELDS = {"format": int, "model_name": str, "n_layers": int, "layers": list, "kinds": list, "heads": dict,
               "d_head": int, "d_model": int}


def _check_meta(meta: Any, path: Path) -> None:
    """The metadata a statistics file must carry, with the types ``save`` gives them."""
    if not isinstance(meta, dict):
        raise InterpError(f"{path}: its interp metadata is not a JSON object: the file is damaged; record again")
    if meta.get("format") not in READABLE_FORMATS:
        raise InterpError(f"statistics file format {meta.get('format')} is not {STATS_FORMAT}: "
                          "re-record with this version of interp")
    bad = [k for k, t in META_FIELDS.items() if not isinstance(meta.get(k), t) or isinstance(meta.get(k), bool)]
    if bad:
        raise InterpError(f"{path}: metadata field(s) {', '.join(bad)} missing or of the wrong type: the file is "
                          "damaged or not written by QKVStats.save; record again")
    if (not all(isinstance(x, int) and 0 <= x < meta["n_layers"] for x in meta["layers"])
            or not set(meta["kinds"]) <= set(QKV) or not set(meta["kinds"]) <= set(meta["heads"])):
        raise InterpError(f"{path}: metadata layers {meta['layers']} / kinds {meta['kinds']} / heads {meta['heads']} "
                          "do not fit together: the file is damaged; record again")


def _check_values(t: dict[str, Tensor], path: Path) -> None:
    """Counts positive, finite and equal within a layer; means and co-moments finite."""
    for name, value in t.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise InterpError(f"{path}: tensor {name!r} holds NaN or inf: the file is damaged; record again")
    layers = {name.split(".")[0] for name in t if name.endswith(".count")}
    for layer in sorted(layers):
        counts = {name: float(v.reshape(-1)[0]) for name, v in t.items() if name.startswith(f"{layer}.")
                  and name.endswith(".count")}
        if any(c <= 0 or c != int(c) for c in counts.values()) or len(set(counts.values())) > 1:
            raise InterpError(f"{path}: counts of {layer} are {counts}: each must be the same positive whole "
                              "number of positions; the file is damaged; record again")
