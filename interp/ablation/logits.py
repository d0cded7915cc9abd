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

Peak memory: two or three chunks of ``CHUNK_BYTES`` (log q, then log p - log q in its place, and p) and, where the
head is one linear map (``Unembedding``, every family measured), the intact run's final-normed rows (real positions
x d_model): the intact logits are recomputed from them a vocabulary tile at a time wherever they are read instead
of being held (real positions x vocabulary: as large as the forward's own logits); ``patched_stacks`` takes several
stacked forwards through the vocabulary at once, so that each tile's intact logits are made once for all of them
(the sweep gathers stacks up to ``memory.WAITING_SHARE`` of the logits' bytes). Where the head is not one linear
map the intact logits are held.

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

from interp.data import Batch
from interp.models.bridge import InterpBridge

CHUNK_BYTES = 4 * 2**20  # logits of one chunk of positions (float32): the chunk's rows x vocab x 4 bytes
CHECK_POSITIONS = 16  # positions per item at which ``head_matches`` compares the split head with the forward
TILE_VOCAB = 512  # vocabulary entries per tile: the stacked variants' metric and the tiled NLL (forward, backward)


def wide(t: Tensor) -> Tensor:
    """``t`` in float32 at least (half precision is too coarse for a metric), float64 kept: a
    float64 model's ablation deltas are then not limited by float32 rounding (~3e-8 on a cosine)."""
    return t if t.dtype == torch.float64 else t.float()


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
    """One batch's intact next-token distribution at its real positions (flattened b * T + t, in order).

    Its logits z_p are held (``logits``) where the head is not one linear map; where it is (``unembedding``) only
    the final-normed rows are (``normed``, real positions x d_model) and ``z`` recomputes any rows and vocabulary
    slice from them, the same numbers every time (one product, ``unembed``)."""

    rows: Int[Tensor, " n"]  # flat positions of real tokens
    item: Int[Tensor, " n"]  # the item (row of the batch) of each
    target: Int[Tensor, " n"]  # the next token (0 where none is counted)
    counted: Bool[Tensor, " n"]  # the NLL at this position counts (this token and the next are real)
    n_items: int
    vocab: int
    lse: Float[Tensor, " n"]  # logsumexp of the intact logits: log p = z_p - lse (float32; float64 for float64)
    total_p: Float[Tensor, " n"]  # float64 sum_v p_v, p_v = exp(z_p,v - lse) in float64 (1 up to rounding)
    p_dot_log_p: Float[Tensor, " n"]  # float64 sum_v p_v (z_p,v - lse) (``patched_stack``'s B is taken against it)
    logits: Optional[Float[Tensor, "n vocab"]] = None  # the intact logits, held where the head is not linear
    normed: Optional[Float[Tensor, "n d_model"]] = None  # ln_final of the intact rows, where it is
    unembedding: Optional["Unembedding"] = None

    @property
    def dtype(self) -> torch.dtype:
        """The intact logits' dtype (the metric's: float32, or float64 for a float64 model)."""
        return self.lse.dtype

    @property
    def counts(self) -> Tensor:
        """Predicted tokens per item (``metric_items``' counts)."""
        return torch.zeros(self.n_items, dtype=self.dtype, device=self.rows.device).index_add_(
            0, self.item, self.counted.to(self.dtype))

    def z(self, part: slice = slice(None), vocab: slice = slice(None), out: Optional[Tensor] = None) -> Tensor:
        """The intact logits of rows ``part`` in columns ``vocab`` (step-1 slices): held, or recomputed from the
        normed rows (``unembed``; into ``out`` where given)."""
        if self.logits is not None:
            return self.logits[part, vocab]
        lo, hi, _ = vocab.indices(self.vocab)
        return unembed(self.normed[part], self.unembedding, lo, hi, self.dtype, out)

    def log_p(self, part: slice = slice(None), vocab: slice = slice(None)) -> Tensor:
        """The intact log-probabilities of rows ``part`` (and a ``vocab`` slice), computed when asked."""
        return self.z(part, vocab) - self.lse[part, None]


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
    """The intact distribution at the batch's real positions: the logits' logsumexp a chunk of rows at a time
    (``_chunk_rows``: no [n, vocab] tensor beside them), and (float64, per position) sum_v p_v and sum_v p_v log p_v
    (``log_p64``). With ``unembedding`` only the final-normed rows are kept and the two sums are taken a vocabulary
    tile at a time from ``IntactLogits.z``, the very numbers ``patched_stack`` recomputes (so that its B is 0
    where a variant's logits equal the intact ones); without it the logits are held and the sums read them."""
    rows, item, target, counted = positions(batch, hidden.device)
    flat = hidden.reshape(-1, hidden.shape[-1])
    with torch.no_grad():
        first = wide(head(model, flat[rows[:1]]))
    vocab, dtype, device = first.shape[-1], first.dtype, hidden.device
    step = _chunk_rows(vocab)
    lse = torch.empty(len(rows), dtype=dtype, device=device)
    total_p, p_dot_log_p = (torch.zeros(len(rows), dtype=torch.float64, device=device) for _ in range(2))
    held = None if unembedding is not None else torch.empty((len(rows), vocab), dtype=dtype, device=device)
    intact = IntactLogits(rows, item, target, counted, hidden.shape[0], vocab, lse, total_p, p_dot_log_p,
                          logits=held, unembedding=unembedding)
    with torch.no_grad():  # constants (the sweep's intact run)
        if unembedding is not None:
            intact.normed = model.ln_final(flat[rows])
            chunk = torch.empty((min(step, len(rows)), vocab), dtype=dtype, device=device)
            for lo in range(0, len(rows), step):
                z = intact.z(slice(lo, lo + step), out=chunk[:min(step, len(rows) - lo)])
                lse[lo:lo + step] = z.logsumexp(-1)
            for lo in range(0, vocab, TILE_VOCAB):
                _add_intact_sums(intact, slice(None), intact.z(vocab=slice(lo, lo + TILE_VOCAB)))
        else:
            for lo in range(0, len(rows), step):
                intact.logits[lo:lo + step] = wide(head(model, flat[rows[lo:lo + step]]))
                lse[lo:lo + step] = intact.logits[lo:lo + step].logsumexp(-1)
            wide_step = max(1, step // 4)  # two float64 temporaries of a quarter chunk: half a chunk's bytes
            for lo in range(0, len(rows), wide_step):
                _add_intact_sums(intact, slice(lo, lo + wide_step), intact.logits[lo:lo + wide_step])
    return intact


def _add_intact_sums(intact: IntactLogits, part: slice, z: Tensor) -> None:
    """Adds rows ``part``'s share of sum_v p_v and sum_v p_v log p_v from their intact logits ``z`` (some
    vocabulary columns), in float64 (``log_p64``)."""
    log_p = log_p64(z, intact.lse[part])
    p = log_p.exp()
    intact.total_p[part] += p.sum(-1)
    intact.p_dot_log_p[part] += p.mul_(log_p).sum(-1)


def unembed(x: Float[Tensor, "n d_model"], unembedding: "Unembedding", lo: int, hi: int, dtype: torch.dtype,
            out: Optional[Tensor] = None) -> Float[Tensor, "n tile"]:
    """Final-normed rows ``x`` through the unembedding's vocabulary entries lo..hi (x W[lo:hi]^T + c[lo:hi]), in
    ``dtype`` (float32, or float64 for a float64 model: a half-precision model's product is widened); into ``out``
    where given and the model computes in ``dtype``. Every intact tile and every stacked variant's tile is this
    one product."""
    weight = unembedding.weight[lo:hi].detach()  # constants: out= refuses a gradient, and none is wanted here
    bias = None if unembedding.bias is None else unembedding.bias[lo:hi].detach()
    x = x.detach()
    if weight.dtype != dtype:
        return wide(torch.nn.functional.linear(x, weight, bias))
    if out is None:
        out = torch.empty((x.shape[0], hi - lo), dtype=dtype, device=x.device)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


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
    for that stack. Several stacked forwards of one batch go through ``patched_stacks`` at once."""
    return patched_stacks(model, unembedding, [(hidden, n)], intact)[0]


def patched_stacks(model: InterpBridge, unembedding: Unembedding, stacks: list[tuple[Tensor, int]],
                   intact: IntactLogits) -> list[list[tuple[Tensor, Tensor]]]:
    """``patched_stack`` for several stacked forwards of one batch (``stacks``: their final hidden states and how
    many variants each holds), through the vocabulary once: each tile's intact logits (recomputed from the normed
    rows, ``IntactLogits.z``) and probabilities are made once for all of them. Every stack's numbers are
    ``patched_stack``'s alone (the same products and sums in the same order)."""
    rows = len(intact.rows)
    vocab, dtype = unembedding.weight.shape[0], intact.dtype
    with torch.no_grad():
        xs = [model.ln_final(h.reshape(n, -1, h.shape[-1])[:, intact.rows]).reshape(n * rows, h.shape[-1])
              for h, n in stacks]
        device = xs[0].device
        tile = min(TILE_VOCAB, vocab)
        # one set of tile buffers for the call: in a process whose glibc mmap threshold is still low, each
        # multi-MB temporary is a fresh mapping, faulted in page by page (63 tiles of 3 x 256 x 512: 0.28-0.46 s
        # with temporaries, 0.087 s with buffers; equal once the threshold has risen)
        space = _TileBuffers(device)
        sums = [_StackSums(n, rows, dtype, device) for _, n in stacks]
        for lo in range(0, vocab, tile):
            hi = min(lo + tile, vocab)
            z_p = intact.z(vocab=slice(lo, hi), out=space.take("intact", (rows, hi - lo), dtype))
            p = log_p64(z_p, intact.lse, out=space.take("p", (rows, hi - lo))).exp_()
            inside = ((intact.target >= lo) & (intact.target < hi)).nonzero().squeeze(1)
            for x, (_, n), acc in zip(xs, stacks, sums):
                z = unembed(x, unembedding, lo, hi, dtype, space.take("logits", (len(x), hi - lo), dtype)
                            ).view(n, rows, hi - lo)
                if len(inside):
                    acc.picked[:, inside] = z[:, inside, intact.target[inside] - lo]
                _torch_tile_sums(space, z, p, intact.lse, acc.sum_exp, acc.sum_p_log_q)
        return [_stack_results(model, hidden, n, acc, intact) for (hidden, n), acc in zip(stacks, sums)]


class _StackSums:
    """One stacked forward's running per-row sums over the vocabulary tiles (``patched_stack``): S, sum_v p_v
    (z_v - lse_p), and the target's logit."""

    def __init__(self, n: int, rows: int, dtype: torch.dtype, device: torch.device):
        self.sum_exp, self.sum_p_log_q = (torch.zeros((n, rows), dtype=torch.float64, device=device) for _ in range(2))
        self.picked = torch.zeros((n, rows), dtype=dtype, device=device)


def _stack_results(model: InterpBridge, hidden: Tensor, n: int, acc: _StackSums, intact: IntactLogits
                   ) -> list[tuple[Tensor, Tensor]]:
    """Per variant of one stack: (NLL sums per item, KL) from its tile sums (``patched_stack``'s formulas)."""
    rows = len(intact.rows)
    # past exp's range above (S inf) or below (S 0 or subnormal: log S -inf or coarse), or an infinite
    # logit (0 x inf in a sum): the log-softmax path, as before
    if not bool((torch.isfinite(acc.sum_exp) & (acc.sum_exp >= torch.finfo(torch.float64).tiny)
                 & torch.isfinite(acc.sum_p_log_q)).all() and torch.isfinite(intact.p_dot_log_p).all()):
        return [patched_items(model, h, intact, True) for h in hidden.chunk(n)]
    log_s = acc.sum_exp.log()
    nll = intact.lse.double() + log_s - acc.picked.double()
    b = (acc.sum_p_log_q - intact.p_dot_log_p) / intact.total_p  # sum_v p_v (z_v - z_p,v) / P
    kl = (log_s - intact.total_p.log() - b).sum(-1) / max(rows, 1)
    return _item_sums(nll, kl.to(intact.dtype), intact)


def _torch_tile_sums(space: "_TileBuffers", z: Float[Tensor, "stack rows tile"], p: Float[Tensor, "rows tile"],
                     lse: Float[Tensor, " rows"], sum_exp: Float[Tensor, "stack rows"],
                     sum_p_log_q: Float[Tensor, "stack rows"]) -> None:
    """One tile's two sums, S and sum_v p_v (z_v - lse_p) (``patched_stack``), in float64 (``log_p64``), added in
    place; ``p``: the intact probabilities of the tile's entries (float64)."""
    shifted = log_p64(z, lse, out=space.take("shifted", z.shape))  # z - lse_p
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
    the shape asked (the last tile is narrower)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.flat: dict[str, Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float64) -> Tensor:
        """A buffer ``name`` viewed as ``shape`` (float64 unless told)."""
        size = int(torch.Size(shape).numel())
        if name not in self.flat or self.flat[name].numel() < size or self.flat[name].dtype != dtype:
            self.flat[name] = torch.empty(size, dtype=dtype, device=self.device)
        return self.flat[name][:size].view(shape)


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
    kl_sum = torch.zeros((), dtype=intact.dtype, device=hidden.device)
    step = _chunk_rows(intact.vocab)
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
