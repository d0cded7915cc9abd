"""The report's rank agreement between the one-pass estimate and exact deltas is computed on the heads run
both ways (the estimate's top and a random sample, said apart), with n and a bootstrap interval over heads;
the figures draw the intervals and the random-direction control."""

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from interp import plots  # noqa: E402
from interp.bootstrap import PERCENTILES, resample_indices  # noqa: E402
from interp.report.pipeline import estimate_vs_exact  # noqa: E402


def _rows(seed=0, n=12):
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=n)
    rows = []
    for i in range(n):
        common = dict(layer=i // 4, head=i % 4, kind="q", scope="head", method="zero", metric="m", baseline=1.0)
        rows.append(dict(common, estimate="atp", delta=truth[i] + 0.3 * rng.normal(), identity="", exact_because=""))
        if i < 3 or 6 <= i < 11:  # exact on 3 "top" and 5 "sample" heads; head 11 is an identity
            rows.append(dict(common, estimate="exact", delta=truth[i], identity="", exact_because="top" if i < 3
                             else "sample"))
    rows.append(dict(rows[-1], layer=2, head=3, estimate="exact", delta=0.0, identity="b_k cancels",
                     exact_because="sample"))
    return pd.DataFrame(rows)


def test_spearman_is_on_the_heads_run_both_ways_with_n_and_a_bootstrap_interval():
    df = _rows()
    cmp = estimate_vs_exact(df, n_boot=200, seed=3)
    est = df[df.estimate == "atp"].set_index(["layer", "head", "kind"]).delta
    exact = df[(df.estimate == "exact") & (df.identity == "")].set_index(["layer", "head", "kind"])
    both = exact.assign(est=est.reindex(exact.index))
    assert cmp["n_compared"] == 8 and cmp["n_top"] == 3 and cmp["sample_n"] == 5  # the identity row is left out
    assert cmp["spearman"] == spearmanr(both.delta, both.est).statistic
    sample = both[both.exact_because == "sample"]
    assert np.isclose(cmp["sample_spearman"], spearmanr(sample.delta, sample.est).statistic)
    # the interval, redrawn by hand: heads in canonical (key) order, resampled with the same seed
    keys = [f"{layer}/{head}/{kind}" for layer, head, kind in both.index]
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    rho = [spearmanr(both.delta.to_numpy()[order[r]], both.est.to_numpy()[order[r]]).statistic
           for r in resample_indices(len(both), 200, 3)]
    np.testing.assert_allclose([cmp["spearman_lo"], cmp["spearman_hi"]], np.nanpercentile(rho, PERCENTILES))
    assert cmp["spearman_lo"] <= cmp["spearman"] <= cmp["spearman_hi"]


def test_the_top_heads_figure_draws_bootstrap_intervals_and_each_heads_matched_control_band():
    df = _rows()
    exact = df[df.estimate == "exact"].assign(delta_lo=lambda d: d.delta - 0.1, delta_hi=lambda d: d.delta + 0.25,
                                              delta_se=0.05)
    rng = np.random.default_rng(0)
    lo = rng.uniform(-0.05, 0.0, len(exact))
    exact = exact.assign(control_lo=lo, control_hi=lo + 0.04, n_control=19,
                         bias_dependent=pd.array(np.arange(len(exact)) % 2 == 0, dtype="boolean"))
    figs = plots.ablation_figures(pd.concat([df[df.estimate == "atp"], exact]), "toy", top=4)
    ax = figs["ablation_top_zero_exact"].axes[0]
    bars = [c for c in ax.collections if c.get_label().startswith("matched control")]
    assert len(bars) == 1 and "19 random directions" in bars[0].get_label()
    shown = exact.assign(a=exact.delta.abs()).nlargest(4, "a")
    drawn = sorted((round(float(s[0, 0]), 9), round(float(s[1, 0]), 9)) for s in bars[0].get_segments())
    assert drawn == sorted(zip(shown.control_lo.round(9), shown.control_hi.round(9)))  # the table's bands
    labels = [t.get_text() for t in ax.get_yticklabels()]
    starred = [f"L{r.layer} H{r['head']} {r.kind} *" for _, r in shown.iterrows() if r.bias_dependent]
    assert sorted(t for t in labels if t.endswith("*")) == sorted(starred)
    segments = np.concatenate([c.get_segments() for c in ax.collections
                               if hasattr(c, "get_segments") and c not in bars])
    widths = sorted({round(float(s[1, 0] - s[0, 0]), 6) for s in segments if s[0, 1] == s[1, 1]})
    assert widths == [0.35]  # lo to hi (0.1 + 0.25), not the standard error
    assert "95% bootstrap interval over items" in ax.get_xlabel()


def test_interval_figure_draws_each_heads_lo_to_hi():
    frame = pd.DataFrame([dict(layer=l, head=h, kind=k, shift_ratio=1 + l + h, shift_ratio_lo=0.5 + l + h,
                               shift_ratio_hi=1.2 + l + h) for l in range(2) for h in range(3) for k in "qv"])
    fig = plots.interval_figure(frame, "shift_ratio", "toy", top=4)
    assert [ax.get_title() for ax in fig.axes] == ["kind = q", "kind = v"]
    segments = np.concatenate([c.get_segments() for c in fig.axes[0].collections if hasattr(c, "get_segments")])
    spans = {(round(float(s[0, 0]), 6), round(float(s[1, 0]), 6)) for s in segments if s[0, 1] == s[1, 1]}
    top = frame[frame.kind == "q"].nlargest(4, "shift_ratio")
    assert spans == set(zip(top.shift_ratio_lo.round(6), top.shift_ratio_hi.round(6)))
    empty = plots.interval_figure(frame.assign(shift_ratio_lo=np.nan), "shift_ratio", "toy")
    assert "no intervals" in empty.axes[0].get_title()


def test_spearman_interval_agrees_with_the_fisher_z_interval_of_bonett_and_wright():
    """Independent of the bootstrap code: for 120 heads whose estimate correlates with the exact delta, the
    bootstrap interval of Spearman's rho is close to the analytic one, tanh(atanh(r) +- 1.96 sqrt((1 + r^2/2)
    / (n - 3))) (Bonett & Wright 2000), and it covers the population value 6/pi asin(rho/2)."""
    rng = np.random.default_rng(1)
    n, rho = 120, 0.6
    exact = rng.normal(size=n)
    est = rho * exact + (1 - rho**2) ** 0.5 * rng.normal(size=n)
    common = dict(kind="q", scope="head", method="zero", metric="m", baseline=1.0, identity="")
    rows = [dict(common, layer=i // 8, head=i % 8, estimate=e, delta=d, exact_because=why)
            for i in range(n) for e, d, why in (("atp", est[i], ""), ("exact", exact[i], "sample"))]
    cmp = estimate_vs_exact(pd.DataFrame(rows), n_boot=300, seed=0)
    r = cmp["spearman"]
    half = 1.96 * ((1 + r**2 / 2) / (n - 3)) ** 0.5
    analytic = np.tanh(np.arctanh(r) + np.array([-half, half]))
    np.testing.assert_allclose([cmp["spearman_lo"], cmp["spearman_hi"]], analytic, atol=0.04)  # 300 resamples: Monte Carlo error ~0.015
    assert cmp["spearman_lo"] < 6 / np.pi * np.arcsin(rho / 2) < cmp["spearman_hi"]
