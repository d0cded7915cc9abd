"""spread_interval / spread_difference: the spread of a profile column over heads, bootstrapped over items."""

import numpy as np
import pandas as pd
import pytest
import torch

import interp
from interp.bootstrap import PERCENTILES, resample_indices
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs


def _model(seed=0):
    return interp.load_model(tiny_hf_model("gpt2", seed=seed), device="cpu")


def test_the_spread_and_each_resample_equal_frequency_profile_on_those_items():
    model = _model()
    x = torch.cat([tiny_inputs(model, batch=3, pos=10, seed=s) for s in range(2)])  # 6 items
    row = interp.spread_interval(model, [x[:3], x[3:]], n_boot=5, seed=2, progress=False).iloc[0]
    assert row.spread == pytest.approx(interp.frequency_profile(model, [x], progress=False).hf_ratio.std(), rel=1e-9)
    boots = interp.spread_interval(model, [x], n_boot=5, seed=2, progress=False).attrs["boots"]
    for b, idx in zip(boots, resample_indices(6, 5, 2)):  # brute force: the profile of the drawn items, duplicates kept
        expected = interp.frequency_profile(model, [x[torch.as_tensor(idx)]], progress=False).hf_ratio.std()
        assert b == pytest.approx(expected, rel=1e-9)
    assert (row.spread_lo, row.spread_hi) == pytest.approx(tuple(np.percentile(boots, PERCENTILES)))


def test_the_difference_is_paired_and_refuses_other_items():
    a, b = _model(0), _model(1)
    x = tiny_inputs(a, batch=6, pos=10)
    first = interp.spread_interval(a, [x], n_boot=50, progress=False)
    second = interp.spread_interval(b, [x], n_boot=50, progress=False)
    diff = interp.spread_difference(first, second).iloc[0]
    assert diff.difference == pytest.approx(first.spread.iloc[0] - second.spread.iloc[0])
    lo, hi = np.percentile(np.subtract(first.attrs["boots"], second.attrs["boots"]), PERCENTILES)
    assert len(pd.concat([first, second])) == 2  # rows of two models make one table
    assert (diff.difference_lo, diff.difference_hi) == pytest.approx((lo, hi))
    fewer = interp.spread_interval(b, [x[:4]], n_boot=50, progress=False)
    with pytest.raises(InputError, match="same items"):
        interp.spread_difference(first, fewer)
    with pytest.raises(InputError, match="column must be"):
        interp.spread_interval(a, [x], column="silhouette", progress=False)


def test_spread_difference_refuses_tables_without_resamples():
    model = _model()
    x = tiny_inputs(model, batch=4, pos=10)
    none = interp.spread_interval(model, [x], n_boot=0, progress=False)
    assert np.isnan(none.spread_lo.iloc[0])
    with pytest.raises(InputError, match="n_boot >= 1"):
        interp.spread_difference(none, none)
    some = interp.spread_interval(model, [x], n_boot=5, progress=False)
    with pytest.raises(InputError, match="not a concatenation"):
        interp.spread_difference(pd.concat([some, some]), some)
