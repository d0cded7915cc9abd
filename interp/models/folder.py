"""A local model folder, checked before anything is built.

``config.json`` must be a JSON object naming a ``model_type`` and an architecture of that
type (a class of another type would be built from its own defaults, ignoring the sizes:
a default 7B model from a tiny checkpoint). The weights must be safetensors (no pickle),
complete (every tensor's bytes inside the file) and of the size the config implies, and the
model must fit in memory. Each failure is one error naming the file and the fix; nothing is
built before they pass. ``_read_weights`` reads only the safetensors headers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import torch
import transformers

from interp.errors import MissingWeightsError, UnknownSourceError, UnsupportedModelError, boundary

HEADER_LIMIT = 100 * 2**20  # a safetensors header larger than this is damage, not metadata
SLACK_PARAMS = 1_000_000  # parameters a model may hold beyond its weights file (a fresh head, buffers)


def read_config_json(path: Path) -> dict:
    """``path/config.json`` as a dict with a ``model_type`` and an ``architectures`` list."""
    file = path / "config.json"
    if not file.exists():
        raise UnknownSourceError(f"{path} is a folder but has no config.json (not an HF model)")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnknownSourceError(f"{file} is not valid JSON ({exc}): repair it, or re-save the model with "
                                 "model.save_pretrained(folder)") from None
    if not isinstance(raw, dict):
        raise UnknownSourceError(f"{file} holds a JSON {type(raw).__name__}, not an object of config fields: "
                                 "re-save the model with model.save_pretrained(folder)")
    if not raw.get("model_type"):
        raise UnknownSourceError(_no_model_type(file, raw))
    if not raw.get("architectures"):
        raise UnsupportedModelError(f"{file} names no architecture: add e.g. "
                                    '"architectures": ["GPT2LMHeadModel"]')
    if not isinstance(raw["architectures"], list) or not all(isinstance(a, str) for a in raw["architectures"]):
        raise UnknownSourceError(f"{file}: architectures must be a list of class names, got {raw['architectures']!r}")
    return raw


def _no_model_type(file: Path, raw: dict) -> str:
    """What a config.json without ``model_type`` needs: the type of the HF class it names (read from
    transformers), or, naming no class, what the two kinds of folder interp reads hold."""
    archs = raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    cls = getattr(transformers, arch, None) if arch else None
    kind = getattr(getattr(cls, "config_class", None), "model_type", "") or ""
    if kind:
        return f'{file} has no model_type: add "model_type": "{kind}" (the type of its architecture {arch})'
    if arch:
        return (f"{file} has no model_type, and its architecture {arch} is not a transformers class: add the "
                "model_type of the class it was saved from, or re-save it with model.save_pretrained(folder)")
    return (f"{file} names neither a model_type and architectures (a transformers folder: model.save_pretrained) "
            "nor an architecture (a timm folder: timm.models.save_for_hf), so its type cannot be read: re-save "
            "the model with its library's save function, or pass timm:NAME with weights=")


def check_architecture(path: Path, raw: dict, cls: type) -> None:
    """Refuse a config whose ``architectures`` class belongs to another ``model_type``."""
    expected = getattr(getattr(cls, "config_class", None), "model_type", "") or ""
    if expected and expected != raw["model_type"]:
        raise UnknownSourceError(
            f"{path / 'config.json'} disagrees with itself: model_type {raw['model_type']!r}, but its architecture "
            f"{cls.__name__} is a {expected!r} class, which would ignore these sizes and build a default-size "
            f"{expected} model: make the two agree")


def load_config(path: Path) -> Any:
    """The HF config of a folder whose config.json passed ``read_config_json``."""
    with boundary(f"reading {path / 'config.json'} as a transformers config", "repair it (each field of the type "
                  "transformers expects: an integer as a number, not text), or re-save the model with "
                  "model.save_pretrained(folder)", UnknownSourceError):
        return transformers.AutoConfig.from_pretrained(path)


def _header(file: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from a safetensors header; the file must hold every tensor's bytes."""
    size = file.stat().st_size
    damaged = f"{file} is truncated or not a safetensors file"
    with open(file, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > min(size - 8, HEADER_LIMIT):
            raise MissingWeightsError(f"{damaged} ({size:,} bytes, no readable header): copy or save it again")
        try:
            meta = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise MissingWeightsError(f"{damaged} (its header is not JSON): copy or save it again") from None
    tensors = {k: v for k, v in meta.items() if k != "__metadata__" and isinstance(v, dict)}
    end = 8 + n + max((int(v.get("data_offsets", [0, 0])[1]) for v in tensors.values()), default=0)
    if end > size:
        raise MissingWeightsError(f"{file} is truncated: its header promises {end:,} bytes, the file holds "
                                  f"{size:,}: copy or save it again")
    return {k: list(v.get("shape", [])) for k, v in tensors.items()}


def _read_weights(path: Path) -> dict[str, list[int]]:
    """Every tensor's shape in the folder's safetensors weights (one file or an index of shards)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise MissingWeightsError(f"{index} is not a safetensors index (no weight_map): save the model "
                                      "again") from None
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        pickled = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt*")]
        hint = (f"; it holds {', '.join(sorted(pickled))}, which interp does not unpickle: convert it with "
                "model.save_pretrained(folder, safe_serialization=True)") if pickled else ""
        raise MissingWeightsError(f"{path} has no model.safetensors{hint}")
    shapes: dict[str, list[int]] = {}
    for name in files:
        if not (path / name).exists():
            raise MissingWeightsError(f"{path}: shard {name} named by {index.name} is missing")
        shapes.update(_header(path / name))
    return shapes


def _meta_model(cls: type, config: Any) -> Optional[torch.nn.Module]:
    """``cls(config)`` on the meta device (nothing allocated); None if it will not build there."""
    try:
        with torch.device("meta"):
            return cls(config)
    except Exception:  # an architecture that cannot build on meta: the load itself will say what is wrong
        return None


SIZE_FIELDS = ("num_hidden_layers", "n_layer", "num_attention_heads", "n_head", "num_key_value_heads", "hidden_size",
               "n_embd", "intermediate_size", "head_dim", "vocab_size", "max_position_embeddings", "n_positions",
               "image_size", "patch_size", "num_channels")


def _check_size_fields(path: Path, config: Any) -> None:
    """Sizes that cannot describe a model (zero or negative layers, heads, widths) are refused."""
    bad = [f"{name}={getattr(config, name)}" for name in SIZE_FIELDS
           if isinstance(getattr(config, name, None), int) and not isinstance(getattr(config, name), bool)
           and getattr(config, name) < 1]
    if bad:
        raise UnknownSourceError(f"{path / 'config.json'} gives {', '.join(bad)}: a model needs at least one of "
                                 "each; use the config.json saved with these weights")


def _mismatches(model: torch.nn.Module, shapes: dict[str, list[int]]) -> list[str]:
    """Tensors whose shape in the file differs from the shape the config gives them (names the model does
    not hold as they are, e.g. renamed by transformers on load, are not compared)."""
    own = {k: list(v.shape) for k, v in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") or "-"
    found = []
    for key, shape in shapes.items():
        for name in (key, f"{prefix}.{key}", key.removeprefix(f"{prefix}.")):
            if name in own:
                if own[name] != shape:
                    found.append(f"{key} is {shape} in the weights, {own[name]} by config.json")
                break
    return found


def _free_bytes() -> Optional[int]:
    """MemAvailable (Linux), None elsewhere."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_sizes(path: Path, cls: type, config: Any, dtype: torch.dtype) -> None:
    """Refuse, before building: tensors of other shapes than the config implies, a config implying far
    more parameters than the weights hold, or a model larger than the free memory."""
    _check_size_fields(path, config)
    shapes = _read_weights(path)
    model = _meta_model(cls, config)
    if model is None:
        return
    wrong = _mismatches(model, shapes)
    if wrong:
        raise UnknownSourceError(f"the weights in {path} do not fit its config.json ({len(wrong)} tensor(s); "
                                 f"{'; '.join(wrong[:3])}): use the config.json saved with these weights")
    built, in_file = sum(p.numel() for p in model.parameters()), sum(math.prod(s) for s in shapes.values())
    if built > 1.5 * in_file + SLACK_PARAMS:
        raise UnknownSourceError(
            f"{path / 'config.json'} describes a {cls.__name__} of {built:,} parameters, but the weights hold "
            f"{in_file:,}: the config lacks size fields or belongs to another checkpoint (a default-size model "
            "would be built); use the config.json saved with these weights")
    need, free = built * torch.finfo(dtype).bits // 8, _free_bytes()
    if free is not None and need > free:
        raise MissingWeightsError(f"{cls.__name__} from {path} needs {need / 2**30:.1f} GiB in {dtype}, but "
                                  f"only {free / 2**30:.1f} GiB of memory is free: free memory or use a smaller dtype")
