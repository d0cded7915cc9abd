"""One input, looked at closely: ``single_input``.

For one image or prompt and each head h of layer l, with content parts c_q,i = x_i W_q and
c_k,j = x_j W_k (each rotated by its own position under rotary) and the head's score scale
(1/sqrt(d_head)):

    s_ij = [c_q,i.c_k,j  +  c_q,i.b_k  +  b_q.c_k,j  +  b_q.b_k] / sqrt(d),     A_ij = softmax_j(s_ij)
            content        query_const   key_prior     const

Conditions (one layer's bias removed, every layer below it intact; the heads of a layer do not
interact in that layer's pattern, so removing a bias from every head of layer l at once gives each
head's own-removal pattern):

    intact        A, the model's own pattern (hook_pattern)
    no_b_q        b_q zeroed (``bias_patch_hooks``): softmax_j(c_q,i.(c_k,j + b_k) / sqrt(d))
    no_b_k        b_k zeroed. Without rotary, c_q,i.b_k and b_q.b_k do not depend on the key j, so softmax
                  cancels them: A is unchanged (an identity; rounding only). Under rotary b_k turns with the
                  key's position and A changes.
    no_b_v        b_v zeroed. A is unchanged exactly (v is not in the score), but the head's output
                  z_i W_O[h] = sum_j A_ij v_j W_O[h] moves by exactly -b_v W_O[h] at every query i
                  (each row of A sums to 1): ``output_change_rms`` in the heads table says by how much.
    no_key_prior  softmax_j(s_ij - b_q.c_k,j / sqrt(d)) = softmax_j(content + query_const + const),
                  recomputed in float64 from the layer's q and k (``score_terms``).

Key prior of key j seen from query i: kp_ij = b_q.c_k,j / sqrt(d); without rotary it is x_j.u / sqrt(d)
with u = W_k b_q, the same for every query, so it ranks the keys once per head: the tokens or
patches the bias makes every query look at.

Tables are long-form (one row per layer x head x condition x [query x] key); nothing is streamed or
cached beyond the one input's activations of the chosen layers.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.analysis.scores import _key_mask, score_terms
from interp.analysis.sink_parts import evaluating, patterns_of, prefix_names
from interp.record.capture import check_fits_dtype, run_until_kept
from interp.data.batch import Batch, image_norm, normalise, pil_pixels, square_resize
from interp.checks import check_count, check_heads, check_layers
from interp.data import CheckedBatch, check_batch
from interp.data.iterate import to_batch, unchecked_batches
from interp.data.sources import data_kind
from interp.errors import InputError, public
from interp.record.fingerprint import data_fingerprint, model_fingerprint
from interp.record.heads import attention_weights, kv_group
from interp.record.hooks import hook_name
from interp.models.bridge import InterpBridge, require_bridge
from interp.models.loading import clone_model
from interp.record.patching import stacked_patch_hooks

CONDITIONS = ("intact", "no_b_q", "no_b_k", "no_b_v", "no_key_prior")
QUERIES = ("cls", "first", "last", "mean", "all")
MAX_PATTERN_ROWS = 3_000_000  # beyond this, ask for fewer layers / heads or one query row
Pattern = Float[Tensor, "head_index query_pos key_pos"]


@dataclass
class SingleInput:
    """What ``single_input`` returns (see its doc for the columns)."""

    patterns: pd.DataFrame  # layer x head x condition x (query x) key: weight, delta
    heads: pd.DataFrame  # layer x head x condition: max_abs_diff, kl, output_change_rms, removed_norm, note
    key_prior: pd.DataFrame  # layer x head x rank: the keys the key prior favours
    positions: pd.DataFrame  # pos, label, kind, row, col
    image: Optional[np.ndarray]  # [H, W, 3] in [0, 1] for a ViT (the normalisation undone), None for text
    meta: dict = field(default_factory=dict)  # model, model_fingerprint, data_fingerprint, query, ...

    def __repr__(self) -> str:
        m = self.meta
        return (f"SingleInput({m.get('model')}, {m.get('modality')}, {len(self.positions)} positions, query="
                f"{m.get('query')!r}, layers {m.get('layers')}, {len(self.patterns):,} pattern rows)")


# ----- the one input -------------------------------------------------------------------------------------


def _more_than_one(what: str) -> InputError:
    return InputError(f"single_input looks at one input, but got {what}: pass one image or prompt (e.g. "
                      "interp.builtin_batches(model, 'photos')[0].inputs[0], or one string)")


def _image_batch(model: InterpBridge, pixels: np.ndarray) -> Batch:
    """An [H, W(, C)] array (uint8, or floats) centre-cropped, resized and normalised like the built-in photos."""
    if pixels.ndim not in (2, 3):
        raise InputError(f"an image array must be [H, W] or [H, W, C]; got shape {pixels.shape} (for several "
                         "images pass one of them)")
    mean, std = image_norm(model)
    x = square_resize(pixels, model.interp.image_size)
    return Batch((x if mean is None else normalise(x, mean, std))[None])


def _literal(model: InterpBridge, item: Any) -> Any:
    """The forms only one input can take, made a batch of one: an image (PIL image, [H, W(, C)] array) for
    a ViT, token ids [pos] (a list of ints, a 1-d tensor or array) or pixel values [C, H, W]; anything else
    is returned as it is, for ``open_data`` to decide."""
    from PIL import Image

    info = model.interp
    if isinstance(item, Image.Image) or (isinstance(item, np.ndarray) and info.modality == "vision"
                                         and item.dtype.kind in "uif" and item.ndim in (2, 3)):
        if info.modality != "vision":
            raise InputError(f"{info.name} is a language model, so an image cannot be its input: pass a prompt "
                             "(str) or token ids [pos]")
        return _image_batch(model, pil_pixels(item) if isinstance(item, Image.Image) else np.asarray(item))
    if isinstance(item, (list, tuple)) and item and all(isinstance(i, int) and not isinstance(i, bool) for i in item):
        item = torch.tensor(item)  # token ids as a list
    if isinstance(item, np.ndarray) and item.dtype.kind in "iu":
        item = torch.from_numpy(item)  # token ids as an array
    one = 3 if info.modality == "vision" else 1  # the dimensions of one image's pixels, one sequence's ids
    if isinstance(item, Tensor) and item.ndim == one:
        return item[None]
    if isinstance(item, dict) or (isinstance(item, tuple) and len(item) == 2 and all(isinstance(t, Tensor)
                                                                                     for t in item)):
        item = to_batch(model, item)  # open_data's reading of a dict or an (ids, mask) / (pixels, labels) pair
    if isinstance(item, Batch) and isinstance(item.inputs, Tensor) and item.inputs.ndim == one:
        mask = item.attention_mask
        return Batch(item.inputs[None], None if mask is None or info.modality == "vision"
                     else torch.as_tensor(mask).reshape(1, -1))
    return item


def _single_input_batch(model: InterpBridge, item: Any) -> Batch:
    """``item`` as a Batch of one: a prompt, an image (path, PIL image, array, pixel tensor) or token ids,
    a dict / Batch / (ids, mask) pair holding one; more than one, or the other modality, is refused.

    What a data argument is, is decided by ``open_data`` (a path that does not exist is never a prompt);
    the forms only one input takes (``_literal``) are made a batch first. The data must then hold exactly
    one item (image or sequence); a sequence's padding is stripped."""
    info = model.interp
    if isinstance(item, (list, tuple)) and len(item) == 1 and not isinstance(item[0], (int, float, str)):
        item = item[0]
    if isinstance(item, (str, os.PathLike)):
        try:
            kind = data_kind(item, text_ok=info.modality == "text")  # the one decision (open_data's)
        except InputError as exc:
            if info.modality != "vision":
                raise
            raise InputError(f"{info.name} is a vision model, so a string must name an image file: {exc}; or pass "
                             "a PIL image, an [H, W, 3] array or [3, H, W] pixel values") from None
        if kind == "builtin" or os.path.isdir(item):
            what = f"the built-in data set {str(item)!r}" if kind == "builtin" else f"the folder {str(item)!r}"
            raise _more_than_one(what)
        if kind == "text" and model.tokenizer is None:
            raise InputError(f"{info.name} has no tokenizer, so a prompt cannot be tokenised: pass token ids "
                             "[pos], or load it with interp.load_model(model, tokenizer=...)")
    if isinstance(item, (list, tuple)) and len(item) > 1 and all(isinstance(i, str) for i in item):
        raise _more_than_one(f"a {type(item).__name__} of {len(item)} prompts")
    item = _literal(model, item)
    batch = _exactly_one(model, unchecked_batches(model, item))
    batch.check(info)
    check_fits_dtype(batch, next(model.parameters()).dtype)
    if batch.attention_mask is not None and info.modality == "text" and batch.attention_mask.shape == \
            batch.inputs.shape:
        batch = Batch(batch.inputs[:, batch.attention_mask[0].bool()])  # one sequence: its real tokens
    elif info.modality == "vision":
        batch = Batch(batch.inputs)  # labels are not an input
    return batch


def _exactly_one(model: InterpBridge, batches: Any) -> Batch:
    """The one batch of one item ``batches`` hold; a second item (in the same batch or a later one) is refused
    without reading further."""
    first = _literal(model, next(batches))  # unchecked_batches: an empty source is one clear error; one item un-batched
    vision = model.interp.modality == "vision"
    if not isinstance(first.inputs, Tensor) or first.inputs.ndim < 1:
        return first  # not a batch of tensors: Batch.check says what is wrong
    n = first.inputs.shape[0]
    if n != 1:
        raise _more_than_one(f"{n} {'images' if vision else 'sequences'} {tuple(first.inputs.shape)}")
    if next(batches, None) is not None:
        raise _more_than_one(f"more than one batch of {'images' if vision else 'sequences'}")
    return first


def _positions_table(model: InterpBridge, batch: Batch) -> pd.DataFrame:
    """One row per position: pos, label (the token string; a ViT's prefix name or "patch (r, c)"), kind
    (token | prefix | patch), row, col (patch-grid coordinates; -1 where there are none)."""
    info = model.interp
    if info.modality == "vision":
        n_pre, ps = info.n_prefix_tokens, info.patch_size
        gh, gw = batch.inputs.shape[-2] // ps, batch.inputs.shape[-1] // ps
        names = prefix_names(model)
        rows = [dict(pos=p, label=names[p] if p < len(names) else f"prefix {p}", kind="prefix", row=-1, col=-1)
                for p in range(n_pre)]
        rows += [dict(pos=n_pre + i, label=f"patch ({i // gw}, {i % gw})", kind="patch", row=i // gw, col=i % gw)
                 for i in range(gh * gw)]
        return pd.DataFrame(rows)
    ids = [int(i) for i in batch.inputs[0]]
    tok = model.tokenizer
    labels = [tok.decode([i]) for i in ids] if tok is not None else [str(i) for i in ids]
    return pd.DataFrame(dict(pos=range(len(ids)), label=labels, kind="token", token_id=ids, row=-1, col=-1))


def input_image(model: InterpBridge, batch: Batch) -> Optional[np.ndarray]:
    """The image a ViT saw, [H, W, 3] in [0, 1]: pixel values times the model's std plus its mean, clipped."""
    if model.interp.modality != "vision":
        return None
    x = batch.inputs[0].detach().double().cpu()
    mean, std = image_norm(model)
    if mean is not None:
        x = x * torch.tensor(std, dtype=x.dtype).view(-1, 1, 1) + torch.tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    x = x[:3] if x.shape[0] >= 3 else x[:1].expand(3, -1, -1)
    return x.clamp(0, 1).permute(1, 2, 0).numpy()


def _default_query(model: InterpBridge) -> str:
    if model.interp.modality == "vision":
        return "cls" if "cls" in prefix_names(model) else "mean"
    return "all"


def _resolve_query(model: InterpBridge, query: Any, n_pos: int) -> tuple[str, Optional[list[int]]]:
    """(label, query rows) for ``query``: a position, "cls", "first", "last" (one row), "all" (every row),
    or "mean" (rows None: the mean over real query rows); None: "cls" for a ViT with a class token, "mean"
    for one without, "all" for a language model."""
    query = _default_query(model) if query is None else query
    named = isinstance(query, str) and query in QUERIES
    if isinstance(query, bool) or not (isinstance(query, int) or named):
        raise InputError(f"query must be a position (an integer in 0..{n_pos - 1}) or one of {', '.join(QUERIES)}; "
                         f"got {query!r}")
    if isinstance(query, int):
        if not -n_pos <= query < n_pos:
            raise InputError(f"query position {query} is outside this input's {n_pos} positions (0..{n_pos - 1})")
        return f"pos {query % n_pos}", [query % n_pos]
    if query == "cls" and "cls" not in prefix_names(model):
        raise InputError(f"{model.interp.name} has no class token to query from: pass query='mean' (the mean over "
                         "queries), 'first', or a position")
    rows = {"cls": [0], "first": [0], "last": [n_pos - 1], "all": list(range(n_pos)), "mean": None}[query]
    return query, rows


# ----- the forwards ----------------------------------------------------------------------------------------


def _intact_store(model: InterpBridge, batch: CheckedBatch, layers: Sequence[int]) -> dict[str, Tensor]:
    """hook_pattern, hook_q, hook_k, hook_v, hook_z (and hook_cos / hook_sin under rotary) of ``layers``."""
    parts = ("pattern", "q", "k", "v", "z") + (("cos", "sin") if model.interp.rotary else ())
    store = run_until_kept(model, batch, [hook_name(layer, p) for layer in layers for p in parts])
    patterns_of(model, store, layers)  # a fused attention kernel (no pattern) is refused here, with the fix
    return store


def _without_biases(model: InterpBridge, batch: CheckedBatch, layer: int) -> dict[str, tuple[Tensor, Tensor]]:
    """Per kind (q, k, v): (pattern [head, q, k], z [pos, head, d_head]) of ``layer`` with that layer's bias
    of that kind zeroed in every head (``bias_patch_hooks`` method "zero", a' = a - b, stacked as three
    variants of one forward), the layers below intact."""
    kinds = ("q", "k", "v")
    groups = [[(layer, h, kind) for h in range(model.interp.heads(kind))] for kind in kinds]
    names = [hook_name(layer, p) for p in ("pattern", "z")]
    store = run_until_kept(model, batch.repeat(len(kinds)), names, stacked_patch_hooks(model, groups, "zero"))
    return {kind: (store[names[0]][i], store[names[1]][i]) for i, kind in enumerate(kinds)}


def _key_prior_parts(model: InterpBridge, store: dict, layer: int, intact: Pattern,
                     allowed: Bool[Tensor, "query_pos key_pos"]) -> tuple[Optional[Pattern], Optional[Pattern], str]:
    """(key-prior term kp_ij = b_q.c_k,j / sqrt(d), pattern without it, note), float64, from the intact q and k
    (``score_terms``): softmax(content + query_const + const). Where the family adds a content-free term
    (ALiBi, relative position bias) that q and k do not carry: softmax(log A - kp), the same pattern with
    that term kept. (None, None, why) where the four terms do not make the score (qk-norm, soft-capping)."""
    spec = model.interp.spec
    if spec.score_refusal:
        return None, None, f"key prior not computed: {spec.score_refusal}"
    names = [hook_name(layer, p) for p in ("q", "k", "cos", "sin")]
    terms = {t: v[0] for t, v in score_terms(model, {n: store[n].double() for n in names if n in store}, layer).items()}
    if spec.extra_score_term:
        kept = intact.clamp_min(1e-300).log() - terms["key_prior"]
        note = f"without the key prior: softmax(log A - key prior), keeping {spec.extra_score_term}"
    else:
        kept, note = terms["content"] + terms["query_const"] + terms["const"], ""
    pattern = kept.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return terms["key_prior"], pattern, note


# ----- one layer -------------------------------------------------------------------------------------------


@dataclass
class _Layer:
    """One layer's patterns [head, q, k] and head outputs z [pos, head, d_head] per condition, float64."""

    layer: int
    patterns: dict[str, Pattern]
    z: dict[str, Float[Tensor, "pos head_index d_head"]]
    key_prior: Optional[Pattern]
    notes: list[str]
    allowed: Bool[Tensor, "query_pos key_pos"]  # the layer's key mask (causal, sliding window)
    real: Bool[Tensor, " query_pos"]  # query rows that attend something


def _layer_conditions(model: InterpBridge, batch: CheckedBatch, store: dict, layer: int) -> _Layer:
    """Every condition's pattern and head output at ``layer`` (module doc). The key-prior condition's
    output is z' = A' V (v of the intact forward, kv heads repeated under grouped-query attention)."""
    info = model.interp
    n_pos = store[hook_name(layer, "pattern")].shape[-1]
    device = store[hook_name(layer, "pattern")].device
    allowed = _key_mask(model, batch, n_pos, device, layer)[0, 0]  # with the layer's sliding window
    pattern = store[hook_name(layer, "pattern")][0].double()
    patterns = {"intact": pattern}
    z = {"intact": store[hook_name(layer, "z")][0].double()}
    for kind, (p, zk) in _without_biases(model, batch, layer).items():
        patterns[f"no_b_{kind}"], z[f"no_b_{kind}"] = p.double(), zk.double()
    kp, without, note = _key_prior_parts(model, store, layer, pattern, allowed)
    if without is not None:
        v = store[hook_name(layer, "v")][0].double()[:, kv_group(info.n_heads, info.n_kv_heads)]
        patterns["no_key_prior"] = without
        z["no_key_prior"] = torch.einsum("hqk,khd->qhd", without, v)
    return _Layer(layer, patterns, z, kp, [note] if note else [], allowed, allowed.any(-1))


def _removed_norms(model: InterpBridge, layer: int) -> tuple[dict[str, Tensor], dict[str, bool]]:
    """Per condition, the norm of what it removes from each query head: ||b_q[h]||, ||b_k[g(h)]||,
    ||b_v[g(h)]||, and for the key prior ||u|| = ||W_k[g(h)] b_q[h]||; and whether that bias exists."""
    info = model.interp
    w = attention_weights(model, layer, torch.float64)
    g = kv_group(info.n_heads, info.n_kv_heads)
    u = torch.einsum("hmd,hd->hm", w.W_K[g], w.b_Q)
    norms = {"intact": torch.zeros(info.n_heads, dtype=torch.float64), "no_b_q": w.b_Q.norm(dim=-1),
             "no_b_k": w.b_K[g].norm(dim=-1), "no_b_v": w.b_V[g].norm(dim=-1), "no_key_prior": u.norm(dim=-1)}
    present = {"intact": True, "no_b_q": w.present["q"], "no_b_k": w.present["k"], "no_b_v": w.present["v"],
               "no_key_prior": w.present["q"]}
    return {c: n.cpu() for c, n in norms.items()}, present


def _condition_note(model: InterpBridge, condition: str, present: bool) -> str:
    spec = model.interp.spec
    if condition != "intact" and not present:
        return f"no {'b_q' if condition == 'no_key_prior' else condition[3:]} in this model: nothing removed"
    if condition == "no_b_k":
        return ("identity: b_k adds key-independent terms that softmax cancels (rounding only)" if spec.k_bias_inert
                else f"b_k turns with the key under {spec.positions} positions, so the pattern changes")
    if condition == "no_b_v":
        return ("pattern unchanged by construction (v is not in the score); the output moves by -b_v W_O[h] at "
                "every query")
    return ""


def _head_rows(model: InterpBridge, got: _Layer, heads: Sequence[int]) -> list[dict]:
    """Per head and condition: max |A' - A| over attended pairs, mean KL(A || A') over real query rows (nats),
    RMS over real queries of ||(z' - z) W_O[h]|| (the change of what the head writes), the removed norm."""
    norms, present = _removed_norms(model, got.layer)
    base, z0, allowed, real = got.patterns["intact"], got.z["intact"], got.allowed, got.real
    W_o = attention_weights(model, got.layer, torch.float64).W_O.to(allowed.device)
    rows = []
    for cond, p in got.patterns.items():
        diff = (p - base).abs().masked_fill(~allowed, 0).amax((-1, -2))
        logs = base.clamp_min(1e-300).log() - p.clamp_min(1e-300).log()
        # KL >= 0; a float sum of near-equal rows can dip below by rounding (-2.2e-8 nats on a float64 ViT)
        kl = (base * logs).masked_fill(~allowed, 0).sum(-1)[:, real].mean(-1).clamp_min(0.0)
        out = torch.einsum("qhd,hdm->qhm", got.z[cond] - z0, W_o).norm(dim=-1)[real]  # [real q, head]
        rms = out.pow(2).mean(0).sqrt()
        for h in heads:
            rows.append(dict(layer=got.layer, head=h, condition=cond, removed_norm=float(norms[cond][h]),
                             present=bool(present[cond]), max_abs_diff=float(diff[h]), kl=float(kl[h]),
                             output_change_rms=float(rms[h]), note=_condition_note(model, cond, present[cond])))
    return rows


# ----- tables ----------------------------------------------------------------------------------------------


def _reduce(p: Pattern, rows: Optional[list[int]], allowed: Tensor,
            real: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights [head, Q, key], attended [Q, key], query positions [Q]) at the query selection: the chosen
    rows, or (rows None) the mean over real query rows, mean_i A_ij (query position -1)."""
    if rows is None:
        w = (p * real[None, :, None]).sum(1, keepdim=True) / real.sum()
        mask, qpos = (allowed & real[:, None]).any(0, keepdim=True), [-1]
    else:
        w, mask, qpos = p[:, rows], allowed[rows], rows
    return w.cpu().numpy(), mask.cpu().numpy(), np.asarray(qpos)


def _pattern_frame(got: _Layer, heads: Sequence[int], rows: Optional[list[int]], query: str) -> pd.DataFrame:
    """Long rows layer, head, condition, query, query_pos, key_pos, weight, delta (= weight - intact weight),
    attended pairs only."""
    reduced = {c: _reduce(p[heads], rows, got.allowed, got.real) for c, p in got.patterns.items()}
    base, mask, qpos = reduced["intact"]
    qi, kj = np.nonzero(mask)
    n, n_heads = len(qi), len(heads)
    parts = []
    for cond, (w, _, _) in reduced.items():
        vals = w[:, qi, kj]
        parts.append(pd.DataFrame(dict(
            layer=got.layer, head=np.repeat(np.asarray(heads), n), condition=cond, query=query,
            query_pos=np.tile(qpos[qi], n_heads), key_pos=np.tile(kj, n_heads), weight=vals.ravel(),
            delta=(vals - base[:, qi, kj]).ravel())))
    return pd.concat(parts, ignore_index=True)


def _key_prior_frame(got: _Layer, heads: Sequence[int], rows: Optional[list[int]], u_norm: Tensor,
                     top_k: Optional[int]) -> pd.DataFrame:
    """Per head, the keys ranked by the key prior kp_ij at the query selection (one row: that row; several
    or "mean": its mean over the real query rows that attend the key), with the attention they get with
    and without it (the same selection). ``key_prior_centered``: minus its mean over the attended keys."""
    one, allowed, real = rows is not None and len(rows) == 1, got.allowed, got.real
    sel = None if not one else rows
    kp, mask, _ = _reduce(got.key_prior[heads], sel, allowed, real)
    if not one:  # the mean over the queries that attend each key (every query without rotary: one value)
        attend = (allowed & real[:, None]).double()
        kp = ((got.key_prior[heads] * attend).sum(1) / attend.sum(0).clamp_min(1))[:, None].cpu().numpy()
    w_in, _, _ = _reduce(got.patterns["intact"][heads], sel, allowed, real)
    w_out, _, _ = _reduce(got.patterns["no_key_prior"][heads], sel, allowed, real)
    keys = np.nonzero(mask[0])[0]
    out = []
    for i, h in enumerate(heads):
        v = kp[i, 0, keys]
        order = np.argsort(-v, kind="stable")[:top_k]
        out.append(pd.DataFrame(dict(
            layer=got.layer, head=h, rank=np.arange(1, len(order) + 1), key_pos=keys[order], key_prior=v[order],
            key_prior_centered=v[order] - v.mean(), weight_intact=w_in[i, 0, keys[order]],
            weight_no_key_prior=w_out[i, 0, keys[order]], u_norm=float(u_norm[h]))))
    return pd.concat(out, ignore_index=True)


def _checked_query(model: InterpBridge, query: Any, n_pos: int, n_layers: int, n_heads: int) -> tuple[str, Any]:
    """``_resolve_query`` with the table's size bounded: the default for text falls back from every query row
    to the last one (with a warning) on a long prompt; an explicit choice over the bound is refused."""
    label, rows = _resolve_query(model, query, n_pos)
    size = n_layers * n_heads * len(CONDITIONS) * (1 if rows is None else len(rows)) * n_pos
    if size <= MAX_PATTERN_ROWS:
        return label, rows
    if query is None and model.interp.modality == "text":
        warnings.warn(f"{n_pos} tokens: every query row would make {size:,} pattern rows; showing the last token's "
                      "row (pass query='all' with layers=/heads= for the full patterns)", UserWarning, stacklevel=3)
        return _resolve_query(model, "last", n_pos)
    raise InputError(f"query={label!r} on {n_layers} layer(s) x {n_heads} head(s) x {n_pos} positions would make "
                     f"{size:,} pattern rows (at most {MAX_PATTERN_ROWS:,}): choose layers= and heads=, or one query "
                     "row (query='cls', 'last', 'mean' or a position)")


def _labelled(frame: pd.DataFrame, positions: pd.DataFrame, prefix: str = "key_") -> pd.DataFrame:
    cols = positions.set_index("pos")[["label", "kind", "row", "col"]].add_prefix(prefix)
    return frame.join(cols, on="key_pos")


@public
def single_input(model: InterpBridge, input: Any, *, layers: Any = None, heads: Any = None, query: Any = None,
                 top_k: Optional[int] = 10, float64: bool = False) -> SingleInput:
    """One image or prompt, looked at closely: each head's pattern intact and with b_q, b_k, b_v or the key
    prior removed, and the keys the key prior u = W_k b_q favours (the conditions: module doc).

    ``input``: a prompt (str) or token ids for a language model; an image (a path, PIL image, [H, W, 3]
    array, or [3, H, W] pixel values, normalised like the model's) for a ViT; a Batch / dict of one.
    ``layers``/``heads``: None (all), an index or a list (as every analyzer takes them). ``query``: which query
    rows the patterns table holds: a position, "cls", "first", "last", "all" (every row: query x key), or "mean" (A_ij
    averaged over real query rows i); default "cls" for a ViT with a class token, "mean" for one
    without, "all" for text. ``float64``: run a float64 copy (``clone_model``) for exact comparisons.

    Returns a ``SingleInput``: ``patterns`` (model, layer, head, condition, query, query_pos, key_pos,
    key_label, key_kind, key_row, key_col, weight, delta = weight - intact weight; attended pairs only),
    ``heads`` (layer, head, condition, removed_norm, present, max_abs_diff, kl (mean KL(A || A') over
    query rows, nats), output_change_rms (RMS over queries of ||(z' - z) W_O[h]||), note), ``key_prior``
    (layer, head, rank, key_pos, label, kind, row, col, key_prior, key_prior_centered, weight_intact,
    weight_no_key_prior, u_norm = ||W_k b_q||; ``top_k`` per head, None: every key), ``positions``,
    ``image`` (the ViT's input, normalisation undone) and ``meta``. Every table carries the model
    fingerprint. The model runs in eval mode without gradients; its own mode is restored.
    """
    info = require_bridge(model, "single_input").interp
    layers, heads = check_layers(layers, info), check_heads(heads, info)
    top_k = None if top_k is None else check_count("top_k", top_k)
    if not isinstance(float64, bool):
        raise InputError(f"float64 must be True or False; got {float64!r}")
    batch = _single_input_batch(model, input)
    positions = _positions_table(model, batch)
    label, rows = _checked_query(model, query, len(positions), len(layers), len(heads))
    run = _float64_copy(model) if float64 else model
    with evaluating(run):
        checked = check_batch(run, batch)  # once, on the host: the forwards below skip their own checks
        store = _intact_store(run, checked, layers)
        # each layer's float64 conditions (~22 MB on a 257-position ViT) become its rows before the next is made
        per_layer = [_layer_tables(run, _layer_conditions(run, checked, store, lay), heads, rows, label, top_k)
                     for lay in layers]
    return _assemble(run, model, batch, positions, per_layer, layers, heads, label)


def _float64_copy(model: InterpBridge) -> InterpBridge:
    if next(model.parameters()).dtype == torch.float64:
        return model
    return clone_model(model, dtype=torch.float64)


@dataclass
class _LayerTables:
    """One layer's rows of the three tables, and its notes (what is kept of a ``_Layer``)."""

    patterns: pd.DataFrame
    heads: list[dict]
    key_prior: Optional[pd.DataFrame]
    notes: list[str]


def _layer_tables(run: InterpBridge, got: _Layer, heads: list[int], rows: Optional[list[int]], label: str,
                  top_k: Optional[int]) -> _LayerTables:
    """The rows of ``got``'s layer in the patterns, heads and key-prior tables."""
    key_prior = None if got.key_prior is None else _key_prior_frame(
        got, heads, rows, _removed_norms(run, got.layer)[0]["no_key_prior"], top_k)
    return _LayerTables(_pattern_frame(got, heads, rows, label), _head_rows(run, got, heads), key_prior, got.notes)


def _assemble(run: InterpBridge, model: InterpBridge, batch: Batch, positions: pd.DataFrame,
              per_layer: list[_LayerTables], layers: list[int], heads: list[int], label: str) -> SingleInput:
    """The tables of ``single_input`` from every layer's rows, labelled and fingerprinted."""
    info = model.interp
    patterns = pd.concat([t.patterns for t in per_layer], ignore_index=True)
    head_rows = pd.DataFrame([r for t in per_layer for r in t.heads])
    kp_frames = [t.key_prior for t in per_layer if t.key_prior is not None]
    key_prior = pd.concat(kp_frames, ignore_index=True) if kp_frames else pd.DataFrame(
        columns=["layer", "head", "rank", "key_pos", "key_prior", "key_prior_centered", "weight_intact",
                 "weight_no_key_prior", "u_norm"])
    notes = list(dict.fromkeys(n for t in per_layer for n in t.notes))
    if not kp_frames:
        notes.append(f"key prior not computed for {info.spec.label}: {info.spec.score_refusal}")
    fp = model_fingerprint(model)
    meta = dict(model=info.name, model_fingerprint=fp, data_fingerprint=data_fingerprint([batch]),
                modality=info.modality, query=label, layers=list(layers), heads=list(heads),
                n_positions=len(positions), n_prefix_tokens=info.n_prefix_tokens, patch_size=info.patch_size,
                grid=_grid(positions), positions=info.positions, k_bias_inert=info.spec.k_bias_inert,
                dtype=str(next(run.parameters()).dtype).removeprefix("torch."), notes=notes)
    patterns = _labelled(patterns, positions)
    patterns["condition"] = pd.Categorical(patterns["condition"], categories=CONDITIONS)
    key_prior = _labelled(key_prior, positions, "")
    frames = [f.assign(model=info.name, model_fingerprint=fp) for f in (patterns, head_rows, key_prior)]
    return SingleInput(*frames, positions.assign(model=info.name, model_fingerprint=fp), input_image(model, batch),
                       meta)


def _grid(positions: pd.DataFrame) -> Optional[tuple[int, int]]:
    patches = positions[positions.kind == "patch"]
    return None if patches.empty else (int(patches.row.max()) + 1, int(patches.col.max()) + 1)
