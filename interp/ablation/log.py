"""The resumable sweep log: finished variants, one JSON line each, in ``<out>/ablation.jsonl``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from interp.io import atomic_path


class ResultLog:
    """Append-only JSONL of finished variants; a torn last line (killed mid-write) is dropped.

    On open, the readable lines are kept and the file is rewritten atomically without the
    torn one, so a kill during that rewrite loses nothing either.
    """

    def __init__(self, path: Optional[Path]):
        self.path = path
        self.rows: dict[str, dict] = {}
        if path is None or not path.exists():
            return
        good = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # torn write from a killed run
            self.rows[row["_key"]] = row
            good.append(line)
        with atomic_path(path) as tmp:
            tmp.write_text("".join(line + "\n" for line in good))

    def add(self, row: dict) -> None:
        self.rows[row["_key"]] = row
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
