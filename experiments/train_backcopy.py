"""Issue 32's positive control: attention sinks that do form (Guo et al. 2024's Bigram-Backcopy task).

    python -m experiments.train_backcopy                       # 4 arms x 3 seeds, 3,000 steps (resumes)
    python -m experiments.train_backcopy --steps 2000          # every run to step 2,000 first
    python -m experiments.train_backcopy --summarise-only      # tables, figure and findings table from the CSVs
    python -m experiments.train_backcopy --seeds 0 --steps 20  # a quick look

Trains the arms of ``experiments.training.backcopy`` (``none``, ``kv_slot``, ``k_slot_v0`` with a start
token ``<s>``, and ``none_no_start`` without), a 2-layer x 4-head LLaMA of width 64 on sequences of
64 tokens, measuring every run every 250 steps on held-out sequences. Checkpoints go to
``--work/<recipe fingerprint>/`` (git-ignored cache): a killed run resumes where it stopped, a finished
one is read back, and since the learning rate is constant after warm-up a larger ``--steps`` extends
finished runs. Writes into ``--out`` (``docs/results/backcopy``): runs.csv, heads.csv, gate.csv,
summary.csv, task.json, tables.md, counts.csv (``interp.sink_counts`` per run and step); the figure into ``--figures`` (``docs/figures/backcopy``). Several
processes may train disjoint parts of the plan (``--arms`` / ``--seeds`` with ``--collect-seeds``):
each writes the tables of every checkpoint found. One thread per process.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from interp.io import atomic_path  # noqa: E402
from experiments.training.backcopy import ARMS, BackcopyRecipe, make_task, recipe_fingerprint  # noqa: E402
from interp.figures.plots import save_figure  # noqa: E402
from experiments.training.backcopy_report import findings_tables, sink_share_figure  # noqa: E402
from interp.analysis.sinks import sink_counts  # noqa: E402
from experiments.training.backcopy_results import (  # noqa: E402
    check_results_folder, floor_gate, floor_heads, floor_runs, run_all, summarise,
)


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--collect-seeds", type=int, nargs="+", default=None,
                    help="the seeds whose checkpoints go into the tables (default: --seeds)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--steps", type=int, default=BackcopyRecipe().steps)
    ap.add_argument("--work", default=".cache/interp/backcopy-runs", help="checkpoints (one folder per recipe)")
    ap.add_argument("--out", default="docs/results/backcopy")
    ap.add_argument("--figures", default="docs/figures/backcopy")
    ap.add_argument("--overwrite", action="store_true", help="replace results of another recipe in --out")
    ap.add_argument("--summarise-only", action="store_true", help="no training: tables and figure from the CSVs")
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args()


def write_task(out: Path, recipe: BackcopyRecipe) -> None:
    task = make_task(recipe)
    record = dict(recipe=recipe_fingerprint(recipe), triggers=list(task.triggers), start_id=task.start_id,
                  n_tokens=task.n_tokens, alpha=recipe.alpha, task_seed=recipe.task_seed)
    with atomic_path(out / "task.json") as tmp:
        tmp.write_text(json.dumps(record, indent=1))


def outputs(out: Path, figures: Path) -> str:
    """summary.csv, tables.md and the figure from runs.csv, heads.csv and gate.csv."""
    runs, heads = pd.read_csv(out / "runs.csv"), pd.read_csv(out / "heads.csv")
    gate = pd.read_csv(out / "gate.csv", dtype={"gate": str})
    recipe = BackcopyRecipe()  # tables measured before issue 37: the own row dropped from the stored masses
    heads = floor_heads(heads, recipe)
    runs, gate = floor_runs(runs, heads), floor_gate(gate, recipe)
    for name, frame in (("runs", runs), ("heads", heads), ("gate", gate)):
        with atomic_path(out / f"{name}.csv") as tmp:
            frame.to_csv(tmp, index=False)
    exact = heads[heads.mass_start.notna()]
    counts = pd.concat([sink_counts(exact, value="mass_start", by=["arm", "seed", "step"]).assign(target="start"),
                        sink_counts(heads[heads.mass_slot.notna()], value="mass_slot", by=["arm", "seed", "step"])
                        .assign(target="slot")])
    with atomic_path(out / "counts.csv") as tmp:
        counts.to_csv(tmp, index=False)
    with atomic_path(out / "summary.csv") as tmp:
        summarise(runs).to_csv(tmp, index=False)
    tables = findings_tables(runs, heads, gate)
    with atomic_path(out / "tables.md") as tmp:
        tmp.write_text(tables + "\n")
    save_figure(sink_share_figure(runs), figures / "sink_share.png")
    return tables


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    out, start = Path(args.out), time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    recipe = replace(BackcopyRecipe(), steps=args.steps)
    if not args.summarise_only:
        check_results_folder(out, recipe, args.overwrite)
        write_task(out, recipe)
        plan = [(arm, seed) for seed in args.seeds for arm in args.arms]
        run_all(plan, recipe, Path(args.work), out, seeds=args.collect_seeds or args.seeds)
    print(outputs(out, Path(args.figures)))
    runs = pd.read_csv(out / "runs.csv")
    train = runs.groupby(["arm", "seed"]).train_seconds.max().sum()
    print(f"wall time of this invocation {time.perf_counter() - start:.0f} s; training time in the checkpoints "
          f"(all runs, all invocations) {train:.0f} s; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
