"""Atomic file writes: a reader never sees a half-written table, figure or stats file."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import math
import os
import re
import secrets
import signal
import socket
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import pandas as pd
from safetensors import SafetensorError

from interp.errors import InputError, InterpError

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


_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _temporary_name(path: Path) -> str:
    """This writer's own temporary for ``path``: ``.<name>.<host>-<pid>-<random>.tmp`` (unique per process and
    per write, so writers side by side never share or remove each other's)."""
    return f".{path.name}.{_HOST}-{os.getpid()}-{secrets.token_hex(6)}.tmp"


_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]{12}\.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _sweep_dead_writers(path: Path) -> None:
    """Remove temporaries for ``path`` left by writers of this host that were killed mid-write (their process is
    gone); a live writer's, or another host's, are never touched."""
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        found = _TEMPORARY.fullmatch(stale.name)
        if found and found["name"] == path.name and found["host"] == _HOST and not _alive(int(found["pid"])):
            stale.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``, this writer's own (``.<name>.<host>-<pid>-<random>.tmp``); rename it
    over ``path`` only on success, and record ``path`` as an output of every folder this process began
    (``begin_outputs``) that holds it. Writers side by side (two processes, one folder) never touch each other's
    temporaries; one killed mid-write leaves only its temporary (the file itself is whole: old or new), removed by
    the next write of that file once the killed process is gone.

    Any failure to write (a full disk, a read-only folder; ``OSError`` or safetensors'
    ``SafetensorError``) raises ``OutputError`` naming the folder and the fix, and leaves
    nothing partial behind."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _sweep_dead_writers(path)
        tmp_path = path.parent / _temporary_name(path)
        os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise OutputError(f"cannot write to output folder {path.parent}: {_why(exc)} ({_fix(path, exc)})") from None
    try:
        try:
            yield tmp_path
            with open(tmp_path, "rb") as fh:
                os.fsync(fh.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_path, 0o666 & ~umask)  # created 0600 while being written; give the usual mode
            fault_point(f"before-replace:{path.name}")
            os.replace(tmp_path, path)
        except (OSError, SafetensorError) as exc:
            raise OutputError(f"writing {path} failed ({_why(exc)}); nothing was written: {_fix(path, exc)}") from None
    finally:
        tmp_path.unlink(missing_ok=True)  # only this writer's own
    record_output(path)


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
    record_output(path)


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


# ----- the one checked reader of text files --------------------------------------------------------------------


def _encoding_guess(path: Path) -> tuple[str, str]:
    """What a file that is not UTF-8 probably is, from its first bytes (a UTF-16 byte-order mark, NUL bytes): the
    sentence and iconv's name for it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        head = b""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or head[1:200:2].count(0) > 50 or head[0:200:2].count(0) > 50:
        return "it looks like UTF-16", "UTF-16"
    return "it looks like latin-1 (ISO-8859-1), Windows-1252 or another 8-bit encoding", "LATIN1"


def _not_utf8(path: PathLike, exc: UnicodeDecodeError) -> InputError:
    """The one message for a text file that is not UTF-8: which file, what encoding it looks like, the fix."""
    path = Path(path)
    guess, name = _encoding_guess(path)
    return InputError(f"{path} is not UTF-8 text ({exc.reason}); {guess}: re-encode it as UTF-8 (e.g. iconv -f {name} "
                      f"-t UTF-8 {path.name} > utf8.txt, or in Python read it with its encoding and write it with "
                      "encoding='utf-8')")


def text_lines(path: PathLike, newline: Optional[str] = None) -> Iterator[str]:
    """The lines of a UTF-8 text file (a byte-order mark dropped), read as a stream: the one checked reader every text
    file of the library goes through. A file that is not UTF-8 is one ``InputError`` naming it and its encoding's
    likely name; a folder or an unreadable file is one ``InputError`` too."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8-sig", errors="strict", newline=newline) as fh:
            try:
                yield from fh
            except UnicodeDecodeError as exc:
                raise _not_utf8(path, exc) from None
    except OSError as exc:
        raise InputError(f"{path} cannot be read as a text file ({exc.strerror or exc}): pass a readable "
                         "file") from None


def read_text(path: PathLike) -> str:
    """A whole UTF-8 text file, through ``text_lines``'s checks."""
    return "".join(text_lines(path, newline=""))


MANIFEST = "manifest.json"
_begun: dict[Path, str] = {}  # folders this process has begun, with the command writing there (the first start counts)
_written: dict[Path, dict[str, None]] = {}  # per begun folder: the files this process wrote there, in order


def _folder_key(path: PathLike) -> Path:
    return Path(os.path.abspath(path)).resolve()


def record_output(path: PathLike) -> None:
    """Record ``path`` as written by this process, in every folder it began (``begin_outputs``) that holds it:
    ``atomic_path`` and ``append_line`` call this as each file lands, so a command's manifest entry lists what
    it wrote, not what a clock suggests. Call it for a file this command owns but wrote another way (another
    process's share it merged, a log it resumed). The folder's own ``manifest.json`` is never recorded."""
    path = _folder_key(path)
    for folder, files in _written.items():
        if folder in path.parents and path != folder / MANIFEST:
            files.setdefault(str(path.relative_to(folder)), None)


def _recorded_outputs(out: PathLike) -> list[Path]:
    """The files this process recorded in ``out`` since ``begin_outputs`` (``record_output``), in the order
    written, those still there."""
    out = Path(out)
    return [out / name for name in _written.get(_folder_key(out), {}) if (out / name).is_file()]


@contextlib.contextmanager
def _manifest_lock(out: PathLike) -> Iterator[None]:
    """Hold ``out``'s lock (``flock`` on the folder itself, no file left behind) while reading and rewriting its
    manifest, so that commands writing into one folder side by side never lose each other's entries."""
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


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


def is_our_manifest(manifest: Any) -> bool:
    """Whether a parsed ``manifest.json`` is one interp wrote: an object of our keys only (``meta``, ``files``,
    ``commands``), with a ``commands`` list of entries or, the format before it, a ``meta`` object naming its
    command. Any other file is someone else's, and no command of ours replaces or removes it."""
    if not isinstance(manifest, dict) or not manifest or set(manifest) - {"meta", "files", "commands"}:
        return False
    commands = manifest.get("commands")
    if commands is not None:
        return isinstance(commands, list) and all(isinstance(e, dict) and "command" in e for e in commands)
    return isinstance(manifest.get("meta"), dict) and "command" in manifest["meta"]


def _write_manifest_entries(out: PathLike, entries: list[dict]) -> Optional[Path]:
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
        if manifest.exists() or manifest.is_symlink():
            found = json.loads(manifest.read_text())
            if not isinstance(found, dict):
                raise ValueError("JSON, but not an object")
            if not is_our_manifest(found):
                raise ValueError(f"a JSON object with keys {sorted(found)[:6]}, none of the commands interp writes")
    except (OSError, ValueError) as exc:
        raise OutputError(f"{manifest} is not a manifest interp wrote ({_why(exc)}), and a command would replace it: "
                          "move it away, or choose another output folder") from None
    return out


def begin_outputs(out: PathLike, command: Optional[str] = None) -> None:
    """Start ``command`` writing into ``out``: its entry in the folder's manifest is removed (until its new
    one lands, its part of the folder is incomplete; other commands' entries stay, under the folder's lock) and
    from now on the files this process writes there are recorded (``record_output``), so that its entry lists
    only files it wrote, not earlier or concurrent commands' files. A second begin of the same command in one
    process (the demo begins twice) keeps the first start."""
    out = check_output_folder(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        key = _folder_key(out)
        begun = _begun.get(key)
        if begun is None or (command and begun and command != begun):  # a new command (another one: anew)
            _written[key] = {}
            _begun[key] = command or ""
        mine = _begun[key] = _begun[key] or command or ""
        with _manifest_lock(out):
            entries = manifest_entries(out)
            kept = [e for e in entries if e.get("command") != mine and e.get("command")]
            if len(kept) != len(entries) or (not entries and (out / MANIFEST).exists()):  # {}: not ours, stale
                _write_manifest_entries(out, kept)
    except OSError as exc:
        raise OutputError(f"cannot write to output folder {out}: {exc.strerror or exc}") from None


def began(out: PathLike) -> bool:
    """Whether this process began ``out`` (``begin_outputs``) and has not finished it."""
    return _folder_key(out) in _begun


def command_of(out: PathLike) -> str:
    """The command this process began in ``out`` ("" when none was named or none began)."""
    return _begun.get(_folder_key(out), "")


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


def _forget_outputs(out: PathLike) -> None:
    """This command is done with ``out``: the next ``begin_outputs`` starts a new command there."""
    _begun.pop(_folder_key(out), None)
    _written.pop(_folder_key(out), None)


def write_manifest(out: PathLike, meta: dict) -> Path:
    """Write this command's entry into ``manifest.json``, last: every file it wrote into the folder since
    ``begin_outputs``, as recorded when each landed (``record_output``; files earlier commands left there, or
    commands writing beside it, are not listed) with its sha256, and what produced them (``meta``, whose
    ``command`` names the entry). The folder's other commands keep their entries (``commands``, oldest first; a
    rerun of a command replaces its own); the top-level ``meta`` and ``files`` are this one's. The manifest is
    read and rewritten under the folder's lock (``_manifest_lock``): commands finishing side by side keep both
    entries.

    Files written together form one unit: a reader that finds no entry, or a file whose hash differs from
    it, is looking at a run that did not finish.
    """
    out = Path(out)
    if not began(out):
        raise OutputError(f"write_manifest({out}): begin_outputs({out}) was not called first, so nothing written "
                          "there was recorded: call it before the command writes")
    files = {str(p.relative_to(out)): sha256_file(p) for p in _recorded_outputs(out)}
    command = str(meta.get("command") or command_of(out) or "report")
    _forget_outputs(out)
    entry = json_ready(dict(command=command, meta=meta, files=files))
    with _manifest_lock(out):
        entries = [e for e in manifest_entries(out) if e.get("command") and e.get("command") != command]
        return _write_manifest_entries(out, [*entries, entry])


def json_ready(value: Any) -> Any:
    """``value`` as JSON can hold it: keys as strings, tuples as lists, non-finite floats as null, numpy / torch
    scalars as Python numbers."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy / torch scalars
        return json_ready(value.item())
    return value
