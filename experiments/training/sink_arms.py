"""The arms of the sink experiment: one tiny LLaMA and the MNIST ViT, in variants that
differ only in what gives attention somewhere to go besides the content.

Text arms (``LlamaForCausalLM``: rotary, RMSNorm, SwiGLU, no bias by default):

* ``none``: no q, k, v or o bias;
* ``qkv``: ``attention_bias=True`` gives q, k, v *and* o bias in HF's LLaMA; the o bias is held at
  exactly 0 and never trained, so the arm has q, k and v bias only (as Qwen2);
* ``kv_slot``: a learnable key/value pair (k*, v*) per layer and head, prepended to the keys and
  values after rotary (it has no position): Sun et al. 2024's "explicit attention bias";
* ``k_slot_v0``: a learnable key slot with its value fixed at 0 (Gu et al. 2024);
* ``sink_token``: a learnable token (id ``SINK_ID``, an embedding row) prepended to every sequence.

Vision arms (the MNIST ViT recipe, ``interp.models.builders.small_vit_classifier_config``; HF's ViT
always has an o bias): ``none`` and ``qkv`` as above, ``kv_slot``, and ``registers`` (4 learnable
tokens after CLS, without position embedding: Darcet et al. 2023).

With a slot, the attention of query i in one head is, over the keys j the mask allows,

    s_i* = q_i . k* / sqrt(d) + g,   s_ij = q_i . k_j / sqrt(d) + mask_ij
    a_i  = softmax([s_i*, s_i1, ..., s_in]),   out_i = a_i* v* + sum_j a_ij v_j

where g is the buffer ``slot_gate`` (0; -inf removes the slot exactly). The returned attention
weights carry the slot in column 0, so every row sums to 1 over slot + keys.

Every arm of a seed starts from the same weights for the parameters the arms share (the no-bias
model built at that seed); what an arm adds (biases: 0; slots, registers: N(0, 0.02^2) drawn from
a generator seeded by the seed) is the only difference.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import transformers as tf
from torch import Tensor, nn
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from interp.errors import InputError, MissingWeightsError
from interp.io import atomic_path
from interp.models.builders import small_vit_classifier_config

TEXT_ARMS = ("none", "qkv", "kv_slot", "k_slot_v0", "sink_token")
VISION_ARMS = ("none", "qkv", "kv_slot", "registers")
SLOT_ATTENTION = "interp_slot"
N_BYTES = 256
SINK_ID = 256  # the sink token's id; no text maps to it
N_REGISTERS = 4
INIT_STD = 0.02
MNIST_IMAGE, MNIST_PATCH = 28, 4
SHIPPED_LM_DIR = Path(__file__).resolve().parents[2] / "data" / "sinks"


@dataclass(frozen=True)
class LMShape:
    """The tiny LLaMA's architecture (every arm): bytes + the sink id as vocabulary."""

    n_layers: int = 4
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 128
    context: int = 128
    rope_theta: float = 10_000.0

    def config(self, bias: bool) -> tf.LlamaConfig:
        return tf.LlamaConfig(
            vocab_size=N_BYTES + 1, hidden_size=self.d_model, intermediate_size=self.d_ff,
            num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads, num_key_value_heads=self.n_heads,
            max_position_embeddings=self.context + 1, rope_theta=self.rope_theta, attention_bias=bias,
            tie_word_embeddings=False, initializer_range=INIT_STD, attn_implementation="eager",
            architectures=["LlamaForCausalLM"])


# ----- the slot -----------------------------------------------------------------------------------------


def slot_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                   scaling: Optional[float] = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """HF attention interface with the module's slot (k*, v*) prepended (module doc): query
    [batch, head, q, d], key and value [batch, kv_head, k, d] (keys already rotated); returns
    (output [batch, q, head, d], weights [batch, head, q, 1 + k], slot in column 0). Softmax in
    float32 or the query's dtype, whichever is wider. A module without ``slot_key`` gets plain attention."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(2, 3) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    if getattr(module, "slot_key", None) is not None:
        k_star = module.slot_key.repeat_interleave(groups, 0).to(query.dtype)  # [head, d]
        v_star = module.slot_value.repeat_interleave(groups, 0).to(value.dtype)
        slot = torch.einsum("bhqd,hd->bhq", query, k_star)[..., None] * scaling + module.slot_gate.to(query.dtype)
        scores = torch.cat([slot, scores], -1)
        value = torch.cat([v_star[None, :, None, :].expand(value.shape[0], -1, 1, -1), value], 2)
    wide = torch.promote_types(query.dtype, torch.float32)
    weights = scores.softmax(-1, dtype=wide).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return (weights @ value).transpose(1, 2).contiguous(), weights


def register_slot_attention() -> None:
    """Make ``SLOT_ATTENTION`` a name HF's attention and mask interfaces know (idempotent)."""
    ALL_ATTENTION_FUNCTIONS.register(SLOT_ATTENTION, slot_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SLOT_ATTENTION, eager_mask)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention module of every layer (the one that owns q_proj ... o_proj), in order."""
    return [m for m in model.modules() if hasattr(m, "q_proj") and hasattr(m, "o_proj")]


def add_slots(model: nn.Module, n_kv_heads: int, d_head: int, learn_value: bool, gen: torch.Generator) -> None:
    """Give every attention module a slot key (and a learnable value, else a zero buffer) and switch
    the model to ``slot_attention``; ``slot_gate`` (buffer, 0) is the slot's logit offset."""
    register_slot_attention()
    for module in attention_modules(model):
        module.slot_key = nn.Parameter(torch.randn(n_kv_heads, d_head, generator=gen) * INIT_STD)
        if learn_value:
            module.slot_value = nn.Parameter(torch.randn(n_kv_heads, d_head, generator=gen) * INIT_STD)
        else:
            module.register_buffer("slot_value", torch.zeros(n_kv_heads, d_head))
        module.register_buffer("slot_gate", torch.zeros(()), persistent=False)
    model.config._attn_implementation = SLOT_ATTENTION


def set_slot_gate(model: nn.Module, gate: float) -> None:
    """The slot's logit offset g in every layer: 0 (trained), -inf (slot removed exactly)."""
    for module in attention_modules(model):
        module.slot_gate.fill_(gate)


def has_slot(model: nn.Module) -> bool:
    return any(getattr(m, "slot_key", None) is not None for m in attention_modules(model))


# ----- building the arms --------------------------------------------------------------------------------


def _check_arm(arm: Any, arms: tuple[str, ...], domain: str) -> str:
    if arm not in arms:
        raise InputError(f"the {domain} arms are {', '.join(arms)}; got {arm!r}")
    return arm


def _extras_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1_000_003 * (seed + 1))


def _freeze_o_bias(model: nn.Module) -> None:
    for module in attention_modules(model):
        if module.o_proj.bias is not None:
            module.o_proj.bias.data.zero_()
            module.o_proj.bias.requires_grad_(False)  # AdamW skips it: no update, no decay


def build_lm_arm(arm: str, seed: int, shape: LMShape = LMShape()) -> tf.LlamaForCausalLM:
    """The text ``arm`` at the seed's shared initialisation (module doc), float32, train mode."""
    _check_arm(arm, TEXT_ARMS, "text")
    torch.manual_seed(seed)
    reference = tf.LlamaForCausalLM(shape.config(bias=False))
    model = tf.LlamaForCausalLM(shape.config(bias=arm == "qkv"))
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False)
    assert not unexpected and all(k.endswith(".bias") for k in missing), (missing, unexpected)
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.data.zero_()
    _freeze_o_bias(model)
    if arm in ("kv_slot", "k_slot_v0"):
        add_slots(model, shape.n_heads, shape.d_model // shape.n_heads, arm == "kv_slot", _extras_generator(seed))
    return model


class _RegisterHook:
    """Forward hook on ViT embeddings: [CLS, patches] -> [CLS, registers, patches] (no position)."""

    def __call__(self, module: nn.Module, inputs: Any, output: Tensor) -> Tensor:
        reg = module.register_tokens.expand(output.shape[0], -1, -1).to(output.dtype)
        return torch.cat([output[:, :1], reg, output[:, 1:]], 1)


def add_registers(model: tf.ViTForImageClassification, n: int, gen: torch.Generator) -> None:
    emb = model.vit.embeddings
    emb.register_tokens = nn.Parameter(torch.randn(1, n, model.config.hidden_size, generator=gen) * INIT_STD)
    emb.register_forward_hook(_RegisterHook())


def build_vit_arm(arm: str, seed: int) -> tf.ViTForImageClassification:
    """The vision ``arm`` of the MNIST ViT recipe at the seed's shared initialisation."""
    _check_arm(arm, VISION_ARMS, "vision")
    torch.manual_seed(seed)
    reference = tf.ViTForImageClassification(small_vit_classifier_config(MNIST_IMAGE, MNIST_PATCH, False))
    model = tf.ViTForImageClassification(small_vit_classifier_config(MNIST_IMAGE, MNIST_PATCH, arm == "qkv"))
    model.load_state_dict(reference.state_dict(), strict=False)
    gen = _extras_generator(seed)
    if arm == "kv_slot":
        add_slots(model, model.config.num_attention_heads,
                  model.config.hidden_size // model.config.num_attention_heads, True, gen)
    if arm == "registers":
        add_registers(model, N_REGISTERS, gen)
    return model


def n_prefix(domain: str, arm: str) -> int:
    """Positions the arm puts before the content: the sink token; CLS (+ registers)."""
    if domain == "text":
        return int(arm == "sink_token")
    return 1 + (N_REGISTERS if arm == "registers" else 0)


# ----- shipped weights ----------------------------------------------------------------------------------


def save_lm_arm(model: nn.Module, arm: str, shape: LMShape, folder: Path, meta: dict) -> Path:
    """``<folder>/<arm>.safetensors`` in float16 (half the bytes; the card gives the cost) with the shape
    and ``meta`` (strings) in its header."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    header = {"arm": arm, "shape": json.dumps(asdict(shape)), **{k: str(v) for k, v in meta.items()}}
    path = Path(folder) / f"{arm}.safetensors"
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)
    return path


def load_sink_lm(arm: str, folder: Optional[Path] = None) -> tf.LlamaForCausalLM:
    """A shipped seed-0 text arm (``data/sinks/<arm>.safetensors``), float32, eval mode: its own
    arm built afresh, then the stored weights (float16 on disk) loaded into it."""
    from safetensors import safe_open

    _check_arm(arm, TEXT_ARMS, "text")
    path = Path(folder or SHIPPED_LM_DIR) / f"{arm}.safetensors"
    if not path.exists():
        raise MissingWeightsError(f"no shipped weights at {path}: run `python -m experiments.train_sinks` "
                                  "(it writes data/sinks/) or pass folder= where they are")
    with safe_open(str(path), "pt") as fh:
        meta, tensors = fh.metadata(), {k: fh.get_tensor(k).float() for k in fh.keys()}
    if meta.get("arm") != arm:
        raise InputError(f"{path} holds arm {meta.get('arm')!r}, not {arm!r}: the file was renamed")
    model = build_lm_arm(arm, 0, LMShape(**json.loads(meta["shape"])))
    model.load_state_dict(tensors)
    return model.eval()
