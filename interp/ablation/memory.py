"""How many variants one stacked patched forward of the exact sweep holds: ``stack="auto"``.

Stacking ``s`` variants on the batch axis multiplies a forward's activations by ``s``; the sweep also holds the
intact run's final-normed rows (``interp.ablation.logits``; its logits, as large as the forward's own, where the
head is not one linear map), a vocabulary tile of every stacked variant's logits and, with prefix reuse, every
block's intact output. ``auto``
takes the largest ``s`` (at most ``MAX_STACK``) whose estimate stays within ``STACK_BUDGET`` times a plain
forward's peak on the same batch, and at least 1: fewer than ``BUDGET`` (the call's goal), because at glibc's
defaults the heap grows past the live tensors while stacked forwards come and go (measured at 25m@128 with the
next-token metric: within two forwards the rule took stack 4, and the call reached 2.23x a forward; within 1.5,
stack 3 and 1.86x: docs/results/scale/memory_defaults_cpu.csv). The estimates count the tensors the eager forward
materialises, in bytes (``e``: the model's element size; HF upcasts the logits and the attention softmax to
float32):

* one block, per sequence of T tokens: T x (3 x heads x T x 4  [scores, pattern, its cast]
  + 3 x d_mlp x e  [gate, up, activation] + 6 x d_model x e  [residual, norms, attention output]);
* the logits, per sequence: T x vocabulary x 4 (causal LMs; a classifier's or a ViT's are negligible);
* a plain forward's peak: the larger of one block and the logits (the earlier blocks' activations are freed);
* the sweep, per sequence of the batch: the intact block outputs (layers x T x d_model x e) + s x (one block +
  the final hidden states, T x d_model x 4), and with a next-token metric read through one linear unembedding
  (``tiled``) the intact final-normed rows (T x d_model x 4) and their logits' tile with its probabilities
  (T x ``logits.TILE_VOCAB`` x (4 + 8)) and the stacked final hidden states waiting for one pass over the
  vocabulary (``WAITING_SHARE`` x the intact logits' bytes), + s x a tile of the variant's logits, their float64
  difference from the intact logsumexp and its product with the probabilities (T x ``logits.TILE_VOCAB`` x
  ``TILE_BYTES``); with
  another head the intact logits (as large as the forward's) + s x ``TILE_COPIES`` x T x ``logits.TILE_VOCAB`` x 4;
* the one-pass estimate's forward and backward (estimate != "exact"): every block's activations kept for the
  backward plus the logits, their log-softmax and its gradient: layers x one block + 3 x the logits; with the
  tiled next-token metric (``tiled``: ``logits.tiled_item_sums``) no logits, and the batch runs in parts of
  ``estimate_items`` items (so does a distance metric's estimate, ``interp.ablation.distance``), the most whose
  backward stays within ``PART_BUDGET`` (one) forward of the whole batch
  (at least one item): the call's peak is to stay within ``BUDGET`` forwards, a forward's worth above the
  forward's own, and at glibc's defaults the heap keeps what a part's backward leaves between the tensors that
  outlive it (measured at 25m@128 without control draws, three fresh processes each: two items a part reached
  2.09-2.22x a forward, one item 1.90-1.94x). AtP* keeps each layer's (A' - A) V for q and k in float64
  (layers x 2 x T x d_model x 8). Where
  one item's backward exceeds ``BUDGET`` forwards of the batch (e.g. 12 layers at 512 tokens), every block but
  the last recomputes its activations in the backward (``estimate_checkpoint``): the backward then holds the
  blocks' inputs (layers x T x d_model x e) and three blocks (the one recomputed, its gradients, the last one).
  Under a backward the exact stage's budget is the larger of two forwards and that stage's peak (memory the call
  reaches anyway).

The same rule on every device (nothing is measured; ``benchmarks/scale.py --ablation`` measures the real peaks).
"""

from __future__ import annotations

from typing import Any, Optional

from interp.ablation import logits as split
from interp.models.bridge import InterpBridge

MAX_STACK = 8  # beyond this, stacking saves no time on either device measured (benchmarks/scale.py)
TILE_COPIES = 2  # a stacked variant's logits tile and its difference from the intact ones (float32)
TILE_BYTES = 4 + 8 + 8  # per stacked row and tile entry, linear head: logits (float32), z - lse_p and p (z - lse_p)
WAITING_SHARE = 0.25  # stacked forwards' final hidden states kept for one pass over the vocabulary (the sweep's
# ``_Waiting``: each pass recomputes the intact logits once): up to this share of the intact logits' bytes
BUDGET = 2.0  # the sweep's peak within this many plain forwards' peaks
STACK_BUDGET = 1.5  # the exact stage's estimate within this many (module doc: the heap grows past it at the defaults)
PART_BUDGET = 1.0  # a part of the one-pass estimate's backward within this many plain forwards of the batch


def _tokens_per_item(model: InterpBridge, inputs: Any) -> int:
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


def estimate_bytes(model: InterpBridge, inputs: Any, logits: bool, reuse_prefix: bool,
                   tiled: bool = False) -> dict[str, float]:
    """Per sequence of the batch: a plain forward's peak (``forward``), what the sweep holds whatever the stack
    (``fixed``), what each stacked variant adds (``per_variant``, and ``tile`` with a next-token metric; ``tiled``:
    read through one linear unembedding), the one-pass estimate's backward through the full head (``backward``)
    and with the tiled metric (``backward_tiled``); bytes (module doc)."""
    info = model.interp
    element = next(model.parameters()).element_size()
    tokens = _tokens_per_item(model, inputs)
    block = tokens * (3 * info.n_heads * tokens * 4 + 3 * _intermediate(model) * element + 6 * info.d_model * element)
    vocab = info.vocab_size or 0
    head = tokens * vocab * 4 if logits and info.causal else 0
    prefix = info.n_layers * tokens * info.d_model * element if reuse_prefix else 0
    tile = TILE_COPIES * tokens * split.TILE_VOCAB * 4 if head else 0
    held = head  # the intact logits, or (tiled) their normed rows and one tile with its probabilities
    if head and tiled:
        held = tokens * (info.d_model * 4 + split.TILE_VOCAB * (4 + 8)) + WAITING_SHARE * head
        tile = tokens * split.TILE_VOCAB * TILE_BYTES
    tiled_head = tokens * (3 * info.d_model + 2 * split.TILE_VOCAB) * 4
    dz = 2 * info.n_layers * tokens * info.d_model * 8  # AtP*'s (A' - A) V of every layer's q and k, float64
    return dict(forward=float(max(block, head)), fixed=float(held + prefix), tile=float(tile),
                per_variant=float(block + tokens * info.d_model * 4),
                backward=float(info.n_layers * block + 3 * head),
                backward_tiled=float(info.n_layers * block + tiled_head + dz),
                backward_checkpointed=float(info.n_layers * tokens * info.d_model * element + 3 * block
                                            + tiled_head + dz))


def estimate_checkpoint(model: InterpBridge, inputs: Any) -> bool:
    """Whether the one-pass estimate with the tiled metric recomputes its blocks in the backward
    (``attribution._checkpointed_blocks``): where one item's backward through every block's kept activations
    exceeds ``BUDGET`` plain forwards of the whole batch and recomputing would hold less (not with fewer than
    four layers or so: it keeps three blocks, and the last block is never recomputed) (module doc)."""
    est = estimate_bytes(model, inputs, logits=True, reuse_prefix=False)
    return (est["backward_tiled"] > BUDGET * est["forward"] * int(inputs.shape[0])
            and est["backward_checkpointed"] < est["backward_tiled"] and model.interp.n_layers > 1)


def estimate_items(model: InterpBridge, inputs: Any, checkpoint: Optional[bool] = None) -> int:
    """Items per part of the one-pass estimate's forward and backward (the tiled metric's, a distance metric's;
    module doc): the most (at most the batch) whose backward, checkpointed as ``checkpoint`` says (None: as
    ``estimate_checkpoint`` says for this batch), stays within ``PART_BUDGET`` plain forwards of the whole batch,
    at least 1."""
    est = estimate_bytes(model, inputs, logits=True, reuse_prefix=False)
    batch = int(inputs.shape[0])
    checkpoint = estimate_checkpoint(model, inputs) if checkpoint is None else checkpoint
    per_item = est["backward_checkpointed" if checkpoint else "backward_tiled"]
    return max(1, min(batch, int(PART_BUDGET * est["forward"] * batch // per_item)))


def backward_peak(model: InterpBridge, inputs: Any, tiled: bool) -> float:
    """The one-pass estimate's estimated peak on a batch of ``inputs``, bytes: whole batches through the full
    head, or parts of ``estimate_items`` items with the tiled metric (module doc)."""
    est = estimate_bytes(model, inputs, logits=True, reuse_prefix=False)
    if tiled:
        per_item = est["backward_checkpointed" if estimate_checkpoint(model, inputs) else "backward_tiled"]
        return estimate_items(model, inputs) * per_item
    return int(inputs.shape[0]) * est["backward"]


def auto_stack(model: InterpBridge, inputs: Any, logits: bool, reuse_prefix: bool, backward: bool = False,
               tiled: bool = False, parts: Optional[bool] = None) -> int:
    """The stack ``stack="auto"`` uses for a batch of ``inputs`` (module doc): 1 to ``MAX_STACK``. With
    ``backward`` (the sweep's one-pass estimate runs a forward and backward first; ``parts``: in parts of items,
    as the tiled metric's and a distance metric's do; None: as ``tiled``) the budget is the larger of
    ``STACK_BUDGET`` forwards and that backward's own peak
    (``backward_peak``): a stack within the peak the call reaches anyway costs no memory (measured:
    benchmarks/scale.py --ablation, estimate_peak_mb)."""
    est = estimate_bytes(model, inputs, logits, reuse_prefix, tiled)
    batch = int(inputs.shape[0])
    in_parts = tiled if parts is None else parts  # the estimate's backward in parts of items (a distance metric's too)
    budget = max(STACK_BUDGET * est["forward"] * batch, backward_peak(model, inputs, in_parts) if backward else 0.0)
    room = budget - est["fixed"] * batch
    return max(1, min(MAX_STACK, int(room // ((est["per_variant"] + est["tile"]) * batch))))
