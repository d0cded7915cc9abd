"""The side-by-side comparisons kept in docs/results/compare/: MiniLM-L6 (q, k, v, o biases) beside SmolLM2-135M
(none) on the same 16 Python-docs paragraphs, and the shipped digits ViT with and without QKV bias on the same 64
digits. Each folder is what ``interp compare`` writes, less compare.csv where it is over 300 kB (compare.parquet
holds the same table, exactly).

    python -m experiments.compare_real                  # both runs (the LM pair: ~6 CPU-minutes)
    python -m experiments.compare_real --redraw         # figure, summary and report again from the kept tables
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from interp.compare import compare_models, write_comparison

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "compare"
RUNS = {"minilm-vs-smollm2": (["minilm-l6", "smollm2-135m"], "python-docs", None),
        "digits-vit-bias": (["digits-vit", "digits-vit-nobias"], "digits", 64)}
MAX_CSV_BYTES = 300_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redraw", action="store_true", help="read each folder's compare.parquet instead of running")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    for name, (models, data, n_items) in RUNS.items():
        out = OUT / name
        if args.redraw:
            table = pd.read_parquet(out / "compare.parquet")
        else:
            table = compare_models(models, data, n_items=n_items, device=args.device)
        line = f"interp compare {' '.join('--model ' + m for m in models)} --data {data}" + \
            (f" --max-items {n_items}" if n_items else "") + f" --device {args.device}"
        write_comparison(table, out, dict(model_sources=models, data=data, command_line=line,
                                          redrawn_from_kept_table=args.redraw))
        if (out / "compare.csv").stat().st_size > MAX_CSV_BYTES:
            (out / "compare.csv").unlink()
        (out / ".interp-started").unlink(missing_ok=True)
        print((out / "report.md").read_text())


if __name__ == "__main__":
    main()
