"""The resumable sweep log: finished variants, one JSON line each, in ``<out>/ablation.jsonl``.

The first line is the run's fingerprint (model weights, data, max_batches, metric,
library version). A rerun with the same fingerprint resumes; any other run refuses to
mix its rows with these (or, with ``overwrite=True``, starts a new log).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from interp.errors import StaleResultsError
from interp.io import append_line, atomic_path, fault_point

HEADER = "_fingerprint"


class ResultLog:
    """Append-only JSONL of finished variants; a torn last line (killed mid-write) is dropped.

    On open, the readable lines are kept and the file is rewritten atomically without the
    torn one, so a kill during that rewrite loses nothing either.
    """

    def __init__(self, path: Optional[Path], fingerprint: dict, overwrite: bool = False):
        self.path = path
        self.fingerprint = fingerprint
        self.rows: dict[str, dict] = {}
        if path is None:
            return
        lines = [] if overwrite or not path.exists() else self._read(path)
        with atomic_path(path) as tmp:
            tmp.write_text("".join(line + "\n" for line in [json.dumps({HEADER: fingerprint})] + lines))

    def _read(self, path: Path) -> list[str]:
        good = []
        lines = path.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except ValueError:
                if number == len(lines):
                    continue  # a torn last write from a killed run
                raise StaleResultsError(f"{path}, line {number}: unreadable (not JSON); the log is damaged: use "
                                        "another --out folder or overwrite=True (--overwrite)") from None
            if number == 1:
                self._check(path, row)
                continue
            if not isinstance(row, dict) or "_key" not in row:
                raise StaleResultsError(f"{path}, line {number}: not a result row of interp; "
                                        "move the file away or pass overwrite=True (--overwrite)")
            self.rows[row["_key"]] = row
            good.append(line)
        return good

    def _check(self, path: Path, header: object) -> None:
        found = header.get(HEADER) if isinstance(header, dict) else None
        if found is None:
            raise StaleResultsError(f"{path} was written without a fingerprint (by an older interp, or not by "
                                    "interp): its rows cannot be trusted for this run; use another --out folder or "
                                    "overwrite=True (--overwrite)")
        differ = sorted(k for k in set(found) | set(self.fingerprint) if found.get(k) != self.fingerprint.get(k))
        if any("#unfingerprintable-" in str(v) for v in (found.get("metric"), self.fingerprint.get("metric"))):
            raise StaleResultsError(f"{path}: the metric captures a value interp cannot hash (an object without a "
                                    "stable content), so its rows cannot be matched to this run's metric: use "
                                    "another --out folder, overwrite=True, or a metric capturing only numbers, "
                                    "strings, tensors or arrays")
        if differ:
            details = "; ".join(f"{k}: {found.get(k)!r} there, {self.fingerprint.get(k)!r} now" for k in differ)
            raise StaleResultsError(f"{path} holds results of another run ({details}); refusing to mix them: use "
                                    "another --out folder, or overwrite=True (--overwrite) to start afresh")

    def add(self, row: dict) -> None:
        self.rows[row["_key"]] = row
        if self.path is None:
            return
        append_line(self.path, json.dumps(row))
        fault_point(f"after-row:{len(self.rows)}")
