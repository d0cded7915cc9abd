"""The Bigram-Backcopy control's tables (``experiments.training.backcopy``), all long-form and read back
from the runs' checkpoints, so processes training different parts of the plan add up:

* ``runs.csv``: one row per run (arm x seed) and measured step: loss (all / copy / bigram
  positions), accuracies, the bigram floor, shares of heads sinking on ``<s>`` and on the slot;
* ``heads.csv``: one row per run, step, layer and head: masses on ``<s>`` and on the slot (all
  queries, copy queries ``_active``, the rest ``_dormant``), value and output norms;
* ``gate.csv``: the causal check on every run's last checkpoint: the slot arms with the slot's gate
  at 0 and at -inf (the slot removed exactly), every arm at 0 for reference.

Each row carries ``recipe`` (the recipe's fingerprint) and ``fingerprint`` (of recipe, arm and seed:
``results.tag_rows``). The run loop, the folder check and the writer are ``experiments.training.results``, shared
with the sink experiment.
``summarise``: per arm x metric at a step, over seeds s = 1..n, the mean, its 95% t-interval
(mean +- t_{0.975, n-1} sd / sqrt(n)) and the per-seed values, in seed order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from interp.analysis.sinks import SINK_THRESHOLD
from experiments.training.backcopy import (
    ARMS, SLOT_ARMS, BackcopyRecipe, BackcopyRun, build_model, gate_check, make_task, n_start, recipe_fingerprint,
    run_fingerprint, shares, train_run, verify_checkpoint, with_start,
)
from experiments.training.sink_metrics import drop_own_rows, uniform_floor
from experiments.training import results
from experiments.training.results import refuse_other_recipes, t_interval, tag_rows

TABLES = ("runs", "heads", "gate")
METRICS = ["loss", "copy_loss", "bigram_loss", "bigram_floor", "copy_accuracy", "sink_share_start",
           "sink_heads_start", "sink_near_start", "mean_mass_start", "max_mass_start", "uniform_start",
           "sink_share_slot", "sink_heads_slot", "sink_near_slot", "mean_mass_slot", "max_mass_slot", "uniform_slot"]


def collect(recipe: BackcopyRecipe, work: Path, arms: Iterable[str] = ARMS,
            seeds: Iterable[int] = (0, 1, 2)) -> dict[str, pd.DataFrame]:
    """The three tables from every checkpoint of ``recipe`` in ``work`` (each verified: another run's
    or a damaged file is refused), with the gate check on each run's last checkpoint."""
    recipe_fp, folder = recipe_fingerprint(recipe), Path(work) / recipe_fingerprint(recipe)
    runs, heads, gate = [], [], []
    for seed in seeds:
        for arm in arms:
            run = BackcopyRun(arm, seed, recipe)
            path = folder / f"{run.domain}-{arm}-seed{seed}.pt"
            if not path.exists():
                continue
            fp = run_fingerprint(recipe, arm, seed)
            verify_checkpoint(path, fp)
            state = torch.load(path, weights_only=True)
            runs += tag_rows(state["runs"], recipe_fp)
            heads += tag_rows(state["heads"], recipe_fp)
            model = build_model(arm, seed, recipe)
            model.load_state_dict(state["model"])
            gate += [dict(r, step=state["step"], recipe=recipe_fp, fingerprint=fp) for r in gate_check(model, run)]
    return dict(runs=pd.DataFrame(runs), heads=pd.DataFrame(heads), gate=pd.DataFrame(gate))


def check_results_folder(out: Path, recipe: BackcopyRecipe, overwrite: bool = False) -> None:
    """Refuse ``out`` if its runs.csv holds rows of another recipe (``overwrite``: replaced)."""
    refuse_other_recipes(out, recipe_fingerprint(recipe), overwrite=overwrite)


def write_tables(out: Path, frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """runs.csv, heads.csv and gate.csv, each written atomically."""
    return results.write_tables(out, frames, TABLES)


def run_all(plan: list[tuple[str, int]], recipe: BackcopyRecipe, work: Path, out: Path,
            seeds: Iterable[int] = (0, 1, 2), log: Callable[[str], None] = print) -> dict[str, pd.DataFrame]:
    """Every (arm, seed) of ``plan``, trained to ``recipe.steps`` (or resumed, or read back); after each,
    the tables of every checkpoint of the recipe and ``seeds`` in ``work`` (by any process) into ``out``
    (``results.run_plan``)."""
    def train(item: tuple[str, int]) -> str:
        arm, seed = item
        _, state, _ = train_run(arm, seed, recipe, work)
        last = state["runs"][-1]
        return (f"{arm:13s} seed {seed}: step {last['step']}, loss {last['loss']:.3f}, copy accuracy "
                f"{last['copy_accuracy']:.3f}, heads sinking on <s> {last['sink_heads_start']:.0f}, on the slot "
                f"{last['sink_heads_slot']:.0f}, train {state['seconds']:.0f} s")

    return results.run_plan(plan, train, lambda: collect(recipe, work, seeds=seeds), out, TABLES, log)


def common_step(runs: pd.DataFrame) -> int:
    """The last step every run in ``runs`` has reached."""
    return int(runs.groupby(["arm", "seed"]).step.max().min())


def summarise(runs: pd.DataFrame, step: Optional[int] = None) -> pd.DataFrame:
    """Long form: arm, metric, step, n_seeds, mean, ci95_low, ci95_high, per_seed ("a / b / c" in
    seed order), at ``step`` (default: ``common_step``)."""
    step = common_step(runs) if step is None else step
    at = runs[runs.step == step].sort_values("seed")
    rows = []
    for arm in [a for a in ARMS if a in set(at.arm)]:
        part = at[at.arm == arm]
        for metric in METRICS:
            values = part[metric].astype(float)
            mean, lo, hi = t_interval(values)
            rows.append(dict(arm=arm, metric=metric, step=step, n_seeds=int(values.notna().sum()), mean=mean,
                             ci95_low=lo, ci95_high=hi, seeds=" / ".join(str(int(s)) for s in part.seed),
                             per_seed=" / ".join(f"{v:.4g}" for v in values)))
    return pd.DataFrame(rows)


# ----- tables measured before issue 37: the sink's own query row dropped from the stored masses ---------


def floor_heads(heads: pd.DataFrame, recipe: BackcopyRecipe) -> pd.DataFrame:
    """``heads.csv`` measured before the own row was left out (every query row counted, the first position's own row
    included) in the current schema, from the stored masses alone (``sink_metrics.drop_own_rows``):
    ``mass_start_with_self`` = the stored mass; ``mass_start`` = without the first position's own row,
    exact where that row's mass is 1 by construction (no slot: ``none``, ``none_no_start``), NaN in
    the slot arms, with the bounds ``mass_start_low`` / ``mass_start_high`` (equal to it where exact);
    ``mass_start_dormant`` likewise (the own row is a non-trigger query; the probe's trigger counts
    are regenerated from the task); ``uniform_start`` / ``uniform_slot`` = the floors under uniform
    causal attention. ``mass_slot`` and the ``_active`` masses have no own row: unchanged. A table
    already in the current schema (``uniform_start`` present) is returned as is."""
    if "uniform_start" in heads:
        return heads
    out = []
    probe = BackcopyRun("none", 0, recipe).eval_seq[: recipe.probe_sequences]
    trigger = make_task(recipe).is_trigger(probe)
    for arm, part in heads.groupby("arm", sort=False):
        part = part.copy()
        slot, length = int(arm in SLOT_ARMS), recipe.shape.context + n_start(arm)
        n_seq, own = len(probe), None if arm in SLOT_ARMS else float(len(probe))
        dormant = int((~task_triggers(trigger, arm)).sum())
        part["mass_start_with_self"] = part.mass_start
        part["mass_start"], part["mass_start_low"], part["mass_start_high"] = drop_own_rows(
            part.mass_start_with_self, n_seq * length, n_seq, own)
        part["mass_start_dormant"] = drop_own_rows(part.mass_start_dormant, dormant, n_seq, own)[0]
        part["uniform_start"] = uniform_floor(length, [slot], slot, True)
        part["uniform_slot"] = uniform_floor(length, [0], 1, True) if slot else np.nan
        out.append(part)
    return pd.concat(out).loc[heads.index]


def task_triggers(trigger: Tensor, arm: str) -> Tensor:
    """The trigger mask over the model's input positions (``<s>``, prepended except in ``none_no_start``, is
    no trigger)."""
    return with_start(trigger.long(), arm, 0).bool()


def floor_runs(runs: pd.DataFrame, heads: pd.DataFrame) -> pd.DataFrame:
    """``runs.csv``'s attention columns recomputed from ``floor_heads``' masses (``backcopy.shares``'
    definitions; NaN where the masses are, in the slot arms on ``<s>``)."""
    if "uniform_start" in runs:
        return runs
    keys = ["arm", "seed", "step"]
    rows = []
    for key, part in heads.groupby(keys, sort=False):
        rows.append(dict(zip(keys, key), **shares(part)))
    new = pd.DataFrame(rows)
    kept = runs.drop(columns=[c for c in new.columns if c not in keys and c in runs])
    return kept.merge(new, on=keys, how="left")[[*kept.columns, *[c for c in new.columns if c not in keys]]]


def floor_gate(gate: pd.DataFrame, recipe: BackcopyRecipe) -> pd.DataFrame:
    """``gate.csv`` measured before the own row was left out, without the first position's own query row: the mean and
    largest masses on ``<s>`` (``mean_mass_start``, ``max_mass_start``; stored ones kept as ``*_with_self``)
    exact where that row's mass is 1 by construction (the slot's gate at -inf, or no slot), else NaN,
    with bounds ``*_low`` / ``*_high`` (``sink_metrics.drop_own_rows``). The count ``sink_heads_start``
    needs each head's mass, which gate.csv does not keep: bounds ``sink_heads_start_low`` / ``_high``
    from the largest head (0 when even its upper bound is at most the threshold; at least 1 when its
    exact mass is above it; at most the count with the own row, which only adds mass there), NaN
    where they do not follow."""
    if "mean_mass_start_with_self" in gate:
        return gate
    out = gate.copy()
    n_seq = recipe.probe_sequences
    rows = n_seq * (recipe.shape.context + out.arm.map(n_start))
    exact = (out.gate == "-inf") | ~out.arm.isin(SLOT_ARMS)
    for col in ("mean_mass_start", "max_mass_start"):
        out[f"{col}_with_self"] = m = out[col]
        known = (m * rows - n_seq) / (rows - n_seq)  # drop_own_rows with the own row's mass 1
        out[col] = known.where(exact)
        out[f"{col}_low"] = known.where(exact, ((m * rows - n_seq) / (rows - n_seq)).clip(lower=0))
        out[f"{col}_high"] = known.where(exact, m * rows / (rows - n_seq))
    none_above = out.max_mass_start_high <= SINK_THRESHOLD
    out["sink_heads_start_low"] = np.where(none_above, 0.0, np.where(exact, 1.0, np.nan))
    out["sink_heads_start_high"] = np.where(none_above, 0.0, np.where(exact, out.sink_heads_start, np.nan))
    return out
