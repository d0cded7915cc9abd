"""The sink experiment's results: every number in the findings comes from the CSVs the benchmark
wrote (summary.csv recomputed from runs.csv; the findings tables generated from summary.csv), the
CSVs cover every arm, seed and checkpoint, and the figures draw from them."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from experiments.training.sink_arms import TEXT_ARMS, VISION_ARMS
from experiments.training.sink_report import findings_tables, massive_figure, sink_share_figure, table_figure
from experiments.training.results import t_interval
from experiments.training.sink_results import summarise

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "sinks"
REQUIRED = ["domain", "arm", "seed", "step", "val_loss", "accuracy", "sink_share_first", "sink_share_slot",
            "max_over_median", "measured_by", "recipe"]


@pytest.fixture(scope="module")
def runs():
    return pd.read_csv(RESULTS / "runs.csv")


@pytest.mark.parametrize("folder", [RESULTS, RESULTS.with_name("sinks_long")])
def test_the_findings_quote_the_tables_generated_from_the_csv(folder):
    tables = findings_tables(pd.read_csv(folder / "summary.csv"))
    assert tables in (ROOT / "docs" / "findings.md").read_text()
    assert (folder / "tables.md").read_text().strip() == tables
    heads = pd.read_csv(folder / "heads.csv")
    pd.testing.assert_frame_equal(summarise(pd.read_csv(folder / "runs.csv"), heads),
                                  pd.read_csv(folder / "summary.csv"), check_dtype=False, rtol=1e-9)


def test_runs_cover_every_arm_seed_and_checkpoint_of_one_recipe(runs):
    assert set(REQUIRED) <= set(runs.columns)
    for domain, arms in (("text", TEXT_ARMS), ("vision", VISION_ARMS)):
        part = runs[runs.domain == domain]
        assert part.recipe.nunique() == 1
        assert set(part.arm) == set(arms) and set(part.seed) >= {0, 1, 2}
        steps = part.groupby(["arm", "seed"]).step.apply(tuple)
        assert steps.nunique() == 1 and steps.iloc[0][0] == 0 and len(steps.iloc[0]) >= 4
    by = runs.measured_by == "analyzer"
    assert set(runs[by].arm) == {"none", "qkv", "sink_token"}
    assert (runs[by].analyzer_vs_direct < 2.0**-11).all()  # the analyzer's histogram median, else rounding
    has_slot = runs.arm.isin(["kv_slot", "k_slot_v0"])
    assert runs[has_slot].sink_share_slot.notna().all() and runs[~has_slot].sink_share_slot.isna().all()


def test_intervals_and_paired_differences():
    x = [1.0, 2.0, 4.0]
    mean, lo, hi = t_interval(x)
    half = 4.303 * (7 / 3) ** 0.5 / 3 ** 0.5  # a printed t table's t(0.975, 2 df) x s / sqrt(n); s^2 = 7/3 by hand
    assert (mean, lo, hi) == pytest.approx((7 / 3, 7 / 3 - half, 7 / 3 + half), abs=1e-3)
    rng = np.random.default_rng(0)  # the property: 95% coverage of the true mean at n = 3 (a z-interval: ~80%)
    covered = [lo <= 1.0 <= hi for _, lo, hi in (t_interval(rng.normal(1.0, 2.0, 3)) for _ in range(2000))]
    assert abs(np.mean(covered) - 0.95) < 0.02  # binomial sd 0.005
    assert np.isnan(t_interval([1.0])[1]) and np.isnan(t_interval([])[0])
    runs = pd.DataFrame([dict(domain="text", arm=a, seed=s, step=9, val_loss=v + s)
                         for a, v in (("none", 2.0), ("qkv", 1.5)) for s in range(3)])
    row = summarise(runs).query("arm == 'qkv' and metric == 'val_loss'").iloc[0]
    assert row.paired_diff == pytest.approx(-0.5) and row.paired_ci95_low == pytest.approx(-0.5)
    assert row["mean"] == pytest.approx(2.5) and row.n_seeds == 3


def test_the_figures_draw_from_the_csvs(runs):
    layers, heads, summary = (pd.read_csv(RESULTS / f"{n}.csv") for n in ("layers", "heads", "summary"))
    for fig in (sink_share_figure(runs, heads, "scale", 128), massive_figure(layers, "scale"), table_figure(summary)):
        for ax in fig.axes:
            if ax.get_label() == "<colorbar>":
                continue
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()


# the summary.csv metric behind each coloured column of the table figure: share of heads, then largest head's mass,
# on the first position and on the arm's own target (by hand, from the arms' definitions)
TARGET = {"kv_slot": "slot", "k_slot_v0": "slot", "sink_token": "first", "registers": "registers"}
FIRST = {"text": "first_text", "vision": "first"}


@pytest.mark.parametrize("folder", ["sinks", "sinks_long", "sinks_text"])
def test_the_table_figure_colours_summary_csv_by_the_colour_rule(folder):
    """docs/figures/<folder>/table.png's coloured cells are summary.csv's means (plain lookups), drawn by the
    library's colour rule (viridis on 0-1, tagged head_share and mass), the other columns left white."""
    summary = pd.read_csv(RESULTS.with_name(folder) / "summary.csv")
    fig = table_figure(summary)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title().split(":")[0] for ax in panels] == [d for d in ("text", "vision") if d in set(summary.domain)]
    for ax in panels:
        domain = ax.get_title().split(":")[0]
        arms = [t.get_text() for t in ax.get_yticklabels()]
        mean = summary[(summary.domain == domain) & (summary.step == summary[summary.domain == domain].step.max())] \
            .set_index(["arm", "metric"])["mean"]

        def want(arm, metric):
            return float(mean.get((arm, metric), np.nan))

        shares, masses = (np.ma.filled(np.ma.asarray(c.get_array(), dtype=float), np.nan).reshape(len(arms), 7)
                          for c in ax.collections)
        for i, arm in enumerate(arms):
            target = TARGET.get(arm)
            expected = [want(arm, f"sink_share_{FIRST[domain]}"), want(arm, f"sink_share_{target}") if target else np.nan]
            np.testing.assert_allclose(shares[i, :2], expected, rtol=1e-12)
            expected = [want(arm, f"max_head_mass_{FIRST[domain]}"),
                        want(arm, f"max_head_mass_{target}") if target else np.nan]
            np.testing.assert_allclose(masses[i, 2:4], expected, rtol=1e-12)
            assert np.isnan(shares[i, 2:]).all() and np.isnan(masses[i, [0, 1, 4, 5, 6]]).all()  # white elsewhere
        assert np.isfinite(shares[:, 0]).all() and np.isfinite(masses[:, 2]).all()  # found, not NaN == NaN
        assert [c.get_gid() for c in ax.collections] == ["interp-colour:head_share", "interp-colour:mass"]
        assert all(c.cmap.name == "viridis" and c.get_clim() == (0.0, 1.0) for c in ax.collections)
    plt.close(fig)


def test_one_seed_prints_its_value_without_an_interval():
    """A one-seed table says so, rather than "[nan, nan]"; three seeds print their t-interval."""
    runs = [pd.DataFrame([dict(domain="text", arm=a, seed=s, step=9, val_loss=v + s / 10)
                          for a, v in (("none", 2.0), ("qkv", 1.5)) for s in range(n)]) for n in (1, 3)]
    one, three = (findings_tables(summarise(r)) for r in runs)
    assert "2.000 (under 2 seeds: no interval)" in one and "-0.500 (under 2 seeds: no interval)" in one
    assert "nan" not in one
    _, lo, hi = t_interval([2.0, 2.1, 2.2])
    assert f"2.100 [{lo:.3f}, {hi:.3f}]" in three and "no interval" not in three
