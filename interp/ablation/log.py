"""The resumable sweep log: finished variants, one JSON line each, in ``<out>/ablation.jsonl``.

The first line is the run's fingerprint (model weights, data, max_batches, metric,
library version). A rerun with the same fingerprint resumes; any other run refuses to
mix its rows with these (or, with ``overwrite=True``, starts a new log).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from interp.errors import InputError, StaleResultsError
from interp.io import append_line, atomic_path, fault_point

HEADER = "_fingerprint"


class ResultLog:
    """Append-only JSONL of finished variants; a torn last line (killed mid-write) is dropped.

    On open, the readable lines are kept and the file is rewritten atomically without the
    torn one, so a kill during that rewrite loses nothing either. Only a log of ours is ever replaced: a torn
    line is only what a crash of ours leaves (a last line without its newline); a complete line that is not JSON,
    or a file that does not open with a fingerprint of ours, is refused and kept as it is, even with
    ``overwrite=True`` (which replaces a log of another run of ours, never a file someone else wrote).
    """

    def __init__(self, path: Optional[Path], fingerprint: dict, overwrite: bool = False,
                 optional: frozenset = frozenset()):
        """``optional``: fingerprint keys a run may leave out, the options that apply to some estimates only (a run
        of another estimate does not fingerprint them: its rows do not depend on them); the log keeps their value
        from the run that bound them, and every other key must be on both sides and equal."""
        self.path = path
        self.fingerprint = fingerprint
        self.optional = optional
        self.rows: dict[str, dict] = {}
        if path is None:
            return
        lines = []
        if path.exists() or path.is_symlink():
            text = _read_text(path)
            header = self._header(path, text)
            lines = [] if overwrite else self._read(path, text, header)
            if not overwrite:  # an option this run does not fingerprint (it does not apply to its estimate) but
                # the log's rows were computed with: kept in the header, so a later run is checked against it
                self.fingerprint = fingerprint = {
                    **{k: v for k, v in header.items() if k not in fingerprint and k in optional}, **fingerprint}
        with atomic_path(path) as tmp:
            tmp.write_text("".join(line + "\n" for line in [json.dumps({HEADER: fingerprint})] + lines))

    @staticmethod
    def _header(path: Path, text: str) -> dict:
        """The fingerprint the log opens with, or one refusal: a file that does not open with one is not ours."""
        first = text.split("\n", 1)[0]
        try:
            header = json.loads(first)
        except ValueError:
            header = None
        found = header.get(HEADER) if isinstance(header, dict) else None
        if not isinstance(found, dict) or "\n" not in text:
            raise StaleResultsError(f"{path} was written without a fingerprint of interp (by an older interp, or not "
                                    "by interp: its first line is not one): interp replaces only a log it wrote, "
                                    "even with overwrite=True; move the file away or use another --out folder")
        return found

    def _read(self, path: Path, text: str, header: dict) -> list[str]:
        good = []
        lines = text.split("\n")
        torn = lines.pop()  # "" when the file ends with its newline; else a last write cut short by a crash
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except ValueError:
                raise StaleResultsError(f"{path}, line {number}: unreadable (not JSON, though the line is complete: "
                                        "not a torn write of ours); the log is damaged and kept as it is: use another "
                                        "--out folder or move the file away") from None
            if number == 1:
                self._check(path, header)
                continue
            if not isinstance(row, dict) or "_key" not in row:
                raise StaleResultsError(f"{path}, line {number}: not a result row of interp; "
                                        "move the file away or use another --out folder")
            self.rows[row["_key"]] = row
            good.append(line)
        if torn:
            try:
                row = json.loads(torn)
            except ValueError:
                row = None  # a torn last write from a killed run: dropped
            if isinstance(row, dict) and "_key" in row:  # whole but for its newline: kept
                self.rows[row["_key"]] = row
                good.append(torn)
        return good

    def _check(self, path: Path, found: dict) -> None:
        # a key on one side only is an option that does not apply to one of the two runs' estimates (attribution
        # rows do not depend on n_control): not a difference; every key both runs bind must be equal
        differ = sorted(k for k in set(found) | set(self.fingerprint) if found.get(k) != self.fingerprint.get(k) and (
            (k in found and k in self.fingerprint) or k not in self.optional))
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


def _read_text(path: Path) -> str:
    """The log's text (bytes that are not UTF-8 kept as surrogates, so a damaged line is named, not misread), or one
    ``InputError`` when ``path`` is a folder or cannot be read."""
    if not path.is_file():
        raise InputError(f"{path} is {'a folder' if path.is_dir() else 'not a regular file'}, where the sweep log "
                         "goes: move it away or pass another out= folder")
    try:
        return path.read_bytes().decode("utf-8", errors="surrogateescape")
    except OSError as exc:
        raise InputError(f"{path} cannot be read ({exc.strerror or exc}): fix its permissions or pass another out= "
                         "folder") from None
