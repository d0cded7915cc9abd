"""How differently heads filter, with intervals: the hf_ratio spread (std over heads) per model, bootstrapped over items.

    python -m experiments.hf_spread     # docs/results/families/hf_spread.csv and hf_spread_differences.csv

Pairs compared on the same items (paired resamples, 200, seed 0): MiniLM-L6 and SmolLM2-135M on 24 Python-docs
texts (64 tokens), the MNIST trio (with q, k, v bias / without / q and v only) on 256 test images, the digits pair.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import interp
from interp.io import write_table

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "families"
GROUPS = {"python-docs": (("minilm-l6", "smollm2-135m"), 24),
          "mnist": (("mnist-vit", "mnist-vit-nobias", "mnist-vit-qv"), 256),
          "digits": (("digits-vit", "digits-vit-nobias"), 256)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--n-boot", type=int, default=200)
    args = ap.parse_args()
    rows, diffs = [], []
    for data, (names, n) in GROUPS.items():
        spreads = {}
        for name in names:
            model = interp.load_model(name, device="cpu")
            batches = interp.builtin_batches(model, data, batch_size=8 if data == "python-docs" else 64, n=n)
            spreads[name] = interp.spread_interval(model, batches, n_boot=args.n_boot, progress=False)
            rows.append(spreads[name].assign(data=data))
        first = spreads[names[0]]
        diffs += [interp.spread_difference(first, spreads[other]).assign(data=data) for other in names[1:]]
    table, differences = pd.concat(rows, ignore_index=True), pd.concat(diffs, ignore_index=True)
    write_table(table, args.out / "hf_spread")
    write_table(differences, args.out / "hf_spread_differences")
    print(table.to_string(index=False))
    print(differences.to_string(index=False))


if __name__ == "__main__":
    main()
