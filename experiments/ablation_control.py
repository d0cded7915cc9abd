"""The matched control on MiniLM: which of the top zero-ablation heads stay bias-dependent.

    python -m experiments.ablation_control            # writes docs/results/minilm-l6/ablation_control.csv

One run of ``ablate_bias(estimate="auto")`` zeroing each q/k/v bias of minilm-l6 on the built-in Python
documentation (``--batches`` batches of 8 texts), with its matched control (19 random directions of each head's own
displacement norm), and, on the same exact heads (chosen by one rule whatever the method), the old
``method="random"`` replacement (a displacement of about sqrt(2)|b|) for comparison. The table holds the exact rows:
delta, the control band, control_p, bias_dependent and the random replacement's delta (``random_delta``).

The CSV was written under the earlier rule: 19 fixed draws, each head called at its own control_p <= 0.05. The
draws are the same with ``control_stop=0`` (below); a rerun now reads control_p from the normal tail and adjusts
bias_dependent across the heads (Benjamini-Hochberg). The defaults' table (early stop, normal tail, adjusted p) is
``docs/results/minilm-l6/ablation_fdr.csv`` (``benchmarks/control_calibration.py --cost``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import interp
from interp.data import builtin_batches
from interp.io import write_table

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "minilm-l6" / "ablation_control"
COLUMNS = ["layer", "head", "kind", "exact_because", "delta", "delta_lo", "delta_hi", "displacement_norm", "control_lo",
           "control_hi", "control_p", "n_control", "bias_dependent", "random_delta", "random_displacement_norm",
           "metric", "baseline", "model_fingerprint", "data_fingerprint"]


def control_table(model: interp.InterpBridge, batches: list, n_control: int = 19) -> pd.DataFrame:
    """The exact rows of a zero sweep (auto) with their matched control, joined with the random replacement's."""
    zero = interp.ablate_bias(model, batches, method="zero", n_control=n_control, control_stop=0, progress=False)
    random = interp.ablate_bias(model, batches, method="random", n_control=0, progress=False)
    key = ["layer", "head", "kind"]
    exact = zero[(zero.estimate == "exact") & (zero.identity == "")]
    other = random[(random.estimate == "exact") & (random.identity == "")].set_index(key)
    joined = exact.join(other[["delta", "displacement_norm"]].rename(
        columns=lambda c: f"random_{c}"), on=key)
    return joined.sort_values("delta", key=abs, ascending=False)[COLUMNS].reset_index(drop=True)


def summary(table: pd.DataFrame, top: int = 10) -> dict:
    """Of the ``top`` exact heads by |delta|: how many are bias-dependent under the matched control, and how many
    the random replacement moved as much or more (the old reading)."""
    head = table.head(top)
    return dict(top=len(head), bias_dependent=int(head.bias_dependent.sum()),
                random_as_large=int((head.random_delta.abs() >= head.delta.abs()).sum()),
                tested=len(table), bias_dependent_all=int(table.bias_dependent.sum()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    model = interp.load_model("minilm-l6")
    batches = builtin_batches(model, "python-docs", batch_size=8, n=8 * args.batches)
    table = control_table(model, batches)
    write_table(table, args.out)
    print(table.to_string(index=False, max_colwidth=12))
    print(summary(table))


if __name__ == "__main__":
    main()
