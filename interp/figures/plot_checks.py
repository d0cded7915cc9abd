"""What a figure checks before it draws: that it was given the table it draws (the analyzer's columns, rows,
one model, each row once), else one ``InputError`` that names the analyzer making the right table.

Every plot function of ``interp.figures.plots`` and ``interp.figures.single_input_plots`` calls ``check_table``
first, so a wrong table is refused in words instead of failing deep in pandas or seaborn (or, worse, drawing two
models' rows averaged into one grid).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from interp.errors import InputError

__all__ = ["check_table"]

MODEL_COLUMNS = ("model", "model_fingerprint")  # columns that say which model a row is of


def check_table(frame: Any, figure: str, analyzer: str, columns: Sequence[str],
                keys: Optional[Sequence[str]] = None, prefix: Optional[str] = None,
                finite: Sequence[str] = ()) -> pd.DataFrame:
    """``frame`` if ``figure`` can draw it: a DataFrame with ``columns`` (and, with ``prefix``, a column
    starting with it), at least one row, rows of one model (``model`` / ``model_fingerprint``), each
    ``keys`` combination once (two runs' tables concatenated hold them twice), and numbers (no NaN, no inf)
    in the ``finite`` columns, which the analyzer never leaves empty. ``analyzer``: what makes the right
    table, e.g. ``"interp.sink_profile(model, data)"``."""
    want = f"{figure} draws the table of {analyzer}"
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"{want}; got {type(frame).__name__}, not a DataFrame")
    missing = [c for c in columns if c not in frame.columns]
    if prefix is not None and not any(str(c).startswith(prefix) for c in frame.columns):
        missing.append(f"{prefix}*")
    if missing:
        have = ", ".join(map(str, list(frame.columns)[:12])) + (", ..." if len(frame.columns) > 12 else "")
        raise InputError(f"{want}; this table lacks {', '.join(missing)} (it has {have or 'no columns'}): is it "
                         f"another analyzer's? Pass the result of {analyzer}")
    if frame.empty:
        raise InputError(f"{want}; this table has no rows (no layers or heads selected?)")
    for column in MODEL_COLUMNS:
        if column in frame.columns and frame[column].nunique(dropna=True) > 1:
            models = ", ".join(map(str, frame[column].dropna().unique()[:4]))
            raise InputError(f"{want} for one model; this table holds rows of {frame[column].nunique()} ({column}: "
                             f"{models}): draw each model's rows apart, e.g. frame[frame.{column} == ...]")
    for column in finite:
        if not (pd.api.types.is_numeric_dtype(frame[column]) and not pd.api.types.is_bool_dtype(frame[column])):
            example = frame[column].dropna().iloc[0] if frame[column].notna().any() else None
            raise InputError(f"{want}; its {column!r} holds {frame[column].dtype} values (e.g. {example!r}), not "
                             f"numbers: was the table read without types or edited? Pass {analyzer}'s own table, "
                             f"or convert the column (pd.to_numeric)")
        values = pd.to_numeric(frame[column], errors="coerce").astype(float)
        bad = ~np.isfinite(values.to_numpy())
        if bad.any():
            first = frame.loc[bad, [c for c in ("layer", "head", "position") if c in frame.columns]].iloc[0].to_dict()
            raise InputError(f"{want}; its {column!r} is missing, not a number or infinite in {int(bad.sum())} rows, "
                             f"e.g. {first or frame.loc[bad, column].iloc[0]!r} ({analyzer} leaves none empty): was "
                             f"the table edited or merged? Draw the analyzer's own table, or drop those rows")
    keys = [k for k in keys or () if k in frame.columns]
    if keys:
        twice = frame.duplicated(keys, keep=False)
        if twice.any():
            first = frame.loc[twice, keys].iloc[0].to_dict()
            raise InputError(f"{want}, each ({', '.join(keys)}) once; {int(twice.sum())} rows share theirs with "
                             f"another row, e.g. {first}: two runs' tables concatenated? Draw one run's table")
    return frame
