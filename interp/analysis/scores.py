"""What the bias does to attention scores: ``score_decomposition`` and ``bias_invariances``.

With content parts c_q = x_i W_q, c_k = x_j W_k (and, under rotary, every vector rotated
by its own position first), the pre-softmax score splits exactly into four terms:

    s_ij = [c_q.c_k  +  c_q.b_k  +  b_q.c_k  +  b_q.b_k] / sqrt(d_head)
            content    query_const key_prior   const

Without rotary, query_const and const do not depend on the key j, so softmax cancels
them (b_k has no effect on the pattern); key_prior is a query-independent preference for
keys along u = W_k b_q. Under rotary every term depends on i - j.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, Iterable, Iterator, Optional, Sequence

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.bootstrap import Resampler, check_bootstrap, item_keys
from interp.checks import check_heads, check_layers
from interp.record.capture import BLOCK_OUTPUTS, OUTPUT, computing_in, replay_blocks, run_until_kept, stream_batches
from interp.data import Batch, iter_batches
from interp.errors import InputError, UnsupportedModelError, public
from interp.record.heads import attention_weights, kv_group
from interp.record.hooks import hook_name, is_block_hook
from interp.record.patching import patch_hooks
from interp.models.bridge import InterpBridge, require_bridge

TERMS = ("content", "query_const", "key_prior", "const")


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's rotary embedding on x [b, p, h, d] with cos/sin [1|b, p, r] (r <= d, partial)."""
    r = cos.shape[-1]
    c, s = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat((rot * c + _rotate_half(rot) * s, rest), dim=-1)


def _key_mask(model: InterpBridge, batch: Batch, n_pos: int, device: Any,
              layer: Optional[int] = None) -> Bool[Tensor, "batch 1 query_pos key_pos"]:
    """Which (query, key) pairs are attended (causal, padding; with ``layer``, its sliding window too:
    keys j with i - window < j <= i, HF's ``sliding_window_overlay``). Without ``layer``, sequences
    longer than a window of the model are refused (the mask would depend on the layer)."""
    b = batch.inputs.shape[0]
    allowed = torch.ones(b, 1, n_pos, n_pos, dtype=torch.bool, device=device)
    if batch.attention_mask is not None and model.interp.modality == "text":
        m = batch.attention_mask.to(device).bool()
        allowed &= m[:, None, None, :] & m[:, None, :, None]
    if model.interp.causal:
        allowed &= torch.ones(n_pos, n_pos, dtype=torch.bool, device=device).tril()[None, None]
    if layer is None and any(w is not None and w < n_pos for w in model.interp.windows):
        raise UnsupportedModelError(
            f"{model.interp.name} attends within a sliding window ({min(w for w in model.interp.windows if w)} keys) "
            f"on some layers and these sequences are {n_pos} long, so the key mask depends on the layer and this "
            "analysis does not pass one yet: use sequences no longer than the window")
    window = model.interp.window(layer) if layer is not None else None
    if window is not None:
        i = torch.arange(n_pos, device=device)
        allowed &= (i[None, :] > i[:, None] - window)[None, None]
    return allowed


ScoreTerm = Float[Tensor, "batch head_index query_pos key_pos"]


def _require_bilinear_scores(info: Any) -> None:
    if info.spec.score_refusal:
        raise UnsupportedModelError(f"the score decomposition does not apply to {info.name} ({info.spec.label}): "
                                    f"{info.spec.score_refusal}")


def score_terms(model: InterpBridge, cache: Any, layer: int, heads: Optional[slice] = None) -> dict[str, ScoreTerm]:
    """The four score terms of ``layer`` from a cache holding hook_q/hook_k (and cos/sin under rotary);
    with ``heads`` (a slice of query heads), those heads' terms only (the same numbers as theirs in the full
    terms: each head's score reads only its own q and its kv head's k)."""
    info = model.interp
    _require_bilinear_scores(info)
    heads = heads if heads is not None else slice(None)
    w = attention_weights(model, layer)
    q = cache[hook_name(layer, "q")][:, :, heads]
    k = cache[hook_name(layer, "k")]
    dt = q.dtype
    bq, bk = w.b_Q[heads].to(q.device, dt), w.b_K.to(k.device, dt)
    cq, ck = q - bq, k - bk
    bq_full = bq.expand_as(q)
    bk_full = bk.expand_as(k)
    if info.rotary:
        cos, sin = cache[hook_name(layer, "cos")], cache[hook_name(layer, "sin")]
        cq, ck = apply_rotary(cq, cos, sin), apply_rotary(ck, cos, sin)
        bq_full, bk_full = apply_rotary(bq_full, cos, sin), apply_rotary(bk_full, cos, sin)
    group = torch.tensor(kv_group(info.n_heads, info.n_kv_heads), device=q.device)[heads]
    ck, bk_full = ck[:, :, group], bk_full[:, :, group]
    scale = info.score_scale(layer)  # 1/sqrt(d_head); GPT-2's scale_attn_by_inverse_layer_idx divides by layer + 1
    dot = lambda a, b: torch.einsum("bihd,bjhd->bhij", a, b) * scale  # noqa: E731
    return {
        "content": dot(cq, ck),
        "query_const": dot(cq, bk_full),
        "key_prior": dot(bq_full, ck),
        "const": dot(bq_full, bk_full),
    }


#: Float64 elements of one score term's block [batch, heads, rows, keys] that ``score_decomposition`` forms at a
#: time on the CPU (4 MiB): heads are taken in chunks and query rows in blocks (``ROW_BLOCK``) so that a block
#: stays under it, and its extra memory does not grow with the number of heads or with the sequence squared.
CHUNK_ELEMENTS = 2**19
#: Most query rows per block on the CPU (fewer where one head's block would pass ``CHUNK_ELEMENTS``): blocks that
#: stay in cache measured fastest (16 to 64 rows within noise at 112m@512, ``benchmarks/score_before_after.py``).
ROW_BLOCK = 32
#: The block budget on an accelerator, where kernel launches rather than caches set the cost: 128 MiB of float64
#: a term, no row cap (fewer, larger kernels). Not yet measured on a GPU.
ACCELERATOR_ELEMENTS = 2**24
#: The batches (by index in the data) on which ``score_decomposition`` checks that the four terms give the
#: model's own pattern: the first. A config flag the audit misses changes every batch alike.
PATTERN_CHECK_BATCHES = (0,)


def head_chunks(n_heads: int, per_head: int, budget: Optional[int] = None) -> list[slice]:
    """Slices of ``n_heads`` heads, each of at most ``budget // per_head`` heads (at least one; ``budget``
    defaults to ``CHUNK_ELEMENTS``)."""
    size = max(1, (CHUNK_ELEMENTS if budget is None else budget) // max(per_head, 1))
    return [slice(h, min(h + size, n_heads)) for h in range(0, n_heads, size)]


def _computed_terms(info: Any) -> tuple[str, ...]:
    """The terms whose row-centred values can be nonzero: all four under rotary; else content and key_prior
    (query_const and const do not depend on the key j, so centred along a row they are exactly 0)."""
    return TERMS if info.rotary else ("content", "key_prior")


def _factors(model: InterpBridge, store: dict, layer: int, heads: slice,
             used: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, float, Tensor]:
    """Both sides of ``layer``'s score terms for query ``heads``, head-first and contiguous, in the cache's dtype
    (at least float32), and the score scale: queries [b, h, q, 2, d] = (c_q, b_q) and keys [b, h, n, k, d] = c_k
    (n = 1) or, under rotary, (c_k, b_k) (n = 2; every vector rotated by its position; k from the query head's kv
    head), so that term (t, u) = scale x queries[.., t, :] . keys[.., u, :] is term t * n + u of
    ``_computed_terms``. Where the scale is a power of two it is put on the queries (no bit changes); else it is 1
    and the caller scales each product, as ``score_terms`` does. Last, [b, h, q]: the row constant the formed terms
    leave out (without rotary query_const + const = q_i . b_k x scale; else 0), for the pattern check. Positions
    no pair uses (``used``: query rows [b, q] and keys [b, k] with an allowed pair) get zero factors, so that their
    products are 0, not NaN: HF's sliding-window attention leaves NaN states at padded positions."""
    info = model.interp
    w = attention_weights(model, layer)
    q, k = store[hook_name(layer, "q")][:, :, heads], store[hook_name(layer, "k")]
    dt = torch.promote_types(q.dtype, torch.float32)
    bq, bk = w.b_Q[heads].to(q.device, dt), w.b_K.to(k.device, dt)
    cq, ck = q.to(dt) - bq, k.to(dt) - bk
    bq, bk = bq.expand_as(cq), bk.expand_as(ck)
    if info.rotary:
        cos, sin = store[hook_name(layer, "cos")], store[hook_name(layer, "sin")]
        cq, ck, bq, bk = (apply_rotary(x, cos, sin) for x in (cq, ck, bq, bk))
    group = torch.tensor(kv_group(info.n_heads, info.n_kv_heads), device=q.device)[heads]
    keys = torch.stack([x[:, :, group] for x in ((ck, bk) if info.rotary else (ck,))], 1)  # [b, n, k, h, d]
    scale = info.score_scale(layer)  # 1/sqrt(d_head); GPT-2's scale_attn_by_inverse_layer_idx divides by layer + 1
    exact = math.frexp(scale)[0] == 0.5
    queries = (torch.stack((cq, bq), 3) * (scale if exact else 1.0)).masked_fill_(~used[0][:, :, None, None, None], 0)
    keys = keys.masked_fill_(~used[1][:, None, :, None, None], 0)
    left_out = torch.einsum("bqhd,bqhd->bhq", cq + bq, bk[:, :, group]) * scale if not info.rotary else cq.new_zeros(())
    return (queries.transpose(1, 2).contiguous(), keys.permute(0, 3, 1, 2, 4).contiguous(), 1.0 if exact else scale,
            left_out)


def _block_terms(queries: Tensor, keys: Tensor, scale: float, rows: slice, cols: slice, mask: Tensor,
                 n: Tensor) -> tuple[Tensor, Tensor]:
    """The formed terms of query ``rows`` over keys ``cols`` [b, h, rows, terms, keys], float64, centred along
    each row over its allowed keys and 0 on blocked ones (``mask`` [b, q, k], 0/1; ``n`` [b, q]: allowed keys, at
    least 1): one batched product of the ``_factors`` (times ``scale`` in their dtype, as ``score_terms``), then
    a - abar over the allowed keys. Also the sum over terms of abar [b, h, rows] (the score's row mean, less what
    ``_factors`` leaves out)."""
    b, h, _, _, d = queries.shape
    sides, r, c = keys.shape[2], rows.stop - rows.start, cols.stop - cols.start
    product = queries[:, :, rows].reshape(b, h, 2 * r, d) @ keys[:, :, :, cols].reshape(b, h, sides * c, d).mT
    product = product.mul_(scale) if scale != 1.0 else product
    m = mask[:, None, rows, None, cols]
    terms = product.view(b, h, r, 2 * sides, c).double().mul_(m)
    mean = terms.sum(-1, keepdim=True).div_(n[:, None, rows, None, None])
    return terms.sub_(mean).mul_(m), mean.sum((-2, -1))


def _block_gram(terms: Tensor, weight: Tensor) -> Tensor:
    """Per item and head [b, h, t, t]: sum over the block's rows of weight_i G_i, G_i[t, u] = sum_j a_t,j a_u,j
    over row i's allowed keys of the centred terms (Cov(t, u) = G / n_i): one batched product."""
    return torch.einsum("bhrtu,br->bhtu", terms @ terms.mT, weight)


def _block_budget(device: torch.device, n_pos: int) -> tuple[int, int]:
    """(float64 elements of one term's block, most query rows in a block): ``CHUNK_ELEMENTS`` and ``ROW_BLOCK`` on
    the CPU; ``ACCELERATOR_ELEMENTS`` (or ``CHUNK_ELEMENTS`` if larger) and every row elsewhere."""
    if device.type == "cpu":
        return CHUNK_ELEMENTS, ROW_BLOCK
    return max(CHUNK_ELEMENTS, ACCELERATOR_ELEMENTS), n_pos


def _blocks(info: Any, layer: int, n_pos: int, size: int) -> list[tuple[slice, slice]]:
    """(query rows, keys) of each block of ``size`` rows: the keys any of its rows may attend (causal: none after
    its last row; a sliding window w: none before its first row's i - w + 1); every other key is blocked."""
    window = info.window(layer)
    out = []
    for start in range(0, n_pos, size):
        stop = min(start + size, n_pos)
        first = max(0, start - window + 1) if window is not None else 0
        out.append((slice(start, stop), slice(first, stop if info.causal else n_pos)))
    return out


def _layer_sums(model: InterpBridge, store: dict, layer: int, allowed: Tensor, valid_rows: Tensor,
                check: Optional[Tensor]) -> tuple[Tensor, Tensor, list]:
    """(sum over valid rows of G_i / n_i [b, h, t, t] (``_block_gram``), sum over valid rows of KL(P || P without
    the key prior) [b, h] (``_kl_without_key_prior``), the ``_pattern_gap`` of each block when ``check`` is
    the model's pattern), a chunk of heads (``head_chunks``) and a block of rows (``_blocks``) at a time: a term's
    block holds at most ``CHUNK_ELEMENTS`` float64 entries and ``ROW_BLOCK`` rows on the CPU (``_block_budget``),
    and spans only the keys its rows may attend (causal: about half the square), so memory is O(block x keys),
    never [batch, head, query, key] of a whole layer. The terms formed are ``_computed_terms``' (without rotary,
    query_const and const are constant along a row: centred, exactly 0; their rows of the table say 0)."""
    keys = allowed[:, 0].to(torch.float64)  # [b, q, k]
    b, q, k = keys.shape
    n = keys.sum(-1).clamp(min=1)  # [b, q]
    used = (allowed[:, 0].any(-1), allowed[:, 0].any(-2))  # query rows and keys in some allowed pair
    weight = valid_rows[:, 0] / n  # a row's mean over its keys; 0 for rows that attend nothing
    prior = _computed_terms(model.interp).index("key_prior")
    ones = keys.new_ones(1, len(_computed_terms(model.interp)))
    grams, kls, gaps = [], [], []
    budget, most = _block_budget(keys.device, q)
    for heads in head_chunks(model.interp.n_heads, b * min(q, most) * k, budget):
        queries, factors, scale, left_out = _factors(model, store, layer, heads, used)
        size = max(1, min(most, budget // (b * queries.shape[1] * k)))
        gram = kl = 0
        for rows, cols in _blocks(model.interp, layer, q, size):
            terms, level = _block_terms(queries, factors, scale, rows, cols, keys, n)
            score = (ones @ terms)[..., 0, :]  # the centred score (softmax ignores a row constant); 0 if blocked
            if check is not None:
                level = level + left_out[..., rows] if left_out.dim() else level  # the score's row mean
                gaps.append(_pattern_gap(score, check[:, heads, rows], allowed[:, :, rows], cols, level))
            gram = gram + _block_gram(terms, weight[:, rows])
            kl = kl + _kl_without_key_prior(score, terms[..., prior, :], keys[:, rows, cols], valid_rows[:, :, rows])
        grams.append(gram)
        kls.append(kl)
    return torch.cat(grams, 1), torch.cat(kls, 1), gaps


def _term_stats(gram: Tensor, computed: Sequence[str]) -> dict[tuple[str, str], Tensor]:
    """Per item and head [b, h], from the row-summed Gram matrix of the ``computed`` terms: Var(t) = G[t, t],
    Cov(t, s) = sum_u G[t, u] (s = the sum of the terms) and Var(s) = sum G; 0 for a term not formed."""
    zero = gram.new_zeros(gram.shape[:2])
    with_score = gram.sum(-1)
    out = {}
    for name in TERMS:
        i = computed.index(name) if name in computed else None
        out[(name, "var")] = zero if i is None else gram[..., i, i]
        out[(name, "cov")] = zero if i is None else with_score[..., i]
    out[("total", "var")] = out[("total", "cov")] = with_score.sum(-1)
    return out


def _accumulate_terms(model: InterpBridge, store: dict, layer: int, allowed: Tensor, valid_rows: Tensor,
                      acc: dict, kl_acc: dict, check: Optional[Tensor] = None) -> None:
    """Add ``layer``'s sums to ``acc`` (per term and stat: the sum over items [h], and the per-item sums
    [batch, h] a share's bootstrap needs, under ("items", layer, name, stat)) and its KL sum to ``kl_acc``
    (``_layer_sums``: no float64 [batch, head, query, key] tensor of every head, nor of every query row, is
    formed). With ``check`` (the model's pattern), the softmax of the four terms is compared with it
    (``_check_terms_give_pattern``)."""
    info = model.interp
    gram, kl, gaps = _layer_sums(model, store, layer, allowed, valid_rows, check)
    if check is not None:
        _check_terms_give_pattern(info, layer, gaps, check.dtype)
    kl_acc[layer] = kl_acc.get(layer, 0) + kl.sum(0)
    for (name, stat), per_item in _term_stats(gram, _computed_terms(info)).items():
        acc[(layer, name, stat)] = acc.get((layer, name, stat), 0) + per_item.sum(0)
        if (stat == "cov") != (name == "total"):
            acc.setdefault(("items", layer, name, stat), []).append(per_item)


@public
def score_decomposition(
    model: InterpBridge, data: Any, *, max_batches: Optional[int] = None, layers: Any = None, heads: Any = None,
    progress: bool = True, n_boot: int = 1000, seed: int = 0,
) -> pd.DataFrame:
    """Per layer x head x term: how much of the score's variance across keys each term carries.

    Within a query row, across its allowed keys, the score s = sum_t t splits its variance exactly: Var(s) =
    sum_t Cov(t, s). ``share`` = Cov(t, s) / Var(s) (rows averaged in numerator and denominator), so the four
    shares sum to 1 by construction; a term that works against the others has a negative share. ``variance``
    is the term's own Var(t) (the terms covary, so these do not add up to Var(s)).

    Columns: layer, head, term, variance, share, total_variance (Var(s) of the four terms' sum, the score
    without ALiBi / relative terms), kl_without_key_prior (mean over rows of KL(P || P without the key_prior
    term), nats), rotary, terms_complete (False where the family adds a content-free score term the four leave
    out: ALiBi, BEiT's relative position bias), share_lo / share_hi (95% percentile bootstrap over items of the
    share, ``n_boot`` resamples fixed by ``seed``, from per-item sums kept for it: independent of the batching;
    ``interp.bootstrap``), n_batches, pattern_checked (the batches, by index in the data, on which the softmax of
    the four terms was compared with the model's own pattern: ``PATTERN_CHECK_BATCHES``, the first batch; a
    config flag the audit misses changes every batch alike). Refused (``UnsupportedModelError``, with the
    reason) where the score is not bilinear in content + bias: qk-norm, Gemma 2's soft-capping, OLMo's
    ``clip_qkv``; and whenever the softmax of the four terms is not the model's own pattern (checked on the
    first batch). Each layer's rows use its sliding window (Mistral, Qwen2) and its score scale (GPT-2's
    ``scale_attn_by_inverse_layer_idx``). ``layers`` / ``heads`` (None: all): only those rows (the others'
    terms are not computed), equal to the same rows of the full table. Cost: each layer is reduced in its pattern
    hook, a block of heads and query rows at a time over the keys they may attend (``_layer_sums``); the forward
    stops at the last selected layer's pattern (``docs/results/scale/score_before_after.csv``).
    """
    info = require_bridge(model, "score_decomposition").interp
    _require_bilinear_scores(info)
    layers, heads = check_layers(layers, info), check_heads(heads, info)
    boot = check_bootstrap(n_boot, seed)
    acc: dict[tuple[int, str], Tensor] = {}
    kl_acc: dict[int, Tensor] = {}
    n_rows, keys, checked = [0.0], [], []  # real query rows over the batches; item keys; batches checked
    fired: list[Tensor] = []  # each pattern hook's real query rows in the current batch
    index = [0]  # the batch being run
    last = max(layers)  # the forward stops at its pattern: the blocks above it and the unembedding are skipped

    def hooks(batch: Batch) -> list:
        keys.extend(item_keys(batch))
        fired.clear()
        check = index[0] in PATTERN_CHECK_BATCHES
        if check:
            checked.append(index[0])
        index[0] += 1
        return _decompose_hooks(model, batch, acc, kl_acc, layers, fired, check)

    def consume(batch: Batch, store: dict) -> None:
        if len(fired) != last + 1:
            raise UnsupportedModelError(f"{info.name}: hook_pattern fired for {len(fired)} of {last + 1} "
                                        "layers; the decomposition needs every layer's pattern")
        n_rows[0] += float(fired[layers[0]])

    n_batches, _ = stream_batches(model, data, max_batches, [hook_name(last, "pattern")], consume, hooks=hooks,
                                  desc="score decomposition", progress=progress)
    if n_rows[0] == 0:
        raise InputError("data is empty: no query rows to decompose")
    table = _share_intervals(_decomposition_table(info, acc, kl_acc, n_rows[0], layers), acc, Resampler(keys, *boot))
    table = table.assign(n_batches=n_batches, pattern_checked="+".join(map(str, checked)))
    return table[table["head"].isin(heads)].reset_index(drop=True)


def _share_intervals(table: pd.DataFrame, acc: dict, resampler: Resampler) -> pd.DataFrame:
    """``table`` with share_lo / share_hi: each resample's share is sum_i Cov_i(t, s) / sum_i Var_i(s)."""
    bounds = {}
    for layer in table.layer.unique():
        den = torch.cat(acc[("items", layer, "total", "var")]).cpu().numpy()  # [items, h]
        for term in TERMS:
            num = torch.cat(acc[("items", layer, term, "cov")]).cpu().numpy()
            bounds[(layer, term)] = resampler.ratio_interval(num, den)
    lo_hi = [(bounds[(r.layer, r.term)][0][r.head], bounds[(r.layer, r.term)][1][r.head]) for r in table.itertuples()]
    return table.assign(share_lo=[float(lo) for lo, _ in lo_hi], share_hi=[float(hi) for _, hi in lo_hi])


_KEPT = {"attn.q.hook_out": "attn.hook_q", "attn.k.hook_out": "attn.hook_k", "attn.hook_cos": "attn.hook_cos",
         "attn.hook_sin": "attn.hook_sin"}


def _decompose_hooks(model: InterpBridge, batch: Batch, acc: dict, kl_acc: dict, layers: list[int],
                     rows: list, check: bool = True) -> list:
    """The hooks of one batch's forward: each layer's terms are accumulated in its pattern hook (q, k, cos
    and sin of that layer have been kept by then) and, with ``check``, checked against the model's own
    pattern; each pattern hook appends that layer's query rows to ``rows``."""
    store: dict[str, Tensor] = {}

    def keep(t: Tensor, hook: Any) -> None:
        head, _, tail = hook.name.partition(".attn.")
        store[f"{head}.{_KEPT['attn.' + tail]}"] = t.detach()

    def at_pattern(pattern: Tensor, hook: Any) -> None:
        layer = int(hook.name.split(".")[1])
        if layer not in layers:  # not selected: nothing computed, the firing counted
            rows.append(torch.zeros(()))
            store.clear()
            return
        allowed = _key_mask(model, batch, pattern.shape[-1], pattern.device, layer)
        valid_rows = allowed.any(-1).to(torch.float64)  # [b, 1, q]
        _accumulate_terms(model, store, layer, allowed, valid_rows, acc, kl_acc, pattern if check else None)
        rows.append(valid_rows.sum())
        store.clear()

    kept = lambda n: is_block_hook(n) and n.split(".", 2)[-1] in _KEPT  # noqa: E731
    patterns = lambda n: is_block_hook(n) and n.endswith(".attn.hook_pattern")  # noqa: E731
    return [(kept, keep), (patterns, at_pattern)]


def _kl_without_key_prior(score: Tensor, key_prior: Tensor, keys: Tensor, valid_rows: Tensor) -> Tensor:
    """Per item and head [batch, h]: the sum over valid query rows of KL(P || Q), P = softmax of ``score``
    and Q = softmax of ``score - key_prior`` over each row's allowed keys (``keys`` [batch, q, k], 0/1), nats.

    log P_j - log Q_j = kp_j - lse(s) + lse(s - kp), so KL = sum_j P_j kp_j - lse(s) + lse(s - kp): one
    softmax, no second distribution formed. Both inputs may carry any row constant (softmax ignores it);
    ``key_prior`` must be 0 on blocked keys. ``score`` is overwritten (it is a temporary of the caller)."""
    blocked = keys[:, None] == 0
    s = score.masked_fill_(blocked, torch.finfo(torch.float64).min)
    top = s.amax(-1, keepdim=True)
    e = torch.sub(s, top).exp_()
    z = e.sum(-1)
    expected_prior = torch.einsum("...qk,...qk->...q", e, key_prior) / z  # sum_j P_j kp_j
    lse = top[..., 0] + z.log()
    shifted = s.sub_(key_prior)  # s - kp (blocked keys stay at the float64 minimum)
    top = shifted.amax(-1, keepdim=True)
    lse_shifted = top[..., 0] + torch.sub(shifted, top, out=e).exp_().sum(-1).log()
    return ((expected_prior - lse + lse_shifted) * valid_rows).sum(-1)


def _pattern_gap(score: Tensor, pattern: Tensor, allowed: Tensor, cols: slice = slice(None),
                 level: Optional[Tensor] = None) -> tuple[float, float, float, float]:
    """(gap, spread, largest, outside) of ``_check_terms_give_pattern`` for one block: ``score`` over keys
    ``cols`` less the row constant ``level`` [.., rows] (largest is of |score + level|), ``pattern`` and
    ``allowed`` over every key of the same rows (keys outside ``cols`` are blocked).
    p_terms > 1e-4 is read as log p_terms > log 1e-4 (no second exponential)."""
    outside = pattern.masked_fill(allowed, 0).sum(-1, dtype=torch.float64).masked_fill(~allowed.any(-1), 0)
    p, blocked = pattern[..., cols].double(), ~allowed[..., cols]
    masked = score.masked_fill(blocked, float("-inf"))
    logq = masked.log_softmax(-1)
    both = ((p > 1e-4) | (logq > math.log(1e-4))).masked_fill_(blocked, False)
    gap = (p.clamp_min(1e-300).log_().sub_(logq).abs_().masked_fill_(~both, 0)).amax()
    hi, lo = masked.amax(-1), score.masked_fill(blocked, float("inf")).amin(-1)
    spread = (hi - lo).nan_to_num(0.0, 0.0, 0.0).amax()  # rows with no allowed key: 0
    largest = (score if level is None else score + level[..., None]).abs().masked_fill_(blocked, 0).amax()
    return float(gap), float(spread), float(largest), float(outside.amax())  # outside: real rows only


def _check_terms_give_pattern(info: Any, layer: int, gaps: Sequence[tuple[float, float, float, float]],
                              dtype: torch.dtype) -> None:
    """Refuse when the softmax of the four terms over the allowed keys is not the model's own pattern.

    ``gaps``: ``_pattern_gap`` of each block of heads and rows (the maxima below are over all of them).
    The config audit covers the flags it knows; this catches the ones it does not (a scale, window,
    norm or cap the decomposition does not model). Families with a content-free extra term (ALiBi,
    relative position bias) are not checked: the four terms leave it out by design. ``gap``: the largest
    |log p_model - log p_terms| over attended pairs where either exceeds 1e-4 (log p is the score less
    a row constant); allowed: 1e-3 (5e-2 in half precision) of 1 + the largest spread of a score row, plus
    rounding (16 eps of 1 + max |score|). The model's pattern mass on keys the mask excludes must stay
    below the same relative bound (rows of padding queries, which attend nothing, are left out).
    """
    if info.spec.extra_score_term:
        return
    gap, spread, largest, outside = (max(g[i] for g in gaps) for i in range(4))
    rtol = 5e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-3
    allowed_gap = rtol * (1 + spread) + 16 * torch.finfo(dtype).eps * (1 + largest)
    if gap > allowed_gap or outside > rtol:
        raise UnsupportedModelError(
            f"{info.name}, layer {layer}: the four score terms do not reproduce the model's attention pattern "
            f"(log-pattern gap {gap:.2g}, allowed {allowed_gap:.2g}; pattern mass outside the key mask "
            f"{outside:.2g}), so its config changes the attention math in a way interp does not model (a scale, "
            "window, norm or cap); no numbers are returned. The config audit (interp/models/audit.py) lists what "
            "is handled: report the config so that it gets an entry")


def _decomposition_table(info: Any, acc: dict, kl_acc: dict, rows_acc: float, layers: list[int]) -> pd.DataFrame:
    """The long table of ``score_decomposition`` from its row-summed accumulators."""
    out = []
    for layer in layers:
        term_var = torch.stack([acc[(layer, t, "var")] for t in TERMS]) / rows_acc  # [4, h]
        term_cov = torch.stack([acc[(layer, t, "cov")] for t in TERMS]) / rows_acc  # Cov(term, score)
        total_var = acc[(layer, "total", "var")] / rows_acc
        denom = total_var.clamp(min=1e-300)
        kl = kl_acc[layer] / rows_acc
        for h in range(info.n_heads):
            for i, t in enumerate(TERMS):
                out.append(dict(
                    layer=layer, head=h, term=t, variance=float(term_var[i, h]),
                    share=float(term_cov[i, h] / denom[h]), total_variance=float(total_var[h]),
                    kl_without_key_prior=float(kl[h]), rotary=info.rotary,
                    terms_complete=not info.spec.extra_score_term,  # ALiBi, BEiT's relative position bias
                ))
    return pd.DataFrame(out)


def _invariance_hooks(m: InterpBridge, layer: int, fold_dtype: Optional[torch.dtype]) -> tuple[list, list]:
    """(b_k removed, b_v folded into b_O, the fold summed in ``fold_dtype``) at ``layer``: ``bias_patch_hooks``'
    hooks on every kv head."""
    heads = range(m.interp.n_kv_heads)
    return (patch_hooks(m, [(layer, h, "k") for h in heads], "zero"),
            patch_hooks(m, [(layer, h, "v") for h in heads], "fold", fold_dtype=fold_dtype))


def _layer_invariances(m: InterpBridge, layer: int, hooks: tuple[list, list], batch: Batch, store: dict,
                       diffs: dict[int, list[float]]) -> None:
    """Max pattern change with b_k removed and max output change with b_v folded into b_O at ``layer``
    (``hooks``: ``_invariance_hooks``), on one batch, taken into ``diffs[layer]``. Every forward here replays
    the intact blocks below ``layer`` (they compute the same there); the two for the pattern, intact and with
    b_k removed, stop at it (nothing after it can change it): one block each, and no layer's pattern is kept
    longer than its own check."""
    remove_k, fold_v = hooks
    pat = hook_name(layer, "pattern")
    with replay_blocks(m, store[BLOCK_OUTPUTS], layer, 1, batch.inputs.shape[0]):
        base = run_until_kept(m, batch, [pat])[pat]
        patched = run_until_kept(m, batch, [pat], remove_k)[pat]
        allowed = _key_mask(m, batch, base.shape[-1], base.device, layer)
        k_diff = float((patched - base).abs().masked_fill(~allowed, 0).max())
        del base, patched, allowed
        folded = m.run_with_hooks(batch, fwd_hooks=fold_v)
    folded = folded if isinstance(folded, Tensor) else folded[0]
    v_diff = float((folded - store[OUTPUT]).abs().max())
    diffs[layer] = [max(diffs[layer][0], k_diff), max(diffs[layer][1], v_diff)]


@public
def bias_invariances(
    model: InterpBridge, data: Any, *, max_batches: Optional[int] = 1, float64: bool = True, layers: Any = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Per layer: the two exact bias identities, measured.

    ``k_bias_pattern``: max |pattern_l(b_k removed at l) - pattern_l| (0 up to rounding
    without rotary). ``v_bias_fold``: max |output(b_v in place) - output(b_v removed at l
    and sum_h b_v[h] W_O[h] added to the attention output)| on the model's final output.
    ``bias_norm`` is the norm of the bias each check removes (b_k, b_v) at that layer.
    Computed in float64 by default, without a float64 copy of the model: the weights outside the blocks are
    float64 copies for the check and each block's only while it runs (``interp.record.capture.computing_in``;
    the model is not touched), one item at a time (the maxima are over every item read). ``dtype`` says what the
    check ran in, ``softmax_dtype`` what limited the pattern
    (HF softmaxes ViT, DeiT, BEiT, OPT, NeoX, Qwen2 and LLaMA attention in float32 even in float64). ``layers``
    (None: all): check only those layers (each layer's rows do not depend on the others).
    """
    info = require_bridge(model, "bias_invariances").interp
    layers = check_layers(layers, info)
    if not isinstance(float64, bool):  # a string such as "no" would be truthy
        raise InputError(f"float64 must be True or False; got {float64!r}")
    dtype = torch.float64 if float64 else next(model.parameters()).dtype
    name = str(dtype).removeprefix("torch.")
    # HF's eager softmax of some families runs in float32 whatever the model's dtype
    softmax_dtype = "float32" if info.spec.softmax_float32 and name == "float64" else name
    diffs = {layer: [0.0, 0.0] for layer in layers}
    hooks = {layer: _invariance_hooks(model, layer, dtype) for layer in layers}

    def consume(batch: Batch, store: dict) -> None:  # the intact forward's output and block outputs
        for layer in layers:
            _layer_invariances(model, layer, hooks[layer], batch, store, diffs)

    n_batches = 0

    def items_of(batches: Iterable[Batch]) -> Iterator[Batch]:
        # one item at a time: a float64 forward's activations are twice a forward's, and each check's forwards
        # hold every block's output beside them; a max over the items is the max over the batch
        nonlocal n_batches
        for batch in batches:
            n_batches += 1
            yield from (batch.items(i, i + 1) for i in range(batch.inputs.shape[0]))

    with computing_in(model, dtype) if float64 else nullcontext():
        stream_batches(model, items_of(iter_batches(model, data, max_batches)), None, [], consume,
                       desc="bias invariances", progress=progress, keep_output=True, block_outputs=True,
                       unit="item")
    rows = []
    for layer in layers:
        w = attention_weights(model, layer, dtype)
        (k_diff, v_diff), common = diffs[layer], dict(layer=layer, rotary=info.rotary, n_batches=n_batches,
                                                      dtype=name, softmax_dtype=softmax_dtype)
        rows.append(dict(check="k_bias_pattern", max_abs_diff=k_diff, bias_kind="k",
                         bias_norm=float(w.b_K.norm()), **common))
        rows.append(dict(check="v_bias_fold", max_abs_diff=v_diff, bias_kind="v",
                         bias_norm=float(w.b_V.norm()), **common))
    return pd.DataFrame(rows)[["layer", "check", "max_abs_diff", "bias_kind", "bias_norm", "rotary",
                               "n_batches", "dtype", "softmax_dtype"]]


def _grab(store: dict, key: str) -> Any:
    def fn(t: Tensor, hook: Any) -> None:
        store[key] = t.detach().clone()
    return fn
