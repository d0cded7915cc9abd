"""Patching biases out at inference time, weights untouched: ``ablate_bias``.

For a target (layer l, head h, kind c) the hook on ``blocks.{l}.attn.hook_{c}`` edits the
activation a = XW + b of that head:

* ``method="zero"``: a' = a - b = XW (the head's origin falls back to E[X]W).
* ``method="mean"``: a' = a - b + E[XW], i.e. the learned bias b is replaced by the
  data-induced origin E[XW] (the content mean from ``record_qkv`` on the same data): the
  head keeps an offset of the size and direction its data induces, but loses the learned
  part b - E[XW]. Requires ``stats`` (recorded if not given).
* ``method="fold"`` (v only): a' = a - b_v and sum_h b_v[h] W_O[h] is added to the
  attention output; exact, so its delta is rounding only.

``estimate="exact"`` runs one patched forward per variant. ``estimate="attribution"``
estimates every variant to first order from one forward and one backward per batch:
delta ~ sum over positions of (a' - a) . dL/da (attribution patching).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from interp.analysis.origin import kv_group
from interp.bias import attention_weights
from interp.data import Batch, iter_batches, model_inputs
from interp.errors import InputError
from interp.io import write_table
from interp.record import QKVStats, check_batch, record_qkv

Target = tuple[int, int, str]  # (layer, head, kind)
DISTANCE_METRICS = ("embedding_cosine", "feature_cosine")
TASK_METRICS = ("next_token_ce", "cross_entropy")


@dataclass(frozen=True)
class Variant:
    """One ablation: a set of (layer, head, kind) patched together."""

    targets: tuple[Target, ...]
    label: tuple  # (layer, head, kind) with -1 for "all" in a coordinate

    def key(self, method: str, estimate: str, metric: str) -> str:
        return json.dumps([list(self.label), method, estimate, metric])


def _heads(info: Any, kind: str) -> int:
    return info.n_heads if kind == "q" else info.n_kv_heads


def make_variants(model: Any, kinds: Sequence[str], scope: Union[str, Iterable[Target]]) -> list[Variant]:
    """Variants for ``scope``: "head" (each head alone), "layer", "all", or explicit targets."""
    info = model.interp
    for k in kinds:
        if k not in ("q", "k", "v"):
            raise InputError(f"kinds must be among q, k, v; got {k!r}")
    if isinstance(scope, str):
        if scope == "head":
            return [Variant(((l, h, k),), (l, h, k)) for k in kinds for l in range(info.n_layers)
                    for h in range(_heads(info, k))]
        if scope == "layer":
            return [Variant(tuple((l, h, k) for h in range(_heads(info, k))), (l, -1, k))
                    for k in kinds for l in range(info.n_layers)]
        if scope == "all":
            return [Variant(tuple((l, h, k) for l in range(info.n_layers) for h in range(_heads(info, k))),
                            (-1, -1, k)) for k in kinds]
        raise InputError(f"scope must be 'head', 'layer', 'all' or a list of (layer, head, kind); got {scope!r}")
    targets = tuple((int(l), int(h), str(k)) for l, h, k in scope)
    for l, h, k in targets:
        if not 0 <= l < info.n_layers or k not in ("q", "k", "v") or not 0 <= h < _heads(info, k):
            raise InputError(f"target {(l, h, k)} out of range for {info.name}")
    return [Variant(targets, (-2, -2, "+".join(sorted({k for _, _, k in targets}))))]


def bias_patch_hooks(
    model: Any, targets: Sequence[Target], method: str = "zero", stats: Optional[QKVStats] = None
) -> list[tuple[str, Callable]]:
    """Forward hooks that patch the biases of ``targets`` out (see module doc for methods)."""
    info = model.interp
    if method not in ("zero", "mean", "fold"):
        raise InputError(f"method must be 'zero', 'mean' or 'fold'; got {method!r}")
    if method == "fold" and any(k != "v" for _, _, k in targets):
        raise InputError("method='fold' applies to v only (b_v folds exactly into b_O)")
    if method == "mean" and stats is None:
        raise InputError("method='mean' needs stats from record_qkv (the content means)")
    by_site: dict[tuple[int, str], list[int]] = {}
    for l, h, k in targets:
        by_site.setdefault((l, k), []).append(h)
    hooks: list[tuple[str, Callable]] = []
    weights = {l: attention_weights(model, l) for l in {l for l, _ in by_site}}
    for (l, k), heads in by_site.items():
        w = weights[l]
        shift = -w.bias(k).clone()  # [head, d_head]
        if method == "mean":
            shift = shift + stats.mean(l, k, "content").to(shift.device, shift.dtype)
        delta = torch.zeros_like(shift)
        idx = torch.tensor(sorted(set(heads)))
        delta[idx] = shift[idx]

        def edit(t: Tensor, hook: Any, delta: Tensor = delta) -> Tensor:
            return t + delta.to(t.device, t.dtype)

        hooks.append((f"blocks.{l}.attn.hook_{k}", edit))
        if method == "fold":
            group = kv_group(info.n_heads, info.n_kv_heads)
            query_heads = [qh for qh in range(info.n_heads) if group[qh] in set(heads)]
            b_v = w.b_v[[group[qh] for qh in query_heads]]
            fold = torch.einsum("hd,hdm->m", b_v, w.W_o[query_heads])

            def add(t: Tensor, hook: Any, fold: Tensor = fold) -> Tensor:
                return t + fold.to(t.device, t.dtype)

            hooks.append((f"blocks.{l}.attn.o.hook_out", add))
    return hooks


def stacked_patch_hooks(
    model: Any, groups: Sequence[Sequence[Target]], method: str = "zero", stats: Optional[QKVStats] = None
) -> list[tuple[str, Callable]]:
    """Hooks for ``len(groups)`` variants stacked on the batch axis (variant-major).

    Rows ``v*B:(v+1)*B`` of every activation get variant v's patch, so one forward on a
    batch repeated V times equals V separate patched forwards.
    """
    n = len(groups)
    per_variant = [bias_patch_hooks(model, g, method, stats) for g in groups]
    sites: dict[str, list[Optional[Callable]]] = {}
    for v, hooks in enumerate(per_variant):
        for name, fn in hooks:
            sites.setdefault(name, [None] * n)[v] = fn
    out = []
    for name, fns in sites.items():
        def edit(t: Tensor, hook: Any, fns: list = fns) -> Tensor:
            chunks = list(t.chunk(n, dim=0))
            return torch.cat([c if f is None else f(c, hook) for c, f in zip(chunks, fns)], dim=0)
        out.append((name, edit))
    return out


def _repeat_batch(batch: Batch, n: int) -> Batch:
    rep = lambda t: None if t is None else t.repeat(n, *([1] * (t.ndim - 1)))  # noqa: E731
    return Batch(rep(batch.inputs), rep(batch.attention_mask), rep(batch.labels))


# ----- metrics ----------------------------------------------------------------------------

def auto_metric(model: Any, batch: Batch) -> str:
    info = model.interp
    if info.kind == "decoder":
        return "next_token_ce"
    if info.kind == "encoder":
        return "embedding_cosine"
    if "unembed" in model.adapter.component_mapping and batch.labels is not None:
        return "cross_entropy"
    return "feature_cosine"


def _sentence_embedding(hidden: Tensor, mask: Optional[Tensor]) -> Tensor:
    if mask is None:
        return hidden.mean(1)
    m = mask[..., None].to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def _metric_value(name: str, model: Any, out: Tensor, hidden: Optional[Tensor], base: dict, batch: Batch) -> Tensor:
    if name == "next_token_ce":
        ids = batch.inputs.to(out.device)
        logp = out[:, :-1].float().log_softmax(-1)
        nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
        if batch.attention_mask is not None:
            keep = batch.attention_mask[:, 1:].to(out.device).float()
            return (nll * keep).sum() / keep.sum().clamp(min=1)
        return nll.mean()
    if name == "cross_entropy":
        return F.cross_entropy(out.float(), batch.labels.to(out.device))
    if name == "embedding_cosine":
        emb = _sentence_embedding(hidden, batch.attention_mask.to(out.device) if batch.attention_mask is not None else None)
        return F.cosine_similarity(emb.float(), base["embedding"].float(), dim=-1).mean()
    if name == "feature_cosine":
        feats = out[:, 0] if out.ndim == 3 else out
        return F.cosine_similarity(feats.float(), base["features"].float(), dim=-1).mean()
    raise InputError(f"unknown metric {name!r}")


def _kl(base_out: Tensor, out: Tensor, batch: Batch, model: Any) -> float:
    if model.interp.kind not in ("decoder",) and not (out.ndim == 2 and "unembed" in model.adapter.component_mapping):
        return float("nan")
    p = base_out.float().log_softmax(-1)
    q = out.float().log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1)
    if batch.attention_mask is not None and kl.ndim == 2:
        m = batch.attention_mask.to(kl.device).float()
        return float((kl * m).sum() / m.sum().clamp(min=1))
    return float(kl.mean())


def _forward(model: Any, batch: Batch, hooks: list, need_hidden: bool) -> tuple[Tensor, Optional[Tensor]]:
    x, kw = model_inputs(model, batch)
    store: dict[str, Tensor] = {}
    last = f"blocks.{model.interp.n_layers - 1}.hook_out"
    all_hooks = list(hooks)
    if need_hidden:
        def grab(t: Tensor, hook: Any) -> None:
            store["hidden"] = t
        all_hooks.append((last, grab))
    out = model.run_with_hooks(x, fwd_hooks=all_hooks, **kw)
    out = out if isinstance(out, Tensor) else out[0]
    return out, store.get("hidden")


# ----- resumable table --------------------------------------------------------------------

class ResultLog:
    """Append-only JSONL of finished variants; a torn last line (killed mid-write) is dropped."""

    def __init__(self, path: Optional[Path]):
        self.path = path
        self.rows: dict[str, dict] = {}
        if path is not None and path.exists():
            good = []
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # torn write from a killed run
                self.rows[row["_key"]] = row
                good.append(line)
            path.write_text("".join(l + "\n" for l in good))

    def add(self, row: dict) -> None:
        self.rows[row["_key"]] = row
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


# ----- the sweep --------------------------------------------------------------------------

def ablate_bias(
    model: Any,
    data: Any,
    kinds: Sequence[str] = ("q", "k", "v"),
    scope: Union[str, Iterable[Target]] = "head",
    method: str = "zero",
    metric: Union[str, Callable] = "auto",
    estimate: str = "exact",
    *,
    stats: Optional[QKVStats] = None,
    out: Optional[Union[str, Path]] = None,
    max_batches: Optional[int] = None,
    stack: int = 8,
    progress: bool = True,
) -> pd.DataFrame:
    """Patch biases out and measure the metric; one row per variant.

    Columns: layer, head, kind (-1 = all heads/layers of that kind; -2 = a custom set),
    method, estimate, metric, baseline, ablated, delta (= ablated - baseline), kl (exact
    runs on models with logits; NaN otherwise). ``metric`` is "auto", one of
    next_token_ce, cross_entropy, embedding_cosine, feature_cosine, or a callable
    ``f(output, batch) -> scalar tensor``. With ``out`` (a folder), each finished variant
    is appended to ``out/ablation.jsonl`` at once; a rerun skips finished variants.
    ``stack`` exact variants run together in one forward, stacked on the batch axis
    (lower it when memory is short; 1 runs one forward per variant).
    """
    info = model.interp
    if estimate not in ("exact", "attribution"):
        raise InputError(f"estimate must be 'exact' or 'attribution'; got {estimate!r}")
    batches = list(iter_batches(model, data, max_batches))
    for b in batches:
        check_batch(b, info)
    metric_name = metric if isinstance(metric, str) else getattr(metric, "__name__", "custom")
    if metric == "auto":
        metric_name = auto_metric(model, batches[0])
    elif isinstance(metric, str) and metric not in DISTANCE_METRICS + TASK_METRICS:
        raise InputError(f"unknown metric {metric!r}; choose from {DISTANCE_METRICS + TASK_METRICS} or pass a callable")
    if metric_name == "cross_entropy" and any(b.labels is None for b in batches):
        raise InputError("metric 'cross_entropy' needs labels in every batch (e.g. the 'digits' dataset)")
    if estimate == "attribution" and metric_name in DISTANCE_METRICS:
        raise InputError(
            f"estimate='attribution' cannot estimate the distance metric {metric_name!r}: its gradient "
            "at the intact model is zero, so a first-order estimate is meaningless; use a task metric "
            "(next_token_ce, cross_entropy, a logit difference) or estimate='exact'"
        )
    if method == "mean" and stats is None:
        stats = record_qkv(model, batches, progress=False)
    variants = make_variants(model, kinds, scope)
    log = ResultLog(Path(out) / "ablation.jsonl" if out is not None else None)
    need_hidden = metric_name == "embedding_cosine"

    def value(o: Tensor, hidden: Optional[Tensor], base: dict, batch: Batch) -> Tensor:
        if callable(metric) and not isinstance(metric, str):
            return metric(o, batch)
        return _metric_value(metric_name, model, o, hidden, base, batch)

    # baseline (and the intact outputs distance metrics compare against)
    bases, base_vals, weights = [], [], []
    with torch.no_grad():
        for batch in batches:
            o, hidden = _forward(model, batch, [], need_hidden)
            ref = {"output": o}
            if need_hidden:
                ref["embedding"] = _sentence_embedding(hidden, None if batch.attention_mask is None else batch.attention_mask.to(o.device))
            ref["features"] = o[:, 0] if o.ndim == 3 else o
            bases.append(ref)
            base_vals.append(float(value(o, hidden, ref, batch)))
            weights.append(float(batch.inputs.shape[0]))
    total_w = sum(weights)
    baseline = sum(v * w for v, w in zip(base_vals, weights)) / total_w

    todo = [v for v in variants if v.key(method, estimate, metric_name) not in log.rows]
    if estimate == "exact":
        stack = max(1, int(stack))
        groups = [todo[i : i + stack] for i in range(0, len(todo), stack)]
        bar = tqdm(total=len(todo), desc=f"ablate {method} (exact)", disable=not progress, unit="variant")
        with torch.no_grad():
            for group in groups:
                n = len(group)
                hooks = stacked_patch_hooks(model, [v.targets for v in group], method, stats)
                vals = [[] for _ in group]
                kls = [[] for _ in group]
                for batch, ref in zip(batches, bases):
                    o, hidden = _forward(model, _repeat_batch(batch, n), hooks, need_hidden)
                    for i, (oc, hc) in enumerate(zip(o.chunk(n), hidden.chunk(n) if hidden is not None else [None] * n)):
                        vals[i].append(float(value(oc, hc, ref, batch)))
                        kls[i].append(_kl(ref["output"], oc, batch, model))
                for var, vv, kk in zip(group, vals, kls):
                    ablated = sum(v * w for v, w in zip(vv, weights)) / total_w
                    kl = sum(k * w for k, w in zip(kk, weights)) / total_w
                    log.add(_row(var, method, estimate, metric_name, baseline, ablated, kl,
                                 method_key=var.key(method, estimate, metric_name)))
                bar.update(n)
        bar.close()
    elif todo:
        deltas = _attribution(model, batches, weights, todo, method, stats, value, bases, need_hidden)
        for var, d in zip(todo, deltas):
            log.add(_row(var, method, estimate, metric_name, baseline, baseline + d, float("nan"),
                         method_key=var.key(method, estimate, metric_name)))
    keys = [v.key(method, estimate, metric_name) for v in variants]
    df = pd.DataFrame([{k: v for k, v in log.rows[key].items() if k != "_key"} for key in keys])
    if out is not None:
        write_table(df, Path(out) / f"ablation_{method}_{estimate}")
    return df


def _row(var: Variant, method: str, estimate: str, metric: str, baseline: float, ablated: float,
         kl: float, method_key: str) -> dict:
    l, h, k = var.label
    return dict(_key=method_key, layer=l, head=h, kind=k, method=method, estimate=estimate, metric=metric,
                baseline=baseline, ablated=ablated, delta=ablated - baseline, kl=kl, n_targets=len(var.targets))


def _attribution(model, batches, weights, variants, method, stats, value, bases, need_hidden) -> list[float]:
    """First-order deltas: sum over batches/positions of (a' - a) . dL/da, weighted like exact."""
    info = model.interp
    sites = sorted({(l, k) for v in variants for l, _, k in v.targets})
    shift = {}
    for l, k in sites:
        w = attention_weights(model, l)
        s = -w.bias(k).clone()
        if method == "mean":
            s = s + stats.mean(l, k, "content").to(s.device, s.dtype)
        if method == "fold":
            s = torch.zeros_like(s)  # exact identity: no first-order change
        shift[(l, k)] = s
    # per site, per head: accumulated (shift . grad) over positions, weighted by batch share
    contrib = {site: torch.zeros(shift[site].shape[0], dtype=torch.float64) for site in sites}
    total_w = sum(weights)
    for batch, ref, wgt in zip(batches, bases, weights):
        acts: dict[tuple[int, str], Tensor] = {}

        def keep(site):
            def fn(t: Tensor, hook: Any) -> Tensor:
                # return a fresh leaf-like node so the bridge computes *from* it and its
                # gradient is populated (a discarded view would get none)
                t = t.clone()
                t.retain_grad()
                acts[site] = t
                return t
            return fn

        hooks = [(f"blocks.{l}.attn.hook_{k}", keep((l, k))) for l, k in sites]
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            o, hidden = _forward(model, batch, hooks, need_hidden)
            loss = value(o, hidden, ref, batch)
            loss.backward()
        for site, a in acts.items():
            g = a.grad  # [b, p, head, d]
            if g is None:
                continue
            mask = batch.attention_mask
            if mask is not None and info.modality == "text":
                g = g * mask.to(g.device)[..., None, None].to(g.dtype)
            per_head = torch.einsum("bphd,hd->h", g.double(), shift[site].double().to(g.device))
            contrib[site] += per_head.cpu() * (wgt / total_w)
    model.zero_grad(set_to_none=True)
    return [float(sum(contrib[(l, k)][h] for l, h, k in v.targets)) for v in variants]
