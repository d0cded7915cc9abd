"""``load_model``: a zoo name, a local HF folder, a hub id or an in-memory HF model -> ``InterpBridge``.

Weights load with safetensors only (``use_safetensors=True``); nothing is unpickled.
"""

from __future__ import annotations

import copy
import inspect
import os
import socket
from pathlib import Path
from typing import Any, Optional, Union

import torch
import transformers
from safetensors import SafetensorError
from torch import nn
from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent

from interp.checks import check_count, check_dtype
from interp.errors import (
    InputError, MissingWeightsError, OfflineError, UnknownSourceError, UnsupportedModelError, boundary, public,
)
from interp.models import external, folder
from interp.models.audit import check_config
from interp.models.bridge import InterpBridge, require_bridge
from interp.models.families import family_for_model_type
from interp.models.info import family_of, require_family
from interp.models.zoo import ZOO

Device = Union[str, torch.device, None]


def _hf_model_class(architecture: str) -> type:
    cls = getattr(transformers, architecture, None)
    if cls is None:
        raise UnsupportedModelError(f"transformers has no model class {architecture!r}")
    return cls


def from_hf(hf_model: nn.Module, *, name: Optional[str] = None, tokenizer: Any = None, processor: Any = None,
            device: Device = None, dtype: Optional[torch.dtype] = None, warn_zero_biases: bool = True) -> InterpBridge:
    """Move/cast an in-memory HF model, then wrap it in an ``InterpBridge`` (in place)."""
    if isinstance(hf_model, nn.Module):
        family_of(hf_model)  # refuse an unsupported model before moving it
        _refuse_meta(hf_model)
        if dtype is not None:
            hf_model = hf_model.to(dtype=dtype)
        if device is not None:
            hf_model = hf_model.to(device)
    return InterpBridge(hf_model, name=name, tokenizer=tokenizer, processor=processor,
                        warn_zero_biases=warn_zero_biases)


def _refuse_meta(hf_model: nn.Module) -> None:
    meta = next((n for n, t in [*hf_model.named_parameters(), *hf_model.named_buffers()] if t.is_meta), None)
    if meta is not None:
        raise InputError(f"{type(hf_model).__name__} has weights on the meta device (e.g. {meta}): they hold no "
                         "values, so nothing can be measured. Load real weights (from_pretrained without "
                         "device_map='meta' or init_empty_weights), or model.to_empty(device='cpu') and "
                         "load_state_dict(...)")


def _resolve_tokenizer(tokenizer: Any) -> Any:
    """None, a transformers tokenizer, or a local folder holding one (read from it); else one clear error."""
    if tokenizer is None or isinstance(tokenizer, transformers.PreTrainedTokenizerBase):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer).expanduser()
        if not path.is_dir():
            raise InputError(f"tokenizer={str(tokenizer)!r} is not a local folder; interp does not fetch tokenizers: "
                             "pass a folder holding tokenizer.json / tokenizer_config.json, or a tokenizer object "
                             "(AutoTokenizer.from_pretrained(folder))")
        try:
            return transformers.AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise InputError(f"no tokenizer could be read from {path} ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}): it needs tokenizer.json or "
                             "tokenizer_config.json with its vocabulary files") from None
    raise InputError(f"tokenizer must be a transformers tokenizer (AutoTokenizer.from_pretrained(folder)) or a local "
                     f"folder path; got {type(tokenizer).__name__}")


def _load_local_dir(path: Path, *, tokenizer: Any, device: Device, dtype: Optional[torch.dtype],
                    name: Optional[str] = None) -> InterpBridge:
    library = external.folder_library(path)  # a folder timm's or open_clip's save_for_hf wrote
    if library is not None:
        module = external.timm_folder(path) if library == "timm" else external.open_clip_folder(path)
        return from_hf(module, name=name or str(path), device=device, dtype=dtype)
    raw = folder.read_config_json(path)  # every check below runs before anything is built
    arch = raw["architectures"][0]
    require_family(raw["model_type"], arch)
    cls = _hf_model_class(arch)
    folder.check_architecture(path, raw, cls)
    cfg = folder.load_config(path)
    family = require_family(cfg.model_type, arch, cfg)
    if not family.inferred:
        check_config(family, config=cfg)  # a config the audit refuses fails before its weights are read
    with boundary(f"building {arch} from {path / 'config.json'}", "repair config.json or save config.json and "
                  "weights together again (model.save_pretrained(folder))", UnknownSourceError):
        folder.check_sizes(path, cls, cfg, dtype or torch.float32)
        try:
            hf_model = cls.from_pretrained(path, attn_implementation="eager", use_safetensors=True,
                                           dtype=dtype or torch.float32)
        except (OSError, RuntimeError, ValueError, SafetensorError) as exc:
            raise MissingWeightsError(f"the weights in {path} do not load into {arch} ({type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0]}): save config.json and weights together again "
                                      "(model.save_pretrained(folder))") from None
    if tokenizer is None and ((path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()):
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    processor = None
    if (path / "preprocessor_config.json").exists():
        processor = transformers.AutoImageProcessor.from_pretrained(path)
    return from_hf(hf_model, name=name or str(path), tokenizer=tokenizer, processor=processor, device=device)


def _load_zoo(name: str, device: Device, dtype: Optional[torch.dtype]) -> InterpBridge:
    entry = ZOO[name]
    if not entry.available():
        raise MissingWeightsError(
            f"zoo model {name!r} is not in the local cache ({entry.folder()}): {entry.missing_hint()}"
        )
    entry.verify()
    try:
        return _load_local_dir(entry.folder(), tokenizer=None, device=device, dtype=dtype, name=name)
    except Exception as exc:  # a corrupt or truncated cache: say how to fix it
        fix = ("the cache looks corrupt: delete that folder and rerun `make models`" if entry.package
               else "the installed package looks damaged: reinstall interp")
        raise MissingWeightsError(
            f"zoo model {name!r} in {entry.folder()} could not be loaded ({type(exc).__name__}: {exc}); {fix}"
        ) from None


def _hub_reachable(timeout: float = 1.5) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_hub(source: str, tokenizer: Any, device: Device, dtype: Optional[torch.dtype]) -> InterpBridge:
    offline_names = ", ".join(ZOO)
    if not _hub_reachable():
        raise OfflineError(
            f"{source!r} looks like a hub id, but the model hub is offline here "
            f"(HF_HUB_OFFLINE or no network). Offline alternatives: zoo names "
            f"{offline_names}, a local HF folder, or an in-memory HF model."
        )
    cfg = transformers.AutoConfig.from_pretrained(source)
    hf_model = _hf_model_class((cfg.architectures or [""])[0]).from_pretrained(
        source, attn_implementation="eager", use_safetensors=True, dtype=dtype or torch.float32)
    family = family_for_model_type(cfg.model_type)
    if tokenizer is None and family is not None and family.modality == "text":
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    return from_hf(hf_model, name=source, tokenizer=tokenizer, device=device)


def check_device(device: Device) -> Union[str, torch.device]:
    """A usable device (CUDA when available by default), or one clear error naming what is wrong."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"device {device!r} is not a device torch knows (try 'cpu', 'cuda' or 'cuda:0')") from None
    if parsed.type == "meta":
        raise InputError(f"device {device!r} holds shapes, not values: nothing could be measured; use 'cpu' or 'cuda'")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {device!r} asks for CUDA, but no CUDA device is available here: use 'cpu'")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise InputError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


@public
def load_model(source: Any, device: Device = None, dtype: Optional[torch.dtype] = None, *,
               tokenizer: Any = None, weights: Any = None, model_args: Optional[dict] = None) -> InterpBridge:
    """Load a model as a hooked ``TransformerBridge`` with its own, unfolded biases.

    ``source`` is a zoo name (``interp.list_models()``), a local HF folder, a folder written by
    timm's or open_clip's ``save_for_hf``, ``timm:NAME`` / ``open_clip:NAME`` (built from the
    library's config, nothing downloaded; ``weights``: a ``.safetensors`` or ``.pth`` state dict,
    read without unpickling; ``model_args``: constructor arguments, e.g. ``{"img_size": 32}``;
    see ``interp.models.external``), an in-memory HF / timm / open_clip model (wrapped in place),
    or a hub id (online only). ``device`` defaults to CUDA when available. A model this function already
    loaded is returned as it is, and an option given with it (which would not apply) is refused.
    """
    if isinstance(source, InterpBridge):
        given = [n for n, v in dict(device=device, dtype=dtype, tokenizer=tokenizer, weights=weights,
                                    model_args=model_args).items() if v is not None]
        if given:  # the model is returned as it is: these would be ignored
            raise InputError(f"load_model got a model it already loaded, which it returns as it is: "
                             f"{', '.join(given)} do(es) not apply to it. For another dtype or device use "
                             "interp.clone_model(model, dtype=...) or model.to(device); for other weights or "
                             "arguments load the source again")
        return source
    device = check_device(device)
    dtype = check_dtype(dtype)
    tokenizer = _resolve_tokenizer(tokenizer)
    library = external.library_source(source) if isinstance(source, str) else None
    if library is not None:
        module = external.build(*library, weights, model_args)
        return from_hf(module, name=source, device=device, dtype=dtype, warn_zero_biases=weights is not None)
    if weights is not None or model_args is not None:
        given = repr(source) if isinstance(source, str) else type(source).__name__
        raise InputError("weights= and model_args= go with a timm:NAME or open_clip:NAME source (e.g. "
                         f"'timm:vit_tiny_patch16_224'); {given} carries its own weights")
    if isinstance(source, nn.Module):
        return from_hf(source, tokenizer=tokenizer, device=device, dtype=dtype)
    if isinstance(source, os.PathLike):
        source = str(source)
    if not isinstance(source, str):
        raise UnknownSourceError(
            f"source must be a zoo name, a local folder, a hub id or an HF model; got {type(source).__name__}"
        )
    if source in ZOO:
        return _load_zoo(source, device, dtype)
    path = Path(source).expanduser()
    if path.is_dir():
        return _load_local_dir(path, tokenizer=tokenizer, device=device, dtype=dtype)
    if source.count("/") != 1 or source.startswith((".", "/", "~")):
        raise UnknownSourceError(
            f"unknown model source {source!r}: not a zoo name ({', '.join(ZOO)}), not timm:NAME or "
            f"open_clip:NAME, not a local folder, not an in-memory model"
        )
    return _load_hub(source, tokenizer, device, dtype)


def _unwrapped_copy(wrapped: nn.Module) -> nn.Module:
    """A deep copy of a bridged timm / open_clip model with every bridge component replaced by the
    module it wraps: the library's own model again, with the same weights."""
    fresh = copy.deepcopy(wrapped)
    for parent in list(fresh.modules()):
        for name, child in list(parent.named_children()):
            while isinstance(child, GeneralizedComponent):
                child = child.original_component
            if child is not getattr(parent, name):
                setattr(parent, name, child)
    if hasattr(fresh, "config"):
        del fresh.config  # ours, set by the bridge: the copy is described afresh
    return fresh


@public
def clone_model(model: InterpBridge, dtype: Optional[torch.dtype] = None) -> InterpBridge:
    """A fresh, independent copy of a loaded model (optionally cast), weights identical.

    The bridge wraps HF submodules in place, so ``copy.deepcopy`` cannot copy it: we
    build the same HF class from its config, bridge it the same way, and load the
    original bridge's state dict into it (both carry the same parameter names).
    """
    model = require_bridge(model, "clone_model")
    dtype = check_dtype(dtype)
    hf = model.hf_model
    if model.interp.spec.source != "transformers":  # timm / open_clip: no config to rebuild from
        fresh = _unwrapped_copy(hf).to(dtype=dtype or next(hf.parameters()).dtype)
        clone = InterpBridge(fresh, name=model.interp.name, processor=model.processor, warn_zero_biases=False)
        clone.interp = copy.deepcopy(model.interp)
        return clone
    # a promoted encoder (BertModel in BertForMaskedLM) is rebuilt bare and promoted again
    source = getattr(hf, hf.base_model_prefix) if model.interp.random_head else hf
    kwargs = {}
    if "add_pooling_layer" in inspect.signature(type(source).__init__).parameters:
        kwargs["add_pooling_layer"] = getattr(source, "pooler", None) is not None
    param = next(hf.parameters())
    fresh = type(source)(copy.deepcopy(source.config), **kwargs).to(device=param.device, dtype=dtype or param.dtype)
    # the fresh model's biases are zero until the state dict lands: no warning for that
    clone = InterpBridge(fresh, name=model.interp.name, tokenizer=model.tokenizer, processor=model.processor,
                         warn_zero_biases=False)
    with torch.no_grad():
        clone.hf_model.load_state_dict(hf.state_dict(), strict=True)
    clone.interp = copy.deepcopy(model.interp)
    return clone


@public
def untrained_copy(model: InterpBridge, seed: int = 0) -> InterpBridge:
    """The same architecture as ``model``, untrained: its HF class built again from its config, with the
    class's own random initialisation under ``torch.manual_seed(seed)`` (the caller's random state is left as it
    was), on the model's device and in its dtype. No weight is copied; the biases are whatever the class
    initialises (zero for most). The reference that ``interp.specialisation_test`` reads a trained model against.
    Only models built from a transformers config can be re-initialised this way (timm / open_clip: refused)."""
    model = require_bridge(model, "untrained_copy")
    seed = check_count("seed", seed, minimum=0)
    if model.interp.spec.source != "transformers":
        raise InputError(f"untrained_copy rebuilds a model from its transformers config; {model.interp.name} comes "
                         f"from {model.interp.spec.source}: build its untrained copies yourself and profile them")
    hf = model.hf_model
    source = getattr(hf, hf.base_model_prefix) if model.interp.random_head else hf
    kwargs = {}
    if "add_pooling_layer" in inspect.signature(type(source).__init__).parameters:
        kwargs["add_pooling_layer"] = getattr(source, "pooler", None) is not None
    param = next(hf.parameters())
    with torch.random.fork_rng(devices=[]):  # the bridge draws too: all of it inside
        torch.manual_seed(seed)
        fresh = type(source)(copy.deepcopy(source.config), **kwargs).to(device=param.device, dtype=param.dtype).eval()
        return InterpBridge(fresh, name=f"{model.interp.name} (untrained, seed {seed})", tokenizer=model.tokenizer,
                            processor=model.processor, warn_zero_biases=False)
