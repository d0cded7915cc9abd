"""An offline text corpus every machine has: the running interpreter's standard-library source.

Gathered deterministically: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]`` except
``site-packages``, ``__pycache__`` and test suites (``test``, ``tests``, ``idle_test``), ordered by
h(f) = sha256(relative POSIX path), taken whole in that order while the total stays within
``budget`` bytes. A file is validation when int(h(f)[:8], 16) mod 10 == 0 (about a tenth, split by
file, never inside one), else training. Each split is its files' bytes joined by a blank line, one
token per byte (ids 0..255). The two byte arrays and ``corpus.json`` (every file with its size,
sha256 and split; the sha256 of each split's text; the interpreter's version) are cached under
``<cache>/sinks-corpus/<key>/`` (git-ignored ``.cache/interp`` in a checkout), key = sha256 of
(stdlib path, Python version, budget, rule version); a rerun verifies and reuses them.

``packages_corpus``: the same rule over the installed packages' Python sources (``*.py`` of
``PACKAGES`` under ``sysconfig.get_paths()["purelib"]``, test suites skipped, relative paths
``<package>/...``), with one more rule: a file whose bytes equal an earlier file's (by sha256, in
the corpus order) is skipped, so no text is in the corpus twice. Its cache key also covers the
packages and their installed versions (``corpus.json`` records them). Large enough (tens of MB)
that a run can read every training byte at most once (``experiments.training.sinks``, sampling
``disjoint``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from interp.errors import InterpError
from interp.io import atomic_path
from interp.models.zoo import cache_dir

RULE_VERSION = 1
SKIP_PARTS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
SEPARATOR = b"\n\n"
DEFAULT_BUDGET = 4 * 2**20
PACKAGES = ("numpy", "scipy", "pandas", "sklearn", "matplotlib", "sympy", "networkx", "torch")
DISTRIBUTIONS = {"sklearn": "scikit-learn"}  # import name -> distribution name, where they differ


class CorpusError(InterpError, OSError):
    """The standard-library corpus cannot be gathered or its cache does not match its record."""


@dataclass(frozen=True)
class Corpus:
    """Both splits as uint8 tokens, and the record (``corpus.json``) they were made from."""

    train: torch.Tensor
    val: torch.Tensor
    record: dict

    @property
    def sha256(self) -> str:
        """One identity for the corpus: sha256 over both splits' sha256."""
        return hashlib.sha256((self.record["train_sha256"] + self.record["val_sha256"]).encode()).hexdigest()


def _path_hash(rel: str) -> str:
    return hashlib.sha256(rel.encode()).hexdigest()


def stdlib_files(root: Optional[Path] = None) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every eligible ``*.py``, in the corpus order (by path hash)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise CorpusError(f"the standard library folder {root} does not exist: run with a full CPython "
                          "installation (sysconfig.get_paths()['stdlib'])")
    found = [(p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*.py"))
             if not SKIP_PARTS & set(p.relative_to(root).parts[:-1]) and p.is_file()]
    return sorted(found, key=lambda item: _path_hash(item[0]))


def gather(budget: int = DEFAULT_BUDGET, root: Optional[Path] = None) -> tuple[bytes, bytes, dict]:
    """(train bytes, validation bytes, record) by the module doc's rule."""
    source = Path(root or sysconfig.get_paths()["stdlib"])
    return _gather(stdlib_files(root), budget, dict(source=str(source)))


def _gather(found: list[tuple[str, Path]], budget: int, about: dict,
            unique: bool = False) -> tuple[bytes, bytes, dict]:
    files, chunks, total, seen = [], {"train": [], "val": []}, 0, set()
    for rel, path in found:
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if total + len(data) > budget or (unique and digest in seen):
            continue
        seen.add(digest)
        total += len(data)
        split = "val" if int(_path_hash(rel)[:8], 16) % 10 == 0 else "train"
        chunks[split].append(data)
        files.append(dict(path=rel, bytes=len(data), sha256=digest, split=split))
    train, val = SEPARATOR.join(chunks["train"]), SEPARATOR.join(chunks["val"])
    if not train or not val:
        raise CorpusError(f"budget {budget} bytes left a split empty ({len(files)} files): raise the budget")
    record = dict(about, python=platform.python_version(),
                  budget=budget, rule_version=RULE_VERSION, n_files=len(files), bytes=total,
                  train_bytes=len(train), val_bytes=len(val), train_sha256=hashlib.sha256(train).hexdigest(),
                  val_sha256=hashlib.sha256(val).hexdigest(), files=files)
    return train, val, record


def package_files(packages: tuple[str, ...] = PACKAGES, root: Optional[Path] = None) -> list[tuple[str, Path]]:
    """(``<package>/...`` path, path) of every eligible ``*.py`` of ``packages`` under ``root``
    (site-packages), in the corpus order (by path hash)."""
    root = Path(root or sysconfig.get_paths()["purelib"])
    missing = [p for p in packages if not (root / p).is_dir()]
    if missing:
        raise CorpusError(f"package(s) {', '.join(missing)} are not installed under {root}: install them "
                          "(they are the project's own dependencies) or pass other packages")
    found = []
    for package in packages:
        found += [(p.relative_to(root).as_posix(), p) for p in sorted((root / package).rglob("*.py"))
                  if not SKIP_PARTS & set(p.relative_to(root).parts[:-1]) and p.is_file()]
    return sorted(found, key=lambda item: _path_hash(item[0]))


def _versions(packages: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in packages:
        try:
            out[p] = importlib.metadata.version(DISTRIBUTIONS.get(p, p))
        except importlib.metadata.PackageNotFoundError:
            out[p] = "unknown"
    return out


def _cache_key(budget: int, root: Optional[Path]) -> str:
    ident = json.dumps([str(root or sysconfig.get_paths()["stdlib"]), platform.python_version(), budget,
                        RULE_VERSION])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _read_cached(folder: Path) -> Optional[Corpus]:
    try:
        record = json.loads((folder / "corpus.json").read_text())
        train, val = (folder / "train.bin").read_bytes(), (folder / "val.bin").read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(train).hexdigest() != record["train_sha256"] or \
            hashlib.sha256(val).hexdigest() != record["val_sha256"]:
        raise CorpusError(f"the cached corpus in {folder} does not match its corpus.json (a damaged or "
                          "edited file): delete that folder and run again")
    return Corpus(_tokens(train), _tokens(val), record)


def load_corpus(folder: Path) -> Corpus:
    """A corpus from its folder (``train.bin``, ``val.bin``, ``corpus.json``: what the cache holds), its
    bytes checked against the record's sha256: to train on another machine (other packages, another
    interpreter) on exactly the bytes gathered here."""
    folder = Path(folder)
    missing = [n for n in ("corpus.json", "train.bin", "val.bin") if not (folder / n).is_file()]
    if missing:
        raise CorpusError(f"{folder} is not a corpus folder: it lacks {', '.join(missing)}; pass a folder under "
                          "<cache>/sinks-corpus/ (.cache/interp/sinks-corpus/ in a checkout)")
    try:
        corpus = _read_cached(folder)
    except (KeyError, TypeError) as err:  # JSON, but not a record with both splits' sha256
        raise CorpusError(f"{folder}/corpus.json is not a corpus record (a JSON object with train_sha256 and "
                          f"val_sha256; {type(err).__name__}: {err}): gather the corpus again") from err
    if corpus is None:
        raise CorpusError(f"{folder}'s corpus.json is not JSON, or a file of it cannot be read: gather the corpus "
                          "again")
    return corpus


def _tokens(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())


def stdlib_corpus(budget: int = DEFAULT_BUDGET, root: Optional[Path] = None,
                  cache: Optional[Path] = None) -> Corpus:
    """The corpus (module doc), from the cache when it is there (a rerun is a no-op), else gathered
    and cached atomically (``corpus.json`` last, so a half-written cache is never taken)."""
    folder = Path(cache or cache_dir()) / "sinks-corpus" / _cache_key(budget, root)
    return _cached(folder, lambda: gather(budget, root))


def packages_corpus(budget: int = 32 * 2**20, packages: tuple[str, ...] = PACKAGES, root: Optional[Path] = None,
                    cache: Optional[Path] = None) -> Corpus:
    """The installed packages' sources (module doc), cached like ``stdlib_corpus``."""
    packages = tuple(packages)
    root = Path(root or sysconfig.get_paths()["purelib"])
    versions = _versions(packages)
    key = hashlib.sha256(json.dumps(["packages", str(root), versions, platform.python_version(), budget,
                                     RULE_VERSION]).encode()).hexdigest()[:16]
    about = dict(source=str(root), packages=versions)
    return _cached(Path(cache or cache_dir()) / "sinks-corpus" / f"packages-{key}",
                   lambda: _gather(package_files(packages, root), budget, about, unique=True))


def _cached(folder: Path, make) -> Corpus:
    cached = _read_cached(folder)
    if cached is not None:
        return cached
    train, val, record = make()
    for name, data in (("train.bin", train), ("val.bin", val)):
        with atomic_path(folder / name) as tmp:
            tmp.write_bytes(data)
    with atomic_path(folder / "corpus.json") as tmp:
        tmp.write_text(json.dumps(record, indent=1))
    return Corpus(_tokens(train), _tokens(val), record)
