"""The exact sweep's numbers on the shipped models equal the ones frozen before its rewrite (issue 40).

``docs/results/sweep_frozen/*.csv`` were written by ``tests/ablation/freeze_sweep.py`` with the code of the commit
named in ``commit.txt`` (the sweep that held every variant's full logits and recomputed the intact
log-softmax per variant); the same cases run now must give the same rows to 1e-6 (relative; a metric value's
absolute tolerance is 1e-6 of the baseline's magnitude).
"""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

_spec = importlib.util.spec_from_file_location("freeze_sweep", Path(__file__).parent / "freeze_sweep.py")
freeze = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(freeze)
CASES, KEY, NUMBERS, OUT, sweep = freeze.CASES, freeze.KEY, freeze.NUMBERS, freeze.OUT, freeze.sweep
ON_METRIC_SCALE = {"ablated", "delta", "delta_se", "delta_lo", "delta_hi", "control_lo", "control_hi"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_exact_sweep_equals_the_frozen_numbers(name):
    frozen = pd.read_csv(OUT / f"{name}.csv")
    now = sweep(name)
    # the frozen control_p is the Monte Carlo p of the draws; control_p is now a normal tail fitted to the same draws
    # (its own tests: tests/ablation/test_control.py), and the Monte Carlo p is kept as control_p_empirical
    now = now.assign(control_p=now["control_p_empirical"])[KEY + NUMBERS]
    assert len(now) == len(frozen) and (now.estimate == "exact").all()
    for column in KEY:
        assert [str(v) for v in now[column].astype(object).fillna("")] == \
            [str(v) for v in frozen[column].astype(now[column].dtype).astype(object).fillna("")], column
    # a metric value's rounding is relative to the metric's scale, not to a delta's: MiniLM's cosine deltas
    # (~1e-4) are differences of float32 numbers near 1, which another BLAS or thread count rounds by ~6e-8
    scale = float(frozen["baseline"].abs().max())
    for column in NUMBERS:
        atol = 1e-6 * scale if column in ON_METRIC_SCALE else 1e-9
        np.testing.assert_allclose(now[column].astype(float), frozen[column].astype(float), rtol=1e-6, atol=atol,
                                   equal_nan=True, err_msg=column)
