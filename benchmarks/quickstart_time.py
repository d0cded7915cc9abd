"""Time README's "Ten lines" quickstart as a script, line by line (wall seconds, this machine).

Usage: HF_HUB_OFFLINE=1 python benchmarks/quickstart_time.py [--readme README.md]
Prints each line's seconds and the total; nothing is written.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path


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
    args = parser.parse_args()
    scope: dict = {}
    total = time.perf_counter()
    for line in quickstart_lines(args.readme):
        t0 = time.perf_counter()
        exec(compile(line, "<quickstart>", "exec"), scope)  # noqa: S102 - README's own code
        print(f"{time.perf_counter() - t0:7.1f} s  {line[:90]}", flush=True)
    print(f"{time.perf_counter() - total:7.1f} s  total")


if __name__ == "__main__":
    main()
