"""The matched control of ``ablate_bias``: random directions of the method's own displacement norm.

Each test fails on the release before it: there the control columns did not exist, "auto" chose its exact heads by
the method's own estimate, and ``method="random"`` (a displacement of about sqrt(2)|b|) was the only control.
"""

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import interp
from interp.ablation import ablate_bias
from interp.ablation.options import SweepOptions
from interp.ablation.control import (CONTROL_ALPHA, adjust_controls, benjamini_hochberg, control_columns,
                                    control_forwards, control_stages, normal_tail_p, used_draws)
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs
from interp.record.patching import bias_shift, matched_shift

D_HEAD = 32  # wide heads: a random unit direction has |cos| to a fixed one of about 1/sqrt(32)


def batches(model, n=2, pos=12):
    return [tiny_inputs(model, batch=3, pos=pos, seed=s) for s in range(n)]


def next_token_ce(hf, x):
    """The mean next-token cross-entropy of a plain HF forward (no hooks, no interp)."""
    logits = hf(x).logits.double()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()


def test_control_columns_are_the_band_the_monte_carlo_p_and_the_normal_tail():
    controls = [0.1, -0.3, 0.2, 0.05]
    for tail in ("normal", "sequential"):
        got = control_columns(-0.25, controls, 0, tail)
        assert (got["control_lo"], got["control_hi"], got["n_control"]) == (-0.3, 0.2, 4)
        assert got["control_p_empirical"] == pytest.approx((1 + 1) / 5)  # only |-0.3| >= 0.25
        assert got["outside_control"] is False
        m, s = np.mean(controls), np.std(controls, ddof=1)
        assert got["delta_z"] == pytest.approx((-0.25 - m) / s)
        assert "bias_dependent" not in got  # read across the table's heads (adjust_controls), never per row
    assert control_columns(-0.25, controls, 0, "sequential")["control_p"] == pytest.approx(2 / 5)
    # the normal tail: P(|X| >= 0.25), X = m + s sqrt(1 + 1/4) T_3, through scipy's frozen t rather than the formula
    from scipy import stats
    predictive = stats.t(3, loc=np.mean(controls), scale=np.std(controls, ddof=1) * np.sqrt(1.25))
    expected = 1 - (predictive.cdf(0.25) - predictive.cdf(-0.25))
    assert control_columns(-0.25, controls, 0, "normal")["control_p"] == pytest.approx(expected, rel=1e-9)
    missing = control_columns(0.5, None)
    assert missing["n_control"] == 0 and np.isnan(missing["control_p"]) and np.isnan(missing["delta_z"])
    assert np.isnan(missing["control_p_empirical"])


def test_the_normal_tail_is_exact_for_normal_draws_far_from_zero():
    """Its claim: for delta and the draws from one normal, P(p <= u) = u (the Student-t prediction of one more draw;
    far from 0, |X| >= |delta| is the one tail). 20,000 seeded sets of 19 draws: within 4 binomial SDs at each u."""
    rng = np.random.default_rng(0)
    x = 5.0 + rng.normal(size=(20_000, 20))
    p = np.array([normal_tail_p(row[0], row[1:]) for row in x])
    for u in (0.05, 0.01, 0.0025):
        sd = np.sqrt(u * (1 - u) / len(p))
        assert abs(np.mean(p <= u) - u) < 4 * sd, (u, np.mean(p <= u))
    assert np.isnan(normal_tail_p(1.0, [0.5, 0.5, 0.5])) and np.isnan(normal_tail_p(1.0, [0.1, 0.2]))


def _sequential_by_hand(delta, draws, stop, n_max):
    """Besag and Clifford's rule written out: draw one at a time; stop at the stop-th draw as large as |delta|
    (p = stop / n), else after n_max draws (p = (1 + hits) / (n_max + 1))."""
    hits = 0
    for n, c in enumerate(draws[:n_max], start=1):
        hits += abs(c) >= abs(delta)
        if hits == stop:
            return n, stop / n
    return n_max, (1 + hits) / (n_max + 1)


@pytest.mark.parametrize("seed", range(6))
def test_sequential_p_values_equal_the_rule_drawn_one_at_a_time(seed):
    rng = np.random.default_rng(seed)
    draws = rng.normal(size=199)
    for delta in (0.0, 0.3, 1.5, 2.5, 4.0):
        for stop in (1, 3, 5):
            n, p = _sequential_by_hand(delta, list(draws), stop, 199)
            got = control_columns(delta, list(draws), stop, "sequential")
            assert (got["n_control"], got["control_p"]) == (n, pytest.approx(p))
            assert got["control_p_empirical"] == pytest.approx(p)
            assert used_draws(delta, draws[:n], stop, 199) == n  # decided from the draws up to the stop alone
            assert used_draws(delta, draws[:n - 1], stop, 199) is None or n == 199
            assert got["control_lo"] == draws[:n].min() and got["control_hi"] == draws[:n].max()


def test_p_falls_below_a_correction_across_twenty_heads_at_the_old_19_draws():
    """With 19 draws the Monte Carlo p could not go below 1 / 20 = 0.05, so no correction across heads could ever
    pass (20 heads: 0.05 / 20 = 0.0025); the normal tail of the same 19 draws can, for a head far outside its band,
    and the sequential rule can with 199 draws (p = 1 / 200)."""
    draws = list(np.random.default_rng(1).normal(size=199))
    far = control_columns(10.0, draws[:19], 5, "normal")
    assert far["n_control"] == 19 and far["control_p_empirical"] == pytest.approx(1 / 20)  # the old floor
    assert far["control_p"] < CONTROL_ALPHA / 20 and far["delta_z"] > 5
    seq = control_columns(10.0, draws, 5, "sequential")
    assert seq["n_control"] == 199 and seq["control_p"] == pytest.approx(1 / 200)
    near = control_columns(0.01, draws[:19], 5, "normal")  # inside the band: stopped at 5 draws, Monte Carlo p
    assert near["n_control"] == 5 and near["control_p"] == near["control_p_empirical"] == pytest.approx(1.0)


def test_control_stages_double_from_the_stop_to_the_maximum():
    assert control_stages(199, 5) == [5, 10, 20, 40, 80, 160, 199] and control_stages(19, 5) == [5, 10, 19]
    assert control_stages(19, 0) == [19] and control_stages(3, 5) == [3] and control_stages(0, 5) == []
    assert [control_forwards(n, 199, 5) for n in (0, 5, 6, 10, 33, 161, 199)] == [0, 5, 10, 10, 40, 199, 199]


def _bh_by_hand(p):
    """The step-up rule's adjusted p without sorting: q_i = min over thresholds t >= p_i among the p of
    m t / #{p <= t}, at most 1."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    return np.array([min(1.0, min(m * t / np.sum(p <= t) for t in p if t >= pi)) for pi in p])


@pytest.mark.parametrize("seed", range(8))
def test_benjamini_hochberg_equals_the_step_up_rule_by_hand(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 40))
    p = np.round(rng.uniform(0, 1, m) ** 3, 2)  # small p and ties among them
    q = benjamini_hochberg(p)
    np.testing.assert_allclose(q, _bh_by_hand(p), rtol=0, atol=1e-12)
    order = np.sort(p)
    k = max([i for i in range(1, m + 1) if order[i - 1] <= i * CONTROL_ALPHA / m], default=0)
    assert set(np.flatnonzero(q <= CONTROL_ALPHA)) == set(np.flatnonzero(p <= (order[k - 1] if k else -1)))


def test_one_head_at_p_005_among_twenty_is_not_called():
    """The old call (control_p <= 0.05 per head) called this head; across 20 heads its adjusted p is 1."""
    table = pd.DataFrame(dict(control_p=[0.05] + [1.0] * 19, identity=[""] * 20))
    adjusted = adjust_controls(table)
    assert adjusted.control_p_adjusted.iloc[0] == pytest.approx(1.0) and not adjusted.bias_dependent.any()
    strong = adjust_controls(pd.DataFrame(dict(control_p=[1 / 200] * 3 + [0.5] * 17, identity=[""] * 20)))
    assert strong.bias_dependent.tolist() == [True] * 3 + [False] * 17  # 20 x 0.005 / 3 = 0.033
    mixed = adjust_controls(pd.DataFrame(dict(control_p=[1 / 200, 1.0, np.nan], identity=["", "absent bias", ""])))
    assert mixed.control_p_adjusted.iloc[0] == pytest.approx(1 / 200)  # the identity row is no test: m = 1
    assert mixed.bias_dependent.iloc[1] is False or mixed.bias_dependent.iloc[1] == False  # noqa: E712
    assert pd.isna(mixed.bias_dependent.iloc[2]) and np.isnan(mixed.control_p_adjusted.iloc[2])


def test_a_control_draw_equals_a_plain_hf_forward_with_the_bias_moved_by_that_draw():
    """Brute force: the control deltas of draws 0 and 1 equal editing HF's fused c_attn bias by the drawn vectors,
    and delta_z is delta in their spread, (delta - mean) / sd."""
    hf = tiny_hf_model("gpt2", d_head=D_HEAD).double()
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    data = batches(model)
    layer, head = 1, 2
    row = ablate_bias(model, data, kinds=("q",), layers=[layer], heads=[head], estimate="exact", n_control=2,
                      control_stop=0, progress=False).iloc[0]
    n_tokens = [x.shape[0] * (x.shape[1] - 1) for x in data]
    mean = lambda m: sum(next_token_ce(m, x) * n for x, n in zip(data, n_tokens)) / sum(n_tokens)  # noqa: E731
    expected = []
    for draw in (0, 1):
        shift = matched_shift(bias_shift(model, layer, "q", "zero"), layer, "q", seed=0, draw=draw)[head]
        edited = copy.deepcopy(hf)
        with torch.no_grad():
            edited.transformer.h[layer].attn.c_attn.bias[head * D_HEAD:(head + 1) * D_HEAD] += shift.double()
            expected.append(mean(edited) - mean(hf))
    assert row.n_control == 2
    assert abs(row.control_lo - min(expected)) <= 1e-9 and abs(row.control_hi - max(expected)) <= 1e-9
    spread = abs(expected[0] - expected[1]) / np.sqrt(2)  # the sd of two values
    assert row.delta_z == pytest.approx((row.delta - np.mean(expected)) / spread, rel=1e-6)
    assert row.displacement_norm == pytest.approx(float(shift.norm()), rel=1e-9)  # same norm: matched
    with torch.no_grad():
        zeroed = copy.deepcopy(hf)
        zeroed.transformer.h[layer].attn.c_attn.bias[head * D_HEAD:(head + 1) * D_HEAD] = 0.0
        assert abs(row.delta - (mean(zeroed) - mean(hf))) <= 1e-9


def _planted_value_head(layer: int, head: int) -> torch.nn.Module:
    """A tiny GPT-2 whose head (layer, head) writes only the component of v along its own b_v: W_O's rows for the
    head are b_v's unit vector times w. Zeroing b_v moves the residual by -|b_v| w; a random direction of the same
    norm by |b_v| cos(u, b_v) w, |cos| about 1/sqrt(32): the bias's own direction is what matters."""
    hf = tiny_hf_model("gpt2", d_head=D_HEAD, seed=3).double()
    n_embd = hf.config.n_embd
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        v_bias = hf.transformer.h[layer].attn.c_attn.bias[2 * n_embd + head * D_HEAD:2 * n_embd + (head + 1) * D_HEAD]
        unit = v_bias / v_bias.norm()
        w = 0.02 * torch.randn(n_embd, generator=gen, dtype=torch.float64)
        hf.transformer.h[layer].attn.c_proj.weight[head * D_HEAD:(head + 1) * D_HEAD] = torch.outer(unit, w)
    return hf


def test_a_planted_direction_specific_value_bias_is_called_bias_dependent_after_correction():
    """With 19 draws its Monte Carlo p is 1 / 20, which no correction across the model's 8 value heads could pass
    (8 x 0.05 = 0.4: the old per-head call had no correction); the normal tail of the same 19 draws puts it far below
    0.05 / 8, and the sequential rule drawn on to 199 at 1 / 200."""
    model = interp.load_model(_planted_value_head(1, 1), device="cpu")
    df = ablate_bias(model, batches(model), kinds=("v",), estimate="exact", progress=False)
    planted = df[(df.layer == 1) & (df["head"] == 1)].iloc[0]
    assert planted.n_control == 19 and planted.control_p_empirical == pytest.approx(1 / 20)
    assert planted.control_p < CONTROL_ALPHA / len(df) and planted.bias_dependent
    np.testing.assert_allclose(df.control_p_adjusted, _bh_by_hand(df.control_p))
    assert abs(planted.delta_z) > 5  # a random direction moves it about 1/sqrt(32) as much
    others = df.drop(planted.name)  # random heads: at most a chance call among them (FDR, not family-wise)
    assert others.control_p.min() > planted.control_p and others.bias_dependent.sum() <= 1
    assert (others.n_control < 19).any()  # heads inside their band stop early
    seq = ablate_bias(model, batches(model), kinds=("v",), layers=[1], heads=[1], estimate="exact", progress=False,
                      control_p="sequential", n_control=199).iloc[0]
    assert seq.n_control == 199 and seq.control_p == pytest.approx(1 / 200)


def test_a_random_init_model_shows_almost_no_bias_dependent_heads():
    """Gaussian biases are exchangeable with the control's draws: each p-value is about uniform, so about 5% of
    heads may have p <= 0.05 and, with the false discovery rate controlled across them, none is called unless some
    p is near 0.05 / 16. 2 layers x 4 heads x (q, v) = 16 exact rows: 5 or more uncorrected p <= 0.05 has
    probability 0.0006 under the null. The calibration over 8 seeds: docs/results/control_calibration.csv."""
    model = interp.load_model(tiny_hf_model("gpt2", d_head=D_HEAD, seed=5).double(), device="cpu")
    df = ablate_bias(model, batches(model), kinds=("q", "v"), estimate="exact", progress=False)
    assert len(df) == 16 and (df.n_control <= 19).all() and (df.n_control >= 5).all()
    assert (df.control_p <= CONTROL_ALPHA).sum() <= 4, df[["layer", "head", "kind", "delta", "control_p"]]
    assert df.bias_dependent.sum() == 0, df[["layer", "head", "kind", "delta", "control_p", "control_p_adjusted"]]
    assert df.n_control.mean() < 19  # null heads inside their band stop early: fewer forwards than 19 each


def test_the_sequential_rule_reads_the_same_draws_as_a_fixed_count_run():
    """A sequential row that used n draws equals a fixed run of n draws (control_stop=0, the old rule) in its band,
    and that run's p says how many of the n were as large as delta: the stop (or fewer at the maximum)."""
    model = interp.load_model(tiny_hf_model("gpt2", d_head=D_HEAD, seed=5).double(), device="cpu")
    data = batches(model, n=1)
    keywords = dict(kinds=("q",), layers=[0], estimate="exact", progress=False, n_boot=0)
    seq = ablate_bias(model, data, n_control=40, control_stop=2, control_p="sequential", **keywords)
    for _, row in seq.iterrows():
        fixed = ablate_bias(model, data, heads=[int(row["head"])], n_control=int(row.n_control), control_stop=0,
                            **keywords).iloc[0]
        assert (fixed.control_lo, fixed.control_hi, fixed.n_control) == (row.control_lo, row.control_hi, row.n_control)
        hits = round(fixed.control_p_empirical * (fixed.n_control + 1)) - 1
        if row.n_control < 40:
            assert hits == 2 and row.control_p == pytest.approx(2 / row.n_control)
        else:
            assert hits <= 2 and row.control_p == pytest.approx(fixed.control_p)


def test_sequential_draws_do_not_depend_on_stacking_or_rounds(monkeypatch):
    import interp.ablation.sweep as sweep
    model = interp.load_model(tiny_hf_model("gpt2", d_head=D_HEAD, seed=5).double(), device="cpu")
    data = batches(model, n=1)
    keywords = dict(kinds=("q", "v"), estimate="exact", progress=False, n_boot=0, n_control=60, control_stop=3)
    columns = ["control_lo", "control_hi", "control_p", "control_p_adjusted", "n_control", "delta_z", "bias_dependent"]
    one = ablate_bias(model, data, stack=8, **keywords)[columns]
    monkeypatch.setattr(sweep, "ROUND_JOBS", 3)
    other = ablate_bias(model, data, stack=1, reuse_prefix=False, **keywords)[columns]
    pd.testing.assert_frame_equal(one, other, check_exact=False, rtol=1e-9)


def test_control_forwards_count_the_draws_run(monkeypatch):
    import interp.ablation.sweep as sweep
    model = interp.load_model(tiny_hf_model("gpt2", d_head=D_HEAD, seed=5).double(), device="cpu")
    calls = []
    real = sweep.control_patch_hooks
    monkeypatch.setattr(sweep, "control_patch_hooks", lambda *a, **k: calls.append(1) or real(*a, **k))
    df = ablate_bias(model, batches(model, n=1), kinds=("q", "v"), estimate="exact", progress=False, n_boot=0,
                     n_control=50, control_stop=4)
    assert len(calls) == sum(control_forwards(n, 50, 4) for n in df.n_control) < 50 * len(df)


def test_identity_rows_have_zero_controls_and_estimates_have_none():
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    df = ablate_bias(model, batches(model), kinds=("k", "q"), estimate="auto", top_k=1, sample_k=1, progress=False)
    identity = df[df.identity != ""]
    assert len(identity) and (identity.control_lo == 0).all() and (identity.control_hi == 0).all()
    assert (identity.control_p == 1).all() and (identity.control_p_adjusted == 1).all()
    assert not identity.bias_dependent.any() and (identity.n_control == 5).all()  # the stop, reached at once
    estimated = df[(df.estimate != "exact") & (df.identity == "")]
    assert len(estimated) and estimated.bias_dependent.isna().all() and estimated.control_p.isna().all()
    exact = df[(df.estimate == "exact") & (df.identity == "")]
    assert len(exact) and exact.n_control.between(5, 19).all() and exact.bias_dependent.notna().all()
    np.testing.assert_allclose(exact.control_p_adjusted, _bh_by_hand(exact.control_p))  # the exact rows: one family


def test_auto_runs_the_same_heads_exactly_whatever_the_method():
    model = interp.load_model(tiny_hf_model("gpt2", n_layers=3), device="cpu")
    chosen = {}
    for method in ("zero", "random", "layer_mean"):
        df = ablate_bias(model, batches(model), kinds=("q", "v"), method=method, top_k=2, sample_k=2, n_control=0,
                         progress=False)
        exact = df[df.estimate == "exact"]
        chosen[method] = sorted(zip(exact.layer, exact["head"], exact.kind, exact.exact_because))
    assert chosen["zero"] == chosen["random"] == chosen["layer_mean"]


def test_the_random_method_displaces_the_bias_by_about_sqrt2_its_norm_and_zero_by_its_norm():
    model = interp.load_model(tiny_hf_model("gpt2", d_head=D_HEAD), device="cpu")
    norms = {}
    for method in ("zero", "random"):
        df = ablate_bias(model, batches(model, n=1), kinds=("q",), method=method, estimate="exact", n_control=0,
                         progress=False)
        norms[method] = df.set_index(["layer", "head"]).displacement_norm
    b = interp.attention_weights(model, 0).b_Q.double().norm(dim=-1)
    assert np.allclose(norms["zero"].loc[0].to_numpy(), b.numpy(), rtol=1e-6)
    ratio = (norms["random"] / norms["zero"]).to_numpy()
    assert 1.2 < ratio.mean() < 1.6  # E||r - b|| / ||b|| -> sqrt(2) as d_head grows


def test_merge_shards_adjusts_across_the_merged_heads():
    """Each rank adjusts over its own rows; the merged table over all of them (m = 4, not 2)."""
    from interp.ablation.sweep import merge_shards

    def frame(heads, p):
        return adjust_controls(pd.DataFrame(dict(layer=0, head=heads, kind="q", scope="head", method="zero",
                                                 estimate="exact", n_targets=1, identity="", control_p=p)))
    ranks = [frame([0, 2], [0.01, 0.5]), frame([1, 3], [0.02, 0.9])]
    assert ranks[0].control_p_adjusted.tolist() == pytest.approx([0.02, 0.5])  # m = 2 within the rank
    merged = merge_shards(ranks)
    assert merged["head"].tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(merged.control_p_adjusted, _bh_by_hand(merged.control_p))
    assert merged.bias_dependent.tolist() == [True, True, False, False]  # 0.01 x 4 / 1, 0.02 x 4 / 2: both 0.04


def test_the_rule_is_an_option_and_a_sequential_rule_that_cannot_pass_a_correction_is_refused():
    assert SweepOptions().control_p == "normal" and SweepOptions().n_control == 19
    assert SweepOptions(control_p="sequential", n_control=199).control_p == "sequential"
    with pytest.raises(InputError, match=r"control_p='sequential' with n_control=19.*1 / 20.*n_control=199"):
        SweepOptions(control_p="sequential")
    with pytest.raises(InputError, match="control_p must be one of normal, sequential"):
        SweepOptions(control_p="t")


@pytest.mark.parametrize("family", ["gpt2", "llama"])  # llama: SmolLM2's architecture, no q, k, v bias
def test_the_displacement_norm_is_the_norm_of_the_targets_bias_shifts_and_0_without_biases(family):
    """||s|| over the targets, by hand from the shifts ``bias_shift`` gives (the method's a' - a at each head);
    exactly 0 under every method where the model has no bias."""
    from interp.ablation.control import displacement_norm

    model = interp.load_model(tiny_hf_model(family), device="cpu")
    stats = interp.record_qkv(model, batches(model), progress=False)
    for method in ("zero", "mean", "random"):
        for kind in "qkv":
            last = model.interp.heads(kind) - 1
            rows = bias_shift(model, 1, kind, method, stats, seed=0)[[0, last]].double()
            got = displacement_norm(model, [(1, 0, kind), (1, last, kind)], method, stats)
            assert got == pytest.approx(float(rows.norm()), rel=1e-12)
            assert (got == 0.0) == (family == "llama"), (method, kind)
