"""Issue 37: the sink experiment's heads against their floor, from the stored heads.csv (no training).

    python -m experiments.sink_floor_tables

For each of docs/results/sinks, sinks_long and sinks_text: ``experiments.training.sink_results.floor_heads``
(the stored masses re-expressed without the position's own query row: exact where that row's mass is 1
by construction, else bounds; the uniform-attention floors) and ``sink_report.floor_table`` into
``floor.md``, which docs/findings.md section 4c quotes (experiments/tests/test_sink_floor_tables.py keeps
them equal). A second or so per folder.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from interp.io import atomic_path
from experiments.training.sink_report import floor_table
from experiments.training.sink_results import floor_heads
from experiments.training.sinks import TextRecipe

FOLDERS = ("sinks", "sinks_long", "sinks_text")


def main() -> None:
    for name in FOLDERS:
        out = Path("docs/results") / name
        table = floor_table(floor_heads(pd.read_csv(out / "heads.csv"), TextRecipe().shape.context))
        with atomic_path(out / "floor.md") as tmp:
            tmp.write_text(table + "\n")
        print(f"{out / 'floor.md'}\n{table}\n")


if __name__ == "__main__":
    main()
