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

from typing import Any, Optional, Sequence

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.bootstrap import Resampler, check_bootstrap, item_keys
from interp.checks import check_heads, check_layers
from interp.capture import BLOCK_OUTPUTS, OUTPUT, run_until_kept, stream_batches
from interp.data import Batch
from interp.errors import InputError, UnsupportedModelError, public
from interp.heads import attention_weights, kv_group
from interp.hooks import hook_name, is_block_hook
from interp.patching import bias_patch_hooks
from interp.prefix import replay_blocks
from interp.models.bridge import InterpBridge, require_bridge
from interp.models.loading import clone_model

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


#: Float64 elements of one score-term tensor [batch, heads, query, key] that ``score_decomposition`` forms at
#: a time (4 MiB): heads are taken in chunks of at most this size, so its extra memory does not grow with the
#: number of heads (one head of 2 x 512 x 512 fills it).
CHUNK_ELEMENTS = 2**19
#: The batches (by index in the data) on which ``score_decomposition`` checks that the four terms give the
#: model's own pattern: the first. A config flag the audit misses changes every batch alike.
PATTERN_CHECK_BATCHES = (0,)


def head_chunks(n_heads: int, per_head: int) -> list[slice]:
    """Slices of ``n_heads`` heads, each of at most ``CHUNK_ELEMENTS // per_head`` heads (at least one)."""
    size = max(1, CHUNK_ELEMENTS // max(per_head, 1))
    return [slice(h, min(h + size, n_heads)) for h in range(0, n_heads, size)]


def _term_sums(terms: dict[str, Tensor], keys: Tensor, n: Tensor, valid_rows: Tensor) -> dict[tuple[str, str], Tensor]:
    """Per item and head [batch, h]: each term's row variance and row covariance with the score, and the
    score's row variance, summed over valid query rows. Within a row, Cov(a, b) = mean over allowed keys of
    (a - mean a)(b - mean b); each term is centred once in float64 (in place, into one [.., 4, key] buffer), and
    one batched product gives every row's 4 x 4 Gram matrix G[t, u] = sum_j a_t,j a_u,j of the centred terms:
    Var(t) = G[t, t], Cov(t, s) = sum_u G[t, u] and Var(s) = sum G (s = the sum of the terms), so the terms are
    read once. Also ``("kl", "")``: per item and head, the sum over rows of KL(P || P without the key_prior
    term) (``_kl_without_key_prior``), from the centred score and key prior (softmax ignores a row constant)."""
    first = next(iter(terms.values()))
    b, h, q, k = first.shape
    centred = torch.empty((b, h, q, len(TERMS), k), dtype=torch.float64, device=first.device)
    for i, name in enumerate(TERMS):  # centred[..., i, :] = (t - row mean over allowed keys) on allowed keys, else 0
        c = centred[:, :, :, i]
        c.copy_(terms[name])
        c.sub_((torch.einsum("bhqk,bqk->bhq", c, keys) / n)[..., None]).mul_(keys[:, None])
    gram = centred @ centred.transpose(-1, -2)  # [b, h, q, 4, 4]
    weight = valid_rows / n  # [b, 1, q]: a row's mean over its keys, 0 for rows that attend nothing
    over_rows = lambda a: (a * weight).sum(-1)  # noqa: E731
    out = {}
    cov_with_score = gram.sum(-1)
    for i, name in enumerate(TERMS):
        out[(name, "var")] = over_rows(gram[..., i, i])
        out[(name, "cov")] = over_rows(cov_with_score[..., i])
    out[("total", "var")] = over_rows(cov_with_score.sum(-1))
    out[("total", "cov")] = out[("total", "var")]
    key_prior = centred[:, :, :, TERMS.index("key_prior")]
    out[("kl", "")] = _kl_without_key_prior(centred.sum(-2), key_prior, keys, valid_rows)
    return out


def _accumulate_terms(model: InterpBridge, store: dict, layer: int, allowed: Tensor, valid_rows: Tensor,
                      acc: dict, kl_acc: dict, check: Optional[Tensor] = None) -> None:
    """Add ``layer``'s sums to ``acc`` (per term and stat: the sum over items [h], and the per-item sums
    [batch, h] a share's bootstrap needs, under ("items", layer, name, stat)) and its KL sum to ``kl_acc``,
    one chunk of heads at a time (``head_chunks``): no float64 [batch, head, query, key] tensor of every
    head is formed. With ``check`` (the model's pattern), the softmax of the four terms is compared with it
    (``_check_terms_give_pattern``)."""
    info = model.interp
    keys = allowed[:, 0].to(torch.float64)  # [b, q, k]
    n = keys.sum(-1).clamp(min=1)[:, None]  # [b, 1, q]
    b, q, k = keys.shape
    parts: dict[tuple[str, str], list[Tensor]] = {}
    gaps = []
    for heads in head_chunks(info.n_heads, b * q * k):
        terms = score_terms(model, store, layer, heads)
        if check is not None:
            gaps.append(_pattern_gap(sum(t.double() for t in terms.values()), check[:, heads], allowed))
        for key, value in _term_sums(terms, keys, n, valid_rows).items():
            parts.setdefault(key, []).append(value)
        del terms
    if check is not None:
        _check_terms_give_pattern(info, layer, gaps, check.dtype)
    for (name, stat), chunks in parts.items():
        per_item = torch.cat(chunks, 1)  # [b, h]
        if name == "kl":
            kl_acc[layer] = kl_acc.get(layer, 0) + per_item.sum(0)
            continue
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
    terms are not computed), equal to the same rows of the full table. Cost: each layer's terms are reduced in
    its pattern hook, a chunk of heads at a time (``CHUNK_ELEMENTS`` float64 entries per term tensor); the
    forward stops at the last selected layer's pattern (no unembedding).
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


def _pattern_gap(score: Tensor, pattern: Tensor, allowed: Tensor) -> tuple[float, float, float, float]:
    """(gap, spread, largest, outside) of ``_check_terms_give_pattern`` for one chunk of heads."""
    p, s = pattern.double(), score
    logq = s.masked_fill(~allowed, float("-inf")).log_softmax(-1)
    both = allowed & ((p > 1e-4) | (logq.exp() > 1e-4))
    zero = torch.zeros_like(p)
    gap = float(torch.where(both, (p.clamp_min(1e-300).log() - logq).abs(), zero).amax())
    hi, lo = s.masked_fill(~allowed, float("-inf")).amax(-1), s.masked_fill(~allowed, float("inf")).amin(-1)
    spread = float((hi - lo).nan_to_num(0.0, 0.0, 0.0).amax())  # rows with no allowed key: 0
    largest = float(torch.where(allowed, s.abs(), zero).amax())
    outside = float(torch.where(allowed, zero, p).sum(-1).masked_fill(~allowed.any(-1), 0).amax())  # real rows
    return gap, spread, largest, outside


def _check_terms_give_pattern(info: Any, layer: int, gaps: Sequence[tuple[float, float, float, float]],
                              dtype: torch.dtype) -> None:
    """Refuse when the softmax of the four terms over the allowed keys is not the model's own pattern.

    ``gaps``: ``_pattern_gap`` of each chunk of heads (the maxima below are over all of them).
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


def _invariance_hooks(m: InterpBridge, layer: int) -> tuple[list, list]:
    """(b_k removed, b_v folded into b_O) at ``layer``: ``bias_patch_hooks`` on every kv head."""
    heads = range(m.interp.n_kv_heads)
    return (bias_patch_hooks(m, [(layer, h, "k") for h in heads], "zero"),
            bias_patch_hooks(m, [(layer, h, "v") for h in heads], "fold"))


def _layer_invariances(m: InterpBridge, layer: int, hooks: tuple[list, list], batch: Batch, store: dict,
                       diffs: dict[int, list[float]]) -> None:
    """Max pattern change with b_k removed and max output change with b_v folded into b_O at ``layer``
    (``hooks``: ``_invariance_hooks``), on one batch, taken into ``diffs[layer]``. Both patched forwards replay
    the intact blocks below ``layer`` (they compute the same there); the one for the pattern stops at it
    (nothing after it can change it)."""
    remove_k, fold_v = hooks
    pat = hook_name(layer, "pattern")
    base = store[pat]
    with replay_blocks(m, store[BLOCK_OUTPUTS], layer, 1, batch.inputs.shape[0]):
        patched = run_until_kept(m, batch, [pat], remove_k)[pat]
        folded = m.run_with_hooks(batch, fwd_hooks=fold_v)
    folded = folded if isinstance(folded, Tensor) else folded[0]
    allowed = _key_mask(m, batch, base.shape[-1], base.device, layer)
    k_diff = float((patched - base).abs().masked_fill(~allowed, 0).max())
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
    Computed in float64 by default (a float64 copy; the model is not touched); ``dtype``
    says what the model ran in, ``softmax_dtype`` what limited the pattern (HF softmaxes
    ViT, DeiT, BEiT, OPT, NeoX, Qwen2 and LLaMA attention in float32 even in float64). ``layers``
    (None: all): check only those layers (each layer's rows do not depend on the others).
    """
    info = require_bridge(model, "bias_invariances").interp
    layers = check_layers(layers, info)
    if not isinstance(float64, bool):  # a string such as "no" would be truthy
        raise InputError(f"float64 must be True or False; got {float64!r}")
    m = clone_model(model, dtype=torch.float64) if float64 else model
    dtype = str(next(m.parameters()).dtype).removeprefix("torch.")
    # HF's eager softmax of some families runs in float32 whatever the model's dtype
    softmax_dtype = "float32" if info.spec.softmax_float32 and dtype == "float64" else dtype
    diffs = {layer: [0.0, 0.0] for layer in layers}
    hooks = {layer: _invariance_hooks(m, layer) for layer in layers}

    def consume(batch: Batch, store: dict) -> None:  # the intact forward's patterns, output and block outputs
        for layer in layers:
            _layer_invariances(m, layer, hooks[layer], batch, store, diffs)

    n_batches, _ = stream_batches(m, data, max_batches, [hook_name(layer, "pattern") for layer in layers], consume,
                                  desc="bias invariances", progress=progress, keep_output=True, block_outputs=True)
    rows = []
    for layer in layers:
        w = attention_weights(m, layer)
        (k_diff, v_diff), common = diffs[layer], dict(layer=layer, rotary=info.rotary, n_batches=n_batches,
                                                      dtype=dtype, softmax_dtype=softmax_dtype)
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
