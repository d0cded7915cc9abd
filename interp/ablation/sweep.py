"""``ablate_bias``: patch biases out per head, layer or set, and measure the model's task.

Estimates (the ``estimate`` column):

* ``exact``: one patched forward per variant, ``stack`` variants at a time on the batch
  axis; a variant patched from layer l replays the intact layers 0..l-1 (``interp.record.capture.replay_blocks``)
  instead of recomputing them. Streamed: per round of variants and per batch, the intact
  forward is rerun for that batch's block outputs and intact log-probabilities, which every patched forward of
  the round reads and which are dropped before the next batch; a causal LM's next-token metric and KL are taken
  from the final hidden states a chunk of real positions at a time (``interp.ablation.logits``), never from every
  stacked variant's full logits.
* ``attribution``: first order in the patched activation, one forward and backward per batch.
* ``atp`` (AtP*): the patched head's pattern recomputed exactly for q and k, linear after it
  (``interp.ablation.attribution``). Task metrics only (a distance metric's gradient is 0).
* ``atp_distance``: a second-order estimate of a distance metric from random projections
  through AtP* (``interp.ablation.distance``).
* ``auto`` (a request, not a row label): ``atp`` (or ``atp_distance``, or ``attribution``
  where the family refuses score recomputation) for every variant, then ``exact`` for the
  ``top_k`` per kind that it ranks highest (``exact_because`` "top") and for ``sample_k`` per kind
  drawn at random by ``seed`` among the rest ("sample"): rows of both, to compare, on heads whose
  choice does not depend on the estimate too. An ``exact`` request's rows say "requested".

Matched control (exact rows; ``n_control`` draws, default 19): every exact bias variant is run again with each
targeted head's displacement s_h = a' - a replaced by a random direction of the same norm ||s_h||
(``interp.ablation.control``; draw d fixed by ``seed`` and d alone). With c_1, c_2, ... the
control deltas in draw order, the draws are taken in stages (``control_stages``: ``control_stop``, twice that, ...
up to ``n_control``) and a head stops at the first n at which ``control_stop`` (default 5) of c_1..c_n have
|c_d| >= |delta|: it is inside its band, and its p is Besag and Clifford's (1991) sequential Monte Carlo p,
control_stop / n. A head that reads all ``n_control`` draws gets, by ``control_p``:

* ``"normal"`` (default): the tail of a normal fitted to its draws, P(|X| >= |delta|) with X the Student-t
  prediction of one more draw (``normal_tail_p``: mean m, standard deviation s, X = m + s sqrt(1 + 1/n) T_{n-1}).
  p is no longer floored at 1 / (n_control + 1), so a head far outside its band can pass a correction across
  many heads at the cost of the old 19 draws. This is a stated model of the control's tail, not a Monte Carlo
  bound: exact for normal draws, and measured on untrained models, where every head is null
  (``benchmarks/control_calibration.py``, the mathematics page); ``control_p_empirical`` beside it is
  the Monte Carlo p of the same draws, (1 + #{d: |c_d| >= |delta|}) / (n + 1).
* ``"sequential"``: the Monte Carlo p alone (stopped: control_stop / n; else (1 + #{d: |c_d| >= |delta|}) /
  (n_control + 1)), valid without a model of the tail (P(p <= u) <= u when delta is exchangeable with the draws),
  with ``n_control=199`` so that p can fall to 1 / 200: heads near or beyond their band draw all 199 (about 9
  times the forwards of the default on the trained zoo models, whose tested heads are mostly beyond it).

The rule reads only the draws up to its stop, fixed by the seed, so a row does not depend on stacking, rounds or
batching (draws run past the stop within a stage are not read). ``n_control`` = the draws read;
``control_lo`` / ``control_hi`` = their min / max; ``outside_control`` = delta outside that band; ``delta_z`` =
(delta - mean c) / sd c, the effect in units of the control's spread (what the normal tail reads).
``control_stop=0``: every head draws ``n_control``.

Many heads, one error rate: ``control_p_adjusted`` is the Benjamini-Hochberg adjusted p across the rows of the
table that were tested against their control (``adjust_controls``: every exact bias row with a forward, of one call,
or of the merged table in ``merge_shards``), and ``bias_dependent`` = control_p_adjusted <= 0.05: the false
discovery rate over the heads called is controlled at 5% (for independent or positively dependent tests), not the
family-wise error. The head's own bias direction matters, beyond how far the method moves it. Cost: an exact
variant is 1 + (draws run) patched forwards (stacked, on the same replayed prefix), ``control_forwards``: at most
1 + ``n_control``. Implicit kinds (sink_v, massive) have no control (NaN); identity rows have controls of exactly 0
by the same identity (control_p 1, not counted in the family). Estimated rows carry none (bias_dependent missing,
not False). ``displacement_norm`` = sqrt(sum_h ||s_h||^2) on every bias row.
What it matches: the displacement's norm, not its effect on the activation's norm. Where the bias dominates
the activation (``origin_shift``'s shift_ratio well above 1), zeroing shrinks ||a|| while a random displacement of
the same norm grows it on average, so a call there says "removing this offset matters" more than "this direction
matters" (a random-init model with biases far above its content can be called: notebook 04).

Methods and what they displace: zero moves a by ||b_h||; mean by ||E[XW]_h - b_h||; layer_mean by
||mean_h' b_h' - b_h||; random (b replaced by a random vector r of its norm) by ||r_h - b_h||, about
sqrt(2) ||b_h||, so ``method="random"`` is not a matched control of zeroing: the control columns are.

Which heads "auto" runs exactly does not depend on the method: the ``top_k`` per kind by the one-pass estimate
of *zeroing* (computed too when ``method`` is another), and ``sample_k`` drawn by ``seed`` among the rest.

Uncertainty: ``delta_lo`` / ``delta_hi`` (exact rows) are the 95% percentile bootstrap over items
(``n_boot`` resamples fixed by ``seed``, ``interp.bootstrap``) of the same ratio of per-item sums as the
delta, so independent of the batching; over batches for a callable metric that returns one scalar per
batch. ``n_boot``, ``n_control``, ``control_stop``, ``control_p`` and ``seed`` are in the fingerprint.

Variants the mathematics answers (b_k under positions that cancel it, absent biases under every method, a
displacement a' - a of exactly 0, b_v folded) are written without a forward, with the reason in ``identity``.
With ``out``, each finished variant is appended to ``out/ablation.jsonl`` at once; a rerun skips finished
variants; the table is written as ``out/ablation.csv`` / ``.parquet`` (one name: a later call into ``out`` replaces it).
"""

from __future__ import annotations

import dataclasses
import json
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

import interp.ablation.metrics as metrics
from interp.ablation.attribution import EstimateInputs, atp_star_deltas, attribution_deltas
from interp.ablation.control import (adjust_controls, control_columns, control_patch_hooks, control_stages,
                                     displacement_norm, used_draws)
from interp.ablation.distance import distance_deltas
from interp.ablation.implicit import (ImplicitSites, check_implicit, explicit_targets, is_implicit, prepare_sites,
                                      stacked_implicit_hooks, variant_key)
from interp.ablation.log import ResultLog
from interp.ablation.memory import WAITING_SHARE, auto_stack, estimate_checkpoint, estimate_items
from interp.ablation.options import OPTION_NAMES, SweepOptions, sweep_options
from interp.ablation.logits import (IntactLogits, Unembedding, head_matches, intact_logits, linear_unembedding,
                                   patched_items, patched_stack, patched_stacks, tiled_item_sums)
from interp.record.hooks import block_hook
from interp.record.capture import HostCopy, off_heap, record_block_outputs, replay_blocks, tensors
from interp.ablation.variants import Variant, make_variants
from interp._version import __version__
from interp.bootstrap import Resampler, item_keys
from interp.checks import check_frames, check_not_blank
from interp.data import Batch, batch_to_device, iter_batches
from interp.errors import InputError, public
from interp.record.fingerprint import callable_identity, data_fingerprint, hooks_identity, model_fingerprint
from interp.record.heads import bias_present
from interp.io import write_table
from interp.models.bridge import InterpBridge, require_bridge
from interp.record.patching import Target, check_patch, patch_hooks, stack_hooks
from interp.record.recording import record_qkv
from interp.record.stats import QKVStats
from interp.types import Estimate, Method

COLUMNS = ["layer", "head", "kind", "scope", "method", "estimate", "metric", "baseline", "ablated", "delta",
           "delta_se", "delta_lo", "delta_hi", "displacement_norm", "control_lo", "control_hi", "delta_z", "control_p",
           "control_p_empirical", "control_p_adjusted", "n_control", "outside_control", "bias_dependent", "kl",
           "n_targets", "identity", "exact_because", "below_rounding", "model_fingerprint", "data_fingerprint",
           "options"]
ROUND_JOBS = 160  # patched forwards per batch in one round of the exact stage (whole variants; module doc)
NUMERIC = {"baseline": float, "ablated": float, "delta": float, "delta_se": float, "delta_lo": float,
           "delta_hi": float, "displacement_norm": float, "control_lo": float, "control_hi": float,
           "delta_z": float, "control_p": float, "control_p_empirical": float, "control_p_adjusted": float,
           "n_control": int, "outside_control": "boolean", "bias_dependent": "boolean", "kl": float, "n_targets": int,
           "below_rounding": bool}


@dataclass
class _Run:
    """What every variant of one sweep shares: the data, the metric and the intact run."""

    model: InterpBridge
    batches: list[Batch]
    metric: metrics.Metric
    metric_name: str
    need_hidden: bool
    refs: list[dict]
    rounding: float  # |delta| below this is within the model dtype's rounding of the baseline (0 for >= float32)
    weights: list[float]  # per batch: the units its metric value averages over (tokens or items)
    baseline: float
    kl_weights: list[float] = field(default_factory=list)  # per batch: the units its KL averages over
    fingerprint: dict = field(default_factory=dict)
    split_head: bool = False  # next-token metrics from final hidden states, chunked (interp.ablation.logits)
    unembedding: Optional[Unembedding] = None  # the split head's unembedding as one linear map (vocabulary tiles)
    base_sums: Optional[Tensor] = None  # the intact metric's per-item sums, all batches in order
    weights_per_item: list[float] = field(default_factory=list)  # and each item's count (tokens or 1)
    implicit: Optional[ImplicitSites] = None  # what sink_v / massive variants patch (interp.ablation.implicit)
    resampler: Optional[Resampler] = None  # bootstrap resamples of the items (delta_lo / delta_hi)

    def options(self, var: Variant) -> str:
        """The ``options`` column of ``var``'s row: what its value depends on besides the model, the data and the
        variant (the log's fingerprint without them and the rank; a sink_v row's positions, a massive row's
        thresholds), as sorted JSON, so that ``merge_shards`` can refuse frames run under other options."""
        bound = {k: v for k, v in self.fingerprint.items() if k not in ("model", "model_name", "data", "shard")}
        kinds = {kind for _, _, kind in var.targets}
        if "sink_v" in kinds:
            bound["positions"] = self.implicit.positions
        if "massive" in kinds:
            bound.update(abs_threshold=self.implicit.abs_threshold, ratio_threshold=self.implicit.ratio_threshold)
        return json.dumps(bound, sort_keys=True, default=str)

    def items(self, out: Tensor, hidden: Optional[Tensor], ref: dict, batch: Batch) -> tuple[Tensor, Tensor]:
        """(per-item sums, per-item counts) of the metric on one batch's output."""
        if callable(self.metric) and not isinstance(self.metric, str):
            return metrics.custom_items(metrics.call_metric(self.metric, out, batch), batch)
        return metrics.metric_items(self.metric_name, out, hidden, ref, batch)

    def value(self, out: Tensor, hidden: Optional[Tensor], ref: dict, batch: Batch) -> Tensor:
        """The metric's mean over the batch's units: what the one-pass estimates differentiate."""
        sums, counts = self.items(out, hidden, ref, batch)
        return sums.sum() / counts.sum().clamp(min=1)

    def mean(self, values: Sequence[float], weights: Optional[Sequence[float]] = None) -> float:
        """The unit-weighted mean over batches of per-batch means (each token or item counts once)."""
        weights = self.weights if weights is None else weights
        return sum(v * w for v, w in zip(values, weights)) / sum(weights)

    def ablated_and_se(self, sums: Tensor) -> tuple[float, float, float, float]:
        """(metric, standard error of its delta, delta_lo, delta_hi) from an ablated run's per-item sums.

        The delta is a ratio of sums over items, sum_i d_i / sum_i n_i with d_i the item's change
        and n_i its count; its standard error is the linearised one over items (clusters):
        sqrt(N / (N - 1) * sum_i (d_i - delta n_i)^2) / sum_i n_i (NaN with one item). delta_lo /
        delta_hi: the 95% percentile bootstrap over items of the same ratio (``interp.bootstrap``)."""
        counts = torch.tensor(self.weights_per_item, dtype=sums.dtype, device=sums.device)
        total, d = counts.sum(), sums - self.base_sums.to(sums.dtype)
        delta = d.sum() / total
        n = d.shape[0]
        se = ((n / (n - 1) * ((d - delta * counts) ** 2).sum()) ** 0.5 / total) if n > 1 else float("nan")
        lo, hi = self.resampler.ratio_interval(d.cpu().numpy(), counts.cpu().numpy())
        return float(sums.sum() / total), float(se), float(lo), float(hi)


def _check_estimate(estimate: str, name: str) -> None:
    """Refuse an estimate that cannot estimate the metric ``name``."""
    if estimate in ("attribution", "atp") and name in metrics.DISTANCE_METRICS:
        raise InputError(
            f"estimate={estimate!r} cannot estimate the distance metric {name!r}: its gradient "
            "at the intact model is zero, so a first-order estimate is meaningless; use a task metric "
            "(next_token_ce, cross_entropy, a logit difference), estimate='atp_distance' (second order), "
            "'auto' or 'exact'"
        )
    if estimate == "atp_distance" and name not in metrics.DISTANCE_METRICS:
        raise InputError(f"estimate='atp_distance' is for the distance metrics {', '.join(metrics.DISTANCE_METRICS)}; "
                         f"{name!r} is not one: use estimate='atp' (or 'auto')")


def _run_intact(run: _Run) -> None:
    """The intact forward of every batch: references and baseline. The references keep what the one-pass
    estimates and distance metrics compare against (features, embeddings), never a batch's full output: the exact
    stage recomputes the intact run per batch as it streams (``_exact``). Once the first batch has shown that the
    final norm and a linear unembedding give the logits (``linear_unembedding``), next_token_ce's later batches
    stop after the last block: no batch's full-vocabulary logits are formed beside its intact distribution."""
    values = []
    next_token = run.metric_name == "next_token_ce" and not run.need_hidden
    with torch.no_grad():
        for batch in run.batches:
            if next_token and run.unembedding is not None:
                hidden, _ = metrics.run_forward(run.model, batch, [], True)
                values.append(_tiled_baseline(run, hidden, batch))
                run.refs.append({})  # nothing to compare against: the metric reads the intact distribution
            else:
                values.append(_intact_outputs(run, batch, next_token))
            run.kl_weights.append(metrics.kl_weight(run.model, batch))
    sums, counts = (torch.cat([v[i].detach() for v in values]) for i in (0, 1))
    run.base_sums, run.weights_per_item = sums, counts.tolist()
    run.weights = [float(v[1].sum()) for v in values]
    run.baseline = float(sums.sum() / counts.sum())
    if not math.isfinite(run.baseline):
        raise InputError(_non_finite_baseline(run, sums, counts))
    run.rounding = _rounding_level(run.model, run.baseline)


def _non_finite_baseline(run: _Run, sums: Tensor, counts: Tensor) -> str:
    """Why the intact metric is not finite, said as its likely cause: no counted unit, a callable metric, or the
    model's own output."""
    said = (f"the metric {run.metric_name!r} is {run.baseline} on the intact model, before any ablation, so every "
            "delta would be too")
    if float(counts.sum()) == 0:
        return (f"{said}: no unit is counted (next_token_ce counts a position whose token and next token are both "
                "real; these attention masks leave none): pass items with at least two real tokens")
    bad = [i for i, s in enumerate(sums.tolist()) if not math.isfinite(s)]
    items = f"item{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad[:5]))}{' ...' if len(bad) > 5 else ''}"
    if callable(run.metric) and not isinstance(run.metric, str):
        return f"{said} (at {items} of the data, in order): a callable metric must return finite values"
    return (f"{said}: the model's own output is not finite at {items} of the data (in order). A half-precision "
            "model may overflow (load it in float32); with padding, HF's eager attention can leave NaN at a padded "
            "query whose every key is masked (measured: a float64 Qwen2 whose sliding window is shorter than the "
            "padding), and the next layer carries it to every position of the item: pad less than the window, "
            "load the model in float32, or pass unpadded items")


def _intact_outputs(run: _Run, batch: Batch, next_token: bool) -> tuple[Tensor, Tensor]:
    """One batch's intact (per-item sums, counts) from a full forward, its reference appended to ``run.refs``;
    on the first batch of next_token_ce, whether the split head and the tiled unembedding reproduce the logits."""
    kept: dict[str, Tensor] = {}
    grab = [(block_hook(run.model.interp.n_layers - 1, "hook_out"), lambda t, hook: kept.update(h=t))]
    out, hidden = metrics.run_forward(run.model, batch, grab if next_token else [], run.need_hidden)
    if "h" in kept and not run.refs:  # once: does the final norm and unembedding alone give the logits?
        run.split_head = head_matches(run.model, kept["h"], out)
        run.unembedding = linear_unembedding(run.model, kept["h"], out) if run.split_head else None
    ref = metrics.reference(out, hidden, batch)
    tiled = run.unembedding is not None
    value = None if tiled else run.items(out, hidden, ref, batch)
    ref.pop("output")
    ref["features"] = ref["features"].clone()  # not a view that keeps the whole output alive
    run.refs.append(ref)
    del out, hidden
    # the baseline in the patched variants' own arithmetic: a patch that changes nothing has delta 0 to rounding,
    # not the gap between two ways of computing log-softmax
    return _tiled_baseline(run, kept.pop("h"), batch) if tiled else value


def _tiled_baseline(run: _Run, hidden: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
    """(per-item NLL sums, counts) of the intact run in ``patched_stack``'s arithmetic (one unpatched variant)."""
    intact = intact_logits(run.model, hidden, batch, run.unembedding)
    return patched_stack(run.model, run.unembedding, hidden, intact, 1)[0][0], intact.counts.double()


def _rounding_level(model: InterpBridge, baseline: float) -> float:
    """eps(dtype) x |baseline| for a half-precision model (bfloat16: 2^-7 relative): a delta below it is
    dominated by the model's own rounding, and its row says so (``below_rounding``). 0 for float32/64."""
    dtype = next(model.parameters()).dtype
    return torch.finfo(dtype).eps * abs(baseline) if dtype in (torch.float16, torch.bfloat16) else 0.0


def _prepare(model: InterpBridge, data: Any, metric: metrics.Metric, opts: SweepOptions) -> _Run:
    host = list(iter_batches(model, data, opts.max_batches))  # checked on the host, as they are read
    device = next(model.parameters()).device
    batches = [batch_to_device(b, device) for b in host]  # moved once, not per variant
    name = metrics.metric_name(model, metric, batches[0])
    metrics.check_labels(model, name, host)  # on the host, once
    _check_estimate(opts.estimate, name)
    run = _Run(model, batches, metric, name, name == "embedding_cosine", [], 0.0, [], 0.0)
    _run_intact(run)
    keys = [item_keys(b) for b in host]
    units = [k for ks in keys for k in ks]
    if len(units) != len(run.base_sums):  # a callable metric that returns one scalar per batch: resample batches
        units = ["+".join(ks) for ks in keys]
    run.resampler = Resampler(units, opts.n_boot, opts.seed)
    identity = callable_identity(metric) if callable(metric) and not isinstance(metric, str) else name
    run.fingerprint = dict(model=model_fingerprint(model), model_name=model.interp.name,
                           data=data_fingerprint(host), batches=len(batches), metric=identity, interp=__version__,
                           **opts.fingerprint(name in metrics.DISTANCE_METRICS))
    hooks = hooks_identity(model)
    if hooks:  # a hook left on the model changes every number
        run.fingerprint["hooks"] = hooks
    return run


def _row(var: Variant, key: str, method: str, estimate: str, run: _Run, ablated: float, kl: float,
         identity: str = "", spread: tuple[float, float, float] = (float("nan"),) * 3,
         controls: Optional[Sequence[float]] = None, displacement: float = float("nan"),
         rule: tuple[int, str] = (0, "sequential")) -> dict:
    """One result row; ``spread`` = (delta_se, delta_lo, delta_hi) where per-item sums exist (exact rows);
    ``controls``: the matched control's deltas in draw order (exact and identity rows), read by ``rule`` =
    (control_stop, control_p) (``control_columns``)."""
    return dict(_key=key, layer=var.layer, head=var.head, kind=var.kind, scope=var.scope, method=method,
                estimate=estimate, metric=run.metric_name, baseline=run.baseline, ablated=ablated,
                delta=ablated - run.baseline, delta_se=spread[0], delta_lo=spread[1], delta_hi=spread[2],
                displacement_norm=displacement, **control_columns(ablated - run.baseline, controls, *rule), kl=kl,
                n_targets=len(var.targets), identity=identity,
                below_rounding=bool(not identity and abs(ablated - run.baseline) < run.rounding),
                model_fingerprint=run.fingerprint["model"], data_fingerprint=run.fingerprint["data"])


def _identity_reason(model: InterpBridge, var: Variant, method: Method) -> str:
    """Why ``var`` provably changes nothing, so that no forward is needed; "" when it must run.

    * every target's bias is absent (the architecture has none), whatever the method: nothing to remove or
      replace, so every method's shift a' - a is 0 (``interp.record.patching.bias_shift``; "mean" does not add E[XW]);
    * only b_k, and the registry says b_k cancels in the softmax (learned, ALiBi, relative or no
      positions; not rotary or qk-norm): every method shifts k by a per-head constant,
      which adds the same amount to every score of a query row;
    * only b_v, folded into b_O: attention rows sum to 1, so the fold is exact.
    """
    kinds = {kind for _, _, kind in var.targets}
    present = {layer: bias_present(model, layer) for layer in {layer for layer, _, _ in var.targets}}
    if not any(present[layer].get(kind, True) for layer, _, kind in var.targets):
        return "absent bias: nothing to remove"
    spec = model.interp.spec
    if kinds == {"k"} and spec.k_bias_inert:
        return f"b_k cancels in the softmax under {spec.positions} positions"  # any per-head constant shift does
    if kinds == {"v"} and method == "fold":
        return "b_v folds exactly into b_O (attention rows sum to 1)"
    return ""


def _groups(todo: list[Variant], stack: int, reuse_prefix: bool) -> list[tuple[int, list[Variant]]]:
    """(first layer to compute, variants) per stacked forward; with prefix reuse, variants that
    start at the same layer share a forward (the layers below it are replayed)."""
    stack = max(1, int(stack))
    if not reuse_prefix:
        return [(0, todo[i:i + stack]) for i in range(0, len(todo), stack)]
    by_start: dict[int, list[Variant]] = {}
    for var in todo:
        by_start.setdefault(min(layer for layer, _, _ in var.targets), []).append(var)  # its lowest patched layer
    return [(start, group[i:i + stack]) for start, group in sorted(by_start.items())
            for i in range(0, len(group), stack)]


@dataclass(frozen=True)
class _Job:
    """One patched forward of the exact stage: a variant itself (``draw`` -1) or a draw of its matched control."""

    var: Variant
    draw: int = -1

    @property
    def targets(self) -> tuple[Target, ...]:
        return self.var.targets


def _has_control(var: Variant, method: str) -> bool:
    """Bias variants get a matched control; implicit ones (no bias vector) and b_v's exact fold do not."""
    return not is_implicit(var.targets) and method != "fold"


def _job_hooks(run: _Run, group: list[_Job], stats: Optional[QKVStats], opts: SweepOptions) -> list:
    """The stacked hooks of one group of jobs (variant-major on the batch axis)."""
    per_job = []
    for job in group:
        plain = explicit_targets(job.targets)  # sink_v / massive hooks are added below
        if not plain:
            per_job.append([])
        elif job.draw < 0:
            per_job.append(patch_hooks(run.model, plain, opts.method, stats, opts.seed))
        else:
            per_job.append(control_patch_hooks(run.model, plain, opts.method, job.draw, stats, opts.seed))
    implicit = [job.targets if job.draw < 0 else () for job in group]
    return stack_hooks(per_job) + stacked_implicit_hooks(run.implicit, implicit, opts.method)


@dataclass
class _Intact:
    """One batch's intact run, recomputed per round of the exact stage and dropped after it (streamed)."""

    outputs: list[Any]  # per layer, what the block returned (prefix reuse); empty without
    logits: Optional[IntactLogits] = None  # the intact next-token distribution (split head)
    output: Optional[Tensor] = None  # the intact output, for the KL without a split head


def _intact_batch(run: _Run, index: int, record: bool, logits: bool) -> _Intact:
    """The intact forward of batch ``index``: its block outputs if ``record``, and (``logits``) what the KL from
    the intact run needs: its log-probabilities at the real positions (split head) or its output."""
    batch = run.batches[index]
    with record_block_outputs(run.model) if record else nullcontext([]) as outputs:
        if record or logits:
            out, _ = metrics.run_forward(run.model, batch, [], run.need_hidden or run.split_head)
    if not logits:
        return _Intact(outputs)
    if run.split_head:
        return _Intact(outputs, logits=intact_logits(run.model, out, batch, run.unembedding))
    return _Intact(outputs, output=out)


def _stacked_forward(run: _Run, index: int, intact: _Intact, group: list[_Job], start: int,
                     hooks: list) -> tuple[Tensor, Optional[Tensor]]:
    """The stacked patched forward of ``group`` on batch ``index`` (``metrics.run_forward``'s output and hidden
    states), the layers below ``start`` replayed from the intact run."""
    batch, n = run.batches[index], len(group)
    if run.implicit is not None:
        run.implicit.index = index  # the implicit hooks read this batch's sink and real-token masks
    replay = (replay_blocks(run.model, intact.outputs, start, n, batch.inputs.shape[0])
              if start and intact.outputs else nullcontext())
    with replay:
        return metrics.run_forward(run.model, batch.repeat(n), hooks, run.need_hidden or run.split_head)


def _group_results(run: _Run, index: int, intact: _Intact, group: list[_Job], out: Tensor,
                   hidden: Optional[Tensor]) -> list[tuple[Tensor, Optional[Tensor]]]:
    """Per job of one stacked forward on batch ``index`` without a tiled unembedding: (per-item metric sums, KL
    from the intact run; None for control draws and without logits), on the device (no host sync)."""
    batch, n = run.batches[index], len(group)
    results = []
    hiddens = hidden.chunk(n) if hidden is not None else [None] * n
    for job, o, h in zip(group, out.chunk(n), hiddens):
        kl = job.draw < 0 and not run.need_hidden  # a hidden-state metric's forward has no logits
        if run.split_head:
            results.append(patched_items(run.model, o, intact.logits, kl))
        else:
            results.append((run.items(o, h, run.refs[index], batch)[0].detach(),
                            metrics.kl_from_intact(run.model, intact.output, o, batch) if kl else None))
    return results


class _Waiting:
    """Stacked forwards of one batch whose tiled metric waits for one pass over the vocabulary
    (``logits.patched_stacks``: each tile's intact logits are recomputed once for all of them): their final hidden
    states, at most ``WAITING_SHARE`` of the intact logits' bytes (which are not held) before the pass runs.

    The states are copied into one buffer, made at the first stacked forward and refilled after each pass: a
    forward's own output stayed where the forward had made it, among the next forward's temporaries, and at
    glibc's defaults the heap grew past those kept outputs forward after forward (112m@512: by 263 MB over one
    round's ten stacked forwards, 3 MB of states)."""

    def __init__(self, run: _Run, intact: IntactLogits, n_stacks: int):
        """``n_stacks``: how many stacked forwards the round runs on this batch (the buffer holds no more)."""
        self.run, self.intact, self.n_stacks = run, intact, n_stacks
        self.limit = WAITING_SHARE * len(intact.rows) * intact.vocab * 4
        self.stacks: list[tuple[list[_Job], Tensor]] = []
        self.buffer: Optional[Tensor] = None
        self.used = 0  # elements of the buffer the waiting states fill

    def add(self, group: list[_Job], out: Tensor) -> list[tuple[list[_Job], list]]:
        """Keeps ``group``'s final hidden states; runs the pass (its groups' results) once they reach the limit."""
        self.stacks.append((group, self._keep(out)))
        if sum(o.numel() * o.element_size() for _, o in self.stacks) < self.limit:
            return []
        return self.flush()

    def _keep(self, out: Tensor) -> Tensor:
        """``out``'s values in the buffer (room for the limit and one more stack of the first one's size: ``add``
        runs the pass once the limit is reached; no more than the round's stacked forwards); a larger stack is kept
        as it is."""
        if self.buffer is None:
            per_stack = out.numel() * out.element_size()
            room = min(int(self.limit // per_stack) + 1, self.n_stacks)
            self.buffer = out.new_empty((room * out.numel(),))
        if self.used + out.numel() > self.buffer.numel() or out.dtype != self.buffer.dtype:
            return out
        kept = self.buffer[self.used:self.used + out.numel()].view(out.shape).copy_(out)
        self.used += out.numel()
        return kept

    def flush(self) -> list[tuple[list[_Job], list]]:
        """Per waiting group: its jobs' (per-item NLL sums, KL; None for control draws)."""
        if not self.stacks:
            return []
        run, stacks, self.stacks = self.run, self.stacks, []
        stacked = patched_stacks(run.model, run.unembedding, [(o, len(g)) for g, o in stacks], self.intact)
        self.used = 0  # the pass has read them: the buffer is free again
        return [(group, [(s, kl if job.draw < 0 else None) for job, (s, kl) in zip(group, results)])
                for (group, _), results in zip(stacks, stacked)]


def _rounds(jobs: list[_Job]) -> list[list[_Job]]:
    """One stage's jobs in rounds of whole variants (a variant's jobs stay together), each at least
    ``ROUND_JOBS`` jobs but the last: a round streams every batch once (one intact forward per batch and round)."""
    rounds: list[list[_Job]] = [[]]
    for job in jobs:
        if rounds[-1] and job.var != rounds[-1][-1].var and len(rounds[-1]) >= ROUND_JOBS:
            rounds.append([])
        rounds[-1].append(job)
    return [r for r in rounds if r]


def _exact(run: _Run, todo: list[Variant], keys: dict, stats: Optional[QKVStats], log: ResultLog,
           opts: SweepOptions) -> None:
    """Each variant's patched forward and its matched control's draws, stacked ``stack`` at a time, in stages
    (``control_stages``): the first runs every variant and its first draws; each later one runs the next draws of
    the variants the sequential rule has not yet decided (``used_draws``: ``control_stop`` draws as large as
    |delta|, or ``n_control`` draws). Streamed: per round of a stage's jobs (``_rounds``), per batch, the intact
    forward is rerun to record the block outputs the patched forwards replay (prefix reuse) and the intact
    log-probabilities the KL reads, every stacked forward of the round runs on that batch, and both are dropped
    before the next batch; a variant's row is logged as soon as it is decided."""
    method = opts.method
    n_max = {v: opts.n_control if _has_control(v, method) else 0 for v in todo}
    units = sum(run.weights_per_item)  # the metric's units over all batches: a control's mean is its sums over them
    bar = tqdm(total=sum(1 + n for n in n_max.values()) * len(run.batches), disable=not opts.progress,
               unit="forward", desc=f"ablate {method} (exact, with up to {opts.n_control} control draws)")
    logits = not run.need_hidden  # the KL reads the intact run's distribution (kl_from_intact says where there is one)
    stack = opts.stack if opts.stack != "auto" else min(  # the most constrained batch's
        auto_stack(run.model, b.inputs, logits, opts.reuse_prefix, backward=opts.estimate != "exact",
                   tiled=_reads_tiles(run), parts=_in_parts(run))  # parts: as the estimate ran
        for b in run.batches)
    own: dict[Variant, tuple] = {}
    controls: dict[Variant, dict[int, float]] = {v: {} for v in todo}
    active, lo = list(todo), 0
    for end in control_stages(opts.n_control, opts.control_stop) or [0]:
        jobs = [_Job(v, d) for v in active for d in ([-1] if lo == 0 else []) + list(range(lo, min(end, n_max[v])))]
        for round_jobs in _rounds(jobs):
            sums, kls = _run_round(run, round_jobs, stack, stats, logits, bar, opts)
            for job in round_jobs:  # one host sync per round
                kept = torch.cat(tensors(sums[job]))  # the job's per-item sums, back from off the heap
                if job.draw >= 0:
                    controls[job.var][job.draw] = float(kept.sum() / units) - run.baseline
                    continue
                kk = tensors(kls[job])
                kl = float("nan") if not kk or kk[0] is None else run.mean(torch.stack(kk).tolist(), run.kl_weights)
                own[job.var] = (*run.ablated_and_se(kept), kl)
        decided = []
        for var in active:
            ablated, *spread, kl = own[var]
            drawn = [controls[var][d] for d in sorted(controls[var])]
            if n_max[var] and used_draws(ablated - run.baseline, drawn, opts.control_stop, n_max[var]) is None:
                continue
            decided.append(var)
            log.add(_row(var, keys[var], method, "exact", run, ablated, kl, spread=tuple(spread),
                         controls=drawn if n_max[var] else None, displacement=_displacement(run, var, stats, opts),
                         rule=(opts.control_stop, opts.control_p)))
        active, lo = [v for v in active if v not in decided], end
        if not active:
            break
    bar.close()


def _run_round(run: _Run, jobs: list[_Job], stack: int, stats: Optional[QKVStats], logits: bool, bar: Any,
               opts: SweepOptions) -> tuple[dict, dict]:
    """Per job of one round: its per-item metric sums and KLs (one entry per batch), on the device (on the host as
    Python numbers: ``off_heap``)."""
    groups = _groups(jobs, stack, opts.reuse_prefix)
    hooks = [_job_hooks(run, group, stats, opts) for _, group in groups]
    record = opts.reuse_prefix and any(start for start, _ in groups)
    sums: dict[_Job, list[Union[Tensor, HostCopy]]] = {job: [] for job in jobs}
    kls: dict[_Job, list[Union[None, Tensor, HostCopy]]] = {job: [] for job in jobs}
    tiled = run.split_head and run.unembedding is not None  # every variant's metric from the tiled unembedding

    def collect(done: list[tuple[list[_Job], list]]) -> None:
        for group, results in done:
            for job, (s, kl) in zip(group, results):
                sums[job].append(off_heap(s))  # kept across the round's forwards: off the host's heap
                kls[job].append(kl if kl is None else off_heap(kl))
            bar.update(len(group))

    with torch.no_grad():
        for index in range(len(run.batches)):
            intact = _intact_batch(run, index, record, logits)
            waiting = _Waiting(run, intact.logits, len(groups)) if tiled else None
            for (start, group), group_hooks in zip(groups, hooks):
                out, hidden = _stacked_forward(run, index, intact, group, start, group_hooks)
                collect(waiting.add(group, out) if waiting is not None
                        else [(group, _group_results(run, index, intact, group, out, hidden))])
                del out, hidden
            if waiting is not None:
                collect(waiting.flush())
            del intact, waiting
    return sums, kls


def _displacement(run: _Run, var: Variant, stats: Optional[QKVStats], opts: SweepOptions) -> float:
    plain = explicit_targets(var.targets)
    if is_implicit(var.targets) or not plain:
        return float("nan")
    return displacement_norm(run.model, plain, opts.method, stats, opts.seed)


def _no_displacement(run: _Run, var: Variant, stats: Optional[QKVStats], opts: SweepOptions) -> str:
    """Why a bias variant needs no forward when its method moves no targeted activation: a' - a = 0 on every
    target (a present bias of zeros under zero, fold or random; layer_mean on a layer with one kv head); its
    delta is exactly 0. "" for an implicit variant or a displacement above 0."""
    if is_implicit(var.targets) or _displacement(run, var, stats, opts) != 0:
        return ""
    return "zero displacement: the method moves no activation (a' - a = 0 on every target)"


def _answer_by_identity(run: _Run, todo: list[Variant], keys: dict, estimate: str, stats: Optional[QKVStats],
                        log: ResultLog, opts: SweepOptions) -> list[Variant]:
    """Log the rows an identity answers (no forward); return the variants left to run. The identity answers the
    matched control too (a random direction of the same displacement is as inert): its draws are exactly 0."""
    method = opts.method
    reasons = {v: _identity_reason(run.model, v, method) or _no_displacement(run, v, stats, opts)
               or (run.implicit.reason(v.targets) if run.implicit else "") for v in todo}
    for var in [v for v in todo if reasons[v]]:
        controls = [0.0] * opts.n_control if _has_control(var, method) else None
        log.add(_row(var, keys[var], method, estimate, run, run.baseline, 0.0, reasons[var], controls=controls,
                     displacement=_displacement(run, var, stats, opts), rule=(opts.control_stop, opts.control_p)))
    return [v for v in todo if not reasons[v]]


def _run_estimate(run: _Run, variants: list[Variant], estimate: str, stats: Optional[QKVStats],
                  log: ResultLog, opts: SweepOptions) -> pd.DataFrame:
    """Rows of ``variants`` under one concrete estimate: resumed from the log, answered by an
    identity, or computed now (and logged at once)."""
    method = opts.method
    keys = {v: variant_key(v, method, estimate, run.metric_name, run.implicit) for v in variants}
    force = opts.force_exact
    todo = [v for v in variants if keys[v] not in log.rows or (force and log.rows[keys[v]].get("identity"))]
    todo = todo if force else _answer_by_identity(run, todo, keys, estimate, stats, log, opts)
    if estimate == "exact":
        _exact(run, todo, keys, stats, log, opts)
    elif todo:
        job = EstimateInputs(run.model, run.batches, run.weights, todo, method, stats, run.refs, run.need_hidden,
                             bias_seed=opts.seed, **_tiled_metric(run))
        if estimate == "atp_distance":
            deltas = distance_deltas(job, run.metric_name, opts.n_projections)
        else:
            deltas = (atp_star_deltas if estimate == "atp" else attribution_deltas)(job, run.value)
        for var, d in zip(todo, deltas):
            log.add(_row(var, keys[var], method, estimate, run, run.baseline + d, float("nan"),
                         displacement=_displacement(run, var, stats, opts)))
    missing = {c: False if NUMERIC.get(c) is bool else None if NUMERIC.get(c) == "boolean"
               else float("nan") if c in NUMERIC else "" for c in COLUMNS}
    df = pd.DataFrame([{c: log.rows[keys[v]].get(c, missing[c]) for c in COLUMNS}
                       for v in variants], columns=COLUMNS)
    df["options"] = [run.options(v) for v in variants]  # from this run: resumed rows match it (fingerprint, keys)
    df[["layer", "head"]] = df[["layer", "head"]].astype("Int64")
    # typed even when empty (an "auto" sweep with nothing left to run exactly), so frames concatenate as numbers
    return df.astype(NUMERIC)


def _reads_tiles(run: _Run) -> bool:
    """Whether next_token_ce reads a linear unembedding a vocabulary tile at a time (``_tiled_metric``)."""
    return run.unembedding is not None and run.metric_name == "next_token_ce"


def _in_parts(run: _Run) -> bool:
    """Whether the one-pass estimate runs in parts of items (``_tiled_metric`` gives it parts): a distance
    metric's (its projections are sums over items) and next_token_ce's through a linear unembedding."""
    return run.metric_name in metrics.DISTANCE_METRICS or _reads_tiles(run)


def _tiled_metric(run: _Run) -> dict:
    """``EstimateInputs``' item_sums, items_per_part and checkpoint where next_token_ce reads a linear unembedding
    (the one-pass estimate's backward then forms no full-vocabulary logits and runs in parts, its blocks recomputed
    where one item's would not fit: ``interp.ablation.attribution``); items_per_part and checkpoint for a distance
    metric (``interp.ablation.distance``: its projections are sums over items)."""
    if not _in_parts(run):
        return {}
    model = run.model
    checkpoint = any(estimate_checkpoint(model, b.inputs) for b in run.batches)  # one rule for every batch
    parts = dict(items_per_part=min(estimate_items(model, b.inputs, checkpoint) for b in run.batches),
                 checkpoint=checkpoint)
    if run.metric_name in metrics.DISTANCE_METRICS:  # its projections are sums over items: parts too (distance.py)
        return parts
    unembedding = run.unembedding
    return dict(item_sums=lambda hidden, batch: tiled_item_sums(model, unembedding, hidden, batch), **parts)


def _one_pass_estimate(model: InterpBridge, metric_name: str) -> str:
    """The one-pass estimate ``auto`` ranks by: AtP* (plain attribution where the family refuses score
    recomputation) for task metrics, its second-order projection form for distance metrics."""
    if metric_name in metrics.DISTANCE_METRICS:
        return "atp_distance"
    return "attribution" if model.interp.spec.score_refusal else "atp"


def _top_variants(estimated: pd.DataFrame, variants: list[Variant], top_k: int) -> list[Variant]:
    """The ``top_k`` variants per kind with the largest estimated |delta| (identity rows excluded)."""
    ranked = estimated.assign(_abs=estimated.delta.abs(), _i=range(len(estimated)))
    ranked = ranked[ranked.identity.fillna("") == ""]
    chosen = ranked.sort_values("_abs", ascending=False, kind="stable").groupby("kind").head(top_k)
    return [variants[i] for i in sorted(chosen._i)]


def _sample_variants(estimated: pd.DataFrame, variants: list[Variant], top: list[Variant], sample_k: int,
                    seed: int) -> list[Variant]:
    """Up to ``sample_k`` variants per kind drawn at random (``numpy.random.default_rng(seed)``, kinds in
    order) among those the estimate did not rank in its top and no identity answers: exact rows whose
    choice does not depend on the estimate, so that estimate and exact can be compared without bias."""
    rng = np.random.default_rng(seed)
    taken, chosen = set(top), []
    answered = {i for i, ident in enumerate(estimated.identity.fillna("")) if ident}
    for kind in dict.fromkeys(v.kind for v in variants):
        pool = [i for i, v in enumerate(variants) if v.kind == kind and v not in taken and i not in answered]
        picks = rng.choice(len(pool), size=min(sample_k, len(pool)), replace=False) if pool else []
        chosen += [pool[j] for j in sorted(int(p) for p in picks)]
    return [variants[i] for i in sorted(chosen)]


def _sweep(run: _Run, variants: list[Variant], stats: Optional[QKVStats], log: ResultLog,
           opts: SweepOptions) -> pd.DataFrame:
    """This rank's rows: its share of the variants, or, for "auto", the one-pass estimate of every
    variant (identical on every rank) and its share of the top_k per kind (``exact_because`` "top") and
    of ``sample_k`` random others per kind ("sample") run exactly."""
    rank, world = opts.shard
    if opts.estimate != "auto":
        df = _run_estimate(run, variants[rank::world], opts.estimate, stats, log, opts)
        return df.assign(exact_because="requested" if opts.estimate == "exact" else "")
    one_pass = _one_pass_estimate(run.model, run.metric_name)
    estimated = _run_estimate(run, variants, one_pass, stats, log, opts)
    # one rule whatever the method: rank by the estimate of zeroing, so that two methods run the same heads
    ranking = estimated if opts.method == "zero" else _run_estimate(
        run, variants, one_pass, stats, log, dataclasses.replace(opts, method="zero"))
    top = _top_variants(ranking, variants, opts.top_k)
    sample = _sample_variants(ranking, variants, top, opts.sample_k, opts.seed)
    why = {v: "top" for v in top} | {v: "sample" for v in sample}
    chosen = [v for v in variants if v in why][rank::world]
    exact = _run_estimate(run, chosen, "exact", stats, log, opts).assign(exact_because=[why[v] for v in chosen])
    return pd.concat([estimated.assign(exact_because=""), exact], ignore_index=True)


def _sweep_all(run: _Run, variants: list[Variant], stats: Optional[QKVStats], log: ResultLog,
               opts: SweepOptions) -> pd.DataFrame:
    """``_sweep`` of the bias variants, then the implicit ones (sink_v, massive) exactly whatever the
    estimate (no one-pass estimate of them exists; ``exact_because`` says so): one table."""
    plain = [v for v in variants if not is_implicit(v.targets)]
    implicit = [v for v in variants if is_implicit(v.targets)]
    frames = [_sweep(run, plain, stats, log, opts)] if plain else []
    if implicit:
        rank, world = opts.shard
        exact = _run_estimate(run, implicit[rank::world], "exact", stats, log, opts)
        frames.append(exact.assign(exact_because="requested" if opts.estimate == "exact" else "exact only"))
    return pd.concat(frames, ignore_index=True)


def _refuse_repeated_exact_rows(frames: Sequence[pd.DataFrame], key: list[str]) -> None:
    """Ranks run disjoint shares of the exact variants (only the one-pass estimate of "auto" is on every rank),
    so an exact row in two frames means one rank's table given twice (the merge would silently lack the
    missing rank's rows) or tables of two sweeps."""
    seen: dict[tuple, int] = {}
    for i, frame in enumerate(frames):
        if "estimate" not in frame:
            continue
        for row in frame.loc[frame.estimate == "exact", [k for k in key if k in frame]].astype(str).itertuples(
                index=False, name=None):
            if seen.setdefault(row, i) != i:
                where = ", ".join(f"{k}={v}" for k, v in zip(key, row))
                raise InputError(f"merge_shards: frames {seen[row]} and {i} both hold the exact row ({where}); ranks "
                                 "run disjoint variants, so this is one rank's table given twice or tables of "
                                 "two sweeps: give each rank's table once (rank0, rank1, ...)")


def _refuse_mixed_options(df: pd.DataFrame) -> None:
    """Every option in the rows' ``options`` column takes one value over all frames (a sink_v row's positions
    are compared with other sink_v rows', since only those rows hold them); frames written before the column
    existed hold none to compare."""
    if "options" not in df:
        return
    values: dict[str, dict[str, None]] = {}
    for text in df.options.dropna().unique():
        for name, value in (json.loads(text) if text else {}).items():
            values.setdefault(name, {})[json.dumps(value, sort_keys=True)] = None
    differ = {name: list(seen) for name, seen in values.items() if len(seen) > 1}
    if differ:
        details = "; ".join(f"{name}: {' vs '.join(seen)}" for name, seen in sorted(differ.items()))
        raise InputError(f"merge_shards: the frames were run with different options ({details}); merge the ranks "
                         "of one sweep only (the same options on every rank)")


@public
def merge_shards(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The ranks' ``ablate_bias`` frames as one table, in the one-process order: rows of each
    estimate in turn (the one-pass estimate first), variants by kind (q, k, v), layer, head; rows
    that several ranks computed alike (the estimate of "auto") once; frames of another model, other data or other
    options (the ``options`` column: e.g. sink_v positions, n_boot, seed), and an exact row in two frames (one
    rank's table given twice), are refused."""
    if isinstance(frames, pd.DataFrame) or not frames or not all(isinstance(f, pd.DataFrame) for f in frames):
        raise InputError("merge_shards takes a list of the ranks' ablate_bias DataFrames (e.g. [pd.read_parquet(p) "
                         f"for p in paths]); got {type(frames).__name__}" + (" (empty)" if not frames else ""))
    check_frames(frames, ["layer", "head", "kind", "scope", "method", "estimate", "n_targets"], "merge_shards",
                 "interp.ablate_bias(model, data, shard=(rank, world))")
    df = pd.concat(frames, ignore_index=True)
    for column in ("model_fingerprint", "data_fingerprint"):
        if column in df and df[column].nunique() > 1:
            raise InputError(f"merge_shards: the frames come from different runs ({column}: "
                             f"{', '.join(sorted(df[column].astype(str).unique()))}); merge one sweep's ranks only")
    _refuse_mixed_options(df)
    key = ["layer", "head", "kind", "scope", "method", "estimate", "n_targets"]
    _refuse_repeated_exact_rows(frames, key)
    df = df.drop_duplicates(key).reset_index(drop=True)
    order = {e: i for i, e in enumerate(dict.fromkeys(frames[0].estimate))}
    df = df.assign(_e=df.estimate.map(order), _k=df.kind.map({"q": 0, "k": 1, "v": 2, "sink_v": 3, "massive": 4}))
    df = df.sort_values(["_e", "_k", "layer", "head"], kind="stable", na_position="first")
    return adjust_controls(df.drop(columns=["_e", "_k"]).reset_index(drop=True))  # across the merged heads


@public
def ablate_bias(
    model: InterpBridge,
    data: Any,
    kinds: Sequence[str] = ("q", "k", "v"),
    scope: Union[str, Iterable[Target]] = "head",
    method: Method = "zero",
    metric: Union[str, Callable] = "auto",
    estimate: Estimate = "auto",
    *,
    stats: Optional[QKVStats] = None,
    out: Optional[Union[str, Path]] = None,
    layers: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None,
    max_batches: Optional[int] = None, stack: Any = "auto", force_exact: bool = False, reuse_prefix: bool = True,
    top_k: int = 5, sample_k: int = 5, n_projections: int = 8, n_boot: int = 1000, n_control: int = 19,
    control_stop: int = 5, control_p: str = "normal", seed: int = 0, shard: tuple[int, int] = (0, 1),
    progress: bool = True, overwrite: bool = False,
    positions: Any = None, abs_threshold: float = 100.0, ratio_threshold: float = 1000.0,
) -> pd.DataFrame:
    """Patch biases out and measure the metric; one row per variant (and estimate).

    Columns: layer, head (None where the variant spans several), kind, scope (head | layer | all | custom), method,
    estimate, metric, baseline, ablated, delta (= ablated - baseline), delta_se (standard error over items; exact
    rows), delta_lo / delta_hi, displacement_norm, the matched control's control_lo / control_hi / delta_z /
    control_p / control_p_empirical / control_p_adjusted / n_control / outside_control / bias_dependent (exact
    rows: up to ``n_control`` random directions of the same displacement norm, a head stopping once
    ``control_stop`` of them move the metric as much; control_p from the tail of a normal fitted to the draws,
    ``control_p="normal"``, or their Monte Carlo p, ``"sequential"``; control_p_adjusted: Benjamini-Hochberg across
    the table's tested heads; a head is bias-dependent only when control_p_adjusted <= 0.05, a false discovery rate
    of 5%, not a family-wise error; module doc), kl (exact, with logits; NaN under embedding_cosine, whose forward
    stops at the last block), n_targets, identity, exact_because,
    below_rounding (float16/bfloat16: |delta| < eps(dtype) x |baseline|), model_fingerprint, data_fingerprint,
    options (JSON: what the row depends on besides model, data and variant; ``SweepOptions``): see the module doc
    for the intervals, ``sample_k``, ``n_boot``, ``n_control``, ``control_p``, ``seed`` and ``method="random"``.
    Options are keywords (``method`` and ``estimate`` also by position), each declared once in
    ``interp.ablation.options.SweepOptions`` (its default, how it binds the results, where it applies): a value of
    the wrong type (``overwrite="no"``, ``top_k=2.0``), a name that is no option (the nearest is named) and a value
    other than the default where the option does not apply (``top_k`` under ``estimate="exact"``, ``n_control``
    under attribution, ``positions`` without sink_v, ``overwrite`` without ``out``) are each one ``InputError``.
    ``metric`` is "auto" (the family's default), next_token_ce, cross_entropy, embedding_cosine, feature_cosine,
    or a callable ``f(output, batch) -> scalar tensor``.
    ``estimate``: see the module doc. ``out`` (a folder): finished variants go to ``out/ablation.jsonl`` at once,
    a rerun resumes, a log of another run (weights, data, max_batches, metric, library version) is refused or,
    with ``overwrite=True``, replaced. A variant an identity answers (its delta is exactly 0: module doc) is not
    run unless ``force_exact``; its row says why. ``reuse_prefix`` (exact): layers below a patch are replayed from
    the intact run. ``layers`` / ``heads`` (None: all) aim the sweep at those layers and heads (``make_variants``).
    ``shard=(rank, world)``: this process runs every world-th variant (the one-pass estimate of "auto" runs whole
    on every rank, so all choose the same top heads); ``merge_shards`` joins the ranks' frames into the
    one-process table. ``kinds`` may add the implicit biases ``sink_v`` (a kv head's values at the sink
    ``positions``) and ``massive`` (residual entries past ``abs_threshold`` and ``ratio_threshold`` x median),
    zero or mean, always exact (``interp.ablation.implicit``).
    """
    model = require_bridge(model, "ablate_bias")  # the one check of the model: what runs below takes the bridge
    check_not_blank("out", out)
    given = locals()
    opts = sweep_options(**{name: given[name] for name in OPTION_NAMES})  # every option, checked once
    opts.check_applies(kinds, out is not None)
    variants = make_variants(model.interp, kinds, scope, layers, heads)
    sites, record_means = _check_patches(model, variants, stats, opts)
    return _ablate(model, data, variants, sites, record_means, metric, stats, out, opts)


def _check_patches(model: InterpBridge, variants: list[Variant], stats: Optional[QKVStats],
                   opts: SweepOptions) -> tuple[Optional[ImplicitSites], bool]:
    """What the variants patch, checked together at the door, so that the hooks of every patched forward are built
    without checking again (``patch_hooks``, ``control_patch_hooks``): the implicit sites (sink_v, massive), then
    the method against the bias targets and ``stats``, where given, as statistics of this model (``check_patch``,
    the one door of a bias patch). Returns the implicit sites and whether the content means that ``method="mean"``
    needs are to be recorded (``_ablate``, once the data are read): not given, and some targeted bias is present
    (an absent one is shifted by 0)."""
    targets = [t for v in variants for t in v.targets]
    sites = check_implicit(model, opts.method, targets, opts.positions, opts.abs_threshold,
                           opts.ratio_threshold)  # before check_patch: its messages are about biases
    needs = check_patch(model, opts.method, targets, stats, need_stats=False)  # the means: recorded if not given
    return sites, stats is None and needs


def _ablate(model: InterpBridge, data: Any, variants: list[Variant], sites: Optional[ImplicitSites],
            record_means: bool, metric: metrics.Metric, stats: Optional[QKVStats], out: Optional[Union[str, Path]],
            opts: SweepOptions) -> pd.DataFrame:
    """``ablate_bias`` once its model, options and patches are checked: the intact run, the sweep, the table."""
    targets = [t for v in variants for t in v.targets]
    run = _prepare(model, data, metric, opts)
    if opts.method == "mean" and stats is not None:  # other data's means give other rows
        run.fingerprint["stats"] = f"{stats.model_fingerprint}/{stats.data_fingerprint}"
    run.implicit = sites and prepare_sites(model, sites, run.batches, targets)
    if record_means:
        stats = record_qkv(model, run.batches, progress=False)
    log = ResultLog(None if out is None else Path(out) / "ablation.jsonl", run.fingerprint, opts.overwrite,
                    optional=SweepOptions.ESTIMATE_BOUND)
    df = adjust_controls(_sweep_all(run, variants, stats, log, opts))
    if out is not None:
        write_table(df, Path(out) / "ablation")
    return df
