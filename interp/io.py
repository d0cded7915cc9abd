"""Atomic file writes: a reader never sees a half-written table, figure or stats file."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Union

import pandas as pd
from safetensors import SafetensorError

from interp.errors import InterpError

PathLike = Union[str, os.PathLike]


class OutputError(InterpError, OSError):
    """An output file or folder could not be written (read-only path, full disk, ...)."""


FAULT_ENV = "INTERP_FAULT"


def fault_point(name: str) -> None:
    """Crash tests' hook: when ``$INTERP_FAULT`` equals ``name``, this process kills itself (SIGKILL)
    here, so a test hits the worst moment every time instead of racing a timer. Names in use:
    ``before-replace:<file name>`` (a whole temporary written, not yet renamed over the file) and
    ``after-row:<n>`` (the n-th result row appended to an ablation log)."""
    if os.environ.get(FAULT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _fix(path: Path, exc: BaseException) -> str:
    """What to do about a failed write into ``path``'s folder."""
    text = f"{_why(exc)} {exc}".lower()
    if getattr(exc, "errno", None) == errno.ENOSPC or "no space" in text or "storagefull" in text:
        return f"the disk holding {path.parent} is full: free space there or choose another output folder"
    if getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS) or "permission" in text:
        return f"{path.parent} is not writable: choose another output folder"
    return f"check that {path.parent} is a writable folder with free space, or choose another output folder"


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only on success.

    Any failure to write (a full disk, a read-only folder; ``OSError`` or safetensors'
    ``SafetensorError``) raises ``OutputError`` naming the folder and the fix, and leaves
    nothing partial behind."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a writer killed mid-write (SIGKILL) leaves its temporary behind: sweep those up
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write to output folder {path.parent}: {_why(exc)} ({_fix(path, exc)})") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        try:
            yield tmp_path
            with open(tmp_path, "rb") as fh:
                os.fsync(fh.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; give the usual mode
            fault_point(f"before-replace:{path.name}")
            os.replace(tmp_path, path)
        except (OSError, SafetensorError) as exc:
            raise OutputError(f"writing {path} failed ({_why(exc)}); nothing was written: {_fix(path, exc)}") from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def append_line(path: PathLike, line: str) -> None:
    """Append ``line`` and a newline to ``path``, flushed and fsynced (a resumable log); a failed write
    (a full disk) is ``OutputError`` naming the folder and the fix. A torn last line is the reader's
    to drop."""
    path = Path(path)
    try:
        with open(path, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise OutputError(f"appending to {path} failed ({_why(exc)}): {_fix(path, exc)}; rerun to resume") from None


def sha256_file(path: PathLike) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_table(df: pd.DataFrame, stem: PathLike) -> tuple[Path, Path]:
    """Write ``stem.csv`` and ``stem.parquet`` atomically; return both paths."""
    stem = Path(stem)
    csv, parquet = stem.with_suffix(".csv"), stem.with_suffix(".parquet")
    with atomic_path(csv) as tmp:
        df.to_csv(tmp, index=False)
    with atomic_path(parquet) as tmp:
        df.to_parquet(tmp, index=False)
    return csv, parquet


STARTED = ".interp-started"  # touched when a command begins writing: its mtime bounds what the command wrote
MANIFEST = "manifest.json"
_begun: dict[Path, str] = {}  # folders this process has begun, with the command writing there (the first start counts)


def manifest_entries(out: PathLike) -> list[dict]:
    """Every command's entry in ``out``'s manifest (``command``, ``meta``, ``files``), oldest first; a manifest
    of one command (the format before ``commands``) is one entry; none, or one interp did not write: []."""
    path = Path(out) / MANIFEST
    try:
        manifest = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return []
    if not isinstance(manifest, dict):
        return []
    entries = manifest.get("commands")
    if entries is None and isinstance(manifest.get("meta"), dict):
        entries = [dict(command=manifest["meta"].get("command"), meta=manifest["meta"],
                        files=manifest.get("files") or {})]
    return [e for e in entries or [] if isinstance(e, dict) and isinstance(e.get("files", {}), dict)]


def write_manifest_entries(out: PathLike, entries: list[dict]) -> Optional[Path]:
    """``out``'s manifest holding ``entries`` (the last one's ``meta`` and ``files`` also at the top, where
    readers of one command's manifest look), written atomically; removed when there are none."""
    path = Path(out) / MANIFEST
    if not entries:
        path.unlink(missing_ok=True)
        return None
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(dict(meta=entries[-1]["meta"], files=entries[-1]["files"], commands=entries),
                                  indent=2))
    return path


def check_output_folder(out: PathLike) -> Path:
    """``out`` as a folder a command can write into (made when absent), checked before any work: a file there
    (or above it), a folder that is not writable, or a ``manifest.json`` that is not JSON (it would be lost) is
    one ``OutputError`` naming the fix."""
    out = Path(out)
    above = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not above.is_dir():
        raise OutputError(f"output folder {out}: {above} is a file, not a folder: choose a folder (it is made when "
                          "absent)")
    if not os.access(above, os.W_OK | os.X_OK):
        raise OutputError(f"output folder {out}: {above} is not writable: choose another output folder")
    manifest = out / MANIFEST
    try:
        if manifest.exists() and not isinstance(json.loads(manifest.read_text()), dict):
            raise ValueError("JSON, but not an object")
    except (OSError, ValueError) as exc:
        raise OutputError(f"{manifest} is not a manifest interp wrote ({_why(exc)}), and a command would replace it: "
                          "move it away, or choose another output folder") from None
    return out


def begin_outputs(out: PathLike, command: Optional[str] = None) -> None:
    """Start ``command`` writing into ``out``: its entry in the folder's manifest is removed (until its new
    one lands, its part of the folder is incomplete; other commands' entries stay), and the start is marked,
    so that its entry lists only files it wrote, not earlier commands' files. A second begin of the same
    command in one process (the demo begins twice) keeps the first start."""
    out = check_output_folder(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        begun = _begun.get(out.resolve())
        if begun is None or (command and begun and command != begun):  # a new command (another one: anew)
            (out / STARTED).unlink(missing_ok=True)
            (out / STARTED).touch()
            _begun[out.resolve()] = command or ""
        mine = _begun[out.resolve()] = _begun[out.resolve()] or command or ""
        entries = manifest_entries(out)
        kept = [e for e in entries if e.get("command") != mine and e.get("command")]
        if len(kept) != len(entries) or (not entries and (out / MANIFEST).exists()):  # {}: not ours, stale
            write_manifest_entries(out, kept)
    except OSError as exc:
        raise OutputError(f"cannot write to output folder {out}: {exc.strerror or exc}") from None


def command_of(out: PathLike) -> str:
    """The command this process began in ``out`` ("" when none was named or none began)."""
    return _begun.get(Path(out).resolve(), "")


def refuse_overwriting(out: PathLike, names: list[str], command: str) -> None:
    """Refuse to write files ``names`` into ``out`` where another command's manifest entry lists one: its
    results would be replaced and then blamed on this command's data. Nothing is written."""
    for entry in manifest_entries(out):
        if entry.get("command") and entry.get("command") != command:
            taken = sorted(set(names) & set(entry.get("files", {})))
            if taken:
                more = f", with {len(taken) - 1} more of its files" if len(taken) > 1 else ""
                raise OutputError(
                    f"{Path(out) / taken[0]} holds the results of 'interp {entry['command']}' (listed in "
                    f"{Path(out) / MANIFEST}{more}); "
                    f"'{command or 'this command'}' would replace them: choose another --out folder, or remove "
                    "that command's files and its entry first")


def written_since_begin(out: PathLike) -> list[Path]:
    """Files of ``out`` written since ``begin_outputs`` (all files when it was not called), marker excluded."""
    out = Path(out)
    marker = out / STARTED
    since = marker.stat().st_mtime_ns if marker.exists() else 0
    return [p for p in sorted(out.rglob("*")) if p.is_file() and p.name != STARTED
            and not p.name.endswith(".tmp") and p.stat().st_mtime_ns >= since]


def forget_outputs(out: PathLike) -> None:
    """This command is done with ``out``: the next ``begin_outputs`` starts a new command there."""
    _begun.pop(Path(out).resolve(), None)
