"""How many variants one stacked patched forward of the exact sweep holds: ``stack="auto"``.

Stacking ``s`` variants on the batch axis multiplies a forward's activations by ``s``; the sweep also holds the
intact run's logits at the real positions (``interp.ablation.logits``: as large as the forward's own logits), a
vocabulary tile of every stacked variant's logits and, with prefix reuse, every block's intact output. ``auto``
takes the largest ``s`` (at most ``MAX_STACK``) whose estimate stays within ``BUDGET`` times a plain forward's
peak on the same batch, and at least 1. The estimates count the tensors the eager forward materialises, in
bytes (``e``: the model's element size; HF upcasts the logits and the attention softmax to float32):

* one block, per sequence of T tokens: T x (3 x heads x T x 4  [scores, pattern, its cast]
  + 3 x d_mlp x e  [gate, up, activation] + 6 x d_model x e  [residual, norms, attention output]);
* the logits, per sequence: T x vocabulary x 4 (causal LMs; a classifier's or a ViT's are negligible);
* a plain forward's peak: the larger of one block and the logits (the earlier blocks' activations are freed);
* the sweep: the intact logits + ``logits.TILE_BYTES`` + the intact block outputs (layers x T x d_model x e) +
  s x (one block + the final hidden states, T x d_model x 4), per sequence of the batch;
* the one-pass estimate's forward and backward (estimate != "exact"): every block's activations kept for the
  backward plus the logits, their log-softmax and its gradient: layers x one block + 3 x the logits. Measured
  at 25m@128 the sweep's peak is that stage's (198 MB whatever the stack, 1 or 8), so under a backward the
  budget is its peak, not two forwards'.

The same rule on every device (nothing is measured; ``benchmarks/scale.py --ablation`` measures the real peaks).
"""

from __future__ import annotations

from typing import Any

from interp.ablation import logits as split
from interp.models.bridge import InterpBridge

MAX_STACK = 8  # beyond this, stacking saves no time on either device measured (benchmarks/scale.py)
BUDGET = 2.0  # the sweep's peak within this many plain forwards' peaks (issue 40's goal)


def tokens_per_item(model: InterpBridge, inputs: Any) -> int:
    """Sequence length of one item: token ids' width, or a ViT's patches plus its prefix tokens."""
    info = model.interp
    if getattr(inputs, "ndim", 0) == 2:
        return int(inputs.shape[1])
    if info.image_size and info.patch_size:
        return (info.image_size // info.patch_size) ** 2 + info.n_prefix_tokens
    return int(inputs.shape[-1])


def _intermediate(model: InterpBridge) -> int:
    config = model.hf_model.config
    for name in ("intermediate_size", "n_inner", "ffn_dim", "d_ff"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 4 * model.interp.d_model


def estimate_bytes(model: InterpBridge, inputs: Any, logits: bool, reuse_prefix: bool) -> dict[str, float]:
    """Per sequence of the batch: a plain forward's peak (``forward``), what the sweep holds whatever the stack
    (``fixed``) and what each stacked variant adds (``per_variant``); bytes (module doc)."""
    info = model.interp
    element = next(model.parameters()).element_size()
    tokens = tokens_per_item(model, inputs)
    block = tokens * (3 * info.n_heads * tokens * 4 + 3 * _intermediate(model) * element + 6 * info.d_model * element)
    vocab = info.vocab_size or 0
    head = tokens * vocab * 4 if logits and info.causal else 0
    prefix = info.n_layers * tokens * info.d_model * element if reuse_prefix else 0
    return dict(forward=float(max(block, head)), fixed=float(head + prefix), tile=float(split.TILE_BYTES),
                per_variant=float(block + tokens * info.d_model * 4),
                backward=float(info.n_layers * block + 3 * head))


def auto_stack(model: InterpBridge, inputs: Any, logits: bool, reuse_prefix: bool, backward: bool = False) -> int:
    """The stack ``stack="auto"`` uses for a batch of ``inputs`` (module doc): 1 to ``MAX_STACK``. With
    ``backward`` (the sweep's one-pass estimate runs a forward and backward first) the budget is the larger of
    ``BUDGET`` forwards and that backward's own peak (``estimate_bytes``' ``backward``): a stack within the peak the
    call reaches anyway costs no memory (measured: benchmarks/scale.py --ablation, estimate_peak_mb)."""
    est = estimate_bytes(model, inputs, logits, reuse_prefix)
    batch = int(inputs.shape[0])
    budget = max(BUDGET * est["forward"], est["backward"] if backward else 0.0) * batch
    room = budget - est["fixed"] * batch - est["tile"]
    return max(1, min(MAX_STACK, int(room // (est["per_variant"] * batch))))
