"""The matched control of ``ablate_bias``: random directions of the method's own displacement norm.

Each test fails on the release before it: there the control columns did not exist, "auto" chose its exact heads by
the method's own estimate, and ``method="random"`` (a displacement of about sqrt(2)|b|) was the only control.
"""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import interp
from interp.ablation import ablate_bias
from interp.ablation.sweep import CONTROL_ALPHA, control_columns
from interp.models import tiny_hf_model, tiny_inputs
from interp.record.patching import bias_shift, matched_shift

D_HEAD = 32  # wide heads: a random unit direction has |cos| to a fixed one of about 1/sqrt(32)


def batches(model, n=2, pos=12):
    return [tiny_inputs(model, batch=3, pos=pos, seed=s) for s in range(n)]


def next_token_ce(hf, x):
    """The mean next-token cross-entropy of a plain HF forward (no hooks, no interp)."""
    logits = hf(x).logits.double()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()


def test_control_columns_are_the_band_and_the_monte_carlo_p_value():
    controls = [0.1, -0.3, 0.2, 0.05]
    got = control_columns(-0.25, controls)
    assert (got["control_lo"], got["control_hi"], got["n_control"]) == (-0.3, 0.2, 4)
    assert got["control_p"] == pytest.approx((1 + 1) / 5)  # only |-0.3| >= 0.25
    assert got["outside_control"] is False and got["bias_dependent"] is False
    strong = control_columns(0.5, [0.01 * i for i in range(19)])
    assert strong["control_p"] == pytest.approx(1 / 20) and strong["bias_dependent"] is True
    assert 1 / 20 <= CONTROL_ALPHA  # 19 draws reach alpha; 18 cannot
    assert control_columns(0.5, [0.0] * 18)["bias_dependent"] is False
    missing = control_columns(0.5, None)
    assert missing["n_control"] == 0 and np.isnan(missing["control_p"]) and missing["bias_dependent"] is None


def test_a_control_draw_equals_a_plain_hf_forward_with_the_bias_moved_by_that_draw():
    """Brute force: the control delta of draw 0 equals editing HF's fused c_attn bias by the drawn vector."""
    hf = tiny_hf_model("gpt2", d_head=D_HEAD).double()
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    data = batches(model)
    layer, head = 1, 2
    row = ablate_bias(model, data, kinds=("q",), layers=[layer], heads=[head], estimate="exact", n_control=1,
                      progress=False).iloc[0]
    shift = matched_shift(bias_shift(model, layer, "q", "zero"), layer, "q", seed=0, draw=0)[head]
    edited = copy.deepcopy(hf)
    with torch.no_grad():
        edited.transformer.h[layer].attn.c_attn.bias[head * D_HEAD:(head + 1) * D_HEAD] += shift.double()
    n_tokens = [x.shape[0] * (x.shape[1] - 1) for x in data]
    mean = lambda m: sum(next_token_ce(m, x) * n for x, n in zip(data, n_tokens)) / sum(n_tokens)  # noqa: E731
    with torch.no_grad():
        expected = mean(edited) - mean(hf)
    assert row.n_control == 1
    assert abs(row.control_lo - expected) <= 1e-9 and row.control_hi == row.control_lo
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


def test_a_planted_direction_specific_value_bias_is_called_bias_dependent():
    model = interp.load_model(_planted_value_head(1, 1), device="cpu")
    df = ablate_bias(model, batches(model), kinds=("v",), layers=[1], estimate="exact", progress=False)
    planted = df[df["head"] == 1].iloc[0]
    assert planted.n_control == 19
    assert planted.bias_dependent and planted.control_p == pytest.approx(1 / 20)
    assert abs(planted.delta) > 1.5 * max(abs(planted.control_lo), abs(planted.control_hi))  # max |cos| of 19: ~0.5


def test_a_random_init_model_shows_almost_no_bias_dependent_heads():
    """Gaussian biases are exchangeable with the control's draws: each p-value is uniform, so about 5% of heads
    (not most) may be called bias-dependent. 2 layers x 4 heads x (q, v) = 16 exact rows: 5 or more calls has
    probability 0.0006 under the null."""
    model = interp.load_model(tiny_hf_model("gpt2", d_head=D_HEAD, seed=5).double(), device="cpu")
    df = ablate_bias(model, batches(model), kinds=("q", "v"), estimate="exact", progress=False)
    assert len(df) == 16 and (df.n_control == 19).all()
    assert df.bias_dependent.sum() <= 4, df[["layer", "head", "kind", "delta", "control_lo", "control_hi"]]


def test_identity_rows_have_zero_controls_and_estimates_have_none():
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    df = ablate_bias(model, batches(model), kinds=("k", "q"), estimate="auto", top_k=1, sample_k=1, progress=False)
    identity = df[df.identity != ""]
    assert len(identity) and (identity.control_lo == 0).all() and (identity.control_hi == 0).all()
    assert (identity.control_p == 1).all() and not identity.bias_dependent.any()
    estimated = df[(df.estimate != "exact") & (df.identity == "")]
    assert len(estimated) and estimated.bias_dependent.isna().all() and estimated.control_p.isna().all()
    exact = df[(df.estimate == "exact") & (df.identity == "")]
    assert len(exact) and (exact.n_control == 19).all() and exact.bias_dependent.notna().all()


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
