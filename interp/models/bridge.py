"""``InterpBridge``: a TransformerLens 4.x ``TransformerBridge`` over an HF model, raw weights.

The bridge wraps the HF modules in place and delegates each forward to HF, so the hooked
forward *is* the HF forward. We never call ``enable_compatibility_mode`` /
``process_weights``: those fold layer-norm biases into b_Q/b_K/b_V and b_V into b_O,
which would erase the very biases this library studies.

One way to make one: ``InterpBridge(hf_model, name=..., tokenizer=..., processor=...)``
(``interp.load_model`` calls it). Every analyzer starts with ``require_bridge(model)``.
"""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace
from typing import Any, Optional

import torch
import transformers
from torch import nn
from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent
from transformer_lens.model_bridge.sources import build_bridge_config_from_hf, detect_tokenizer_bos_eos
from transformer_lens.model_bridge.sources.transformers_driver import TransformersDriver
from transformer_lens.utilities import get_tokenizer_with_bos

from interp.checks import Batch, CheckedBatch, check_batch, check_pixel_values, check_token_ids, model_inputs
from interp.errors import InputError, UnknownSourceError, UnsupportedModelError
from interp.models.families import Family, adapters
from interp.models.info import ModelInfo, family_of, model_info


class InterpBridge(TransformerBridge):
    """A ``TransformerBridge`` with the model's own biases, and input checks before HF runs.

    ``model(token_ids)`` for LMs, ``model(pixel_values)`` for ViTs (positional),
    ``run_with_cache`` / ``run_with_hooks`` as in TransformerLens. ``model.interp`` holds
    the sizes and family facts (``ModelInfo``); ``model.processor`` the image processor.
    The HF model is modified in place (its submodules are wrapped): pass a copy to keep it.
    """

    interp: ModelInfo

    def __init__(self, hf_model: nn.Module, *, name: Optional[str] = None, tokenizer: Any = None,
                 processor: Any = None, warn_zero_biases: bool = True) -> None:
        if not isinstance(hf_model, nn.Module):
            raise UnknownSourceError(f"expected a transformers, timm or open_clip model, got {type(hf_model).__name__}")
        wrapped = any(isinstance(m, GeneralizedComponent) for m in hf_model.modules())
        if isinstance(hf_model, TransformerBridge) or wrapped:
            raise InputError(
                "this HF model is already wrapped by a bridge (load_model wraps in place): "
                "use the model load_model returned, or interp.clone_model"
            )
        family = family_of(hf_model)
        if family.describe is not None:  # a timm / open_clip model: an HF config of its sizes, for TL and us
            hf_model.config = family.describe(hf_model)
        if family.inferred:
            warnings.warn(f"{type(hf_model).__name__} is not in interp's family registry; TransformerLens bridges it, "
                          f"so it loads with inferred facts: {family.inferred}. No bias identity is assumed and "
                          "score_decomposition refuses it; register a Family to describe it", UserWarning, stacklevel=2)
        hf_model, random_head = _promote(hf_model, family)
        info = model_info(hf_model, family, name or getattr(hf_model.config, "name_or_path", "")
                          or type(hf_model).__name__, random_head)
        hf_model.eval()
        _use_eager_attention(hf_model)
        adapter = _adapter(hf_model, info)
        adapter.prepare_model(hf_model)
        tokenizer = _configure_tokenizer(tokenizer, adapter.cfg)
        driver_class = TransformersDriver if family.source == "transformers" else _PositionalDriver
        driver = driver_class(hf_model, adapter, tokenizer)
        super().__init__(hf_model, adapter, tokenizer, driver=driver)
        if hasattr(adapter, "finalize"):
            adapter.finalize(hf_model)
        if family.source != "transformers" and getattr(hf_model, "pos_embed", False) is None:
            # TL's forward sets a batch size on any `pos_embed` it can reach, and reaches timm's
            # attribute, None in models without absolute positions (BEiT): give it a slot of its own
            self.pos_embed = SimpleNamespace()
        self.interp = info
        self.processor = processor
        _read_head_layout(self)
        if warn_zero_biases:
            _warn_if_biases_are_zero(self)

    @property
    def hf_model(self) -> nn.Module:
        """The wrapped HF model (its submodules are the bridge's components)."""
        return self.original_model

    def forward(self, input: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        """The HF forward, after the input checks (``interp.checks``), which every input gets except a
        ``CheckedBatch`` that holds for this model (checked once on the host by ``check_batch``: the same
        checks on a GPU tensor would synchronise the host with the device on every forward). An
        ``interp.Batch`` carries its own attention mask (and is checked here like any input)."""
        info = self.interp
        refuse_active_dropout(self.hf_model)
        check = True
        if isinstance(input, Batch):
            input, kwargs = _batch_forward(self, input, kwargs)
            check = False  # checked, here or by check_batch
        pixel_values = kwargs.get("pixel_values")
        if info.modality == "vision":
            if check:
                check_pixel_values(pixel_values if pixel_values is not None else input, info)
            if info.spec.source != "transformers":  # timm / open_clip take the images positionally
                input = kwargs.pop("pixel_values", input)
            elif pixel_values is None and input is not None:
                kwargs["pixel_values"], input = input, None
            return super().forward(input, *args, **kwargs)
        if pixel_values is not None:
            raise InputError(f"{info.name} is a language model: pass token ids, not pixel_values")
        if check:
            check_token_ids(input, info)
        _refuse_float64_left_padding(self, kwargs.get("attention_mask"))
        return super().forward(input, *args, **kwargs)

    def run_with_cache(self, input: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        if input is None and "pixel_values" in kwargs:
            input = kwargs.pop("pixel_values")
        return super().run_with_cache(input, *args, **kwargs)

    def run_with_hooks(self, input: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        if input is None and "pixel_values" in kwargs:
            input = kwargs.pop("pixel_values")
        return super().run_with_hooks(input, *args, **kwargs)


def _batch_forward(model: InterpBridge, batch: Any, kwargs: dict) -> tuple[Any, dict]:
    """(input, forward kwargs) of an ``interp.Batch``: a ``CheckedBatch`` that holds for ``model`` as it is,
    any other batch checked here first; on the model's device, pixels in its dtype (``model_inputs``)."""
    given = [k for k in ("attention_mask", "pixel_values") if kwargs.get(k) is not None]
    if given:
        raise InputError(f"a Batch carries its own inputs and attention mask: pass no {' or '.join(given)} with it")
    if not (isinstance(batch, CheckedBatch) and batch.holds_for(model.interp, next(model.parameters()).dtype)):
        batch = check_batch(model, batch)
    x, kw = model_inputs(model, batch)
    return x, {**kwargs, **kw}


class _PositionalDriver(TransformersDriver):
    """Runs a timm / open_clip model as ``model(images)``: they take no ``pixel_values`` keyword."""

    def forward(self, input_ids: Any = None, **kwargs: Any) -> Any:
        if "pixel_values" in kwargs:
            input_ids = kwargs.pop("pixel_values")
        return super().forward(input_ids, **kwargs)


def _refuse_float64_left_padding(model: InterpBridge, mask: Any) -> None:
    """HF's eager attention of these families softmaxes in float32: in a float64 model the mask's float64
    minimum becomes -inf there, so a query row with no real key to attend to (left padding in a causal
    model) turns NaN, and 0 x NaN carries it into the real tokens of the next layer."""
    info = model.interp
    if mask is None or not info.spec.softmax_float32 or not info.causal or not isinstance(mask, torch.Tensor):
        return
    if mask.ndim == 2 and next(model.parameters()).dtype == torch.float64 and bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise InputError(f"{info.name} in float64 with left padding: HF's attention takes its softmax in float32, "
                         "where the padding rows become NaN and reach the real tokens; pad on the right "
                         "(tokenizer.padding_side = 'right'), or run the model in float32 (for bias_invariances: "
                         "float64=False)")


def _warn_if_biases_are_zero(model: InterpBridge) -> None:
    """'Absent' and 'zero' differ: a present bias holding only zeros (e.g. a random HF config) is worth a word."""
    biases = [getattr(getattr(model.blocks[layer].attn, kind).original_component, "bias", None)
              for layer in range(model.interp.n_layers) for kind in ("q", "k", "v")]
    present = [b for b in biases if b is not None]
    if present and all(not bool(b.detach().any()) for b in present):
        warnings.warn(f"{model.interp.name}: every q/k/v attention bias is present but exactly zero (untrained or "
                      "freshly initialised weights?); bias effects will all be zero", UserWarning, stacklevel=3)


def _read_head_layout(model: InterpBridge) -> None:
    """kv heads from the k projection's own size (configs disagree: Falcon's multi-query, MQA/GQA
    fields under several names); a q projection that is not n_heads x d_head is refused."""
    info = model.interp
    attn = model.blocks[0].attn
    q_out = _out_features(attn.q.original_component)
    k_out = _out_features(attn.k.original_component)
    if q_out != info.n_heads * info.d_head or k_out % info.d_head:
        raise UnsupportedModelError(
            f"{info.architecture}: q projection has {q_out} outputs and k {k_out}, which is not "
            f"{info.n_heads} heads x d_head {info.d_head}; this head layout is not supported"
        )
    info.n_kv_heads = k_out // info.d_head


def _out_features(module: nn.Module) -> int:
    weight = module.weight
    return int(weight.shape[1] if type(module).__name__ == "Conv1D" else weight.shape[0])


DROPOUT_FIELDS = ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop", "attn_drop_rate", "attn_drop")


def _active_dropout(hf_model: nn.Module) -> str:
    """What would make a forward of ``hf_model`` random ("" when nothing): a dropout module with p > 0,
    or an attention-probability dropout rate in the config, in a module left in training mode."""
    for name, module in hf_model.named_modules():
        if not module.training:
            continue
        p = getattr(module, "p", None) if isinstance(module, nn.modules.dropout._DropoutNd) else None
        if p:
            return f"{name or type(module).__name__} (dropout p={p})"
        rate = next((getattr(module, f) for f in DROPOUT_FIELDS if isinstance(getattr(module, f, None), float)), 0.0)
        if rate:
            return f"{name or type(module).__name__} (attention dropout {rate})"
    config = getattr(hf_model, "config", None)
    rate = next((getattr(config, f) for f in DROPOUT_FIELDS if isinstance(getattr(config, f, None), float)), 0.0)
    return f"the config's attention dropout {rate}" if hf_model.training and rate else ""


def refuse_active_dropout(hf_model: nn.Module) -> None:
    """Refuse a forward in training mode with dropout: every number it gave would be random."""
    active = _active_dropout(hf_model)
    if active:
        raise InputError(f"the model is in training mode with dropout active ({active}), so every analysis would "
                         "give random numbers: call model.eval() first (interp.load_model returns it in eval mode)")


def require_bridge(model: Any, what: str = "this analysis") -> InterpBridge:
    """``model`` if it is an ``InterpBridge``; else one clear error naming ``interp.load_model``."""
    if isinstance(model, InterpBridge):
        return model
    raise InputError(
        f"{what} needs a model from interp.load_model, got {type(model).__name__}; "
        "wrap it first: model = interp.load_model(model)"
    )


def _promote(hf_model: nn.Module, family: Family) -> tuple[nn.Module, bool]:
    """Wrap a bare encoder (``BertModel``) in the head class TL's adapter expects.

    The encoder modules are shared, not copied; the head is freshly initialised (seed 0),
    so its logits mean nothing: read hidden states from such a model.
    """
    target = family.promote.get(type(hf_model).__name__)
    if target is None:
        return hf_model, False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        wrapped = getattr(transformers, target)(copy.deepcopy(hf_model.config))
    param = next(hf_model.parameters())
    wrapped = wrapped.to(device=param.device, dtype=param.dtype)
    setattr(wrapped, wrapped.base_model_prefix, hf_model)  # share the real encoder
    return wrapped.eval(), True


def _use_eager_attention(hf_model: nn.Module) -> None:
    """Patterns and scores need the eager kernel (sdpa/flash never materialise them); the eager
    mixture-of-experts kernel also runs in float64, which the grouped-matmul one does not."""
    for sub in hf_model.modules():
        sub_cfg = getattr(sub, "config", None)
        if sub_cfg is not None and hasattr(sub_cfg, "_attn_implementation"):
            sub_cfg._attn_implementation = "eager"
        if sub_cfg is not None and getattr(sub_cfg, "_experts_implementation", None) not in (None, "eager"):
            sub_cfg._experts_implementation = "eager"


def _adapter(hf_model: nn.Module, info: ModelInfo) -> Any:
    for architecture, adapter in adapters().items():
        ArchitectureAdapterFactory.register_adapter(architecture, adapter)  # idempotent
    hf_config = copy.deepcopy(hf_model.config)
    hf_config.architectures = [info.architecture]
    param = next(hf_model.parameters())
    cfg = build_bridge_config_from_hf(hf_config, info.architecture, info.name, param.dtype)
    try:
        adapter = ArchitectureAdapterFactory.select_architecture_adapter(cfg)
    except ValueError as exc:
        classes = [c for c in info.spec.hf_classes if c != info.architecture]
        fix = (f": interp bridges the {info.spec.label} family through {' or '.join(classes)}; load that class "
               f"(e.g. transformers.{classes[0]}.from_pretrained(folder); a bare body's weights load into it)"
               if classes else "")
        raise UnsupportedModelError(f"unsupported architecture {info.architecture} ({exc}){fix}") from None
    adapter.cfg.device = str(param.device)
    return adapter


def _configure_tokenizer(tokenizer: Any, cfg: Any) -> Any:
    """TL's tokenizer conventions (BOS-adding tokenizer, pad = eos when missing), public API only."""
    if tokenizer is None:
        return None
    tokenizer = get_tokenizer_with_bos(tokenizer)
    if getattr(cfg, "default_padding_side", None):
        tokenizer.padding_side = cfg.default_padding_side
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    cfg.tokenizer_prepends_bos, cfg.tokenizer_appends_eos = detect_tokenizer_bos_eos(tokenizer)
    return tokenizer
