"""Frequency profiles, head families and the q-bias shift on real models: dinov2-s14 and the
digits pair over the 2D patch grid, MiniLM-L6 and SmolLM2-135M over the token axis (mean
attention distance in tokens, sink mass on the first token, 1D spectra).

    python -m experiments.frequency_real --out docs/results [--models minilm-l6 smollm2-135m]
    python -m experiments.frequency_real --out docs/results --redraw   # the PNGs from the CSVs there (no model)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import interp
from interp.io import write_table
from interp.figures.plots import attention_distance_figure, cluster_grid_figure, save_figure, spectrum_clustermap

RUNS = {"dinov2-s14": "photos", "digits-vit": "digits", "digits-vit-nobias": "digits",
        "minilm-l6": "python-docs", "smollm2-135m": "python-docs"}


def figures(clustered: pd.DataFrame, name: str) -> dict:
    """The PNGs of one model (name -> figure), from its clustered profile: the run's, or its CSV (``--redraw``)."""
    return {"spectrum_clustermap": spectrum_clustermap(clustered, name),
            "attention_distance": attention_distance_figure(clustered, name),
            "clusters": cluster_grid_figure(clustered, name)}


def redraw(folder: Path, name: str) -> dict:
    """``figures`` from ``folder``'s frequency_profile.csv (no model, no data)."""
    return figures(pd.read_csv(folder / "frequency_profile.csv"), name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/frequency")
    ap.add_argument("--models", nargs="*", default=list(RUNS))
    ap.add_argument("--max-batches", type=int, default=3)
    ap.add_argument("--redraw", action="store_true", help="only the figures, from the CSVs in --out/<model>")
    args = ap.parse_args()
    for name in args.models:
        if args.redraw:
            for key, fig in redraw(Path(args.out) / name, name).items():
                print("wrote", save_figure(fig, Path(args.out) / name / f"{key}.png"))
            continue
        out = Path(args.out) / name
        model = interp.load_model(name)
        data = RUNS[name]
        has_q_bias = bool(interp.bias_spec(model).query("kind == 'q'").present.any())
        shift = interp.frequency_shift_under_ablation(model, data, kinds=("q",), max_batches=args.max_batches) \
            if has_q_bias else None  # SmolLM2 has no bias to remove
        intact = interp.frequency_profile(model, data, max_batches=args.max_batches)
        clustered = interp.cluster_heads(intact)
        write_table(clustered, out / "frequency_profile")
        if shift is not None:
            write_table(shift, out / "frequency_shift_q_bias")
        for key, fig in figures(clustered, name).items():
            save_figure(fig, out / f"{key}.png")
        print(f"== {name}: k={clustered.k.iloc[0]} silhouette {clustered.silhouette_mean.iloc[0]:.3f}")
        print("mean attention distance per layer:",
              clustered.groupby("layer").mean_attention_distance.mean().round(1).to_dict())
        print(clustered.groupby("cluster")[["hf_ratio", "mean_attention_distance", "sink_mass"]].mean().round(3).to_string())
        if shift is not None:
            print("q-bias removal: mean |delta hf_ratio| %.4f, mean delta distance %.2f (max |.| %.2f)" % (
                shift.delta_hf_ratio.abs().mean(), shift.delta_mean_attention_distance.mean(),
                shift.delta_mean_attention_distance.abs().max()))


if __name__ == "__main__":
    main()
