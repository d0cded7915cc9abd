"""The biases a model makes for itself: attention sinks, the value bias they imply, massive activations.

Position classes (``interp.analysis.sink_parts.position_classes``): text ``first``, ``cls``,
``sep``, ``bos``; vision ``cls``, ``distillation``, ``register_0``..; both ``top_content`` (each
sequence's and head's most-attended other real token). Classes may overlap (``first`` is usually
also ``cls`` or ``bos``), so the masses of one head need not add up to 1.

Weighting: every mean is over real query rows (padded queries and padded keys never count), each
row once whatever batch it came in, so the same sequences give the same numbers in one padded
batch, in several, or one at a time. With A the head's pattern and R the set of real query rows
over the whole data, R_c = R without the class's own positions (the query row at a sink position is
left out: under a causal mask the first position's row can attend only to itself, mass 1 by
construction) and K_i the keys row i may attend (causal mask, padding, sliding window):

    mass(c)        = (1/|R_c|) sum_{i in R_c} sum_{j in S_c(i)} A_ij        (sink_profile)
    uniform_mass(c) = (1/|R_c|) sum_{i in R_c} |S_c(i) & K_i| / |K_i|        (its floor: uniform attention)
    c_i            = sum_{j in S} A_ij v_j W_O[h]                           (implicit_value_bias)
    implicit_norm  = ||m||,  m = (1/|R|) sum_{i in R} c_i
    constancy      = ||m||^2 / ((1/|R|) sum_{i in R} ||c_i||^2)              (1: c_i is one constant)
    explicit_norm  = ||b_v W_O[h]||,  output_rms = sqrt((1/|R|) sum_{i in R} ||z_i W_O[h]||^2)

b_v adds exactly b_v W_O to every row because each row of A sums to 1; a sink set S adds c_i,
which is a bias exactly when A_iS and v_S are constant (docs/mathematics.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.analysis.scores import _key_mask, _require_bilinear_scores, head_chunks, score_terms
from interp.analysis.sink_parts import (
    AbsHistogram,
    ClassMasks,
    Consumer,
    RunningTopK,
    add_sums,
    check_positive,
    check_top_k,
    column_sums,
    patterns_of,
    provenance,
    rows_or_fail,
    sink_weights,
    stable_topk,
    check_positions,
    check_threshold,
    class_masks,
    SINK_THRESHOLD,
    default_sink_positions,
    prefix_names,
    stream_batches,
)
from interp.record.capture import run_until_kept
from interp.checks import as_real, check_heads, check_layers
from interp.data import Batch, to_device
from interp.errors import InputError, UnsupportedModelError, public
from interp.record.heads import attention_weights, kv_group
from interp.record.hooks import block_hook, hook_name
from interp.models.bridge import InterpBridge, require_bridge
from interp.record.patching import bias_patch_hooks

REMOVALS = {None: (), "key_prior": ("key_prior", "b_q"), "b_q": ("b_q",)}
MASS_METRIC = "mean attention mass over real query rows, the class's own rows left out"


def _check_remove(model: InterpBridge, remove: Any) -> tuple[str, ...]:
    if not isinstance(remove, (str, type(None))) or remove not in REMOVALS:
        raise InputError(f"remove must be None, 'key_prior' or 'b_q'; got {remove!r}")
    info = model.interp
    if "key_prior" in REMOVALS[remove]:
        _require_bilinear_scores(info)
        if info.spec.extra_score_term:
            raise UnsupportedModelError(
                f"remove='key_prior' needs the whole score from hook_q/hook_k, but {info.name} adds "
                f"{info.spec.extra_score_term} to it; remove='b_q' (b_q zeroed through hooks) works on this model")
    return REMOVALS[remove]



# ----- reducing in the hooks ---------------------------------------------------------------------------


def _over_heads(pattern: Tensor, sums: Callable[[slice], dict[str, Tensor]]) -> dict[str, Tensor]:
    """``sums(heads)`` over chunks of ``pattern``'s heads (``head_chunks``: at most ``CHUNK_ELEMENTS`` entries of
    [batch, head, query, key] at a time), each sum's per-head rows concatenated: a float64 copy of one layer's
    pattern is never formed for all heads at once."""
    b, n_heads, q, k = pattern.shape
    parts = [sums(heads) for heads in head_chunks(n_heads, b * q * k)]
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}


class _BatchClasses:
    """The sink passes' reduction inside the forward, one layer at a time: per batch, ``hooks(batch)`` keeps the
    activations named (each layer's dropped once its pattern hook has run) and calls ``reduce(batch, t, layer,
    store)`` in each selected layer's ``point`` hook; ``classes`` gives the batch's real tokens and class masks
    (built at the first pattern, its real query rows counted into acc["rows"]); ``finish_batch`` refuses a
    forward whose patterns never fired (a fused attention kernel) and returns them."""

    def __init__(self, model: InterpBridge, layers: Sequence[int], acc: dict) -> None:
        self.model, self.layers, self.acc = model, list(layers), acc
        self.real: Any = None
        self.masks: Any = None
        self.done: set[int] = set()

    def hooks(self, reduce: Callable[[Batch, Tensor, int, dict], None], point: str,
              kept: Sequence[str]) -> Callable[[Batch], list]:
        def make(batch: Batch) -> list:
            self.real, self.masks, self.done = None, None, set()
            store: dict[str, Tensor] = {}

            def keep(name: str) -> Callable[[Tensor, Any], None]:
                def fn(t: Tensor, hook: Any) -> None:
                    store[name] = t.detach()
                return fn

            def at(t: Tensor, hook: Any) -> None:
                layer = int(hook.name.split(".")[1])
                reduce(batch, t.detach(), layer, store)
                self.done.add(layer)
                for name in [n for n in store if n.startswith(block_hook(layer, ""))]:
                    del store[name]

            return [(n, keep(n)) for n in kept] + [(hook_name(layer, point), at) for layer in self.layers]
        return make

    def classes(self, batch: Batch, n_pos: int, device: Any) -> tuple[Tensor, ClassMasks]:
        if self.real is None:
            self.real, self.masks = class_masks(self.model, batch, n_pos, device)
            self.acc["rows"] = self.acc.get("rows", 0) + self.real.sum()
        return self.real, self.masks

    def finish_batch(self) -> tuple[Tensor, ClassMasks]:
        missing = [layer for layer in self.layers if layer not in self.done]
        if missing:
            patterns_of(self.model, {}, missing)  # raises: the fused kernel's message
        return self.real, self.masks


# ----- sink profile -------------------------------------------------------------------------------------


def scores_without_key_prior(model: InterpBridge, cache: Any, layer: int) -> tuple[Tensor, Tensor]:
    """(score s, score with the key-prior term removed s - b_q.c_k / sqrt(d)) [batch head q k], float64,
    from a cache holding ``layer``'s hook_q/hook_k (and hook_cos/hook_sin under rotary); the terms are
    ``score_terms``' (rotary and grouped-query attention handled there)."""
    keys = [hook_name(layer, n) for n in ("q", "k", "cos", "sin")]
    cache64 = {k: cache[k].double() for k in keys if k in cache}
    terms = score_terms(model, cache64, layer)
    full = terms["content"] + terms["query_const"] + terms["key_prior"] + terms["const"]
    return full, full - terms["key_prior"]


def _pattern_without_key_prior(model: InterpBridge, store: dict, layer: int, batch: Batch) -> Tensor:
    _, scores = scores_without_key_prior(model, store, layer)
    allowed = _key_mask(model, batch, scores.shape[-1], scores.device)
    return scores.masked_fill(~allowed, torch.finfo(torch.float64).min).softmax(-1)


def _pattern_without_b_q(model: InterpBridge, batch: Batch, layer: int) -> Tensor:
    """``layer``'s pattern in a forward with that layer's b_q zeroed (``bias_patch_hooks``), stopped after it."""
    name = hook_name(layer, "pattern")
    hooks = bias_patch_hooks(model, [(layer, h, "q") for h in range(model.interp.n_heads)], "zero")
    return run_until_kept(model, batch, [name], hooks)[name]  # ends at the pattern: ViT/BERT blocks too


def _class_sums(pattern: Tensor, real: Tensor, masks: ClassMasks, names: Sequence[str],
                allowed: Optional[Tensor] = None) -> dict[tuple[str, str], Tensor]:
    """Per class c and head, over the real query rows outside the class's own positions (R_c, module
    doc): ``(c, "mass")`` = sum_i sum_{j in S_c} A_ij, ``(c, "rows")`` = |R_c|, and with ``allowed``
    [batch, 1, query, key] (the keys each row may attend) ``(c, "uniform")`` = sum_i |S_c & K_i| / |K_i|.
    The own rows' part is taken off the column sums: sum_j w_j (col_j - sum_{i in S_c} A_ij)."""
    a, r = pattern.double(), real.double()
    col = column_sums(a, real)
    per_row = None
    if allowed is not None:
        keys = allowed[:, 0].double()
        per_row = keys / keys.sum(-1, keepdim=True).clamp_min(1)  # uniform attention of each row [b, q, k]
    out = {}
    for name in names:
        w = sink_weights(col, real, masks, [name])  # [b, h, k], 0/1 on real keys only
        own = w * r[:, None, :]  # the class's own query rows
        own_col = torch.einsum("bhq,bhqk->bhk", own, a)
        keep = r[:, None, :] - own
        out[(name, "mass")] = (w * (col - own_col)).sum((0, 2))
        out[(name, "rows")] = keep.sum((0, 2))
        if per_row is not None:
            out[(name, "uniform")] = torch.einsum("bhq,bqk,bhk->h", keep, per_row, w)
    return out


@public
def sink_profile(model: InterpBridge, data: Any, *, threshold: float = SINK_THRESHOLD,
                 layers: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None,
                 positions: Any = None, max_batches: Optional[int] = None,
                 remove: Optional[str] = None, progress: bool = True) -> pd.DataFrame:
    """Per layer x head x position class: the attention mass the class receives (module doc).

    ``mass`` = (1/|R_c|) sum_{i in R_c} sum_{j in S_c} A_ij over the real query rows R_c of all the
    data other than the class's own: the query row at a sink position itself is dropped from the
    average (for the first position under a causal mask that row has mass 1 by construction);
    ``n_query_rows`` = |R_c| (per head: top_content's position differs by head). ``uniform_mass`` =
    (1/|R_c|) sum_{i in R_c} |S_c & K_i| / |K_i|, the mass the class would get if every one of those
    rows attended uniformly over the keys K_i it may attend (causal mask, padding and sliding window
    included; for the first token of causal sequences of length n without padding, (H_n - 1)/(n - 1)
    with H_n = sum_{k<=n} 1/k); ``mass_over_uniform`` = mass - uniform_mass and ``mass_to_uniform`` =
    mass / uniform_mass (NaN where uniform_mass is 0). ``sink`` = mass > ``threshold`` (Gu et al.
    2024: ``SINK_THRESHOLD``; ``sink_counts`` shows how many heads sit near it). ``remove="key_prior"`` adds
    ``mass_without_key_prior`` (the pattern recomputed, in float64, from the scores with the term
    b_q . c_k / sqrt(d) removed exactly; refused where the four score terms do not make the
    score) and ``mass_without_b_q`` (the layer's b_q zeroed by ``bias_patch_hooks``, the layers
    below intact; one extra forward through blocks 0..l per layer l with b_q, the costly part);
    ``remove="b_q"`` adds the latter only. In a layer without b_q both equal ``mass``. A text
    sequence that does not begin with a special token (a window cut from a longer text) has a
    ``first`` token that is not ``cls``/``bos``. Columns: model, layer, head, position, mass, sink,
    uniform_mass, mass_over_uniform, mass_to_uniform, [removal columns: their own patterns, the same
    rows left out], has_b_q, threshold, metric, n_rows (all real query rows), n_query_rows, n_batches,
    max_batches, model_fingerprint, data_fingerprint.
    ``layers`` / ``heads`` (None: all): only those rows, equal to the same rows of the full table.
    """
    require_bridge(model, "sink_profile")
    part = _profile_part(model, threshold, layers, heads, positions, remove)
    return _run_parts(model, data, max_batches, [part], "sink profile", progress)[0]


def _profile_part(model: InterpBridge, threshold: Any, layers: Any, heads: Any, positions: Any, remove: Any) -> Part:
    info = model.interp
    threshold, layers, heads = check_threshold(threshold), check_layers(layers, info), check_heads(heads, info)
    names, removals = check_positions(model, positions), _check_remove(model, remove)
    has_b_q = {layer: attention_weights(model, layer).present["q"] for layer in layers}
    acc: dict = {}
    seen = _BatchClasses(model, layers, acc)

    def reduce(batch: Batch, pattern: Tensor, layer: int, store: dict) -> None:
        real, masks = seen.classes(batch, pattern.shape[-1], pattern.device)
        allowed = _key_mask(model, batch, pattern.shape[-1], pattern.device, layer)
        add_sums(acc, (layer, "mass"),
                 _over_heads(pattern, lambda hs: _class_sums(pattern[:, hs], real, masks, names, allowed)))
        if "key_prior" in removals and has_b_q[layer]:
            without = _pattern_without_key_prior(model, store, layer, batch)
            add_sums(acc, (layer, "mass_without_key_prior"),
                     _over_heads(without, lambda hs: _class_sums(without[:, hs], real, masks, names)))
            del without

    def consume(batch: Batch, store: dict) -> None:
        real, masks = seen.finish_batch()
        for layer in layers:
            if "b_q" in removals and has_b_q[layer]:
                pattern = _pattern_without_b_q(model, batch, layer)
                add_sums(acc, (layer, "mass_without_b_q"),
                         _over_heads(pattern, lambda hs: _class_sums(pattern[:, hs], real, masks, names)))

    kept = [hook_name(layer, p) for layer in layers if has_b_q[layer] for p in ("q", "k", "cos", "sin")
            if "key_prior" in removals and (p in ("q", "k") or info.rotary)]
    batch_hooks = seen.hooks(reduce, "pattern", kept)
    stop = [hook_name(max(layers), "pattern")]  # the forward ends there: nothing above it is read

    def finish(n_batches: int, data_fp: str, max_batches: Optional[int]) -> pd.DataFrame:
        columns = ["mass"] + [f"mass_without_{r}" for r in removals]
        meta = dict(threshold=threshold, metric=MASS_METRIC, **provenance(model, data_fp, n_batches, max_batches))
        return _select_heads(_profile_table(acc, layers, names, columns, has_b_q, meta, info.n_heads), heads)

    return Part(stop, consume, finish, max(layers) + 1, batch_hooks)


def _select_heads(table: pd.DataFrame, heads: list[int]) -> pd.DataFrame:
    return table[table["head"].isin(heads)].reset_index(drop=True)


def _profile_table(acc: dict, layers: Sequence[int], names: Sequence[str], columns: Sequence[str],
                   has_b_q: dict[int, bool], meta: dict, n_heads: int) -> pd.DataFrame:
    n_rows = rows_or_fail(acc.get("rows", 0))
    rows = []
    for layer in layers:
        sums = {col: acc.get((layer, col), acc[(layer, "mass")]) for col in columns}  # no b_q: nothing removed
        main = sums["mass"]
        mean = {col: {n: _per_row(s[(n, "mass")], s[(n, "rows")]) for n in names} for col, s in sums.items()}
        for h in range(n_heads):
            for name in names:
                row = dict(model=meta["model"], layer=layer, head=h, position=name)
                row.update({col: mean[col][name][h] for col in columns})
                uniform = _per_row(main[(name, "uniform")], main[(name, "rows")])[h]
                row.update(sink=row["mass"] > meta["threshold"], uniform_mass=uniform,
                           mass_over_uniform=row["mass"] - uniform,
                           mass_to_uniform=row["mass"] / uniform if uniform > 0 else float("nan"),
                           n_query_rows=int(main[(name, "rows")][h]))
                rows.append(dict(row, has_b_q=has_b_q[layer], n_rows=n_rows, **meta))
    order = ["model", "layer", "head", "position", "mass", "sink", "uniform_mass", "mass_over_uniform",
             "mass_to_uniform", *columns[1:], "has_b_q", "threshold", "metric", "n_rows", "n_query_rows",
             "n_batches", "max_batches", "model_fingerprint", "data_fingerprint"]
    return pd.DataFrame(rows)[order]


def _per_row(total: Tensor, rows: Tensor) -> list[float]:
    """total / rows per head (NaN where no row counts)."""
    rows = rows.double().cpu()
    return torch.where(rows > 0, total.double().cpu() / rows.clamp_min(1), float("nan")).tolist()


@public
def sink_shares(profile: pd.DataFrame) -> pd.DataFrame:
    """Per position class: the share of heads whose mass on it exceeds the threshold (Gu et al. 2024).

    From one ``sink_profile`` (one model, one data set, one threshold; a mix, or a (layer, head, position)
    row given twice, is refused). Columns:
    model, position, n_heads, n_sink_heads, share (= n_sink_heads / n_heads), threshold, and
    share_without_key_prior / share_without_b_q where the profile has those masses.
    """
    need = {"layer", "head", "position", "mass", "threshold", "model_fingerprint", "data_fingerprint"}
    if not isinstance(profile, pd.DataFrame) or not need <= set(profile.columns):
        raise InputError("sink_shares takes the DataFrame from interp.sink_profile (columns "
                         f"{', '.join(sorted(need))})")
    runs = profile[["model_fingerprint", "data_fingerprint", "threshold"]].drop_duplicates()
    if len(runs) != 1:
        raise InputError(f"this profile mixes {len(runs)} runs (models, data or thresholds): compute shares "
                         "for each sink_profile separately")
    key = ["model_fingerprint", "layer", "head", "position"]
    copies = profile.groupby(key, sort=False).size()
    if (copies > 1).any():
        (_, layer, head, position), n = next((k, v) for k, v in copies.items() if v > 1)
        raise InputError(f"this profile holds {int((copies > 1).sum())} (model, layer, head, position) key(s) more "
                         f"than once (e.g. layer {layer}, head {head}, {position!r}: {n} rows): each head would "
                         "count once per copy. Pass one sink_profile's rows (concatenated copies: "
                         "profile.drop_duplicates())")
    threshold = float(profile.threshold.iloc[0])
    extra = [c for c in profile.columns if c.startswith("mass_without_")]
    rows = []
    for position, part in profile.groupby("position", sort=False):
        row = dict(model=part.model.iloc[0], position=position, n_heads=len(part),
                   n_sink_heads=int((part.mass > threshold).sum()))
        row["share"] = row["n_sink_heads"] / len(part)
        row.update({"share" + c.removeprefix("mass"): float((part[c] > threshold).mean()) for c in extra})
        rows.append(dict(row, threshold=threshold, model_fingerprint=part.model_fingerprint.iloc[0],
                         data_fingerprint=part.data_fingerprint.iloc[0]))
    return pd.DataFrame(rows)


THRESHOLDS = (0.2, SINK_THRESHOLD, 0.4)
NEAR_BAND = 0.05


@public
def sink_counts(table: pd.DataFrame, *, value: str = "mass", by: Sequence[str] = ("position",),
                thresholds: Sequence[float] = THRESHOLDS, band: float = NEAR_BAND) -> pd.DataFrame:
    """How many heads sink at several thresholds, and how many sit near each: a count over a threshold
    reads as robust only when few heads are within ``band`` of it.

    ``table``: one row per head and group (``sink_profile``'s, or a training ``heads.csv``), its
    ``value`` column a mass. Per group of ``by`` and threshold t: n_heads, n_sinks = #(value > t),
    share = n_sinks / n_heads, n_near = #(|value - t| <= band), band, largest = max value (the
    largest head), and, where ``table`` has ``uniform_mass``, the group's mean uniform_mass. Long form:
    [*by, threshold, n_heads, n_sinks, share, n_near, band, largest, (uniform_mass)]. A head whose
    value is NaN (not measured) is refused.
    """
    by = [by] if isinstance(by, str) else list(by)
    if not isinstance(table, pd.DataFrame) or not {value, *by} <= set(table.columns):
        raise InputError(f"sink_counts takes a DataFrame with the columns {value!r} and {by} (e.g. "
                         "interp.sink_profile's, value='mass', by=['position'])")
    ts = [check_threshold(t, "each threshold") for t in thresholds]
    width = as_real(band)
    if width is None or not 0 <= width < 1:
        raise InputError(f"band must be a number in [0, 1) (a share of a row's attention); got {band!r}")
    if table[value].isna().any():
        raise InputError(f"{int(table[value].isna().sum())} row(s) have no {value!r}: drop them (or pick the "
                         "groups that were measured) before counting")
    rows = []
    for key, part in table.groupby(by, sort=False):
        v = part[value].to_numpy(float)
        extra = {"uniform_mass": float(part.uniform_mass.mean())} if "uniform_mass" in part else {}
        for t in ts:
            rows.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), threshold=t, n_heads=len(v),
                             n_sinks=int((v > t).sum()), share=float((v > t).mean()),
                             n_near=int((abs(v - t) <= width).sum()), band=width, largest=float(v.max()), **extra))
    return pd.DataFrame(rows)


# ----- implicit value bias ------------------------------------------------------------------------------


def _quadratic(x: Float[Tensor, "batch head_index query_pos d_head"], gram: Tensor, w: Tensor) -> Tensor:
    """sum over rows of w_i x_i G x_i^T per head: the summed ||x_i W_O||^2 through G = W_O W_O^T."""
    return ((torch.einsum("bhqd,hde->bhqe", x, gram) * x).sum(-1) * w[:, None, :]).sum((0, 2))


def _sink_sums(pattern: Tensor, v: Tensor, real: Tensor, masks: ClassMasks, names: Sequence[str],
               gram: Float[Tensor, "head_index d_head d_head"]) -> dict[str, Tensor]:
    """Sums over real query rows of u_i, ||c_i||^2 and A_iS, per head (of ``pattern``'s heads; ``v`` and
    ``gram`` are those heads'); the sink set S is the classes ``names``.

    c_i = u_i W_O with u_i = sum_{j in S} A_ij v_j, so sum_i c_i = (sum_i u_i) W_O and
    ||c_i||^2 = u_i G u_i^T: nothing of width d_model is formed per row. ||z_i W_O||^2 is summed in the
    z hook (``_quadratic``)."""
    sink = sink_weights(column_sums(pattern, real), real, masks, names)
    a = pattern.double() * sink[:, :, None, :]  # attention on the sink set only
    w = real.double()
    u = torch.einsum("bhqk,bkhd->bhqd", a, v.double())
    return dict(u=torch.einsum("bhqd,bq->hd", u, w), c_sq=_quadratic(u, gram, w),
                mass=torch.einsum("bhqk,bq->h", a, w))


@public
def implicit_value_bias(model: InterpBridge, data: Any, *, positions: Any = None,
                        layers: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None,
                        max_batches: Optional[int] = None, progress: bool = True) -> pd.DataFrame:
    """Per layer x head: the constant a sink set S adds to the head's output, beside b_v's.

    c_i = sum_{j in S} A_ij v_j W_O[h] (v_j = x_j W_v + b_v of the query head's kv head);
    ``implicit_norm`` = ||m||, m = mean of c_i over real query rows; ``constancy`` =
    ||m||^2 / mean ||c_i||^2 in [0, 1] (1: c_i is the same vector for every row, a bias);
    ``explicit_norm`` = ||b_v W_O[h]|| (0 without b_v); ``cos_to_explicit`` = cos(m, b_v W_O[h]);
    ``output_rms`` = sqrt(mean ||z_i W_O[h]||^2), the head's whole output; ``sink_mass`` = mean
    A_iS. All norms are in residual-stream units. S = ``positions`` (default: a ViT's prefix
    tokens, a language model's first token). Columns: model, layer, head, positions, sink_mass,
    implicit_norm, constancy, explicit_norm, has_b_v, cos_to_explicit, output_rms, n_rows,
    n_batches, max_batches, model_fingerprint, data_fingerprint. ``layers`` / ``heads`` (None: all): only
    those rows, equal to the same rows of the full table.
    """
    info = require_bridge(model, "implicit_value_bias").interp
    layers, heads = check_layers(layers, info), check_heads(heads, info)
    sink_names = check_positions(model, default_sink_positions(model) if positions is None else positions)
    group = kv_group(info.n_heads, info.n_kv_heads)
    grams = {layer: _output_gram(model, layer) for layer in layers}  # W_O W_O^T per head
    acc: dict = {}
    seen = _BatchClasses(model, layers, acc)

    def at_pattern(batch: Batch, pattern: Tensor, layer: int, store: dict) -> None:
        real, masks = seen.classes(batch, pattern.shape[-1], pattern.device)
        v, gram = store.pop(hook_name(layer, "v"))[:, :, group], grams[layer].to(pattern.device)
        add_sums(acc, layer, _over_heads(
            pattern, lambda hs: _sink_sums(pattern[:, hs], v[:, :, hs], real, masks, sink_names, gram[hs])))

    def hooks(batch: Batch) -> list:
        def at_z(z: Tensor, hook: Any) -> None:  # before or after the pattern hook, by family (ViT: before)
            layer = int(hook.name.split(".")[1])
            real, _ = seen.classes(batch, z.shape[1], z.device)
            add_sums(acc, layer, {"o_sq": _quadratic(z.detach().double().transpose(1, 2), grams[layer].to(z.device),
                                                     real.double())})

        return seen.hooks(at_pattern, "pattern", [hook_name(layer, "v") for layer in layers])(batch) + [
            (hook_name(layer, "z"), at_z) for layer in layers]

    def consume(batch: Batch, store: dict) -> None:
        seen.finish_batch()

    stop = [hook_name(max(layers), n) for n in ("pattern", "z")]  # the forward ends there: nothing above is read
    n_batches, data_fp = stream_batches(model, data, max_batches, stop, consume, desc="implicit value bias",
                                        progress=progress, stop_at_layer=max(layers) + 1, hooks=hooks)
    meta = dict(positions="+".join(sink_names), **provenance(model, data_fp, n_batches, max_batches))
    weights = lambda layer: attention_weights(model, layer, dtype=torch.float64)  # noqa: E731
    return _select_heads(_implicit_table(acc, weights, group, layers, meta), heads)


def _output_gram(model: InterpBridge, layer: int) -> Float[Tensor, "head_index d_head d_head"]:
    """W_O W_O^T per head in float64: what the forward's reductions read of a layer's weights (a float64 copy of
    every layer's W_Q, W_K, W_V and W_O held through the forward would be 4 d_model^2 x 8 bytes a layer: 226 MB at
    the 112M shape, 11 GB at 7B)."""
    w_o = attention_weights(model, layer, dtype=torch.float64).W_O
    return w_o @ w_o.transpose(1, 2)


def _implicit_table(acc: dict, weights: Callable[[int], Any], group: list[int], layers: Sequence[int],
                    meta: dict) -> pd.DataFrame:
    """The table from the forward's sums; ``weights(layer)`` gives a layer's float64 weights, one layer at a time."""
    n_rows = rows_or_fail(acc.get("rows", 0))
    rows = []
    for layer in layers:
        s = {k: v.cpu() / n_rows for k, v in acc[layer].items()}
        w = weights(layer)
        explicit = torch.einsum("hd,hdm->hm", w.b_V[group], w.W_O)  # b_v W_O per query head
        for h in range(len(group)):
            m, e = s["u"][h] @ w.W_O[h], explicit[h]
            mean_sq, m_norm, e_norm = float(s["c_sq"][h]), float(m.norm()), float(e.norm())
            rows.append(dict(
                model=meta["model"], layer=layer, head=h, positions=meta["positions"], sink_mass=float(s["mass"][h]),
                implicit_norm=m_norm, constancy=m_norm**2 / mean_sq if mean_sq > 0 else float("nan"),
                explicit_norm=e_norm if w.present["v"] else 0.0, has_b_v=w.present["v"],
                cos_to_explicit=float(m @ e) / (m_norm * e_norm) if m_norm * e_norm > 0 and w.present["v"]
                else float("nan"),
                output_rms=math.sqrt(float(s["o_sq"][h])), n_rows=n_rows,
                **{k: meta[k] for k in ("n_batches", "max_batches", "model_fingerprint", "data_fingerprint")}))
    return pd.DataFrame(rows)


# ----- massive activations ------------------------------------------------------------------------------

#: The residual point a layer index names (docs/DESIGN.md, "one residual convention"): ``post``, the stream
#: after block l (``blocks.{l}.hook_resid_post``; HF's ``hidden_states[l + 1]``), the default of
#: ``massive_activations`` and ``high_norm_tokens``; or ``pre``, the stream entering block l
#: (``blocks.{l}.hook_resid_pre``; ``hidden_states[l]``, the embeddings for l = 0). Post of l is pre of l + 1.
RESID_POINTS = ("post", "pre")


def check_resid_point(point: Any) -> str:
    """``point`` if it is ``"post"`` or ``"pre"``; otherwise one InputError that says what each means."""
    if not isinstance(point, str) or point not in RESID_POINTS:
        raise InputError(f"point must be 'post' (layer l is the residual stream after block l, {resid_hook(0, 'post')} "
                         f"for l = 0) or 'pre' (the stream entering block l, {resid_hook(0, 'pre')}); got {point!r}")
    return point


def resid_hook(layer: int, point: str) -> str:
    """``blocks.{layer}.hook_resid_{point}``: the residual point read, and the ``hook`` column of the tables."""
    return block_hook(layer, f"hook_resid_{point}")



def _top_entries(absval: Float[Tensor, "batch pos d_model"], real: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(token, channel) of the ``k`` largest |values| of real tokens, ties in data order, largest first.

    Two stages, exact: an entry among the k largest has at most k - 1 tokens ranked above its own token
    by (largest |value|, data order), so the k tokens ranked highest hold them all; only their rows are
    searched (k x d_model values instead of batch x pos x d_model)."""
    token_max = absval.amax(-1).masked_fill(~real, float("-inf")).flatten()
    tokens = stable_topk(token_max, k).sort().values  # in data order: candidates stay in data order
    rows = absval.flatten(0, 1)[tokens].masked_fill(~real.flatten()[tokens][:, None], float("-inf"))
    best = stable_topk(rows.flatten(), k)
    d = absval.shape[-1]
    return tokens[best // d], best % d


class _LayerActivations:
    """One layer's running statistics of |residual value|s and token norms."""

    def __init__(self, top_k: int, device: Any) -> None:
        self.top, self.norm_top = RunningTopK(top_k), RunningTopK(1)
        self.values, self.norms = AbsHistogram(device), AbsHistogram(device)
        self.norm_sum: Any = 0

    def add(self, h: Float[Tensor, "batch pos d_model"], real: Tensor, payload: Tensor) -> None:
        """``payload`` [batch, pos, 3]: sequence index, position among real tokens, token id."""
        absval = h.abs()
        self.values.add(absval.flatten(), real[..., None].expand_as(h).flatten())
        tok, channel = _top_entries(absval, real, self.top.k)
        self.top.add(absval.flatten(0, 1)[tok, channel], h.flatten(0, 1)[tok, channel],
                     torch.cat([payload.flatten(0, 1)[tok], channel[:, None]], 1))
        norms = h.double().norm(dim=-1)
        self.norms.add(norms.flatten(), real.flatten())
        self.norm_sum = self.norm_sum + (norms * real).sum()
        score = norms.masked_fill(~real, float("-inf")).flatten()
        best = stable_topk(score, 1)
        self.norm_top.add(score[best], score[best], payload.flatten(0, 1)[best])


def _token_label(model: InterpBridge, position: int, token_id: int) -> Optional[str]:
    """The token's string (tokenizer), a ViT prefix token's class, ``patch k``; None for bare token ids."""
    if model.interp.modality == "vision":
        prefix = prefix_names(model)
        return prefix[position] if position < len(prefix) else f"patch {position - len(prefix)}"
    tok = model.tokenizer
    return None if tok is None else str(tok.convert_ids_to_tokens(int(token_id)))


@public
def massive_activations(model: InterpBridge, data: Any, *, layers: Optional[Sequence[int]] = None, top_k: int = 3,
                        abs_threshold: float = 100.0, ratio_threshold: float = 1000.0, point: str = "post",
                        max_batches: Optional[int] = None, progress: bool = True) -> pd.DataFrame:
    """Per layer: the ``top_k`` largest |values| of the residual stream and Sun et al.'s flag.

    ``layer`` l is the residual stream after block l with ``point="post"`` (the default, as in
    ``high_norm_tokens``; for a post-LN model such as BERT, after the block's output layer norm) or
    entering block l with ``point="pre"`` (l = 0: the embeddings); the ``hook`` column names it
    (``blocks.{l}.hook_resid_post`` / ``hook_resid_pre``, ``RESID_POINTS``). Over real tokens (padding left out) and
    every channel: the entries with the largest |h_ic|, with ``value`` (signed), ``sequence``
    (index in the data), ``position`` (among the sequence's real tokens), ``token``, ``channel``;
    ``median_abs`` = lower median of |h_ic| (from a histogram of float32 bit patterns, within a
    relative 2^-11 of the exact value: ``interp.analysis.streaming``), ``ratio_to_median`` =
    |value| / median_abs, ``massive`` = |value| > ``abs_threshold`` and ratio > ``ratio_threshold``
    (Sun et al. 2024: 100 and 1000). Equal values (the same token at the same position of many
    sequences, e.g. BOS) are ranked in data order. Token norms ||h_i||: ``norm_mean`` (exact), ``norm_median``
    (histogram, as above), ``norm_max`` with its ``norm_max_sequence`` / ``norm_max_position``.
    """
    require_bridge(model, "massive_activations")
    part = _massive_part(model, layers, top_k, abs_threshold, ratio_threshold, point)
    return _run_parts(model, data, max_batches, [part], "massive activations", progress)[0]


def _massive_part(model: InterpBridge, layers: Any, top_k: Any, abs_threshold: Any, ratio_threshold: Any,
                  point: Any = "post") -> Part:
    info = model.interp
    layers, top_k, point = check_layers(layers, info), check_top_k(top_k), check_resid_point(point)
    hooks = {layer: resid_hook(layer, point) for layer in layers}
    abs_threshold = check_positive(abs_threshold, "abs_threshold")
    ratio_threshold = check_positive(ratio_threshold, "ratio_threshold")
    acc: dict = {"sequences": 0}

    def consume(batch: Batch, store: dict) -> None:
        h0 = store[hooks[layers[0]]]
        real, _ = class_masks(model, batch, h0.shape[1], h0.device)
        ids = batch.inputs if info.modality == "text" else torch.full(real.shape, -1)
        seq = torch.arange(real.shape[0], device=h0.device)[:, None].expand_as(real) + acc["sequences"]
        payload = torch.stack([seq, real.long().cumsum(1) - 1, to_device(ids, h0.device).long()], -1)
        acc["rows"] = acc.get("rows", 0) + real.sum()
        acc["sequences"] += real.shape[0]
        for layer in layers:
            acc.setdefault(layer, _LayerActivations(top_k, h0.device)).add(store[hooks[layer]], real, payload)

    def finish(n_batches: int, data_fp: str, max_batches: Optional[int]) -> pd.DataFrame:
        meta = dict(abs_threshold=abs_threshold, ratio_threshold=ratio_threshold,
                    **provenance(model, data_fp, n_batches, max_batches))
        return _massive_table(model, acc, hooks, meta)

    return Part(list(hooks.values()), consume, finish, max(layers) + 1)


@public
def sink_pass(model: InterpBridge, data: Any, *, threshold: float = SINK_THRESHOLD, positions: Any = None,
              remove: Optional[str] = None, top_k: int = 3, abs_threshold: float = 100.0,
              ratio_threshold: float = 1000.0, max_batches: Optional[int] = None,
              progress: bool = True) -> dict[str, pd.DataFrame]:
    """``{"profile": sink_profile(...), "massive": massive_activations(...)}`` from one forward per batch:
    the same tables as the two calls (every layer), at about the cost of one of them."""
    require_bridge(model, "sink_pass")
    parts = [_profile_part(model, threshold, None, None, positions, remove),
             _massive_part(model, None, top_k, abs_threshold, ratio_threshold)]
    profile, massive = _run_parts(model, data, max_batches, parts, "sinks and massive activations", progress)
    return {"profile": profile, "massive": massive}


@dataclass
class Part:
    """One analyzer's share of a streaming pass: the activations it reads, what it does with each batch,
    how it makes its table, and how many blocks it needs."""

    hooks: list[str]
    consume: Consumer
    finish: Callable[[int, str, Optional[int]], pd.DataFrame]
    blocks: int
    batch_hooks: Optional[Callable[[Batch], list]] = None  # hooks that reduce as the forward passes


def _run_parts(model: InterpBridge, data: Any, max_batches: Optional[int], parts: Sequence[Part], desc: str,
              progress: bool) -> list[pd.DataFrame]:
    """One forward per batch serving every part (``stream_batches``); each part's table."""
    def consume(batch: Batch, store: dict) -> None:
        for part in parts:
            part.consume(batch, store)

    def batch_hooks(batch: Batch) -> list:
        return [hook for part in parts if part.batch_hooks is not None for hook in part.batch_hooks(batch)]

    hooks = list(dict.fromkeys(name for part in parts for name in part.hooks))
    n_batches, data_fp = stream_batches(model, data, max_batches, hooks, consume, desc=desc, progress=progress,
                                        stop_at_layer=max(part.blocks for part in parts), hooks=batch_hooks)
    return [part.finish(n_batches, data_fp, max_batches) for part in parts]


def _massive_table(model: InterpBridge, acc: dict, hooks: dict[int, str], meta: dict) -> pd.DataFrame:
    n_rows = rows_or_fail(acc.get("rows", 0))
    rows = []
    for layer, hook in hooks.items():
        stats: _LayerActivations = acc[layer]
        median, norm_median = stats.values.lower_median(), stats.norms.lower_median()
        (norm_max, _, (norm_seq, norm_pos, _)), = stats.norm_top.rows()
        per_layer = dict(median_abs=median, n_tokens=n_rows, norm_mean=float(stats.norm_sum) / n_rows,
                         norm_median=norm_median, norm_max=norm_max, norm_max_sequence=norm_seq,
                         norm_max_position=norm_pos, norm_max_ratio=norm_max / norm_median if norm_median else math.inf)
        for rank, (magnitude, value, (seq, pos, token_id, channel)) in enumerate(stats.top.rows(), start=1):
            ratio = magnitude / median if median > 0 else math.inf
            rows.append(dict(
                layer=layer, hook=hook, rank=rank, value=value, abs_value=magnitude, ratio_to_median=ratio,
                massive=magnitude > meta["abs_threshold"] and ratio > meta["ratio_threshold"], sequence=seq,
                position=pos, token_id=token_id if token_id >= 0 else None,
                token=_token_label(model, pos, token_id), channel=channel, **per_layer, **meta))
    first = ["model", "layer", "hook", "rank", "value", "abs_value", "ratio_to_median", "massive", "sequence",
             "position", "token_id", "token", "channel", "median_abs"]
    return pd.DataFrame(rows)[first + [c for c in rows[0] if c not in first]]
