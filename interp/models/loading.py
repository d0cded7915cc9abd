"""``load_model``: any supported HF model -> a TransformerLens 4.x bridge with raw weights.

The bridge wraps the HF modules in place and delegates each forward to HF, so the hooked
forward *is* the HF forward. We never call ``enable_compatibility_mode`` /
``process_weights``: those fold layer-norm biases into b_Q/b_K/b_V and b_V into b_O,
which would erase the very biases this library studies.
"""

from __future__ import annotations

import copy
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn
from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.model_bridge.sources._bridge_builder import (
    build_bridge_config_from_hf,
    configure_tokenizer,
)
from transformer_lens.model_bridge.sources.transformers_driver import TransformersDriver

from interp.errors import InputError, OfflineError, UnknownSourceError, UnsupportedModelError
from interp.models.adapters import register_adapters

# model_type -> (family label, modality, uses rotary positions)
FAMILIES: dict[str, tuple[str, str, bool]] = {
    "gpt2": ("gpt2", "text", False),
    "gpt_neox": ("neox", "text", True),
    "opt": ("opt", "text", False),
    "qwen2": ("qwen2", "text", True),
    "llama": ("llama", "text", True),
    "bert": ("bert", "text", False),
    "vit": ("vit", "vision", False),
    "deit": ("deit", "vision", False),
    "dinov2": ("dinov2", "vision", False),
    "beit": ("beit", "vision", False),
}

# Families whose HF "bare encoder" class TL does not wrap: we wrap it in the head class.
_ENCODER_PROMOTION = {"BertModel": "BertForMaskedLM"}


@dataclass
class ModelInfo:
    """What the library needs to know about a loaded model, beyond TL's cfg."""

    name: str
    architecture: str
    family: str
    modality: str  # "text" | "vision"
    kind: str  # "decoder" | "encoder" | "vit"
    rotary: bool
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    image_size: Optional[int] = None
    patch_size: Optional[int] = None
    num_channels: Optional[int] = None
    n_prefix_tokens: int = 0  # CLS (+ distillation) tokens before the patch grid
    max_positions: Optional[int] = None
    random_head: bool = False  # True when the task head was freshly initialised by us
    notes: list[str] = field(default_factory=list)


class InterpBridge(TransformerBridge):
    """A ``TransformerBridge`` that checks its input before delegating to HF.

    ``model(token_ids)`` for LMs, ``model(pixel_values)`` for ViTs (positional),
    ``run_with_cache`` / ``run_with_hooks`` as in TransformerLens.
    """

    interp: ModelInfo

    @property
    def hf_model(self) -> nn.Module:
        return self.__dict__["original_model"]

    def forward(self, input: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        info: ModelInfo = self.__dict__["interp"]
        pixel_values = kwargs.get("pixel_values")
        if info.modality == "vision":
            x = pixel_values if pixel_values is not None else input
            check_pixel_values(x, info)
            if pixel_values is None and input is not None:
                kwargs["pixel_values"] = input
                input = None
            return super().forward(input, *args, **kwargs)
        if pixel_values is not None:
            raise InputError(
                f"{info.name} is a language model: pass token ids, not pixel_values"
            )
        check_token_ids(input, info)
        return super().forward(input, *args, **kwargs)

    def run_with_cache(self, input: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        if input is None and "pixel_values" in kwargs:
            input = kwargs.pop("pixel_values")
        return super().run_with_cache(input, *args, **kwargs)

    def run_with_hooks(self, input: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        if input is None and "pixel_values" in kwargs:
            input = kwargs.pop("pixel_values")
        return super().run_with_hooks(input, *args, **kwargs)


def check_pixel_values(x: Any, info: ModelInfo) -> None:
    """Raise ``InputError`` unless ``x`` is a float ``[batch, C, H, W]`` tensor for this ViT."""
    if not isinstance(x, torch.Tensor):
        raise InputError(
            f"{info.name} is a vision model: expected pixel_values as a float tensor "
            f"[batch, {info.num_channels}, H, W], got {type(x).__name__}"
        )
    if not torch.is_floating_point(x):
        raise InputError(
            f"{info.name} is a vision model: expected pixel_values as a float tensor "
            f"[batch, {info.num_channels}, H, W], got a {x.dtype} tensor of shape "
            f"{tuple(x.shape)} (token ids?)"
        )
    if x.ndim != 4 or x.shape[1] != info.num_channels:
        raise InputError(
            f"{info.name}: pixel_values must be [batch, {info.num_channels}, H, W], "
            f"got shape {tuple(x.shape)}"
        )
    p = info.patch_size or 1
    if x.shape[2] % p or x.shape[3] % p:
        raise InputError(
            f"{info.name}: image size {tuple(x.shape[2:])} is not a multiple of the "
            f"patch size {p}"
        )


def check_token_ids(x: Any, info: ModelInfo) -> None:
    """Raise ``InputError`` unless ``x`` is text, or integer token ids within context."""
    if isinstance(x, (str, list)):
        return
    if not isinstance(x, torch.Tensor):
        raise InputError(
            f"{info.name} is a language model: expected token ids (LongTensor [batch, pos]) "
            f"or text, got {type(x).__name__}"
        )
    if torch.is_floating_point(x):
        raise InputError(
            f"{info.name} is a language model: expected integer token ids [batch, pos], "
            f"got a {x.dtype} tensor of shape {tuple(x.shape)} (pixel values?)"
        )
    if info.max_positions is not None and x.shape[-1] > info.max_positions:
        raise InputError(
            f"{info.name}: sequence length {x.shape[-1]} exceeds the model's context "
            f"of {info.max_positions} positions"
        )


def _hf_model_class(architecture: str) -> type:
    import transformers

    cls = getattr(transformers, architecture, None)
    if cls is None:
        raise UnsupportedModelError(f"transformers has no model class {architecture!r}")
    return cls


def _promote_encoder(hf_model: nn.Module) -> tuple[nn.Module, bool]:
    """Wrap a bare ``BertModel`` in ``BertForMaskedLM`` (TL's BERT adapter needs the head).

    The encoder modules are shared, not copied; the MLM head is freshly initialised
    (seed 0), so its logits mean nothing: read hidden states from such a model.
    """
    target = _ENCODER_PROMOTION.get(type(hf_model).__name__)
    if target is None:
        return hf_model, False
    cls = _hf_model_class(target)
    cfg = copy.deepcopy(hf_model.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        wrapped = cls(cfg)
    param = next(hf_model.parameters())
    wrapped = wrapped.to(device=param.device, dtype=param.dtype)
    wrapped.bert = hf_model  # share the real encoder
    return wrapped.eval(), True


def _model_info(hf_model: nn.Module, name: str, random_head: bool) -> ModelInfo:
    cfg = hf_model.config
    model_type = getattr(cfg, "model_type", None)
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"unsupported architecture {type(hf_model).__name__} (model_type={model_type!r}); "
            f"supported families: {', '.join(sorted(FAMILIES))}"
        )
    family, modality, rotary = FAMILIES[model_type]
    d_model = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd")
    n_heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head")
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    d_head = getattr(cfg, "head_dim", None) or d_model // n_heads
    n_layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer")
    if modality == "vision":
        kind = "vit"
    elif family == "bert":
        kind = "encoder"
    else:
        kind = "decoder"
    info = ModelInfo(
        name=name,
        architecture=type(hf_model).__name__,
        family=family,
        modality=modality,
        kind=kind,
        rotary=rotary,
        n_layers=int(n_layers),
        n_heads=int(n_heads),
        n_kv_heads=int(n_kv),
        d_head=int(d_head),
        d_model=int(d_model),
        random_head=random_head,
    )
    if modality == "vision":
        info.image_size = int(cfg.image_size)
        info.patch_size = int(cfg.patch_size)
        info.num_channels = int(cfg.num_channels)
        info.n_prefix_tokens = 2 if family == "deit" else 1
    else:
        info.max_positions = getattr(cfg, "max_position_embeddings", None) or getattr(
            cfg, "n_positions", None
        )
    return info


def bridge_from_hf(
    hf_model: nn.Module,
    *,
    name: Optional[str] = None,
    tokenizer: Any = None,
    processor: Any = None,
    device: Union[str, torch.device, None] = None,
    dtype: Optional[torch.dtype] = None,
) -> InterpBridge:
    """Wrap an in-memory HF model in an ``InterpBridge`` (raw, unfolded weights)."""
    if not isinstance(hf_model, nn.Module) or not hasattr(hf_model, "config"):
        raise UnknownSourceError(
            f"expected a transformers PreTrainedModel, got {type(hf_model).__name__}"
        )
    from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent

    if isinstance(hf_model, TransformerBridge) or any(
        isinstance(m, GeneralizedComponent) for m in hf_model.modules()
    ):
        raise InputError(
            "this HF model is already wrapped by a bridge (load_model wraps in place): "
            "use the model load_model returned, or interp.models.loading.clone_model"
        )
    register_adapters()
    hf_model, random_head = _promote_encoder(hf_model)
    info = _model_info(hf_model, name or getattr(hf_model.config, "name_or_path", "") or
                       type(hf_model).__name__, random_head)
    if random_head:
        info.notes.append("task head freshly initialised: read hidden states, not logits")
    if dtype is not None:
        hf_model = hf_model.to(dtype=dtype)
    if device is not None:
        hf_model = hf_model.to(device)
    hf_model.eval()
    # Patterns and scores need the eager kernel (sdpa/flash never materialise them).
    hf_model.config._attn_implementation = "eager"
    for sub in hf_model.modules():
        sub_cfg = getattr(sub, "config", None)
        if sub_cfg is not None and hasattr(sub_cfg, "_attn_implementation"):
            sub_cfg._attn_implementation = "eager"

    hf_config = copy.deepcopy(hf_model.config)
    hf_config.architectures = [info.architecture]
    param = next(hf_model.parameters())
    bridge_cfg = build_bridge_config_from_hf(hf_config, info.architecture, info.name, param.dtype)
    try:
        adapter = ArchitectureAdapterFactory.select_architecture_adapter(bridge_cfg)
    except ValueError as exc:
        raise UnsupportedModelError(
            f"unsupported architecture {info.architecture}: {exc}"
        ) from None
    adapter.cfg.device = str(param.device)
    adapter.prepare_model(hf_model)
    if tokenizer is not None:
        tokenizer = configure_tokenizer(tokenizer, adapter.cfg)
    driver = TransformersDriver(hf_model, adapter, tokenizer)
    bridge = TransformerBridge(hf_model, adapter, tokenizer, driver=driver)
    bridge.__class__ = InterpBridge
    bridge.__dict__["interp"] = info
    bridge.__dict__["processor"] = processor
    return bridge


def _hub_reachable(timeout: float = 1.5) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_local_dir(path: Path, *, tokenizer: Any, device: Any, dtype: Any) -> InterpBridge:
    from transformers import AutoConfig

    if not (path / "config.json").exists():
        raise UnknownSourceError(f"{path} is a folder but has no config.json (not an HF model)")
    cfg = AutoConfig.from_pretrained(path)
    archs = getattr(cfg, "architectures", None) or []
    if not archs:
        raise UnsupportedModelError(f"{path}/config.json names no architecture")
    if cfg.model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"unsupported architecture {archs[0]} (model_type={cfg.model_type!r}); "
            f"supported families: {', '.join(sorted(FAMILIES))}"
        )
    cls = _hf_model_class(archs[0])
    hf_model = cls.from_pretrained(
        path, attn_implementation="eager", use_safetensors=True, dtype=dtype or torch.float32
    )
    processor = None
    if tokenizer is None and (
        (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()
    ):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    if (path / "preprocessor_config.json").exists():
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(path)
    return bridge_from_hf(
        hf_model, name=str(path), tokenizer=tokenizer, processor=processor, device=device
    )


def load_model(
    source: Any,
    device: Union[str, torch.device, None] = None,
    dtype: Optional[torch.dtype] = None,
    *,
    tokenizer: Any = None,
) -> InterpBridge:
    """Load a model as a hooked ``TransformerBridge`` with its own, unfolded biases.

    ``source`` is a zoo name (``interp.list_models()``), a local HF folder, an in-memory
    HF model, or a hub id (online only). ``device`` defaults to CUDA when available.
    """
    from interp.models.zoo import ZOO, load_zoo_model

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(source, InterpBridge):
        return source
    if isinstance(source, nn.Module):
        return bridge_from_hf(source, tokenizer=tokenizer, device=device, dtype=dtype)
    if isinstance(source, os.PathLike):
        source = str(source)
    if not isinstance(source, str):
        raise UnknownSourceError(
            f"source must be a zoo name, a local folder, a hub id or an HF model; "
            f"got {type(source).__name__}"
        )
    if source in ZOO:
        return load_zoo_model(source, device=device, dtype=dtype)
    path = Path(source).expanduser()
    if path.is_dir():
        return _load_local_dir(path, tokenizer=tokenizer, device=device, dtype=dtype)
    looks_like_hub_id = source.count("/") == 1 and not source.startswith((".", "/", "~"))
    offline_names = ", ".join(ZOO)
    if not looks_like_hub_id:
        raise UnknownSourceError(
            f"unknown model source {source!r}: not a zoo name ({offline_names}), "
            f"not a local folder, not an in-memory model"
        )
    if not _hub_reachable():
        raise OfflineError(
            f"{source!r} looks like a hub id, but the model hub is offline here "
            f"(HF_HUB_OFFLINE or no network). Offline alternatives: zoo names "
            f"{offline_names}, a local HF folder, or an in-memory HF model."
        )
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(source)
    cls = _hf_model_class((cfg.architectures or [""])[0])
    hf_model = cls.from_pretrained(source, attn_implementation="eager", dtype=dtype or torch.float32)
    if tokenizer is None and FAMILIES.get(cfg.model_type, ("", "text"))[1] == "text":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source)
    return bridge_from_hf(hf_model, name=source, tokenizer=tokenizer, device=device)



def clone_model(model: InterpBridge, dtype: Optional[torch.dtype] = None) -> InterpBridge:
    """A fresh, independent copy of a loaded model (optionally cast), weights identical.

    The bridge swaps HF submodules for wrappers in place, so ``copy.deepcopy`` cannot
    copy it; we rebuild the HF model from its config and the unwrapped state dict.
    """
    hf = model.__dict__["original_model"]
    state = {}
    for name, tensor in hf.state_dict().items():
        state[name.replace("._original_component", "")] = tensor
    import inspect

    kwargs = {}
    if "add_pooling_layer" in inspect.signature(type(hf).__init__).parameters:
        kwargs["add_pooling_layer"] = getattr(hf, "pooler", None) is not None
    fresh = type(hf)(copy.deepcopy(hf.config), **kwargs)
    missing, _ = fresh.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "rotary_emb.inv_freq"))]
    if missing:
        raise UnsupportedModelError(f"cannot clone {model.interp.name}: missing {missing[:5]}")
    param = next(hf.parameters())
    fresh = fresh.to(device=param.device, dtype=dtype or param.dtype)
    clone = bridge_from_hf(
        fresh, name=model.interp.name, tokenizer=model.tokenizer,
        processor=model.__dict__.get("processor"),
    )
    clone.__dict__["interp"] = copy.deepcopy(model.interp)
    return clone
