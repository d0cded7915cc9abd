"""timm and open_clip models by name with a weights file, and the folders their libraries write.

Sources (``interp.load_model`` and every command's ``--model``):

* ``timm:NAME`` (e.g. ``timm:vit_tiny_patch16_224``): ``timm.create_model(NAME, pretrained=False,
  **model_args)``: built from timm's own config for NAME, nothing downloaded; ``weights=FILE`` then
  loads a state dict into it, strictly (every tensor present, of its shape). ``num_classes`` is read
  from the file's ``head.weight`` (0 when the file has no head) unless ``model_args`` gives it.
* ``open_clip:NAME`` (e.g. ``open_clip:ViT-B-32``): ``open_clip.create_model(NAME, pretrained=None)``;
  ``weights`` is the whole CLIP model's state dict (keys ``visual.*``, as open_clip saves it) or the
  vision tower's alone. The vision tower is what interp analyses.
* a folder written by ``timm.models.save_for_hf`` (``config.json`` naming an ``architecture`` and its
  ``model_args``; ``model.safetensors`` or ``pytorch_model.bin``), or by open_clip's ``save_for_hf``
  (``open_clip_config.json`` with ``model_cfg``).

Weights are read with ``safetensors`` (``.safetensors``) or ``torch.load(weights_only=True)``
(``.pth``, ``.pt``, ``.bin``: tensors only; a file that needs Python objects unpickled is refused).
A random initialisation is allowed (a negative control), with a warning: timm and open_clip start
every q/k/v bias at zero, so every bias effect would read zero.
"""

from __future__ import annotations

import difflib
import json
import pickle
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from interp.errors import InputError, MissingWeightsError, UnknownSourceError, boundary

LIBRARIES = ("timm", "open_clip")
PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
TIMM_FOLDER_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def library_source(source: str) -> Optional[tuple[str, str]]:
    """("timm" | "open_clip", NAME) for ``timm:NAME`` / ``open_clip:NAME``; None for any other string."""
    for library in LIBRARIES:
        if source.startswith(library + ":"):
            name = source[len(library) + 1:].strip()
            if not name:
                example = "timm:vit_tiny_patch16_224" if library == "timm" else "open_clip:ViT-B-32"
                raise UnknownSourceError(f"{source!r} names no model: write {library}:NAME, e.g. {example}")
            return library, name
    return None


def _import(library: str) -> Any:
    try:
        if library == "timm":
            import timm
            return timm
        import open_clip
        return open_clip
    except ImportError:
        raise UnknownSourceError(f"{library} is not installed: pip install '.[vision]' (or `make setup`)") from None


# ----- weights files ------------------------------------------------------------------------------------


def read_state_dict(path: Any) -> dict[str, torch.Tensor]:
    """A state dict (name -> tensor) from ``.safetensors`` (safetensors) or ``.pth``/``.pt``/``.bin``/``.ckpt``
    (``torch.load(weights_only=True)``, never unpickling objects); a checkpoint holding it under
    ``state_dict``/``model`` is unwrapped, and a ``module.`` prefix on every key (DataParallel) dropped."""
    file = Path(path).expanduser()
    if not file.is_file():
        folder = " (it is a folder: pass it as the model)" if file.is_dir() else ""
        raise MissingWeightsError(f"weights file {str(path)!r} does not exist{folder}")
    suffix = file.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state: Any = load_file(str(file), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise MissingWeightsError(f"{file} is not a readable safetensors file ({exc}): copy or save it "
                                      "again") from None
    elif suffix in PICKLE_SUFFIXES:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise MissingWeightsError(
                f"{file} holds Python objects besides tensors, which interp does not unpickle (torch.load with "
                "weights_only=True): save the state dict alone, torch.save(model.state_dict(), file), or as "
                "safetensors (safetensors.torch.save_file(model.state_dict(), 'model.safetensors'))") from None
        except (RuntimeError, EOFError, OSError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise MissingWeightsError(f"{file} is truncated or not a torch.save file ({type(exc).__name__}: {first}): "
                                      "copy or save it again") from None
    else:
        raise InputError(f"weights {file}: unknown suffix {suffix or '(none)'!r}: give a .safetensors file or a "
                         f"state dict saved with torch.save ({', '.join(PICKLE_SUFFIXES)})")
    return _unwrapped(state, file)


def _unwrapped(state: Any, file: Path) -> dict[str, torch.Tensor]:
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict) and \
                not any(isinstance(v, torch.Tensor) for v in state.values()):
            state = state[key]
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise MissingWeightsError(f"{file} holds no state dict (a mapping of parameter names to tensors): save "
                                  "model.state_dict()")
    if all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return dict(state)


def _load_state(model: nn.Module, state: dict[str, torch.Tensor], what: str, fix: str) -> None:
    """``model.load_state_dict(state, strict=True)`` after checking names and shapes: a mismatch is one error
    naming the first few tensors and ``fix``."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    wrong = [f"{k} is {list(state[k].shape)} in the file, {list(own[k].shape)} in the model"
             for k in own if k in state and state[k].shape != own[k].shape]
    if missing or extra or wrong:
        parts = [f"{len(missing)} the model has and the file lacks (e.g. {', '.join(missing[:3])})" if missing else "",
                 f"{len(extra)} in the file but not the model (e.g. {', '.join(extra[:3])})" if extra else "",
                 f"{len(wrong)} of another shape ({'; '.join(wrong[:3])})" if wrong else ""]
        raise MissingWeightsError(f"the weights do not fit {what}: {', '.join(p for p in parts if p)}. {fix}")
    cast = [f"{k} ({state[k].dtype})" for k in own if own[k].is_floating_point() and not state[k].is_floating_point()]
    if cast:  # integers read as weights would be cast to floats without a word: not this model's weights
        raise MissingWeightsError(f"the weights for {what} hold {len(cast)} integer or boolean tensor(s) where the "
                                  f"model has floating-point weights (e.g. {', '.join(cast[:3])}): a quantised or "
                                  f"other file, not these weights. {fix}")
    with torch.no_grad():
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)


def _random_init_warning(source: str) -> None:
    warnings.warn(f"{source}: no weights given, so it is timm's / open_clip's random initialisation, which starts "
                  "every q/k/v bias at exactly zero: every bias effect will read zero. Pass weights=FILE (--weights: "
                  "a .safetensors or .pth state dict) or a folder its library saved (weights cannot download here)",
                  UserWarning, stacklevel=4)


def _unknown_name(library: str, name: str, known: list[str]) -> UnknownSourceError:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return UnknownSourceError(f"{library} has no model named {name!r}{hint} ({library}.list_models() lists them)")


# ----- timm ----------------------------------------------------------------------------------------------


def timm_model(name: str, weights: Any = None, model_args: Optional[dict] = None) -> nn.Module:
    """``timm.create_model(name, pretrained=False, **model_args)`` with ``weights`` loaded (module doc)."""
    timm = _import("timm")
    if not timm.is_model(name):
        raise _unknown_name("timm", name, timm.list_models())
    state = read_state_dict(weights) if weights is not None else None
    args = dict(model_args or {})
    if state is not None and "num_classes" not in args:
        head = state.get("head.weight")
        args["num_classes"] = int(head.shape[0]) if isinstance(head, torch.Tensor) and head.ndim == 2 else 0
    model = _create(timm, name, args)
    if state is None:
        _random_init_warning(f"timm:{name}")
    else:
        _load_state(model, state, f"timm's {name} built with {_args_text(args)}",
                   "Pass the arguments the model was built with (model_args= / --model-args '{\"img_size\": 32}'), "
                   "or save it with timm.models.save_for_hf(model, folder), which records them, and load the folder")
    return model.eval()


def _args_text(args: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items()) or "its defaults"


def _create(timm: Any, name: str, args: dict) -> nn.Module:
    # timm's own checks (an assert, a ValueError, a division by a zero size) become the boundary's InputError
    with boundary(f"building timm's {name} with model_args {_args_text(args)}",
                  "pass values this architecture takes (e.g. num_heads dividing embed_dim, positive sizes), or leave "
                  "model_args out for timm's defaults"):
        try:
            return timm.create_model(name, pretrained=False, **args)
        except TypeError as exc:
            raise InputError(f"timm's {name} does not take these model_args ({_args_text(args)}): {exc}") from None


def timm_folder(path: Path) -> nn.Module:
    """A folder written by ``timm.models.save_for_hf``: built from its config.json (architecture and
    model_args), weights from model.safetensors or pytorch_model.bin (weights_only)."""
    timm = _import("timm")
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    arch = raw.get("architecture")
    if not isinstance(arch, str) or not timm.is_model(arch):
        raise _unknown_name("timm", str(arch), timm.list_models())
    file = next((path / f for f in TIMM_FOLDER_WEIGHTS if (path / f).exists()), None)
    if file is None:
        raise MissingWeightsError(f"{path} is a timm folder ({arch}) without weights: it needs "
                                  f"{' or '.join(TIMM_FOLDER_WEIGHTS)} (timm.models.save_for_hf writes them)")
    with boundary(f"{path / 'config.json'} building timm's {arch}", "repair config.json (model_args must be an "
                  "object of constructor arguments) or save the model again with timm.models.save_for_hf",
                  UnknownSourceError):
        model = timm.create_model(f"local-dir:{path}", pretrained=False)
    _load_state(model, read_state_dict(file), f"timm's {arch} as {path / 'config.json'} describes it",
               "Save config.json and the weights together again (timm.models.save_for_hf(model, folder))")
    return model.eval()


# ----- open_clip -----------------------------------------------------------------------------------------


def _open_clip_model(name: str, weights: Any = None, model_args: Optional[dict] = None) -> nn.Module:
    """The vision tower of ``open_clip.create_model(name, pretrained=None, **model_args)``, ``weights`` loaded:
    a whole CLIP state dict (``visual.*`` keys) or the tower's own."""
    open_clip = _import("open_clip")
    if name not in open_clip.list_models():
        raise _unknown_name("open_clip", name, open_clip.list_models())
    state = read_state_dict(weights) if weights is not None else None
    with boundary(f"building open_clip's {name} with model_args {_args_text(model_args or {})}",
                  "pass arguments open_clip.create_model takes, with values this architecture takes, or leave "
                  "model_args out"):
        clip = open_clip.create_model(name, pretrained=None, device="cpu", **(model_args or {}))
    if state is None:
        _random_init_warning(f"open_clip:{name}")
    elif any(k.startswith("visual.") for k in state):
        _load_state(clip, state, f"open_clip's {name}", "Give the state dict of this very open_clip model")
    else:
        _load_state(clip.visual, state, f"open_clip's {name} vision tower",
                   "Give the state dict of this very open_clip model, or of its vision tower (model.visual)")
    return _tower(clip)


def open_clip_folder(path: Path) -> nn.Module:
    """A folder written by open_clip's ``save_for_hf`` (open_clip_config.json with model_cfg): open_clip builds
    it and loads its weights (safetensors first, else torch.load with weights_only=True)."""
    open_clip = _import("open_clip")
    from open_clip.factory import _find_checkpoint_in_dir

    if _find_checkpoint_in_dir(path) is None:
        raise MissingWeightsError(f"{path} is an open_clip folder without weights: it needs "
                                  "open_clip_model.safetensors (open_clip's save_for_hf writes it)")
    with boundary(f"{path} loading as an open_clip model", "save it again with open_clip's save_for_hf",
                  UnknownSourceError):
        clip = open_clip.create_model(f"local-dir:{path}", device="cpu", weights_only=True)
    return _tower(clip)


def _tower(clip: nn.Module) -> nn.Module:
    """The CLIP model's vision tower, its preprocessing mean/std kept where interp reads image statistics
    (``pretrained_cfg``, as timm's)."""
    visual = clip.visual.eval()
    cfg = getattr(visual, "preprocess_cfg", None) or {}
    if cfg.get("mean") is not None and not hasattr(visual, "pretrained_cfg"):
        visual.pretrained_cfg = {"mean": tuple(cfg["mean"]), "std": tuple(cfg["std"])}
    return visual


# ----- which library a folder belongs to -------------------------------------------------------------------


def folder_library(path: Path) -> Optional[str]:
    """"open_clip" (open_clip_config.json), "timm" (config.json with an ``architecture`` and no ``model_type``,
    as timm's save_for_hf writes it), or None (an HF folder, or none: ``folder.read_config_json`` says which)."""
    if (path / "open_clip_config.json").is_file():
        return "open_clip"
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(raw, dict) and raw.get("architecture") and not raw.get("model_type"):
        return "timm"
    return None


def build(library: str, name: str, weights: Any, model_args: Optional[dict]) -> nn.Module:
    if model_args is not None and not isinstance(model_args, dict):
        raise InputError(f"model_args must be a dict of constructor arguments; got {type(model_args).__name__}")
    return (timm_model if library == "timm" else _open_clip_model)(name, weights, model_args)
