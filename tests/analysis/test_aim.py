"""Aim anywhere (issue 25): ``layers=`` / ``heads=`` on every analyzer select rows of the full run.

The selected rows must equal the same rows of the full table exactly (same numbers to the bit, same
order, same columns) and no other row may appear; an index out of range is one ``InputError`` from
the shared check (``interp.checks``), before any forward.
"""

import pandas as pd
import pytest
import torch

import interp
from interp.analysis.frequency import frequency_shift_under_ablation
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs

LAYERS, HEADS = [2], [0, 3]  # of 3 layers x 4 heads


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    vit = interp.load_model(tiny_hf_model("vit", n_layers=3), device="cpu")
    lm = interp.load_model(tiny_hf_model("gpt2", n_layers=3), device="cpu")
    return dict(vit=(vit, [tiny_inputs(vit)]), lm=(lm, [tiny_inputs(lm)]))


def _runs(model, data):
    """name -> (analyzer taking layers=/heads= keywords, whether it takes heads=)."""
    stats = interp.record_qkv(model, data, progress=False)
    q = dict(progress=False)
    return {
        "origin_shift": (lambda **kw: interp.origin_shift(model, stats, **kw), True),
        "score_decomposition": (lambda **kw: interp.score_decomposition(model, data, **q, **kw), True),
        "bias_invariances": (lambda **kw: interp.bias_invariances(model, data, **q, **kw), False),
        "frequency_profile": (lambda **kw: interp.frequency_profile(model, data, **q, **kw), True),
        "frequency_shift": (lambda **kw: frequency_shift_under_ablation(model, data, **q, **kw), True),
        "sink_profile": (lambda **kw: interp.sink_profile(model, data, **q, **kw), True),
        "implicit_value_bias": (lambda **kw: interp.implicit_value_bias(model, data, **q, **kw), True),
        "massive_activations": (lambda **kw: interp.massive_activations(model, data, **q, **kw), False),
        "record_qkv": (lambda **kw: interp.record_qkv(model, data, **q, **kw).to_frame(), False),
    }


@pytest.mark.parametrize("family", ["vit", "lm"])
def test_selected_rows_equal_the_same_rows_of_the_full_run(models, family):
    model, data = models[family]
    for name, (run, takes_heads) in _runs(model, data).items():
        full = run()
        kw = dict(layers=LAYERS, heads=HEADS) if takes_heads else dict(layers=LAYERS)
        chosen = run(**kw)
        keep = full.layer.isin(LAYERS) & (full["head"].isin(HEADS) if takes_heads else True)
        expected = full[keep].reset_index(drop=True)
        assert len(expected) and len(expected) < len(full), name
        pd.testing.assert_frame_equal(chosen, expected, check_exact=True, obj=name)
        assert set(chosen.layer) == set(LAYERS), name  # no other rows
        if takes_heads:
            assert set(chosen["head"]) == set(HEADS), name


def test_one_index_is_a_selection_of_one(models):
    model, data = models["vit"]
    one = interp.frequency_profile(model, data, layers=1, heads=2, progress=False)
    assert list(zip(one.layer, one["head"])) == [(1, 2)]


@pytest.mark.parametrize("kw,words", [(dict(heads=[4]), "heads must lie in 0..3"),
                                      (dict(layers=[3]), "layers must lie in 0..2"),
                                      (dict(heads=[-1]), "heads must lie in 0..3")])
def test_out_of_range_is_one_input_error(models, kw, words):
    model, data = models["vit"]
    for name, (run, takes_heads) in _runs(model, data).items():
        if "heads" in kw and not takes_heads:
            continue
        with pytest.raises(InputError, match=words):
            run(**kw)


def test_origin_refuses_layers_the_statistics_lack(models):
    model, data = models["vit"]
    stats = interp.record_qkv(model, data, layers=[0], progress=False)
    with pytest.raises(InputError, match=r"layers \[1\] were not recorded"):
        interp.origin_shift(model, stats, layers=[0, 1])
    assert set(interp.origin_shift(model, stats).layer) == {0}


def test_fewer_than_three_heads_are_one_family_said_as_such(models):
    """interp frequency --heads 0,1 on one layer: no clustering to do, and the text says why."""
    from interp.report.pipeline import _families, _families_text

    model, data = models["vit"]
    profile = interp.frequency_profile(model, data, layers=[1], heads=[0, 1], progress=False)
    one = _families(profile)
    assert (one.cluster == 0).all() and (one.k == 1).all() and not one.structure.any()
    pd.testing.assert_frame_equal(one[profile.columns], profile)  # the profile itself untouched
    numbers = dict(p_value=float(one.p_value.iloc[0]), structure=False, k=1)
    assert _families_text(numbers, "cluster 0: ...").startswith("Too few heads selected")
    assert "cluster" in _families(interp.frequency_profile(model, data, progress=False))  # 12 heads: clustered
