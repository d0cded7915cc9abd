"""Zero and mean bias-ablation sweeps on minilm-l6, dinov2-s14 and the digits pair.

    python -m experiments.ablate_real --out out/ablate
    python -m experiments.ablate_real --out docs/results --redraw   # the PNGs from the CSVs there (no model)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import interp
from interp.data import builtin_batches
from interp.io import write_table
from interp.figures.plots import ablation_figures, save_figure

RUNS = {"minilm-l6": "python-docs", "dinov2-s14": "photos", "digits-vit": "digits", "digits-vit-nobias": "digits"}


def redraw(folder: Path, name: str) -> dict:
    """The PNGs of one model (name -> figure) from ``folder``'s ablation.csv (no model, no data)."""
    return ablation_figures(pd.read_csv(folder / "ablation.csv"), name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/ablate")
    ap.add_argument("--models", nargs="*", default=list(RUNS))
    ap.add_argument("--redraw", action="store_true", help="only the figures, from the CSVs in --out/<model>")
    args = ap.parse_args()
    for name in args.models:
        if args.redraw:
            for key, fig in redraw(Path(args.out) / name, name).items():
                print("wrote", save_figure(fig, Path(args.out) / name / f"{key}.png"))
            continue
        model = interp.load_model(name)
        batches = builtin_batches(model, RUNS[name], batch_size=8, n=8 if name != "digits-vit" else None)[:1]
        frames = []
        for method in ("zero", "mean"):
            frames.append(interp.ablate_bias(model, batches, kinds=("q", "k", "v"), method=method,
                                             out=Path(args.out) / name, progress=False, estimate="exact"))
        res = pd.concat(frames, ignore_index=True)
        write_table(res, Path(args.out) / name / "ablation")
        for key, fig in ablation_figures(res, name).items():
            save_figure(fig, Path(args.out) / name / f"{key}.png")
        if res.empty:
            print(f"== {name}: no biases to ablate")
            continue
        print(f"== {name} ({res.metric.iloc[0]}, baseline {res.baseline.iloc[0]:.4f})")
        print(res.groupby(["method", "kind"]).delta.agg(lambda d: d.abs().max()).unstack().to_string())
        top = res.assign(a=res.delta.abs()).nlargest(3, "a")
        print("top:", [(int(r.layer), int(r["head"]), r.kind, r.method, round(r.delta, 4)) for _, r in top.iterrows()])


if __name__ == "__main__":
    main()
