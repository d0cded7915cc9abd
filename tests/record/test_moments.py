"""interp.record.moments: streamed float64 moments equal the moments of all the data at once."""

import torch

from interp.record.moments import Moments, batch_moments


def _brute(x: torch.Tensor, w: torch.Tensor):
    keep = x[w.bool()].double()
    mean = keep.mean(0)
    centred = keep - mean
    return len(keep), mean, torch.einsum("nhd,nhe->hde", centred, centred)


def test_chunks_merged_in_any_order_equal_the_whole():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 4, generator=g, dtype=torch.float64) * 3 + 5  # offset: tests the centring
    w = (torch.rand(50, generator=g) > 0.3).double()
    n, mean, m2 = _brute(x, w)
    for cuts in ([0, 50], [0, 7, 8, 30, 50], [0, 1, 2, 49, 50]):
        mom = Moments.zeros(3, 4, "cpu")
        for a, b in zip(cuts[:-1], cuts[1:]):
            mom.add(*batch_moments(x[a:b], w[a:b]))
        assert int(mom.count) == n
        assert (mom.mean - mean).abs().max() <= 1e-12
        assert (mom.m2 - m2).abs().max() <= 1e-9


def test_merging_two_running_moments_is_exact_and_an_empty_batch_changes_nothing():
    x = torch.randn(20, 2, 3, dtype=torch.float64)
    a, b, whole = Moments.zeros(2, 3, "cpu"), Moments.zeros(2, 3, "cpu"), Moments.zeros(2, 3, "cpu")
    a.add(*batch_moments(x[:9], None))
    b.add(*batch_moments(x[9:], None))
    whole.add(*batch_moments(x, None))
    a.merge(b)
    before = a.mean.clone()
    a.add(*batch_moments(x[:4], torch.zeros(4, dtype=torch.float64)))  # all padding
    assert torch.equal(a.mean, before)
    assert (a.mean - whole.mean).abs().max() <= 1e-12 and (a.m2 - whole.m2).abs().max() <= 1e-10


def test_means_only_moments_keep_no_co_moment():
    mom = Moments.zeros(1, 5, "cpu", means_only=True)
    x = torch.randn(6, 1, 5, dtype=torch.float64)
    mom.add(*batch_moments(x, None, with_m2=False))
    assert mom.m2 is None and (mom.mean - x.mean(0)).abs().max() <= 1e-12
