"""Features never dropped, and what training made (specialisation against untrained copies).

Fails on the earlier release: a sequence of 10 tokens left bins 0, 2 and 5 NaN, so text of mixed lengths had NaN
bins for every head and the family test dropped them without a word; there was no untrained reference.
"""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as st

import interp
from interp.analysis.frequency import (
    SPECIALISATION_STATISTICS, _cluster_features, _spectrum_parts, cluster_heads, frequency_profile,
    specialisation_table,
)
from interp.models import tiny_hf_model

from test_frequency import planted_vit  # noqa: E402 (tests/analysis is on the path)


def _by_hand_bins(amp: np.ndarray, n: int, n_bins: int = 8) -> np.ndarray:
    """A 1D amplitude spectrum of length n, binned on the common grid by hand: a bin is its frequencies' mean
    amplitude; a bin with none is the amplitude interpolated at the bin's centre between the nonzero frequencies
    (|k| / n, averaged over +-k), constant beyond them."""
    freqs = np.abs(np.fft.fftfreq(n))
    radii = np.unique(freqs[freqs > 0])
    radial = np.array([amp[freqs == r].mean() for r in radii])
    out = []
    for i in range(n_bins):
        lo, hi = i * 0.5 / n_bins, (i + 1) * 0.5 / n_bins
        inside = (freqs > lo + 1e-12) & (freqs <= hi + 1e-12)
        out.append(amp[inside].mean() if inside.any() else np.interp((lo + hi) / 2, radii, radial))
    return np.array(out)


@pytest.mark.parametrize("n", [2, 3, 5, 10, 13, 16, 40])
def test_every_length_gives_every_bin_and_the_bins_are_their_definition(n):
    amp = np.abs(np.fft.fft(np.random.default_rng(n).standard_normal((3, n)), axis=1))
    parts = _spectrum_parts(torch.from_numpy(amp), 8)
    assert not torch.isnan(parts["amp"]).any()
    for row, got in zip(amp, parts["amp"].numpy()):
        assert np.allclose(got, _by_hand_bins(row, n), rtol=1e-12)
    if n == 10:  # frequencies 0.1 .. 0.5: bins 0, 2 and 5 hold none, the earlier release left them NaN
        freqs = np.abs(np.fft.fftfreq(10))
        assert sorted({math.ceil(f * 16) - 1 for f in freqs[freqs > 0]}) == [1, 3, 4, 6, 7]


def test_text_of_mixed_lengths_uses_all_twelve_features():
    model = interp.load_model(tiny_hf_model("gpt2", n_layers=2), device="cpu")
    ids = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    for row, length in enumerate((16, 10, 7, 3)):
        mask[row, length:] = 0
    profile = frequency_profile(model, [interp.Batch(ids, mask)], progress=False)
    bins = [c for c in profile if c.startswith("bin_")]
    assert len(bins) == 8 and profile[bins].notna().all().all()
    assert (cluster_heads(profile, n_null=19).n_features == 12).all()


def test_inputs_without_a_nonzero_frequency_are_refused_with_their_lengths():
    model = interp.load_model(tiny_hf_model("gpt2", n_layers=2), device="cpu")
    with pytest.raises(interp.InterpError, match=r"lengths or grids \[\(1,\)\].*at least 2 tokens"):
        frequency_profile(model, [torch.randint(0, 97, (3, 1))], progress=False)


def test_untrained_copy_is_the_architecture_freshly_initialised():
    model = interp.load_model(tiny_hf_model("gpt2", n_layers=2), device="cpu")
    state = torch.random.get_rng_state()
    a, b, again = (interp.untrained_copy(model, s) for s in (3, 4, 3))
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is left alone
    sa, sb, s0 = a.hf_model.state_dict(), b.hf_model.state_dict(), model.hf_model.state_dict()
    assert sa.keys() == s0.keys() and all(sa[k].shape == s0[k].shape for k in s0)
    assert all(torch.equal(sa[k], again.hf_model.state_dict()[k]) for k in sa)
    weights = [k for k in sa if k.endswith("weight") and sa[k].dim() == 2]
    assert not any(torch.equal(sa[k], sb[k]) for k in weights) and not any(torch.equal(sa[k], s0[k]) for k in weights)
    assert a.interp.n_layers == model.interp.n_layers and "untrained, seed 3" in a.interp.name
    with pytest.raises(interp.InterpError, match="seed must be an integer"):
        interp.untrained_copy(model, -1)


def _statistics_by_hand(profile: pd.DataFrame) -> dict[str, float]:
    X = _cluster_features(profile, "kmeans")
    layers = profile.layer.to_numpy()
    means = np.stack([X[layers == g].mean(0) for g in layers])
    eta = ((means - X.mean(0)) ** 2).sum() / ((X - X.mean(0)) ** 2).sum()
    return dict(layer_effect=eta, hf_ratio_spread=profile.hf_ratio.std())


def test_specialisation_test_reads_the_model_against_its_untrained_copies_by_its_formulae():
    """Every number recomputed: the untrained profiles from untrained_copy(seed 5..9) on the same data, z, the
    Student-t prediction p, the empirical p and Holm over the statistics."""
    model = interp.load_model(planted_vit(local_heads=(0, 1), n_heads=4), device="cpu")
    data = [torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    out = interp.specialisation_test(model, data, n_random=5, seed=5, progress=False)
    assert set(out.statistic) == set(SPECIALISATION_STATISTICS) and len(out) == 3 * 6
    trained = frequency_profile(model, data, progress=False)
    untrained = [frequency_profile(interp.untrained_copy(model, s), data, progress=False) for s in range(5, 10)]
    pd.testing.assert_frame_equal(out, specialisation_table(trained, untrained, list(range(5, 10)), model=model.interp.name,
                                                            seed=5))
    hand_t, hand_u = _statistics_by_hand(trained), [_statistics_by_hand(u) for u in untrained]
    ps = {}
    for name in ("layer_effect", "hf_ratio_spread"):
        rows = out[out.statistic == name]
        ref = np.array([u[name] for u in hand_u])
        assert rows[rows.weights == "trained"].value.iloc[0] == pytest.approx(hand_t[name])
        assert np.allclose(rows[rows.weights == "untrained"].value, ref)
        z = (hand_t[name] - ref.mean()) / ref.std(ddof=1)
        assert rows.z.iloc[0] == pytest.approx(z)
        assert rows.p_value.iloc[0] == pytest.approx(st.t.sf(z / np.sqrt(1 + 1 / 5), df=4))
        assert rows.p_empirical.iloc[0] == (1 + (ref >= hand_t[name] - 1e-12).sum()) / 6
        ps[name] = rows.p_value.iloc[0]
    ps["within_layer_split"] = out[out.statistic == "within_layer_split"].p_value.iloc[0]
    order = sorted(ps, key=ps.get)
    holm = np.maximum.accumulate([min(1, (3 - i) * ps[n]) for i, n in enumerate(order)])
    for name, h in zip(order, holm):
        rows = out[out.statistic == name]
        assert rows.p_holm.iloc[0] == pytest.approx(h) and rows.specialised.iloc[0] == (h <= 0.05)
    # planted: local heads beside uniform ones, a spread of hf_ratio no untrained copy comes near
    assert out[out.statistic == "hf_ratio_spread"].specialised.all() and (out.n_features == 12).all()


def test_an_untrained_copy_is_not_called_specialised_against_its_siblings():
    base = interp.load_model(tiny_hf_model("gpt2", n_layers=3, n_heads=4), device="cpu")
    data = [torch.randint(0, 97, (4, 24), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    out = interp.specialisation_test(interp.untrained_copy(base, 100), data, n_random=6, progress=False)
    assert not out.specialised.any() and (out.p_holm > 0.05).all()


def test_bad_specialisation_input_is_one_clear_error():
    model = interp.load_model(tiny_hf_model("gpt2", n_layers=2), device="cpu")
    data = [torch.randint(0, 97, (2, 8))]
    with pytest.raises(interp.InterpError, match="n_random must be an integer >= 2"):
        interp.specialisation_test(model, data, n_random=1, progress=False)
    with pytest.raises(interp.InterpError, match="at least 3 heads"):
        interp.specialisation_test(model, data, layers=[0], heads=[0, 1], progress=False)
    with pytest.raises(interp.InterpError, match="specialisation_figure draws the table"):
        interp.plots.specialisation_figure(pd.DataFrame(dict(statistic=["x"])))


@pytest.mark.slow
def test_minilm_on_python_docs_uses_all_twelve_features():
    """The earlier release: bins 0, 2, 4, 5, 6 NaN for all 72 heads, the family test ran on 7 features."""
    model = interp.load_model("minilm-l6", device="cpu")
    profile = frequency_profile(model, "python-docs", max_batches=3, progress=False)
    assert profile.filter(like="bin_").notna().all().all() and len(profile) == 72
    assert _cluster_features(profile, "kmeans").shape[1] == 12
