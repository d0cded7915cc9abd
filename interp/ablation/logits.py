"""Next-token metrics of the exact sweep from final hidden states, a chunk of positions at a time.

A stacked patched forward of V variants on a batch [B, T] would hold V x B x T x vocab logits (1 GB at 8 x 2 x 512
x 32,000 in float32), and the KL from the intact run would recompute the intact log-softmax per variant. Here the
forward stops after the last block (``run_forward(need_hidden=True)``), and each variant's hidden states h go
through the final norm and the unembedding (``head``) ``_chunk_rows`` positions at a time, only at the positions
where a metric is defined (real tokens: attention mask 1):

* next_token_ce: the NLL -log q(x_{t+1} | h_t) at positions t whose token and next token are both real, summed
  per item in float64 (``metrics.metric_items``' rule, the same numbers);
* KL(intact || patched) = sum_v p_v (log p_v - log q_v) at every real position, averaged over them
  (``metrics.kl_from_intact``'s rule), with log p the intact log-probabilities computed once per batch
  (``intact_logits``) and reused by every variant and chunk.

Peak memory: the intact log-probabilities of one batch (real positions x vocab, the metric's dtype: as large as
the forward's own logits) and two or three chunks of ``CHUNK_BYTES`` (log q, then log p - log q in its place,
and p), instead of every stacked variant's logits.

``head(h)`` must be what the model's forward computes after the last block; ``head_matches`` checks it once per
sweep against a full forward (a family whose forward does more, e.g. Gemma 2's logit soft-capping, keeps the
full-logits path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.ablation.metrics import wide
from interp.data import Batch
from interp.models.bridge import InterpBridge

CHUNK_BYTES = 4 * 2**20  # logits of one chunk of positions (float32): the chunk's rows x vocab x 4 bytes
CHECK_POSITIONS = 16  # positions per item at which ``head_matches`` compares the split head with the forward
TILE_VOCAB = 512  # vocabulary entries per tile: the stacked variants' metric and the tiled NLL (forward, backward)


def head(model: InterpBridge, hidden: Float[Tensor, "*rows d_model"]) -> Float[Tensor, "*rows vocab"]:
    """The final norm and the unembedding of final hidden states (the bridge's own components and hooks)."""
    return model.unembed(model.ln_final(hidden))


def _reproduces(head_fn, hidden: Tensor, out: Tensor) -> bool:
    """Whether ``head_fn(hidden)`` gives the forward's logits ``out`` (same inputs) to a few units of rounding, at
    the first ``CHECK_POSITIONS`` positions of each item (a head that does more, e.g. a soft-cap, does it at every
    position; comparing all of them would hold three more copies of the batch's logits)."""
    if out.ndim != 3 or hidden.shape[:2] != out.shape[:2]:
        return False
    hidden, out = hidden[:, :CHECK_POSITIONS], out[:, :CHECK_POSITIONS]
    with torch.no_grad():
        mine = head_fn(hidden)
    if mine.shape != out.shape:
        return False
    scale = float(out.abs().max()) if out.numel() else 0.0
    return bool((mine - out).abs().max() <= 16 * torch.finfo(out.dtype).eps * max(scale, 1.0))


def head_matches(model: InterpBridge, hidden: Tensor, out: Tensor) -> bool:
    """Whether ``head(hidden)`` reproduces the forward's logits ``out`` (same inputs) to a few units of rounding."""
    return _reproduces(lambda h: head(model, h), hidden, out)


def _chunk_rows(vocab: int) -> int:
    """Positions per chunk: ``CHUNK_BYTES`` of float32 logits."""
    return max(1, CHUNK_BYTES // (4 * max(vocab, 1)))


@dataclass
class IntactLogits:
    """One batch's intact next-token distribution at its real positions (flattened b * T + t, in order)."""

    rows: Int[Tensor, " n"]  # flat positions of real tokens
    item: Int[Tensor, " n"]  # the item (row of the batch) of each
    target: Int[Tensor, " n"]  # the next token (0 where none is counted)
    counted: Bool[Tensor, " n"]  # the NLL at this position counts (this token and the next are real)
    logits: Float[Tensor, "n vocab"]  # intact logits z_p (float32, float64 for a float64 model)
    n_items: int
    lse: Float[Tensor, " n"]  # their logsumexp: log p = z_p - lse
    total_p: Float[Tensor, " n"]  # float64 sum_v p_v, p_v = exp(z_p,v - lse) in float64 (1 up to rounding)
    p_dot_log_p: Float[Tensor, " n"]  # float64 sum_v p_v (z_p,v - lse) (``patched_stack``'s B is taken against it)

    @property
    def counts(self) -> Tensor:
        """Predicted tokens per item (``metric_items``' counts)."""
        return torch.zeros(self.n_items, dtype=self.logits.dtype, device=self.rows.device).index_add_(
            0, self.item, self.counted.to(self.logits.dtype))

    def log_p(self, part: slice = slice(None), vocab: slice = slice(None)) -> Tensor:
        """The intact log-probabilities of rows ``part`` (and a ``vocab`` slice), computed when asked."""
        return self.logits[part, vocab] - self.lse[part, None]


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


def intact_logits(model: InterpBridge, hidden: Float[Tensor, "batch pos d_model"], batch: Batch,
                  unembedding: Optional["Unembedding"] = None) -> IntactLogits:
    """The intact logits at the batch's real positions, their logsumexp and (float64, per position) sum_v p_v and
    sum_v p_v log p_v (``log_p64``), computed a chunk at a time into preallocated tensors (no list of chunks
    concatenated: that would hold them twice); with ``unembedding`` (and logits in the model's dtype) each chunk's
    product is written into it directly."""
    rows, item, target, counted = positions(batch, hidden.device)
    flat = hidden.reshape(-1, hidden.shape[-1])
    first = wide(head(model, flat[rows[:1]]))
    z = torch.empty((len(rows), first.shape[-1]), dtype=first.dtype, device=hidden.device)
    lse = torch.empty(len(rows), dtype=first.dtype, device=hidden.device)
    total_p, p_dot_log_p = (torch.empty(len(rows), dtype=torch.float64, device=hidden.device) for _ in range(2))
    step = _chunk_rows(first.shape[-1])
    direct = unembedding is not None and unembedding.weight.dtype == z.dtype
    for lo in range(0, len(rows), step):
        part = flat[rows[lo:lo + step]]
        if direct:  # constants: no gradient (out= refuses one)
            with torch.no_grad():
                x, w = model.ln_final(part), unembedding.weight.t()
                if unembedding.bias is None:
                    torch.mm(x, w, out=z[lo:lo + step])
                else:
                    torch.addmm(unembedding.bias, x, w, out=z[lo:lo + step])
        else:
            z[lo:lo + step] = wide(head(model, part))
        lse[lo:lo + step] = z[lo:lo + step].logsumexp(-1)
    wide_step = max(1, step // 4)  # two float64 temporaries of a quarter chunk: half a chunk's bytes
    for lo in range(0, len(rows), wide_step):
        part = slice(lo, lo + wide_step)
        log_p = log_p64(z[part], lse[part])
        p = log_p.exp()
        total_p[part] = p.sum(-1)
        p_dot_log_p[part] = p.mul_(log_p).sum(-1)
    return IntactLogits(rows, item, target, counted, z, hidden.shape[0], lse, total_p, p_dot_log_p)


def log_p64(logits: Float[Tensor, "*stack n tile"], lse: Float[Tensor, " n"], out: Optional[Tensor] = None
            ) -> Float[Tensor, "*stack n tile"]:
    """logits - lse in float64, each entry widened exactly before the subtraction: ``intact_logits``' sums and
    ``patched_stack``'s tiles share this rounding, so that their B cancels exactly where the patched logits equal
    the intact ones. ``out``: a float64 buffer of the logits' shape (written in place, no temporary)."""
    if out is None:
        out = torch.empty(logits.shape, dtype=torch.float64, device=logits.device)
    return out.copy_(logits).sub_(lse.to(torch.float64)[:, None])


@dataclass
class Unembedding:
    """The unembedding as one linear map (logits = ln_final(h) @ weight.T + bias), read a vocabulary tile at a
    time by ``patched_stack``."""

    weight: Float[Tensor, "vocab d_model"]
    bias: Optional[Float[Tensor, " vocab"]]


def linear_unembedding(model: InterpBridge, hidden: Tensor, out: Tensor) -> Optional[Unembedding]:
    """The model's unembedding as an ``Unembedding`` when it is one ``nn.Linear`` whose map after the final norm
    reproduces the forward's logits ``out`` (``head_matches``' tolerance); None otherwise (the chunked path)."""
    linear = getattr(model.unembed, "original_component", None)
    if not isinstance(linear, torch.nn.Linear) or not _reproduces(
            lambda h: torch.nn.functional.linear(model.ln_final(h), linear.weight, linear.bias), hidden, out):
        return None
    return Unembedding(linear.weight, linear.bias)


def patched_stack(model: InterpBridge, unembedding: Unembedding, hidden: Float[Tensor, "stack_batch pos d_model"],
                  intact: IntactLogits, n: int) -> list[tuple[Tensor, Tensor]]:
    """Per variant of a stacked forward (``n`` variants, variant-major on the batch axis): (per-item NLL sums
    [batch] float64, mean KL(intact || patched) over the real positions), ``patched_items``' quantities.

    Every variant's final-normed rows go through the unembedding together, a vocabulary tile at a time
    (``TILE_VOCAB`` entries: a tile's weights stay in cache while every row streams past them, and a tile of every
    stacked row is small beside the intact logits), and nothing of a tile is kept but per-row sums. With z the
    patched logits, z_p the intact ones, lse_p their logsumexp, p = exp(z_p - lse_p) (float64) and, per row, in
    float64 from the float32 logits,

        S = sum_v exp(z_v - lse_p),   P = sum_v p_v (1 up to rounding),
        B = sum_v p_v (z_v - lse_p) - sum_v p_v (z_p,v - lse_p)   (the second sum: ``intact_logits``),

    logsumexp(z) = lse_p + log S, so

        NLL(x) = lse_p + log S - z_x,        KL(p || q) = log(S / P) - B / P.

    The float32 logits are widened exactly and every difference and sum is float64 (B's two sums share one
    rounding, ``log_p64``, so B is exactly 0 where z = z_p); measured on SmolLM2 the KL is within 1e-3 relative
    of a float64 evaluation where the float32 log-softmax path was off by 1.6e-5 nats (tests/ablation/
    test_logits.py). A patch that raises a logit past float64's
    exp range (z - lse_p > 709) or lowers every logit of a row below it (S < 2.2e-308, the smallest normal
    float64: log S -inf or coarse), or an infinite logit (0 x inf in a sum), falls back to ``patched_items``
    for that stack."""
    rows, d = len(intact.rows), hidden.shape[-1]
    with torch.no_grad():
        x = model.ln_final(hidden.reshape(n, -1, d)[:, intact.rows]).reshape(n * rows, d)
        vocab, dtype, device = unembedding.weight.shape[0], intact.logits.dtype, x.device
        tile = min(TILE_VOCAB, vocab)
        # one set of tile buffers for the call: in a process whose glibc mmap threshold is still low, each
        # multi-MB temporary is a fresh mapping, faulted in page by page (63 tiles of 3 x 256 x 512: 0.28-0.46 s
        # with temporaries, 0.087 s with buffers; equal once the threshold has risen)
        space = _TileBuffers(x.dtype, device)
        sum_exp, sum_p_log_q = (torch.zeros((n, rows), dtype=torch.float64, device=device) for _ in range(2))
        picked = torch.zeros((n, rows), dtype=dtype, device=device)
        for lo in range(0, vocab, tile):
            hi = min(lo + tile, vocab)
            bias = None if unembedding.bias is None else unembedding.bias[lo:hi]
            z = space.logits(x, unembedding.weight[lo:hi], bias).view(n, rows, hi - lo)
            inside = ((intact.target >= lo) & (intact.target < hi)).nonzero().squeeze(1)
            if len(inside):
                picked[:, inside] = z[:, inside, intact.target[inside] - lo]
            _torch_tile_sums(space, z, intact, lo, hi, sum_exp, sum_p_log_q)
        # past exp's range above (S inf) or below (S 0 or subnormal: log S -inf or coarse), or an infinite
        # logit (0 x inf in a sum): the log-softmax path, as before
        if not bool((torch.isfinite(sum_exp) & (sum_exp >= torch.finfo(torch.float64).tiny)
                     & torch.isfinite(sum_p_log_q)).all() and torch.isfinite(intact.p_dot_log_p).all()):
            return [patched_items(model, h, intact, True) for h in hidden.chunk(n)]
        log_s = sum_exp.log()
        nll = intact.lse.double() + log_s - picked.double()
        b = (sum_p_log_q - intact.p_dot_log_p) / intact.total_p  # sum_v p_v (z_v - z_p,v) / P
        kl = (log_s - intact.total_p.log() - b).sum(-1) / max(rows, 1)
        return _item_sums(nll, kl.to(dtype), intact)


def _torch_tile_sums(space: "_TileBuffers", z: Float[Tensor, "stack rows tile"], intact: IntactLogits, lo: int, hi: int,
                     sum_exp: Float[Tensor, "stack rows"], sum_p_log_q: Float[Tensor, "stack rows"]) -> None:
    """One tile's two sums, S and sum_v p_v (z_v - lse_p) (``patched_stack``), in float64 (``log_p64``), added in
    place."""
    p = log_p64(intact.logits[:, lo:hi], intact.lse, out=space.take("p", (z.shape[1], hi - lo))).exp_()
    shifted = log_p64(z, intact.lse, out=space.take("shifted", z.shape))  # z - lse_p
    sum_p_log_q += torch.mul(shifted, p, out=space.take("product", shifted.shape)).sum(-1)
    sum_exp += shifted.exp_().sum(-1)


def _item_sums(nll: Float[Tensor, "n rows"], kl: Float[Tensor, " n"], intact: IntactLogits
               ) -> list[tuple[Tensor, Tensor]]:
    """Per variant: (its counted NLLs summed per item in float64, its KL)."""
    weights = intact.counted.double()
    results = []
    for v in range(nll.shape[0]):
        sums = torch.zeros(intact.n_items, dtype=torch.float64, device=nll.device)
        sums.index_add_(0, intact.item, nll[v] * weights)
        results.append((sums, kl[v]))
    return results


class _TileBuffers:
    """Storage for one call's vocabulary tiles, allocated at the first tile and handed out as contiguous views of
    the shape asked (the last tile is narrower); ``dtype``: the logits' (the model's)."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self.flat: dict[str, Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float64) -> Tensor:
        """A buffer ``name`` viewed as ``shape`` (float64 unless told)."""
        size = int(torch.Size(shape).numel())
        if name not in self.flat or self.flat[name].numel() < size or self.flat[name].dtype != dtype:
            self.flat[name] = torch.empty(size, dtype=dtype, device=self.device)
        return self.flat[name][:size].view(shape)

    def logits(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        """x @ weight.T + bias into a buffer, widened to float32 where the model computes in half precision."""
        if self.dtype not in (torch.float32, torch.float64):
            return wide(torch.nn.functional.linear(x, weight, bias))
        out = self.take("logits", (x.shape[0], weight.shape[0]), self.dtype)
        if bias is None:
            return torch.mm(x, weight.t(), out=out)
        return torch.addmm(bias, x, weight.t(), out=out)


class _TiledNextTokenNLL(torch.autograd.Function):
    """-log softmax(x W^T + c)[target] per row, a vocabulary tile (``TILE_VOCAB`` logits) at a time forward and
    backward: no [rows, vocab] tensor is formed, the tiles are recomputed in the backward. Its gradient is with
    respect to ``x`` only (the one-pass estimates differentiate activations, never the weights):

        d NLL_r / d x_r = sum_v (softmax_v - [v = target_r]) W_v."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Optional[Tensor], target: Tensor) -> Tensor:
        lse = torch.full((x.shape[0],), -torch.inf, dtype=wide(x).dtype, device=x.device)
        picked = torch.zeros_like(lse)
        for lo, z in _tiles(x, weight, bias):
            lse = torch.logaddexp(lse, z.logsumexp(-1))
            _pick(picked, z, target, lo)
        ctx.save_for_backward(x, weight, bias, target, lse)
        return lse - picked

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], None, None, None]:
        x, weight, bias, target = ctx.saved_tensors[:4]
        lse = ctx.saved_tensors[4]
        grad_x = torch.zeros(x.shape, dtype=lse.dtype, device=x.device)
        for lo, z in _tiles(x, weight, bias):
            p = z.sub_(lse[:, None]).exp_()  # softmax over the whole vocabulary, this tile's entries
            inside = ((target >= lo) & (target < lo + z.shape[1])).nonzero().squeeze(1)
            p[inside, target[inside] - lo] -= 1
            grad_x.addmm_(p.mul_(grad[:, None].to(p.dtype)), weight[lo:lo + z.shape[1]].to(p.dtype))
        return grad_x.to(x.dtype), None, None, None


def _tiles(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Iterator[tuple[int, Tensor]]:
    """(first vocabulary index, wide logits [rows, tile]) of ``x`` through each ``TILE_VOCAB`` rows of ``weight``."""
    for lo in range(0, weight.shape[0], TILE_VOCAB):
        hi = min(lo + TILE_VOCAB, weight.shape[0])
        yield lo, wide(torch.nn.functional.linear(x, weight[lo:hi], None if bias is None else bias[lo:hi]))


def _pick(picked: Tensor, z: Tensor, target: Tensor, lo: int) -> None:
    """picked[r] = z[r, target[r] - lo] for the rows whose target falls in this tile."""
    inside = ((target >= lo) & (target < lo + z.shape[1])).nonzero().squeeze(1)
    if len(inside):
        picked[inside] = z[inside, target[inside] - lo]


def tiled_item_sums(model: InterpBridge, unembedding: Unembedding, hidden: Float[Tensor, "batch pos d_model"],
                    batch: Batch) -> tuple[Tensor, Tensor]:
    """(per-item NLL sums [batch] float64, per-item counts) of next_token_ce from final hidden states, with a
    gradient with respect to ``hidden``: ``metrics.metric_items``' numbers (same positions, same rule) without
    the [batch, pos, vocab] logits, their log-softmax and its gradient, which a backward through the full head
    holds (three times the forward's logits): ``_TiledNextTokenNLL``."""
    rows, item, target, counted = positions(batch, hidden.device)
    x = model.ln_final(hidden.reshape(-1, hidden.shape[-1])[rows])
    bias = None if unembedding.bias is None else unembedding.bias.detach()
    nll = _TiledNextTokenNLL.apply(x, unembedding.weight.detach(), bias, target)
    weights = counted.to(torch.float64)
    sums = torch.zeros(hidden.shape[0], dtype=torch.float64, device=hidden.device).index_add(0, item,
                                                                                            nll.double() * weights)
    counts = torch.zeros(hidden.shape[0], dtype=torch.float64, device=hidden.device).index_add_(0, item, weights)
    return sums, counts


def patched_items(model: InterpBridge, hidden: Float[Tensor, "batch pos d_model"], intact: IntactLogits,
                  kl: bool) -> tuple[Tensor, Optional[Tensor]]:
    """(per-item NLL sums [batch] float64, mean KL(intact || patched) over the real positions or None) of one
    variant's final hidden states, a chunk of positions at a time (module doc)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    sums = torch.zeros(intact.n_items, dtype=torch.float64, device=hidden.device)
    kl_sum = torch.zeros((), dtype=intact.logits.dtype, device=hidden.device)
    step = _chunk_rows(intact.logits.shape[-1])
    for lo in range(0, len(intact.rows), step):
        part = slice(lo, lo + step)
        log_q = wide(head(model, flat[intact.rows[part]])).log_softmax(-1)
        nll = -log_q.gather(-1, intact.target[part, None])[:, 0]
        sums.index_add_(0, intact.item[part], nll.double() * intact.counted[part].double())
        if kl:  # sum p (log p - log q), in place: two chunks alive (log q, then log p - log q; and p)
            log_p = intact.log_p(part)
            difference = log_q.neg_().add_(log_p)
            kl_sum = kl_sum + torch.einsum("rv,rv->", log_p.exp(), difference)
    return sums, (kl_sum / max(len(intact.rows), 1) if kl else None)
