"""Atomic file writes: a reader never sees a half-written table, figure or stats file."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union

import pandas as pd
from safetensors import SafetensorError

from interp.errors import InterpError

PathLike = Union[str, os.PathLike]


class OutputError(InterpError, OSError):
    """An output file or folder could not be written (read-only path, full disk, ...)."""


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
_begun: set[Path] = set()  # folders this process has begun (the demo begins twice: the first start counts)


def begin_outputs(out: PathLike) -> None:
    """Remove ``out``'s manifest before writing (until the new one lands, the folder is incomplete) and
    mark the start, so that the manifest lists only files this command wrote, not earlier commands' files."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if out.resolve() not in _begun:
            (out / STARTED).unlink(missing_ok=True)
            (out / STARTED).touch()
            _begun.add(out.resolve())
        (out / MANIFEST).unlink(missing_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot write to output folder {out}: {exc.strerror or exc}") from None


def written_since_begin(out: PathLike) -> list[Path]:
    """Files of ``out`` written since ``begin_outputs`` (all files when it was not called), marker excluded."""
    out = Path(out)
    marker = out / STARTED
    since = marker.stat().st_mtime_ns if marker.exists() else 0
    return [p for p in sorted(out.rglob("*")) if p.is_file() and p.name != STARTED
            and not p.name.endswith(".tmp") and p.stat().st_mtime_ns >= since]


def forget_outputs(out: PathLike) -> None:
    """This command is done with ``out``: the next ``begin_outputs`` starts a new command there."""
    _begun.discard(Path(out).resolve())
