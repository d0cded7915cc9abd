"""Time ``interp ablate --model minilm-l6`` on a 50-sentence JSONL corpus (issue 25's goal: <= 1.5 min on
2 cores), as a researcher would run it: the command line, default options.

Usage: HF_HUB_OFFLINE=1 python benchmarks/cli_ablate_time.py [--sentences 50] [--model minilm-l6]
The sentences are the first ones of the built-in python-docs text (Python's own docstrings); the corpus
and the output go to a temporary folder; prints the wall time and the rows' estimate counts.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from interp.data import python_docs_text


def sentences(n: int) -> list[str]:
    """The first ``n`` sentences of 6 to 40 words in the python-docs text."""
    found = []
    for s in re.split(r"(?<=[.!?])\s+", " ".join(python_docs_text().split())):
        if 6 <= len(s.split()) <= 40:
            found.append(s)
        if len(found) == n:
            return found
    raise SystemExit(f"only {len(found)} sentences found")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=50)
    parser.add_argument("--model", default="minilm-l6")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences(args.sentences)))
        command = [sys.executable, "-m", "interp.cli", "ablate", "--model", args.model, "--data", str(corpus),
                   "--out", str(Path(tmp) / "out")]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        rows = pd.read_csv(Path(tmp) / "out" / "ablation.csv")
    print(f"interp ablate --model {args.model} on {args.sentences} sentences: {seconds:.1f} s wall")
    print(rows.estimate.value_counts().to_string())


if __name__ == "__main__":
    main()
