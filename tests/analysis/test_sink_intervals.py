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
from interp.analysis.sink_intervals import sink_profiles_by_item, sink_share_difference, sink_share_intervals
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


def brute_shares(model, ids, mask, keys, n_boot, seed, threshold):
    """Each resample's share, from sink_profile on the resampled items (one padded batch, repeats included)."""
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    return pd.DataFrame([share(interp.sink_profile(model, [Batch(ids[d], mask[d])], progress=False), threshold)
                         for d in order[resample_indices(len(keys), n_boot, seed)]])


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
    # each resample's items (repeats included) as one padded batch: sink_profile does not depend on batching
    shares = brute_shares(model, ids, mask, [k for b in batches for k in item_keys(b)], n_boot, 3, threshold)
    lo, hi = np.percentile(shares.to_numpy(), PERCENTILES, axis=0)
    assert np.allclose(table.share_lo.loc[shares.columns], lo) and np.allclose(table.share_hi.loc[shares.columns], hi)
    assert (shares.std() > 0).any()  # resamples differ: the interval has width somewhere
    assert set(table.n_items) == {7} and set(table.n_heads) == {8}


def test_difference_of_two_item_sets_equals_the_brute_force_difference_of_their_resamples(setup):
    model, batches, _, _, threshold, (ids, mask) = setup
    other, _, (ids_b, mask_b) = items(n=5, seed=1)
    table = sink_share_difference(sink_profiles_by_item(model, batches), sink_profiles_by_item(model, other),
                                  threshold=threshold, n_boot=12, seed=4).set_index("position")
    a = brute_shares(model, ids, mask, [k for b in batches for k in item_keys(b)], 12, 4, threshold)
    b = brute_shares(model, ids_b, mask_b, [k for x in other for k in item_keys(x)], 12, 5, threshold)
    lo, hi = np.percentile((a - b).to_numpy(), PERCENTILES, axis=0)
    assert np.allclose(table.diff_lo.loc[a.columns], lo) and np.allclose(table.diff_hi.loc[a.columns], hi)
    pooled = [share(interp.sink_profile(model, x, progress=False), threshold) for x in (batches, other)]
    assert np.allclose(table["diff"].loc[a.columns], (pooled[0] - pooled[1]).loc[a.columns])
    assert (table.diff_hi > table.diff_lo).any() and set(table.n_items_second) == {5}


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_each_items_profile_equals_sink_profile_on_that_item_alone(family):
    """One forward per batch, each item's rows apart: every column equals a sink_profile run on the item alone."""
    model = interp.load_model(tiny_hf_model(family), device="cpu")
    batches, singles, _ = items(n=5)
    per_item = sink_profiles_by_item(model, batches, threshold=0.2)
    for i, one in enumerate(singles):
        alone = interp.sink_profile(model, [one], threshold=0.2, progress=False)
        got = per_item[per_item.item_index == i].drop(columns=["item", "item_index"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(got, alone, check_exact=False, rtol=1e-5, atol=1e-7)  # float32 forwards
    assert list(per_item.drop_duplicates("item_index").item) == [k for b in batches for k in item_keys(b)]


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
