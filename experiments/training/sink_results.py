"""The sink experiment's tables: every run, the summary at the last step, and Gu et al.'s Table 4.

``run_all`` trains (or resumes, or just reads back) every domain x arm x seed and writes, after
each run, atomically (the loop, the folder check and the writer: ``experiments.training.results``, shared with
the Bigram-Backcopy control): ``runs.csv`` (one row per run and measured step), ``heads.csv`` (per layer x
head), ``layers.csv`` (per layer), all long-form, every row tagged with the recipe fingerprint.
A results folder holding another recipe's rows is refused (``StaleResultsError``).

``summarise``: per domain x arm x metric at the last step, over seeds s = 1..n,

    mean = (1/n) sum_s x_s,   95% interval = mean +- t_{0.975, n-1} sd(x) / sqrt(n)
    paired difference d_s = x_s(arm) - x_s(none), with its own mean and t-interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np
import pandas as pd

from experiments.training.sink_arms import N_REGISTERS, TEXT_ARMS, VISION_ARMS, n_prefix, save_lm_arm
from experiments.training.sink_metrics import drop_own_rows, uniform_floor
from experiments.training import results
from experiments.training.corpus import Corpus
from experiments.training.results import refuse_other_recipes, t_interval
from experiments.training.sinks import (
    TextRecipe, TextTask, VisionRecipe, VisionTask, read_checkpoint, recipe_fingerprint, run_arm,
)

TABLES = ("runs", "heads", "layers")
ARMS = {"text": TEXT_ARMS, "vision": VISION_ARMS}
METRICS = {
    "text": ["val_loss", "sink_share_first", "sink_share_first_text", "sink_share_slot", "mean_mass_first",
             "mean_mass_first_text", "mean_mass_slot", "max_over_median", "implicit_norm", "explicit_norm",
             "slot_norm"],
    "vision": ["accuracy", "sink_share_first", "sink_share_slot", "sink_share_registers", "mean_mass_first",
               "mean_mass_slot", "mean_mass_registers", "max_over_median", "implicit_norm", "explicit_norm",
               "slot_norm"],
}


def check_results_folder(out: Path, fingerprints: dict[str, str], overwrite: bool = False) -> None:
    """Refuse ``out`` if its runs.csv holds rows of another recipe than ``fingerprints[domain]`` for
    their domain (``overwrite``: they are replaced)."""
    refuse_other_recipes(out, fingerprints, by="domain", overwrite=overwrite)


def finished_states(folders: dict[str, tuple[Path, str]]) -> list[dict]:
    """The states of every finished run checkpointed in each domain's (folder, fingerprint), by any
    process, in domain and file-name order."""
    states = []
    for work, fingerprint in folders.values():
        for path in sorted(Path(work).glob("*.pt")):
            state = read_checkpoint(path)
            if state.get("recipe") == fingerprint and state["step"] == state["final_step"]:
                states.append({name: state[name] for name in TABLES})
    return states


def frames_of(states: Iterable[dict]) -> dict[str, pd.DataFrame]:
    """The runs, heads and layers tables of the runs' states (their rows, in state order)."""
    states = list(states)
    return {name: pd.DataFrame([row for s in states for row in s[name]]) for name in TABLES}


def write_tables(out: Path, states: Iterable[dict]) -> dict[str, pd.DataFrame]:
    """runs.csv, heads.csv and layers.csv from the runs' states, each written atomically."""
    return results.write_tables(out, frames_of(states), TABLES)


def run_all(plan: list[tuple[str, str, int]], text: TextRecipe, vision: VisionRecipe, corpus: Corpus,
            work: Path, out: Path, ship: Optional[Path] = None, collect: Iterable[str] = ("text", "vision"),
            log: Callable[[str], None] = print, device: str = "cpu") -> dict[str, pd.DataFrame]:
    """Every (domain, arm, seed) of ``plan``, resumed from ``work/<the domain's fingerprint>``; after
    each, the tables of every finished run of the ``collect`` domains' recipes (so processes running
    other parts of the plan add up) into ``out`` (``results.run_plan``), and once more at the end; the seed-0
    text arms' weights into ``ship``. The text arms train on ``device`` (``TextTask``), the vision arms on the
    CPU."""
    fps = dict(text=recipe_fingerprint(text, corpus.sha256), vision=recipe_fingerprint(vision))
    folders = {d: (Path(work) / fp, fp) for d, fp in fps.items() if d in collect}

    def train(item: tuple[str, str, int]) -> str:
        domain, arm, seed = item
        task = TextTask(arm, seed, text, corpus, device) if domain == "text" else VisionTask(arm, seed, vision)
        model, state = run_arm(task, Path(work) / fps[domain], fps[domain])
        last = state["runs"][-1]
        if ship is not None and domain == "text" and seed == 0:
            save_lm_arm(model, arm, text.shape, ship, dict(recipe=fps["text"], val_loss=f"{last['val_loss']:.6f}",
                                                           corpus_sha256=corpus.sha256, step=last["step"]))
        return (f"{domain:6s} {arm:10s} seed {seed}: step {last['step']}, val_loss {last['val_loss']:.4f}, "
                f"accuracy {last['accuracy']:.4f}, first-token share {last['sink_share_first']:.3f}, "
                f"train {state['seconds']:.0f} s")

    results.run_plan(plan, train, lambda: frames_of(finished_states(folders)), out, TABLES, log)
    return write_tables(out, finished_states(folders))


HEAD_MAXIMA = ["mass_first", "mass_first_text", "mass_slot", "mass_registers"]


def head_maxima(heads: pd.DataFrame) -> pd.DataFrame:
    """Per run and step: ``max_head_<m>`` = the largest mean mass one head puts on the position
    (max over layers and heads of ``heads.csv``'s m), for m in ``HEAD_MAXIMA``."""
    keys = ["domain", "arm", "seed", "step"]
    return heads.groupby(keys)[HEAD_MAXIMA].max(min_count=1).add_prefix("max_head_").reset_index()


def summarise(runs: pd.DataFrame, heads: Optional[pd.DataFrame] = None, reference: str = "none") -> pd.DataFrame:
    """Long form: domain, arm, metric, step, n_seeds, mean, ci95_low, ci95_high, paired_diff,
    paired_ci95_low, paired_ci95_high (module doc), at each domain's last step; with ``heads`` also
    the ``head_maxima`` metrics."""
    extra = []
    if heads is not None:
        runs = runs.merge(head_maxima(heads), on=["domain", "arm", "seed", "step"], how="left")
        extra = [f"max_head_{m}" for m in HEAD_MAXIMA]
    rows = []
    for domain in [d for d in ARMS if d in set(runs.domain)]:
        part = runs[runs.domain == domain]
        last = part[part.step == part.step.max()]
        for metric in [m for m in METRICS[domain] + extra if m in runs]:
            wide = last.pivot_table(index="seed", columns="arm", values=metric, dropna=False)
            for arm in [a for a in ARMS[domain] if a in set(last.arm)]:
                mean, lo, hi = t_interval(wide[arm])
                d = t_interval(wide[arm] - wide[reference]) if reference in wide else (np.nan,) * 3
                rows.append(dict(domain=domain, arm=arm, metric=metric, step=int(last.step.iloc[0]),
                                 n_seeds=int(wide[arm].notna().sum()), mean=mean, ci95_low=lo, ci95_high=hi,
                                 paired_diff=d[0], paired_ci95_low=d[1], paired_ci95_high=d[2]))
    return pd.DataFrame(rows)


RULE_MARGIN = 0.3  # nats/byte below the best count model (issue 32)


def stopping_rule(runs: pd.DataFrame, baseline: pd.DataFrame, margin: float = RULE_MARGIN) -> pd.DataFrame:
    """Per text run: the last step, its validation loss, the best count model's (``baseline.csv`` of
    ``experiments.training.ngram.count_baseline``: order and nats/byte), the target = best - ``margin``,
    ``met`` (the last validation loss at or below the target) and ``first_step_met`` (the first
    measured step at or below it; NaN if none). A claim about the trained arms may be made only
    where every run met the rule."""
    best = baseline.loc[baseline.val_nats_per_byte.idxmin()]
    target = float(best.val_nats_per_byte) - margin
    rows = []
    for (arm, seed), part in runs[runs.domain == "text"].groupby(["arm", "seed"], sort=False):
        part = part.sort_values("step")
        below = part[part.val_loss <= target]
        last = part.iloc[-1]
        rows.append(dict(arm=arm, seed=int(seed), step=int(last.step), val_loss=float(last.val_loss),
                         count_model_order=int(best.n), count_model_val=float(best.val_nats_per_byte),
                         margin=margin, target=target, met=bool(last.val_loss <= target),
                         first_step_met=float(below.step.iloc[0]) if len(below) else np.nan))
    return pd.DataFrame(rows)


# ----- tables measured before issue 37: the sink's own query row dropped from the stored masses ---------

SLOTTED = ("kv_slot", "k_slot_v0")
VISION_PATCHES = 49  # the MNIST ViT recipe: 28 x 28 images in 4 x 4 patches


def _geometry(domain: str, arm: str, context: int) -> tuple[int, int, dict[str, tuple[list[int], int]]]:
    """(query rows per sequence, slot, {class: (key columns, own rows)}) of one arm's probe."""
    slot, prefix = int(arm in SLOTTED), n_prefix(domain, arm)
    rows = (context if domain == "text" else VISION_PATCHES) + prefix
    first_text = slot + (prefix if domain == "text" else 0)
    classes = {"first": ([slot], 1), "first_text": ([first_text], 1)}
    if slot:
        classes["slot"] = ([0], 0)
    if arm == "registers":
        classes["registers"] = (list(range(1, 1 + N_REGISTERS)), N_REGISTERS)
    return rows, slot, classes


def floor_heads(heads: pd.DataFrame, context: int) -> pd.DataFrame:
    """``heads.csv`` of the sink experiment measured before the own row was left out (every query row counted) in the
    current schema, from the stored masses alone (``sink_metrics.drop_own_rows``): per class c,
    ``mass_<c>_with_self`` = the stored mass, ``mass_<c>`` = without the class's own query rows, exact
    where their mass is 1 by construction (the first position of a causal text probe without a slot),
    else NaN with the bounds ``mass_<c>_low`` / ``_high``; ``uniform_<c>`` = the floor (text: causal
    windows of ``context`` bytes, after the sink token in ``sink_token``; vision: 49 patches after CLS
    and the registers, all attending to all). The slot has no query row: its mass is as measured. A
    table already in the current schema (``uniform_first`` present) is returned as is."""
    if "uniform_first" in heads:
        return heads
    parts = []
    for (domain, arm), part in heads.groupby(["domain", "arm"], sort=False):
        part = part.copy()
        rows, slot, classes = _geometry(domain, arm, context)
        for cls, (cols, own) in classes.items():
            col = f"mass_{cls}"
            exact = domain == "text" and not slot and cols == [0]
            part[f"{col}_with_self"] = part[col]
            part[col], part[f"{col}_low"], part[f"{col}_high"] = drop_own_rows(
                part[col], rows, own, float(own) if exact else None)
            part[f"uniform_{cls}"] = uniform_floor(rows, cols, slot, domain == "text")
        parts.append(part)
    return pd.concat(parts).loc[heads.index]
