"""What the two training experiments share (the sink experiment, ``sink_results``; the Bigram-Backcopy
control, ``backcopy_results``): one run loop, one refusal of a results folder holding another recipe's
runs, one atomic table writer, one tagging of rows with the recipe, and the t-interval of their summaries.

The loop (``run_plan``): train each planned run (or resume it from its checkpoint, or read it back when
finished), log one line, then rewrite the tables of *every* finished run of the recipe found in the work
folder, so that processes running other parts of the plan into one results folder add up (each table
written atomically: ``interp.io.atomic_path``, writers side by side never break each other).

    95% t-interval of a mean over n values: mean +- t_{0.975, n-1} sd(x) / sqrt(n)   (sd with n - 1)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, TypeVar, Union

import numpy as np
import pandas as pd
from scipy import stats

from interp.errors import StaleResultsError
from interp.io import atomic_path

Item = TypeVar("Item")
Tables = dict[str, pd.DataFrame]


def t_interval(values: Iterable[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean (NaN bounds for fewer than 2 values; NaNs dropped)."""
    x = np.asarray([v for v in values if not np.isnan(v)], float)
    if len(x) == 0:
        return np.nan, np.nan, np.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, np.nan, np.nan
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return mean, mean - half, mean + half


def tag_rows(rows: list[dict], recipe_fp: str) -> list[dict]:
    """Rows a run's checkpoint holds, tagged by the run (``recipe``: the run's own fingerprint, of recipe, arm and
    seed), re-tagged for a table of the whole recipe: ``recipe`` the recipe's fingerprint, ``fingerprint`` the
    run's."""
    return [{**{k: v for k, v in r.items() if k != "recipe"}, "recipe": recipe_fp, "fingerprint": r["recipe"]}
            for r in rows]


def refuse_other_recipes(out: Path, expected: Union[str, Mapping[str, str]], by: Optional[str] = None,
                         overwrite: bool = False) -> None:
    """Refuse ``out`` if its runs.csv holds rows of another recipe than ``expected`` (one fingerprint, or with
    ``by`` one per value of that column, e.g. per domain) as ``StaleResultsError`` naming them and the fix;
    ``overwrite``: they are to be replaced, nothing is refused."""
    path = Path(out) / "runs.csv"
    if overwrite or not path.exists():
        return
    found = pd.read_csv(path, usecols=[c for c in (by, "recipe") if c]).drop_duplicates()
    if by is None:
        stale = sorted(set(found.recipe.astype(str)) - {expected})
    else:
        stale = sorted(f"{k} {r}" for k, r in zip(found[by], found.recipe.astype(str)) if expected.get(k) != r)
    if stale:
        raise StaleResultsError(f"{path} holds runs of recipe {', '.join(stale)}, not this run's {expected}: choose "
                                "another --out, or pass --overwrite to replace them")


def write_tables(out: Path, frames: Tables, names: Iterable[str]) -> Tables:
    """``<out>/<name>.csv`` for each of ``names`` (in that order), each written atomically; returns ``frames``."""
    for name in names:
        with atomic_path(Path(out) / f"{name}.csv") as tmp:
            frames[name].to_csv(tmp, index=False)
    return frames


def run_plan(plan: Iterable[Item], train: Callable[[Item], str], collect: Callable[[], Tables], out: Path,
             names: Iterable[str], log: Callable[[str], None] = print) -> Tables:
    """Every item of ``plan`` trained (``train`` returns its log line), and after each the tables of every
    finished run (``collect``, read back from the checkpoints) written into ``out``; returns the last tables
    ({} for an empty plan)."""
    names, frames = tuple(names), {}
    for item in plan:
        log(train(item))
        frames = write_tables(out, collect(), names)
    return frames
