"""Bootstrap intervals over items for origin_shift (shift ratio, bias share) and score_decomposition
(shares): equal to a brute-force recomputation on each resample, covering the point estimate, narrower
with more items, deterministic given the seed."""

import numpy as np
import pytest
import torch

import interp
from interp.bootstrap import PERCENTILES, item_keys, resample_indices
from interp.data import Batch
from interp.errors import InputError
from interp.models import tiny_hf_model


@pytest.fixture(scope="module")
def gpt2():
    return interp.load_model(tiny_hf_model("gpt2", seed=4, bias_scale=2.0).double(), device="cpu")


def _items(n, seed=0, pos=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 90, (pos,), generator=g) for _ in range(n)]


def _resamples(items, n_boot, seed):
    """The resampled item lists of ``interp.bootstrap``, redrawn by hand: canonical order, then indices."""
    keys = [item_keys(Batch(x[None]))[0] for x in items]
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    return [[items[i] for i in order[row]] for row in resample_indices(len(items), n_boot, seed)]


def _origin(model, items, **kw):
    data = [torch.stack(items[:3]), torch.stack(items[3:])]
    return interp.origin_shift(model, interp.record_qkv(model, data, progress=False), data=data, **kw)


def test_origin_intervals_equal_brute_force_resampling(gpt2):
    items = _items(7)
    df = _origin(gpt2, items, n_boot=8, seed=2)
    redone = [interp.origin_shift(gpt2, interp.record_qkv(gpt2, [torch.stack(r)], progress=False), n_boot=0)
              for r in _resamples(items, 8, 2)]
    for value in ("shift_ratio", "bias_share"):
        lo, hi = np.percentile(np.stack([r[value].to_numpy() for r in redone]), PERCENTILES, axis=0)
        np.testing.assert_allclose(df[f"{value}_lo"], lo, rtol=1e-9)
        np.testing.assert_allclose(df[f"{value}_hi"], hi, rtol=1e-9)
        assert ((df[f"{value}_lo"] <= df[value] * (1 + 1e-12)) & (df[value] <= df[f"{value}_hi"] * (1 + 1e-12))).all()


def test_share_intervals_equal_brute_force_resampling(gpt2):
    items = _items(6, seed=1)
    df = interp.score_decomposition(gpt2, [torch.stack(items[:4]), torch.stack(items[4:])], n_boot=8, seed=5,
                                    progress=False)
    redone = [interp.score_decomposition(gpt2, [torch.stack(r)], n_boot=0, progress=False).share.to_numpy()
              for r in _resamples(items, 8, 5)]
    lo, hi = np.percentile(np.stack(redone), PERCENTILES, axis=0)
    np.testing.assert_allclose(df.share_lo, lo, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(df.share_hi, hi, rtol=1e-9, atol=1e-15)
    moving = df[df.term.isin(["content", "key_prior"])]
    assert ((moving.share_lo <= moving.share + 1e-12) & (moving.share <= moving.share_hi + 1e-12)).all()


def test_intervals_shrink_with_more_items_and_follow_the_seed(gpt2):
    few, many = _origin(gpt2, _items(6, seed=3), n_boot=300), _origin(gpt2, _items(60, seed=3), n_boot=300)
    width = lambda df, v: (df[f"{v}_hi"] - df[f"{v}_lo"]).to_numpy()  # noqa: E731
    for v in ("shift_ratio", "bias_share"):
        assert np.median(width(many, v) / width(few, v)) < 0.6  # ~ 1/sqrt(10) = 0.32 expected
    a, b = _origin(gpt2, _items(6), n_boot=50, seed=1), _origin(gpt2, _items(6), n_boot=50, seed=1)
    np.testing.assert_array_equal(a.shift_ratio_lo, b.shift_ratio_lo)
    assert _origin(gpt2, _items(6), n_boot=0).shift_ratio_lo.isna().all()
    shares = [interp.score_decomposition(gpt2, [torch.stack(_items(n, seed=3))], n_boot=300, progress=False)
              for n in (6, 60)]
    kp = [s[s.term == "key_prior"] for s in shares]
    assert np.median((kp[1].share_hi - kp[1].share_lo).to_numpy() / (kp[0].share_hi - kp[0].share_lo).to_numpy()) < 0.6


def test_same_data_is_decided_by_the_data_fingerprint(gpt2):
    """The same items in another order hold the same token count and squared norms (the summaries the old
    check compared, np.allclose), but they are not the batches the statistics were recorded on."""
    items = _items(4)
    stats = interp.record_qkv(gpt2, [torch.stack(items)], progress=False)
    with pytest.raises(InputError, match=f"data fingerprint [0-9a-f]{{16}}.*not the data.*{stats.data_fingerprint}"):
        interp.origin_shift(gpt2, stats, data=[torch.stack(items[::-1])])
    assert not interp.origin_shift(gpt2, stats, data=[torch.stack(items)], n_boot=20).shift_ratio_lo.isna().any()
    stats.data_fingerprint = None  # statistics of unknown data (a file without one)
    with pytest.raises(InputError, match="no data fingerprint"):
        interp.origin_shift(gpt2, stats, data=[torch.stack(items)])


def test_origin_intervals_refuse_data_other_than_the_recorded(gpt2):
    stats = interp.record_qkv(gpt2, [torch.stack(_items(4))], progress=False)
    with pytest.raises(InputError, match="not the data the statistics were recorded on"):
        interp.origin_shift(gpt2, stats, data=[torch.stack(_items(4, seed=9))])
    stats.recorded_data = None  # statistics that kept no data (loaded, merged, a stream): NaN, and why
    df = interp.origin_shift(gpt2, stats)
    assert df.shift_ratio_lo.isna().all() and df.interval_note.str.contains("pass data=").all()


def test_intervals_come_from_the_data_record_qkv_kept(gpt2, tmp_path):
    """Data in memory is kept with the statistics, so origin_shift(model, stats) gives the intervals of
    origin_shift(model, stats, data=data); a stream, a loaded file or a merge keeps none and says so per row."""
    data = [torch.stack(_items(3)), torch.stack(_items(3, seed=1))]
    stats = interp.record_qkv(gpt2, data, progress=False)
    kept, passed = interp.origin_shift(gpt2, stats, n_boot=30), interp.origin_shift(gpt2, stats, data=data, n_boot=30)
    columns = ["shift_ratio_lo", "shift_ratio_hi", "bias_share_lo", "bias_share_hi"]
    assert not kept[columns].isna().any().any() and kept[columns].equals(passed[columns])
    assert kept.interval_note.str.contains("record_qkv read").all() and passed.interval_note.str.contains("data=").all()
    stream = interp.record_qkv(gpt2, (b for b in data), progress=False)
    stats.save(tmp_path / "s.safetensors")
    for other in (stream, interp.QKVStats.load(tmp_path / "s.safetensors"),
                  interp.record_qkv(gpt2, data[:1], progress=False).merge(
                      interp.record_qkv(gpt2, data[1:], progress=False))):
        df = interp.origin_shift(gpt2, other, n_boot=30)
        assert df.shift_ratio_lo.isna().all() and df.interval_note.str.startswith("no intervals").all()
    data.append(torch.stack(_items(3, seed=2)))  # the kept list changed after recording: NaN with the reason
    df = interp.origin_shift(gpt2, stats, n_boot=30)
    assert df.shift_ratio_lo.isna().all() and df.interval_note.str.contains("not the data").all()
    assert interp.origin_shift(gpt2, stats, n_boot=0).interval_note.eq("no intervals: n_boot=0").all()
