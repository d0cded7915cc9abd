"""The direct measurement (attention weights of the slot wrapper, hooks) equals the analyzer
(interp.analysis.sinks over the bridge) wherever both can measure, and sees what the bridge cannot."""

import numpy as np
import pytest
import torch

from experiments.training.sink_arms import SINK_ID, LMShape, attention_modules, build_lm_arm, build_vit_arm, set_slot_gate
from experiments.training.sink_metrics import analyzer_tables, direct_tables, measure


SMALL = LMShape(n_layers=2, d_model=32, n_heads=4, d_ff=64, context=24)


def _with_random_biases(model, std=0.5):
    gen = torch.Generator().manual_seed(0)
    for name, p in model.named_parameters():
        if name.endswith(".bias") and p.requires_grad:
            p.data.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def _case(domain, arm):
    torch.manual_seed(1)
    if domain == "text":
        x = torch.randint(0, 256, (6, 24))
        x = torch.cat([torch.full((6, 1), SINK_ID), x], 1) if arm == "sink_token" else x
        return _with_random_biases(build_lm_arm(arm, 0, SMALL)), x
    return _with_random_biases(build_vit_arm(arm, 0)), torch.randn(6, 3, 28, 28)


@pytest.mark.parametrize("domain, arm", [("text", "none"), ("text", "qkv"), ("text", "sink_token"),
                                         ("vision", "none"), ("vision", "qkv")])
def test_direct_equals_the_analyzer_where_both_measure(domain, arm):
    model, x = _case(domain, arm)
    heads, layers = direct_tables(model, x, domain, arm)
    a_heads, a_layers = analyzer_tables(model, x, domain, batch=4)
    for col in ("mass_first", "implicit_norm", "constancy", "explicit_norm", "output_rms"):
        np.testing.assert_allclose(heads[col], a_heads[col], rtol=1e-7, atol=1e-10, err_msg=col)
    assert (heads.explicit_norm > 0.01).all() == (arm == "qkv")
    # the analyzer's median is a histogram's, within a relative 2^-11
    np.testing.assert_allclose(layers.max_abs, a_layers.max_abs, rtol=1e-6)
    np.testing.assert_allclose(layers.median_abs, a_layers.median_abs, rtol=2.0**-11)
    row = measure(model, x, domain, arm)[2]
    assert row["measured_by"] == "analyzer" and row["analyzer_vs_direct"] < 2.0**-11


def test_the_slot_mass_completes_each_row_and_a_dominant_slot_is_a_sink():
    model = build_lm_arm("kv_slot", 0, SMALL)
    x = torch.randint(0, 256, (4, 24))
    heads, _, row = measure(model, x, "text", "kv_slot")
    assert row["measured_by"] == "direct" and np.isnan(row["analyzer_vs_direct"])
    assert (heads.mass_slot > 0).all() and (heads.mass_slot + heads.mass_first < 1).all()
    assert row["sink_share_slot"] == 0.0
    set_slot_gate(model, 30.0)  # the slot takes (almost) every row's whole mass
    heads, _, row = measure(model, x, "text", "kv_slot")
    assert row["sink_share_slot"] == 1.0 and row["sink_share_first"] == 0.0
    assert float(heads.mass_slot.min()) > 0.999
    # the slot's learned constant: ||mean_i a_i* v* W_O|| ~ ||v* W_O|| when a_i* ~ 1
    attn = attention_modules(model)[0]
    v_wo = torch.einsum("hd,hdm->hm", attn.slot_value.double(),
                        attn.o_proj.weight.double().T.reshape(4, 8, -1)).norm(dim=-1)
    np.testing.assert_allclose(heads[heads.layer == 0].slot_norm, v_wo.detach(), rtol=1e-3)


def test_first_text_token_and_registers_are_measured_directly():
    model, x = _case("text", "sink_token")
    heads, _ = direct_tables(model, x, "text", "sink_token")
    assert not np.allclose(heads.mass_first, heads.mass_first_text)
    vit = build_vit_arm("registers", 0)
    heads, _, row = measure(vit, torch.randn(4, 3, 28, 28), "vision", "registers")
    assert row["measured_by"] == "direct" and heads.mass_registers.between(0, 1).all()
    assert np.isnan(row["sink_share_slot"]) and not np.isnan(row["sink_share_registers"])
