"""Next-token metrics of the exact sweep from final hidden states, a chunk of positions at a time.

A stacked patched forward of V variants on a batch [B, T] would hold V x B x T x vocab logits (1 GB at 8 x 2 x 512
x 32,000 in float32), and the KL from the intact run would recompute the intact log-softmax per variant. Here the
forward stops after the last block (``run_forward(need_hidden=True)``), and each variant's hidden states h go
through the final norm and the unembedding (``head``) ``chunk_rows`` positions at a time, only at the positions
where a metric is defined (real tokens: attention mask 1):

* next_token_ce: the NLL -log q(x_{t+1} | h_t) at positions t whose token and next token are both real, summed
  per item in float64 (``metrics.metric_items``' rule, the same numbers);
* KL(intact || patched) = sum_v p_v (log p_v - log q_v) at every real position, averaged over them
  (``metrics.kl_from_intact``'s rule), with log p the intact log-probabilities computed once per batch
  (``intact_logits``) and reused by every variant and chunk.

Peak memory: the intact log-probabilities of one batch (real positions x vocab, the metric's dtype) and a few
chunks of ``CHUNK_BYTES``, instead of every stacked variant's logits.

``head(h)`` must be what the model's forward computes after the last block; ``head_matches`` checks it once per
sweep against a full forward (a family whose forward does more, e.g. Gemma 2's logit soft-capping, keeps the
full-logits path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.ablation.metrics import wide
from interp.data import Batch
from interp.models.bridge import InterpBridge

CHUNK_BYTES = 16 * 2**20  # logits of one chunk of positions (float32): the chunk's rows x vocab x 4 bytes


def head(model: InterpBridge, hidden: Float[Tensor, "*rows d_model"]) -> Float[Tensor, "*rows vocab"]:
    """The final norm and the unembedding of final hidden states (the bridge's own components and hooks)."""
    return model.unembed(model.ln_final(hidden))


def head_matches(model: InterpBridge, hidden: Tensor, out: Tensor) -> bool:
    """Whether ``head(hidden)`` reproduces the forward's logits ``out`` (same inputs) to a few units of rounding."""
    if out.ndim != 3 or hidden.shape[:2] != out.shape[:2]:
        return False
    with torch.no_grad():
        mine = head(model, hidden)
    if mine.shape != out.shape:
        return False
    scale = float(out.abs().max()) if out.numel() else 0.0
    return bool((mine - out).abs().max() <= 16 * torch.finfo(out.dtype).eps * max(scale, 1.0))


def chunk_rows(vocab: int) -> int:
    """Positions per chunk: ``CHUNK_BYTES`` of float32 logits."""
    return max(1, CHUNK_BYTES // (4 * max(vocab, 1)))


@dataclass
class IntactLogits:
    """One batch's intact next-token distribution at its real positions (flattened b * T + t, in order)."""

    rows: Int[Tensor, " n"]  # flat positions of real tokens
    item: Int[Tensor, " n"]  # the item (row of the batch) of each
    target: Int[Tensor, " n"]  # the next token (0 where none is counted)
    counted: Bool[Tensor, " n"]  # the NLL at this position counts (this token and the next are real)
    log_p: Float[Tensor, "n vocab"]  # intact log-probabilities (float32, float64 for a float64 model)
    n_items: int

    @property
    def counts(self) -> Tensor:
        """Predicted tokens per item (``metric_items``' counts)."""
        return torch.zeros(self.n_items, dtype=self.log_p.dtype, device=self.rows.device).index_add_(
            0, self.item, self.counted.to(self.log_p.dtype))


def positions(batch: Batch, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(flat rows, items, next-token targets, counted) of the batch's real positions."""
    ids = batch.inputs.to(device)
    b, t = ids.shape
    mask = (torch.ones_like(ids, dtype=torch.bool) if batch.attention_mask is None
            else batch.attention_mask.to(device).bool())
    nxt = torch.zeros_like(mask)
    nxt[:, :-1] = mask[:, 1:]
    target = torch.zeros_like(ids)
    target[:, :-1] = ids[:, 1:]
    rows = mask.reshape(-1).nonzero().squeeze(1)
    counted = (mask & nxt).reshape(-1)[rows]
    return rows, rows // t, target.reshape(-1)[rows], counted


def vocab_size(model: InterpBridge, hidden: Tensor) -> int:
    """The width of ``head``'s output (one position through it)."""
    with torch.no_grad():
        return head(model, hidden.reshape(-1, hidden.shape[-1])[:1]).shape[-1]


def intact_logits(model: InterpBridge, hidden: Float[Tensor, "batch pos d_model"], batch: Batch) -> IntactLogits:
    """The intact log-probabilities at the batch's real positions, computed a chunk at a time."""
    rows, item, target, counted = positions(batch, hidden.device)
    flat = hidden.reshape(-1, hidden.shape[-1])
    step = chunk_rows(vocab_size(model, hidden))
    log_p = torch.cat([wide(head(model, flat[rows[lo:lo + step]])).log_softmax(-1)
                       for lo in range(0, max(len(rows), 1), step)])
    return IntactLogits(rows, item, target, counted, log_p, hidden.shape[0])


def patched_items(model: InterpBridge, hidden: Float[Tensor, "batch pos d_model"], intact: IntactLogits,
                  kl: bool) -> tuple[Tensor, Optional[Tensor]]:
    """(per-item NLL sums [batch] float64, mean KL(intact || patched) over the real positions or None) of one
    variant's final hidden states, a chunk of positions at a time (module doc)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    sums = torch.zeros(intact.n_items, dtype=torch.float64, device=hidden.device)
    kl_sum = torch.zeros((), dtype=intact.log_p.dtype, device=hidden.device)
    step = chunk_rows(intact.log_p.shape[-1])
    for lo in range(0, len(intact.rows), step):
        part = slice(lo, lo + step)
        log_q = wide(head(model, flat[intact.rows[part]])).log_softmax(-1)
        nll = -log_q.gather(-1, intact.target[part, None])[:, 0]
        sums.index_add_(0, intact.item[part], nll.double() * intact.counted[part].double())
        if kl:
            log_p = intact.log_p[part]
            kl_sum = kl_sum + (log_p.exp() * (log_p - log_q)).sum()
    return sums, (kl_sum / max(len(intact.rows), 1) if kl else None)
