"""Ablation variants: a scope column says what each row patched; custom sets are keyed by their targets."""

import numpy as np
import pandas as pd
import pytest

import interp
from interp.ablation import ablate_bias
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs


@pytest.fixture(scope="module")
def lm():
    return interp.load_model(tiny_hf_model("gpt2"), device="cpu")


def data():
    return [tiny_inputs("gpt2", batch=2, pos=8, seed=s) for s in range(2)]


def test_scope_column_and_empty_coordinates(lm):
    heads = ablate_bias(lm, data(), kinds=("q",), scope="head", progress=False, estimate="exact", n_control=0)
    layers = ablate_bias(lm, data(), kinds=("q",), scope="layer", progress=False, estimate="exact", n_control=0)
    every = ablate_bias(lm, data(), kinds=("q",), scope="all", progress=False, estimate="exact", n_control=0)
    custom = ablate_bias(lm, data(), scope=[(0, 1, "q"), (1, 0, "v")], progress=False, estimate="exact", n_control=0)
    assert (heads.scope == "head").all() and heads["head"].notna().all() and len(heads) == 2 * 4
    assert (layers.scope == "layer").all() and layers["head"].isna().all() and list(layers.layer) == [0, 1]
    assert (every.scope == "all").all() and every[["layer", "head"]].isna().all().all()
    assert custom.scope.tolist() == ["custom"] and custom.kind.tolist() == ["q+v"] and custom.n_targets.tolist() == [2]
    # a layer's variant patches all its heads: its delta is not one head's
    assert layers.n_targets.tolist() == [4, 4]


def test_a_second_custom_set_is_not_answered_from_the_first_sets_log(lm, tmp_path):
    first = ablate_bias(lm, data(), scope=[(0, 1, "q")], out=tmp_path, progress=False, estimate="exact", n_control=0)
    second = ablate_bias(lm, data(), scope=[(1, 2, "q")], out=tmp_path, progress=False, estimate="exact", n_control=0)
    alone = ablate_bias(lm, data(), scope=[(1, 2, "q")], progress=False, estimate="exact", n_control=0)
    assert second.delta.iloc[0] == pytest.approx(alone.delta.iloc[0], abs=1e-12)
    assert second.delta.iloc[0] != pytest.approx(first.delta.iloc[0], abs=1e-9)


def test_degenerate_choices_are_refused(lm):
    with pytest.raises(InputError, match="must not repeat"):
        ablate_bias(lm, data(), kinds=("q", "q"), progress=False, estimate="exact")
    with pytest.raises(InputError, match="non-empty"):
        ablate_bias(lm, data(), kinds=(), progress=False, estimate="exact")
    with pytest.raises(InputError, match="empty list of targets"):
        ablate_bias(lm, data(), scope=[], progress=False, estimate="exact")
    with pytest.raises(InputError, match="method must be one of zero, mean, layer_mean, fold"):
        ablate_bias(lm, data(), method="bogus", estimate="attribution", progress=False)


def test_rows_round_trip_through_csv(lm, tmp_path):
    df = ablate_bias(lm, data(), kinds=("v",), scope="layer", out=tmp_path, progress=False, estimate="exact", n_control=0)
    again = pd.read_csv(tmp_path / "ablation.csv")
    assert again["head"].isna().all() and (again.scope == "layer").all()
    assert again.delta.tolist() == pytest.approx(df.delta.tolist())


def test_layers_and_heads_aim_the_sweep_and_equal_the_full_sweeps_rows():
    model = interp.load_model(interp.tiny_hf_model("qwen2", n_layers=3, n_heads=4, n_kv_heads=2), device="cpu")
    data = [interp.tiny_inputs("qwen2", batch=2, pos=8, seed=0)]
    full = interp.ablate_bias(model, data, kinds=("q", "k"), estimate="exact", n_control=0, progress=False)
    aimed = interp.ablate_bias(model, data, kinds=("q", "k"), estimate="exact", n_control=0, layers=[1], heads=[0, 3],
                               progress=False)
    # q: heads 0 and 3 of layer 1; k (2 kv heads): head 0 only
    assert sorted(zip(aimed.kind, aimed.layer, aimed["head"])) == [("k", 1, 0), ("q", 1, 0), ("q", 1, 3)]
    merged = aimed.merge(full, on=["kind", "layer", "head"], suffixes=("", "_full"))
    assert np.allclose(merged.delta, merged.delta_full, atol=1e-7)
    layer = interp.ablate_bias(model, data, kinds=("q",), scope="layer", estimate="exact", n_control=0, layers=0, heads=[1, 2],
                               progress=False)
    assert len(layer) == 1 and layer.n_targets.iloc[0] == 2


@pytest.mark.parametrize("kw, words", [
    (dict(layers=[5]), "layers must"), (dict(heads=[-1]), "heads must lie"), (dict(heads="0"), "heads must be"),
    (dict(heads=[]), "heads must be"), (dict(scope=[(0, 0, "q")], heads=[0]), "leave layers and heads out"),
    (dict(kinds=("k",), heads=[3]), "selects no k head"),
])
def test_bad_layer_and_head_selections_are_refused(kw, words):
    model = interp.load_model(interp.tiny_hf_model("qwen2", n_layers=3, n_heads=4, n_kv_heads=2), device="cpu")
    kw = {"kinds": ("q",), **kw}
    with pytest.raises(InputError, match=words):
        interp.ablate_bias(model, [interp.tiny_inputs("qwen2")], progress=False, **kw)
