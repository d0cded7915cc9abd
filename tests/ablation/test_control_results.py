"""The published measurements of the sequential, adjusted matched control (``benchmarks/control_calibration.py``):
calibration on untrained GPT-2s, cost before and after on the demo's setting and MiniLM, the per-head tables, and
the README's quotes of them.

On the release before, every head was called at its own p <= 0.05 from 19 fixed draws: the old rule's rows below
(``fixed_19``, ``old_*``) show its floor (p >= 1/20) and its calls; the checks on the new rule's rows fail for them.
"""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from interp.ablation.sweep import control_forwards

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
README = (ROOT / "README.md").read_text()
MODELS = {"demo": "dinov2-s14", "minilm": "minilm-l6"}
LABELS = {"demo": "The demo", "minilm": "MiniLM"}


def bh_by_hand(p):
    """Benjamini-Hochberg's adjusted p without sorting: min over thresholds t >= p_i of m t / #{p <= t}, at most 1."""
    p = np.asarray(p, dtype=float)
    return np.array([min(1.0, min(len(p) * t / np.sum(p <= t) for t in p if t >= pi)) for pi in p])


def calibration():
    t = pd.read_csv(RESULTS / "control_calibration.csv")
    return t[t.rule == "sequential_bh"].set_index("seed"), t[t.rule == "fixed_19"].set_index("seed")


def test_untrained_gpt2_heads_are_called_at_the_rate_the_null_allows():
    new, old = calibration()
    assert len(new) >= 3 and list(new.index) == list(old.index) and (new.heads == old.heads).all()
    assert (old.min_p >= 1 / 20 - 1e-12).all()  # 19 draws: p never below 0.05, so no correction could pass
    assert (new.called_adjusted <= new.called_unadjusted).all()  # an adjusted p is never below the raw one
    n = int(new.heads.sum())
    for rows in (new, old):  # p <= 0.05 in about 5% of null heads: no more than chance allows (one-sided 0.1%)
        assert binom.sf(int(rows.called_unadjusted.sum()) - 1, n, 0.05) > 1e-3, rows
    # every head is null, so a false discovery rate of 5% is a family-wise rate: P(any call in a seed) <= 0.05
    assert binom.sf(int((new.called_adjusted > 0).sum()) - 1, len(new), 0.05) > 1e-3, new
    assert (new.control_forwards >= 5 * new.heads).all() and (old.control_forwards == 19 * old.heads).all()


@pytest.mark.parametrize("setting", list(MODELS))
def test_per_head_tables_hold_the_adjusted_p_of_their_heads(setting):
    t = pd.read_csv(RESULTS / MODELS[setting] / "ablation_fdr.csv")
    np.testing.assert_allclose(t.control_p_adjusted, bh_by_hand(t.control_p), rtol=0, atol=1e-12)
    assert (t.bias_dependent == (t.control_p_adjusted <= 0.05)).all()
    stopped = t.n_control < 199
    np.testing.assert_allclose(t.control_p[stopped], 5 / t.n_control[stopped])  # Besag-Clifford: h / n
    assert (t.control_p[~stopped] >= 1 / 200 - 1e-12).all() and (t.n_control >= 5).all()
    assert (t.old_n_control == 19).all() and (t.old_called == (t.old_control_p <= 0.05)).all()
    assert (t.old_control_p >= 1 / 20 - 1e-12).all()


@pytest.mark.parametrize("setting", list(MODELS))
def test_cost_table_counts_the_forwards_of_the_per_head_table(setting):
    cost = pd.read_csv(RESULTS / "control_cost.csv").set_index(["setting", "rule"])
    heads = pd.read_csv(RESULTS / MODELS[setting] / "ablation_fdr.csv")
    new, old = cost.loc[(setting, "sequential_bh")], cost.loc[(setting, "fixed_19")]
    assert new.heads == old.heads == len(heads)
    assert new.control_forwards == sum(control_forwards(n, 199, 5) for n in heads.n_control)
    assert old.control_forwards == 19 * len(heads)
    assert new.called_adjusted == heads.bias_dependent.sum() and old.called_unadjusted == heads.old_called.sum()
    assert new.called_unadjusted == (heads.control_p <= 0.05).sum()
    assert new.heads_at_max == (heads.n_control == 199).sum()


def test_readme_calibration_figures_equal_the_csv():
    new, old = calibration()
    text = re.search(r"biases N\(0, 0\.5\^2\), (\d+) seeds, every head null;\s+`docs/results/control_calibration\.csv`\): "
                     r"\*\*(\d+) of (\d+)\*\* q/v heads at p <= 0\.05 before the\s+adjustment \(([\d.]+)%; the old "
                     r"rule: (\d+) of (\d+)\), \*\*(\d+) called after it\*\*\.\s+Control forwards: (\d+) against the "
                     r"old rule's (\d+);", README)
    assert text, "README calibration bullet not found"
    seeds, k, n, share, k_old, n_old, called, forwards, forwards_old = text.groups()
    assert (int(seeds), int(n), int(n_old)) == (len(new), new.heads.sum(), old.heads.sum())
    assert (int(k), int(k_old), int(called)) == (new.called_unadjusted.sum(), old.called_unadjusted.sum(),
                                                 new.called_adjusted.sum())
    assert float(share) == round(100 * int(k) / int(n), 1)
    assert (int(forwards), int(forwards_old)) == (new.control_forwards.sum(), old.control_forwards.sum())


@pytest.mark.parametrize("setting", list(MODELS))
def test_readme_cost_and_calls_equal_the_csvs(setting):
    cost = pd.read_csv(RESULTS / "control_cost.csv").set_index(["setting", "rule"])
    new, old = cost.loc[(setting, "sequential_bh")], cost.loc[(setting, "fixed_19")]
    said = " ".join(README.split())
    text = re.search(rf"\* {LABELS[setting]} at the defaults \([^;]*; `docs/results/{MODELS[setting]}/"
                     r"ablation_fdr\.csv`\): \*\*(\d+) of the (\d+) heads run exactly stay bias-dependent after the "
                     r"correction\*\* \((\d+) at p <= 0\.05 before it, (\d+) drew all 199; the old rule called "
                     r"(\d+)\)\. Control forwards: (\d+) against the old rule's (\d+) \(([\d.]+)x", said)
    assert text, f"README {setting} bullet not found"
    *counts, ratio = text.groups()
    assert [int(v) for v in counts] == [new.called_adjusted, new.heads, new.called_unadjusted, new.heads_at_max,
                                        old.called_unadjusted, new.control_forwards, old.control_forwards]
    assert float(ratio) == round(new.control_forwards / old.control_forwards, 1)
