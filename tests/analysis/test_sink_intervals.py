"""The share of sink heads with a bootstrap interval over items (interp.analysis.sink_intervals), against brute
force: the share equals sink_profile's over all the items at once, and each resample's share equals a
sink_profile run on the resampled items themselves (repeats included), so the interval is the percentiles of
those runs."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

import interp
from interp.analysis.sink_intervals import sink_profiles_by_item, sink_share_intervals
from interp.bootstrap import PERCENTILES, item_keys, resample_indices
from interp.data import Batch
from interp.errors import InputError
from interp.models import tiny_hf_model


def items(n=7, seed=0):
    """n right-padded token sequences of different lengths, in two batches."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [5 + (3 * i) % 6 for i in range(n)]
    ids = torch.randint(3, 97, (n, max(lengths)), generator=gen)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids * mask
    batches = [Batch(ids[:3], mask[:3]), Batch(ids[3:], mask[3:])]
    return batches, [Batch(ids[i:i + 1], mask[i:i + 1]) for i in range(n)], (ids, mask)


def share(profile, threshold):
    return profile.groupby("position", sort=False).mass.apply(lambda m: float((m > threshold).mean()))


@pytest.fixture(scope="module")
def setup():
    model = interp.load_model(copy.deepcopy(tiny_hf_model("llama", n_layers=2, n_heads=4)), device="cpu")
    batches, singles, whole = items()
    pooled = interp.sink_profile(model, batches, progress=False)
    threshold = float(pooled[pooled.position == "first"].mass.median())  # a threshold that splits the heads
    return model, batches, singles, pooled, threshold, whole


def test_share_equals_sink_profile_over_all_items_and_interval_equals_profiles_of_resamples(setup):
    model, batches, singles, pooled, threshold, (ids, mask) = setup
    per_item = sink_profiles_by_item(model, batches)
    assert per_item.item_index.nunique() == 7 and len(per_item) == 7 * len(pooled)
    n_boot = 20
    table = sink_share_intervals(per_item, threshold=threshold, n_boot=n_boot, seed=3).set_index("position")
    want = share(pooled, threshold)
    assert np.allclose(table.share.loc[want.index], want.to_numpy()), (table.share, want)
    assert 0 < table.share["first"] < 1  # the threshold splits the heads: the check is not vacuous
    keys = [k for b in batches for k in item_keys(b)]
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")  # the canonical order of interp.bootstrap
    draws = order[resample_indices(len(keys), n_boot, 3)]
    # each resample's items (repeats included) as one padded batch: sink_profile does not depend on batching
    shares = pd.DataFrame([share(interp.sink_profile(model, [Batch(ids[draw], mask[draw])], progress=False),
                                 threshold) for draw in draws])
    lo, hi = np.percentile(shares.to_numpy(), PERCENTILES, axis=0)
    assert np.allclose(table.share_lo.loc[shares.columns], lo) and np.allclose(table.share_hi.loc[shares.columns], hi)
    assert (shares.std() > 0).any()  # resamples differ: the interval has width somewhere
    assert set(table.n_items) == {7} and set(table.n_heads) == {8}


def test_interval_does_not_depend_on_batching(setup):
    model, batches, singles, _, threshold, _ = setup
    one = sink_share_intervals(sink_profiles_by_item(model, batches), threshold=threshold, n_boot=50)
    other = sink_share_intervals(sink_profiles_by_item(model, singles[::-1]), threshold=threshold, n_boot=50)
    pd.testing.assert_frame_equal(one, other)


@pytest.mark.parametrize("case,words", [
    (lambda t: t.drop(columns="item"), "per-item sink profiles"),
    (lambda t: pd.concat([t, t]), "more than once"),
    (lambda t: t.drop(columns="threshold"), "threshold must be a number"),
    (lambda t: t.iloc[1:], "no row for some head"),
])
def test_bad_tables_raise_one_clear_error(setup, case, words):
    model, batches, *_ = setup
    per_item = sink_profiles_by_item(model, batches[:1])
    with pytest.raises(InputError, match=words):
        sink_share_intervals(case(per_item), n_boot=10)
    with pytest.raises(InputError, match="n_boot"):
        sink_share_intervals(per_item, n_boot=-1)
