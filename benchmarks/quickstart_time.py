"""Time README's "Ten lines" quickstart as a script, line by line (wall seconds, this machine).

Usage: HF_HUB_OFFLINE=1 python benchmarks/quickstart_time.py [--readme README.md] [--out CSV]
Prints each line's wall and CPU seconds (this process, all threads) and the total; ``--out`` writes them as a CSV
(``docs/results/quickstart/timing.csv``: one row per line and a ``total`` row, with the machine's cores and its
1-minute load average before and after the run, so a time measured under load says so).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import pandas as pd


def quickstart_lines(readme: Path) -> list[str]:
    """The statements of the first ```python block after '## Ten lines' (comments dropped)."""
    text = readme.read_text()
    block = re.search(r"## Ten lines\s+```python\n(.*?)```", text, re.S)
    if block is None:
        raise SystemExit("README has no '## Ten lines' python block")
    return [line.split("  #")[0].rstrip() for line in block.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=Path(__file__).resolve().parents[1] / "README.md")
    parser.add_argument("--out", type=Path, default=None, help="write the timings as this CSV")
    args = parser.parse_args()
    scope: dict = {}
    load_before, rows = os.getloadavg()[0], []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for line in quickstart_lines(args.readme):
        t0, c0 = time.perf_counter(), time.process_time()
        exec(compile(line, "<quickstart>", "exec"), scope)  # noqa: S102 - README's own code
        rows.append(dict(line=line, wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0))
        print(f"{rows[-1]['wall_s']:7.1f} s wall {rows[-1]['cpu_s']:7.1f} s CPU  {line[:90]}", flush=True)
    rows.append(dict(line="total", wall_s=time.perf_counter() - wall0, cpu_s=time.process_time() - cpu0))
    print(f"{rows[-1]['wall_s']:7.1f} s wall {rows[-1]['cpu_s']:7.1f} s CPU  total")
    table = pd.DataFrame(rows).assign(cores=os.cpu_count(), load_1min_before=load_before,
                                      load_1min_after=os.getloadavg()[0])
    print(f"load average (1 min) {load_before:.1f} before, {table.load_1min_after.iloc[0]:.1f} after, "
          f"{os.cpu_count()} cores")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.round(3).to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
