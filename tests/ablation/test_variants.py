"""Ablation variants: a scope column says what each row patched; custom sets are keyed by their targets."""

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
    heads = ablate_bias(lm, data(), kinds=("q",), scope="head", progress=False)
    layers = ablate_bias(lm, data(), kinds=("q",), scope="layer", progress=False)
    every = ablate_bias(lm, data(), kinds=("q",), scope="all", progress=False)
    custom = ablate_bias(lm, data(), scope=[(0, 1, "q"), (1, 0, "v")], progress=False)
    assert (heads.scope == "head").all() and heads["head"].notna().all() and len(heads) == 2 * 4
    assert (layers.scope == "layer").all() and layers["head"].isna().all() and list(layers.layer) == [0, 1]
    assert (every.scope == "all").all() and every[["layer", "head"]].isna().all().all()
    assert custom.scope.tolist() == ["custom"] and custom.kind.tolist() == ["q+v"] and custom.n_targets.tolist() == [2]
    # a layer's variant patches all its heads: its delta is not one head's
    assert layers.n_targets.tolist() == [4, 4]


def test_a_second_custom_set_is_not_answered_from_the_first_sets_log(lm, tmp_path):
    first = ablate_bias(lm, data(), scope=[(0, 1, "q")], out=tmp_path, progress=False)
    second = ablate_bias(lm, data(), scope=[(1, 2, "q")], out=tmp_path, progress=False)
    alone = ablate_bias(lm, data(), scope=[(1, 2, "q")], progress=False)
    assert second.delta.iloc[0] == pytest.approx(alone.delta.iloc[0], abs=1e-12)
    assert second.delta.iloc[0] != pytest.approx(first.delta.iloc[0], abs=1e-9)


def test_degenerate_choices_are_refused(lm):
    with pytest.raises(InputError, match="must not repeat"):
        ablate_bias(lm, data(), kinds=("q", "q"), progress=False)
    with pytest.raises(InputError, match="non-empty"):
        ablate_bias(lm, data(), kinds=(), progress=False)
    with pytest.raises(InputError, match="empty list of targets"):
        ablate_bias(lm, data(), scope=[], progress=False)
    with pytest.raises(InputError, match="method must be one of zero, mean, layer_mean, fold"):
        ablate_bias(lm, data(), method="bogus", estimate="attribution", progress=False)


def test_rows_round_trip_through_csv(lm, tmp_path):
    df = ablate_bias(lm, data(), kinds=("v",), scope="layer", out=tmp_path, progress=False)
    again = pd.read_csv(tmp_path / "ablation_zero_exact.csv")
    assert again["head"].isna().all() and (again.scope == "layer").all()
    assert again.delta.tolist() == pytest.approx(df.delta.tolist())
