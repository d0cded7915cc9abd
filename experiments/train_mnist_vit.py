"""The controlled MNIST experiment, in full: every variant (q/k/v bias; none; q and v only) for
every seed, the per-seed table, the summary README quotes, and the shipped seed-0 weights.

    python -m experiments.train_mnist_vit [--seeds 0 1 2 3 4] [--epochs 3] [--no-ship]
    python -m experiments.train_mnist_vit --summarise-only     # the summary and figure from seeds.csv

Writes ``docs/results/mnist_vit/seeds.csv`` (after every run, atomically) and
``docs/results/mnist_vit/summary.csv`` (``experiments.training.mnist_vit.summarise``: test accuracy
mean and 95% t-interval per variant, and the paired difference to the q/k/v variant by seed)
and ``accuracy.png`` (every seed, paired, with the means and their intervals).
About 2 min per run on 2 CPU cores at 3 epochs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402

from interp.io import atomic_path  # noqa: E402
from experiments.training.mnist_vit import run_seeds, summarise  # noqa: E402
from interp.figures.plots import save_figure  # noqa: E402


def accuracy_figure(seeds: pd.DataFrame, summary: pd.DataFrame) -> plt.Figure:
    df = seeds.assign(accuracy_pct=seeds.test_accuracy * 100)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.lineplot(data=df, x="variant", y="accuracy_pct", units="seed", estimator=None, marker="o", color="0.65",
                 lw=0.8, ax=ax)
    s = summary.set_index("variant")
    ax.errorbar(range(len(s)), s.accuracy_pct, yerr=[s.accuracy_pct - s.ci95_low, s.ci95_high - s.accuracy_pct],
                fmt="s", color="C3", capsize=6, label="mean and 95% t-interval")
    ax.set_xticks(range(len(s)), ["q, k, v bias", "no QKV bias", "q and v bias\n(b_k held at 0)"])
    ax.set_xlabel("attention biases (same recipe, init and data order per seed)")
    ax.set_ylabel("MNIST test accuracy (%, 10,000 images)")
    ax.set_title(f"Small ViT on MNIST, {int(s.n_seeds.min())} seeds, {int(seeds.epochs.iloc[0])} epochs: "
                 "grey lines pair seeds")
    ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--no-ship", action="store_true", help="do not replace the shipped seed-0 weights")
    ap.add_argument("--out", default="docs/results/mnist_vit")
    ap.add_argument("--summarise-only", action="store_true", help="no training: summary and figure from seeds.csv")
    args = ap.parse_args()
    torch.set_num_threads(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.summarise_only:
        seeds = pd.read_csv(out / "seeds.csv")
    else:
        seeds = run_seeds(args.seeds, args.epochs, None if args.no_ship else args.seeds[0], out / "seeds.csv")
    summary = summarise(seeds)
    with atomic_path(out / "summary.csv") as tmp:
        summary.to_csv(tmp, index=False)
    save_figure(accuracy_figure(seeds, summary), out / "accuracy.png")
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
