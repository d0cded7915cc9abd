"""MiniLM on python-docs and DINOv2 on photos against 8 untrained copies of their architectures
(``interp.specialisation_test``), with the layer and within-layer tests of ``interp.family_test``.

    python -m experiments.specialisation_real --out docs/results/families
    python -m experiments.specialisation_real --redraw docs/results/families   # the figures from the CSV

Writes ``specialisation.csv`` (the tidy tables of both models), ``specialisation_tests.csv`` (family_test's
one-row summary per model) and ``specialisation_<model>.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

import interp

RUNS = {"minilm-l6": "python-docs", "dinov2-s14": "photos"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/families")
    ap.add_argument("--models", nargs="*", default=list(RUNS))
    ap.add_argument("--max-batches", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    tables, tests = [], []
    for name in args.models:
        model = interp.load_model(name, device="cpu")
        batches = list(interp.iter_batches(model, RUNS[name], args.max_batches))
        table = interp.specialisation_test(model, batches, n_random=8, progress=False).assign(model=name,
                                                                                               data=RUNS[name])
        tables.append(table)
        interp.plots.save_figure(interp.plots.specialisation_figure(table, data=RUNS[name]),
                                 out / f"specialisation_{name}.png")
        first = interp.family_test(model, batches, progress=False).iloc[0]
        tests.append(dict(model=name, data=RUNS[name],
                          **{c: first[c] for c in ("n_features", "family_p", "family_effect", "structure",
                                                   "replication_ari", "layer_effect", "layer_effect_lo",
                                                   "layer_effect_hi", "layer_p", "n_null", "n_boot")}))
        print(table[table.weights == "trained"].drop(columns=["meaning"]).to_string(), tests[-1], flush=True)
    pd.concat(tables, ignore_index=True).to_csv(out / "specialisation.csv", index=False)
    pd.DataFrame(tests).to_csv(out / "specialisation_tests.csv", index=False)



def redraw(out: Path) -> None:
    """The figures again from ``specialisation.csv`` (figures only draw tables)."""
    table = pd.read_csv(out / "specialisation.csv")
    table["seed"] = table["seed"].astype("Int64")
    for name, own in table.groupby("model", sort=False):
        interp.plots.save_figure(interp.plots.specialisation_figure(own, data=own.data.iloc[0]),
                                 out / f"specialisation_{name}.png")


if __name__ == "__main__":
    import sys

    redraw(Path(sys.argv[sys.argv.index("--redraw") + 1])) if "--redraw" in sys.argv else main()
