"""Origin shift, score decomposition and invariances on the real zoo models; CSV + PNG.

    python -m experiments.analyze_real --out out/real
    python -m experiments.analyze_real --out docs/results --redraw   # the PNGs from the CSVs there (no model)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import interp
from interp.data import builtin_batches
from interp.io import write_table
from interp.figures.plots import key_prior_share_figure, origin_shift_figures, save_figure

RUNS = {"minilm-l6": "python-docs", "smollm2-135m": "python-docs", "dinov2-s14": "photos"}


def figures(origin: pd.DataFrame, decomposition: pd.DataFrame, name: str) -> dict:
    """The PNGs of one model (name -> figure), from its tables: the run's, or the CSVs it wrote (``--redraw``)."""
    return {**origin_shift_figures(origin, name), "key_prior_share": key_prior_share_figure(decomposition, name)}


def redraw(folder: Path, name: str) -> dict:
    """``figures`` from ``folder``'s origin_shift.csv and score_decomposition.csv (no model, no data)."""
    return figures(pd.read_csv(folder / "origin_shift.csv"), pd.read_csv(folder / "score_decomposition.csv"), name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/real")
    ap.add_argument("--models", nargs="*", default=list(RUNS))
    ap.add_argument("--redraw", action="store_true", help="only the figures, from the CSVs in --out/<model>")
    args = ap.parse_args()
    for name in args.models:
        if args.redraw:
            for key, fig in redraw(Path(args.out) / name, name).items():
                print("wrote", save_figure(fig, Path(args.out) / name / f"{key}.png"))
            continue
        t = time.time()
        out = Path(args.out) / name
        model = interp.load_model(name)
        data = builtin_batches(model, RUNS[name], batch_size=4, n=16 if name != "dinov2-s14" else 12)
        stats = interp.record_qkv(model, data)
        origin = interp.origin_shift(model, stats)
        dec = interp.score_decomposition(model, data[:2])
        inv = interp.bias_invariances(model, data[:1])
        for df, stem in ((origin, "origin_shift"), (dec, "score_decomposition"), (inv, "bias_invariances")):
            write_table(df, out / stem)
        for key, fig in figures(origin, dec, name).items():
            save_figure(fig, out / f"{key}.png")
        print(f"== {name} ({time.time() - t:.0f}s, {stats.count(0)} tokens)")
        print(origin.groupby("kind")[["bias_norm", "shift_ratio", "bias_share", "data_origin_norm"]].median().round(3).to_string())
        top = origin.sort_values("shift_ratio", ascending=False).head(3)
        print("largest shift ratios:", top[["layer", "head", "kind", "shift_ratio"]].to_dict("records"))
        print(dec.groupby("term").share.mean().round(4).to_string())
        print(inv.groupby("check").max_abs_diff.max().to_string())


if __name__ == "__main__":
    main()
