"""Figures of the implicit biases on the real zoo: token norms per layer with the high-norm tokens marked
(``interp.high_norm_tokens``), and the key-prior share of each sink (from the ``sink_profile`` with
``remove="key_prior"`` that ``experiments/sinks_real.py`` wrote).

Writes ``docs/results/<model>/sinks_high_norm.csv`` and ``docs/figures/<model>/{token_norms,key_prior_sinks}.png``
on the same data as ``sinks_real.py`` (2 batches of 4 items). Run: ``nice python tools/sink_figures.py``.

``--from-csv`` runs no model: it draws findings 4b's ``{sink_mass_grid,implicit_vs_explicit,massive_activations}.png``
from the ``sinks_{profile,implicit,massive}.csv`` that ``sinks_real.py`` wrote, and ``token_norms.png`` and
``key_prior_sinks.png`` from ``sinks_high_norm.csv`` and ``sinks_profile.csv`` (the figures of a run, redrawn).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import interp
from interp.figures.plots import (implicit_vs_explicit, key_prior_sink_plot, massive_activations_plot, save_figure,
                          sink_mass_grid, token_norm_plot)

ROOT = Path(__file__).resolve().parent.parent
DATA = {"minilm-l6": "python-docs", "smollm2-135m": "python-docs", "dinov2-s14": "photos"}
LABEL = {"python-docs": "Python documentation, 64-token windows", "photos": "built-in photos"}
SINK_FIGURES = {"sink_mass_grid": ("profile", sink_mass_grid), "implicit_vs_explicit": ("implicit", implicit_vs_explicit),
                "massive_activations": ("massive", massive_activations_plot), "token_norms": ("high_norm", token_norm_plot),
                "key_prior_sinks": ("profile", key_prior_sink_plot)}


def run_model(name: str, batches: int, batch_size: int, k: float) -> None:
    t0 = time.time()
    model = interp.load_model(name, device="cpu")
    data = interp.builtin_batches(model, DATA[name], batch_size=batch_size, n=batches * batch_size)[:batches]
    note = f"{LABEL[DATA[name]]}: {batches} batches of {batch_size}"
    frame = interp.high_norm_tokens(model, data, k=k, progress=False)
    (ROOT / "docs" / "results" / name).mkdir(parents=True, exist_ok=True)
    frame.assign(data=DATA[name], batch_size=batch_size).to_csv(ROOT / "docs" / "results" / name / "sinks_high_norm.csv",
                                                                index=False)
    figures = ROOT / "docs" / "figures" / name
    save_figure(token_norm_plot(frame, model_name=name, data=note), figures / "token_norms.png")
    profile_csv = ROOT / "docs" / "results" / name / "sinks_profile.csv"
    profile = pd.read_csv(profile_csv) if profile_csv.exists() else None
    if profile is not None and "mass_without_key_prior" in profile:  # sinks_real.py --remove
        save_figure(key_prior_sink_plot(profile, model_name=name, data=note), figures / "key_prior_sinks.png")
    per_layer = frame.drop_duplicates("layer")
    print(f"{name}: outliers (> {k:g} x median) per layer {per_layer.n_outliers.tolist()}, "
          f"max ratio {frame.ratio_to_median.max():.3g}, {time.time() - t0:.0f} s", flush=True)


def figures_from_csv(name: str, batch_size: int) -> None:
    """Findings 4b's three sink figures, the token norms and the key-prior sinks from
    ``docs/results/<name>/sinks_*.csv`` (no forward); ``batch_size`` where a CSV does not say it (the
    sinks_high_norm.csv written before it did)."""
    for figure, (table, draw) in SINK_FIGURES.items():
        frame = pd.read_csv(ROOT / "docs" / "results" / name / f"sinks_{table}.csv")
        if figure == "key_prior_sinks" and "mass_without_key_prior" not in frame:  # sinks_real.py without --remove
            continue
        row = frame.iloc[0]
        note = f"{LABEL.get(row.data, row.data)}: {row.n_batches} batches of {row.get('batch_size', batch_size)}"
        path = ROOT / "docs" / "figures" / name / f"{figure}.png"
        save_figure(draw(frame, model_name=name, data=note), path)
        print(f"{name}: wrote {path.relative_to(ROOT)}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DATA))
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--k", type=float, default=5.0, help="outlier cut: k x the layer's median norm")
    p.add_argument("--from-csv", action="store_true", help="draw every figure from the CSVs in "
                   "docs/results/<model> instead (no model run)")
    args = p.parse_args()
    for name in args.models.split(","):
        if args.from_csv:
            figures_from_csv(name, args.batch_size)
        else:
            run_model(name, args.batches, args.batch_size, args.k)


if __name__ == "__main__":
    main()
