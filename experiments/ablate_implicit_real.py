"""Implicit-bias ablation on the real zoo (issue 26): explicit b_v rows beside sink-value and
massive-activation rows in one ``ablate_bias`` table, on MiniLM-L6 (QKV bias) and SmolLM2-135M (none).

Writes ``docs/results/<model>/ablation_implicit.csv`` (every row) and prints each model's largest
|delta| per kind. Data: the first ``--batches`` batches of ``--batch-size`` python-docs windows (the
same data as ``experiments/sinks_real.py``). Run: ``nice python -m experiments.ablate_implicit_real``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import interp

OUT = Path(__file__).resolve().parent.parent / "docs" / "results"
KINDS = {"minilm-l6": ("v", "sink_v", "massive"), "smollm2-135m": ("sink_v", "massive")}


def run_model(name: str, batches: int, batch_size: int, methods: tuple[str, ...] = ("zero", "mean")) -> pd.DataFrame:
    t0 = time.time()
    model = interp.load_model(name, device="cpu")
    data = interp.builtin_batches(model, "python-docs", batch_size=batch_size, n=batches * batch_size)[:batches]
    frames = [interp.ablate_bias(model, data, kinds=KINDS[name], method=method, estimate="exact", progress=False)
              for method in methods]
    table = pd.concat(frames, ignore_index=True).assign(model=name)
    (OUT / name).mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / name / "ablation_implicit.csv", index=False)
    print(f"{name}: {len(table)} rows, {time.time() - t0:.0f} s")
    return table


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per method and kind: the variant with the largest |delta|, its delta and the median |delta|."""
    rows = []
    for (method, kind), part in table.groupby(["method", "kind"], sort=False):
        top = part.loc[part.delta.abs().idxmax()]
        rows.append(dict(model=top.model, method=method, kind=kind, metric=top.metric, baseline=top.baseline,
                         top=f"L{top.layer}" + ("" if pd.isna(top["head"]) else f" H{top['head']}"),
                         top_delta=top.delta, median_abs_delta=part.delta.abs().median(), n=len(part),
                         n_identity=int((part.identity.fillna("") != "").sum())))
    return pd.DataFrame(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(KINDS))
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--methods", default="zero,mean", help="comma-separated ablation methods")
    p.add_argument("--table", action="store_true", help="print the summary from the CSVs, run nothing")
    args = p.parse_args()
    for name in args.models.split(","):
        table = (pd.read_csv(OUT / name / "ablation_implicit.csv") if args.table
                 else run_model(name, args.batches, args.batch_size, tuple(args.methods.split(","))))
        print(summary(table).to_string(index=False))


if __name__ == "__main__":
    main()
