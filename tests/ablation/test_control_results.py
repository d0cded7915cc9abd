"""The matched control's published measurements (``benchmarks/control_calibration.py``) hold what the docs say.

Each CSV is read again here: its own columns must agree with each other (the adjusted p is Benjamini-Hochberg of the
p, written out by hand; the calls follow from them; the cost is the draws read), and the sentences of the
mathematics page and the findings that quote it must equal it. Under the old rule (19 draws, each head called at its
own Monte Carlo p <= 0.05, no adjustment) the planted head's p could not fall below 0.05 / 16 and these fail.
"""

import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
MATHEMATICS = (ROOT / "docs" / "mathematics.md").read_text()


def agrees(quoted: str, value: float) -> bool:
    """'2.0e-4' agrees with 0.000203, '0.0032' with 0.00324, '8' only with 8 (tests/test_docs.py's rule)."""
    q = Decimal(quoted)
    half_ulp = Decimal(1).scaleb(q.as_tuple().exponent) / 2
    return abs(Decimal(repr(float(value))) - q) <= half_ulp * Decimal("1.000001")


def bh_by_hand(p):
    """The step-up rule's adjusted p without sorting: q_i = min over thresholds t >= p_i of m t / #{p <= t}, <= 1."""
    p = np.asarray(p, dtype=float)
    return np.array([min(1.0, min(len(p) * t / np.sum(p <= t) for t in p if t >= pi)) for pi in p])


def paragraph(text: str, start: str, end: str) -> str:
    return re.sub(r"\s+", " ", text[text.index(start):text.index(end, text.index(start))])


def test_untrained_models_call_no_head_after_the_adjustment_and_the_planted_head_in_every_seed():
    t = pd.read_csv(RESULTS / "control_calibration.csv")
    assert set(t.architecture) == {"gpt2", "qwen2"} and (t.groupby("architecture").seed.nunique() == 8).all()
    assert (t.called_adjusted <= t.called_unadjusted).all() and t.called_adjusted.sum() == 0
    for _, g in t.groupby("architecture"):  # the unadjusted rate near 5%: within 3 binomial SDs of it
        n = g.heads.sum()
        assert abs(g.called_unadjusted.sum() - 0.05 * n) <= 3 * np.sqrt(n * 0.05 * 0.95)
    assert (t.control_forwards <= t.old_control_forwards).all() and (t.old_control_forwards == 19 * t.heads).all()
    planted = t[t.architecture == "gpt2"]
    assert (planted.planted_p_empirical == 0.05).all()  # the old floor: no correction across 16 heads passes it
    assert (planted.planted_p < 0.05 / planted.heads).all() and planted.planted_called.all()
    assert (planted.planted_p_adjusted <= 0.05).all() and planted.planted_others_called.sum() == 0


def test_the_mathematics_page_quotes_the_calibration():
    t = pd.read_csv(RESULTS / "control_calibration.csv")
    text = paragraph(MATHEMATICS, "**Measured** (`benchmarks/control_calibration.py`)", "**Many heads")
    m = re.search(r"At the defaults, (\d+) of (\d+) GPT-2 heads \(q and v\) and (\d+) of (\d+) Qwen2 heads .*? where "
                  r"5% would be ([\d.]+); the old rule .*? called (\d+) and (\d+); after the adjustment none is called "
                  r"in any seed\. .*? the old floor, ([\d.]+), in all (\d+) seeds; its normal-tail p is at most "
                  r"([\d.e-]+) and it is called after the adjustment in (\d+) of (\d+) \(largest adjusted p ([\d.]+)\), "
                  r"with no other head of those models called\. The null heads' early stops ran (\d+) control forwards "
                  r"where 19 draws a head ran (\d+)\.", text)
    assert m, text
    g = t.groupby("architecture").sum(numeric_only=True)
    planted = t[t.architecture == "gpt2"]
    expected = [g.called_unadjusted["gpt2"], g.heads["gpt2"], g.called_unadjusted["qwen2"], g.heads["qwen2"],
                0.05 * g.heads["gpt2"], g.called_old["gpt2"], g.called_old["qwen2"], 0.05, len(planted),
                planted.planted_p.max(), planted.planted_called.sum(), len(planted), planted.planted_p_adjusted.max(),
                t.control_forwards.sum(), t.old_control_forwards.sum()]
    assert g.heads["gpt2"] == g.heads["qwen2"] and t.called_adjusted.sum() == 0
    for quoted, value in zip(m.groups(), expected):
        assert agrees(quoted, value), (quoted, value)


@pytest.mark.parametrize("model", ["minilm-l6", "dinov2-s14"])
def test_the_defaults_sweep_adjusts_its_heads_and_costs_at_most_the_old_forwards(model):
    from interp.ablation.control import control_forwards

    heads = pd.read_csv(RESULTS / model / "ablation_fdr.csv")
    cost = pd.read_csv(RESULTS / "control_cost.csv").set_index("model").loc[model]
    np.testing.assert_allclose(heads.control_p_adjusted, bh_by_hand(heads.control_p), rtol=1e-12)
    assert (heads.bias_dependent == (heads.control_p_adjusted <= 0.05)).all()
    assert (heads.old_called == ((heads.n_control == 19) & (heads.control_p_empirical <= 0.05))).all()
    stopped = heads.n_control < 19  # inside their band: the Monte Carlo p, 5 / n
    np.testing.assert_allclose(heads[stopped].control_p, 5 / heads[stopped].n_control)
    assert (heads[~stopped].control_p_empirical >= 0.05).all()  # 19 draws: the floor the normal tail goes below
    forwards = sum(control_forwards(int(n), 19, 5) for n in heads.n_control)
    assert (cost.heads, cost.control_forwards, cost.old_control_forwards) == (len(heads), forwards, 19 * len(heads))
    assert cost.control_forwards <= 1.2 * cost.old_control_forwards  # the brief: at most about the old cost
    assert cost.called_adjusted == heads.bias_dependent.sum() and cost.called_old == heads.old_called.sum()
    assert cost.called_adjusted >= 1  # a head far outside its band passes the correction at 19 draws


def test_the_findings_quote_the_minilm_sweep_at_the_defaults():
    heads = pd.read_csv(RESULTS / "minilm-l6" / "ablation_fdr.csv")
    cost = pd.read_csv(RESULTS / "control_cost.csv").set_index("model").loc["minilm-l6"]
    text = paragraph((ROOT / "docs" / "findings.md").read_text(), "Those calls were made one head at a time",
                     "The old control")
    m = re.search(r"\*\*(\d+) of the (\d+) largest and (\d+) of the (\d+) stay bias-dependent after the correction\*\* "
                  r"\(the largest adjusted p among them ([\d.]+), L(\d+) H(\d+) ([qkv]), just outside its band\), for "
                  r"(\d+) control forwards where 19 draws a head ran (\d+)\.", text)
    assert m, text
    top = heads.assign(a=heads.delta.abs()).nlargest(10, "a")
    called = heads[heads.bias_dependent]
    edge = called.loc[called.control_p_adjusted.idxmax()]
    assert edge.delta < edge.control_lo or edge.delta > edge.control_hi  # outside its band, as said
    expected = [top.bias_dependent.sum(), len(top), len(called), len(heads), edge.control_p_adjusted, edge.layer,
                edge["head"], edge.kind, cost.control_forwards, cost.old_control_forwards]
    for quoted, value in zip(m.groups(), expected):
        assert quoted == value if isinstance(value, str) else agrees(quoted, value), (quoted, value)


def test_the_mathematics_page_quotes_the_cost_on_minilm_and_the_demo():
    cost = pd.read_csv(RESULTS / "control_cost.csv").set_index("model")
    text = paragraph(MATHEMATICS, "On trained models at the defaults", "**Many heads")
    m = re.search(r": (\d+) heads run exactly each\), .*?MiniLM ran (\d+) control forwards \(([\d.]+) of the old (\d+)\) "
                  r"and calls (\d+) of (\d+) heads after the adjustment, the demo's DINOv2 on 2 photographs (\d+) "
                  r"\(([\d.]+)\) and (\d+) of (\d+); the old rule called (\d+) and (\d+) without any adjustment\. .*?"
                  r"\(down to (1e-\d+)\)", text)
    assert m, text
    mini, demo = cost.loc["minilm-l6"], cost.loc["dinov2-s14"]
    smallest = min(pd.read_csv(RESULTS / model / "ablation_fdr.csv").control_p.min() for model in cost.index)
    expected = [mini.heads, mini.control_forwards, mini.ratio, mini.old_control_forwards, mini.called_adjusted,
                mini.heads, demo.control_forwards, demo.ratio, demo.called_adjusted, demo.heads, mini.called_old,
                demo.called_old]
    assert mini.heads == demo.heads and demo["items"] == 2
    for quoted, value in zip(m.groups(), expected):
        assert agrees(quoted, value), (quoted, value)
    assert 10 ** -22 < smallest <= 10 ** -20 and m.group(13) == "1e-21"  # quoted as its order of magnitude
