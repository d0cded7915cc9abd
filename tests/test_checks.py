"""interp.checks: index and count checks accept what the docs say and refuse the rest, naming the fix."""

import inspect

import numpy as np
import pandas as pd
import pytest
import torch

import interp
import interp.ablation
from interp.checks import check_count, check_heads, check_kinds, check_layers
from interp.errors import InputError, InternalError
from interp.models import tiny_hf_model
from interp.models.loading import load_model


@pytest.fixture(scope="module")
def info():
    return load_model(tiny_hf_model("gpt2", n_layers=3, n_heads=4), device="cpu").interp


@pytest.mark.parametrize("given, expected", [(None, [0, 1, 2]), (1, [1]), ([2, 0, 2], [0, 2]), (range(2), [0, 1])])
def test_layers_are_sorted_unique_indices(info, given, expected):
    assert check_layers(given, info) == expected


@pytest.mark.parametrize("bad", [3, -1, [], "0", 1.0, True, [0, None]])
def test_out_of_range_or_not_an_index_is_refused(info, bad):
    with pytest.raises(InputError, match="layers must"):
        check_layers(bad, info)
    with pytest.raises(InputError, match="heads must"):
        check_heads(bad if bad != 3 else 4, info)


def test_kinds_and_counts():
    assert check_kinds(["q", "v"]) == ["q", "v"] and check_kinds("k") == ["k"]
    with pytest.raises(InputError):
        check_kinds(["x"])
    assert check_count("batch_size", 3) == 3
    for bad in (0, -2, 1.5, "4", True):
        with pytest.raises(InputError, match="batch_size"):
            check_count("batch_size", bad)


# ----- selections: ints and int sequences only (issue 31) ---------------------------------------------------

MASK = [False, True, False, True]  # a mask for heads [1, 3] of a 4-head model; read as indices it was [0, 1]


@pytest.mark.parametrize("bad", [
    torch.tensor(MASK), np.array(MASK), MASK, torch.tensor(MASK, dtype=torch.uint8), torch.tensor(True),
    np.bool_(True), torch.tensor([1.0, 3.0]), np.array([1.0, 3.0]), np.float64(1.0), torch.tensor([[1, 3]]),
    (h for h in (1, 3)), {1: "a"}, [1, 2.0], [torch.tensor(1.0)], b"\x01",
], ids=lambda v: "a generator" if inspect.isgenerator(v) else repr(v))  # repr holds an address: xdist needs stable ids
def test_a_mask_or_a_float_is_not_a_selection(info, bad):
    with pytest.raises(InputError, match="heads must be None .* or a list of indices") as raised:
        check_heads(bad, info)
    if "True" in repr(bad) or "bool" in repr(bad) or "uint8" in repr(bad):
        assert "mask" in str(raised.value) or "True/False" in str(raised.value)


@pytest.mark.parametrize("given", [
    [1, 3], (3, 1), torch.tensor([1, 3]), torch.tensor([3, 1], dtype=torch.int32), np.array([1, 3]),
    np.array([1, 3], dtype=np.uint8), [np.int64(1), torch.tensor(3)], pd.Series([1, 3]), pd.Index([3, 1]),
], ids=repr)
def test_integer_sequences_of_any_library_are_the_same_selection(info, given):
    assert check_heads(given, info) == [1, 3]
    assert all(type(h) is int for h in check_heads(given, info))


def test_a_tensor_without_values_is_refused(info):
    with pytest.raises(InputError, match="holds no values"):
        check_heads(torch.tensor([1, 2], device="meta"), info)


@pytest.mark.parametrize("given", [3, np.int64(3), np.int32(3), torch.tensor(3), np.array(3)], ids=repr)
def test_one_integer_of_any_library_is_one_index(info, given):
    assert check_heads(given, info) == [3]


def _entry_points(model, ids):
    data = [ids]
    return {
        "record_qkv": lambda sel: interp.record_qkv(model, data, layers=sel, progress=False),
        "frequency_profile": lambda sel: interp.frequency_profile(model, data, heads=sel, progress=False),
        "sink_profile": lambda sel: interp.sink_profile(model, data, heads=sel, progress=False),
        "score_decomposition": lambda sel: interp.score_decomposition(model, data, heads=sel),
        "single_input": lambda sel: interp.single_input(model, ids[0], heads=sel),
        "ablate_bias": lambda sel: interp.ablation.ablate_bias(model, data, heads=sel, progress=False),
        "ablate_bias targets": lambda sel: interp.ablate_bias(model, data, scope=[(0, sel, "q")], progress=False),
    }


ENTRY_POINTS = list(_entry_points(None, None))


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_bool_mask_is_refused_by_every_entry_point(entry):
    """A torch bool mask for heads [1, 3] used to analyse heads [0, 1] (and layers [0, 1]) silently."""
    model = load_model(tiny_hf_model("gpt2", n_layers=2, n_heads=4), device="cpu")
    call = _entry_points(model, torch.randint(0, 90, (1, 6), generator=torch.Generator().manual_seed(0)))[entry]
    mask = torch.tensor(MASK if entry != "record_qkv" else [False, True])
    if entry == "ablate_bias targets":
        mask = torch.tensor(True)
    with pytest.raises(InputError, match="mask|True/False|scope must be") as raised:
        call(mask)
    assert not isinstance(raised.value, InternalError)


def test_a_frame_of_another_analyzer_is_named_with_what_it_lacks():
    # issue 38: merge_shards given a sink profile failed with a KeyError deep in pandas (an InternalError)
    from interp.ablation.sweep import COLUMNS
    from interp.checks import check_frames

    key = ["layer", "head", "kind", "scope", "method", "estimate", "n_targets"]
    ablation = pd.DataFrame(columns=COLUMNS)
    profile = pd.DataFrame(columns=["model", "layer", "head", "position", "mass", "sink"])
    check_frames([ablation, ablation], key, "merge_shards", "interp.ablate_bias")  # the right tables pass
    with pytest.raises(InputError, match=r"merge_shards takes tables of interp.ablate_bias; frame 1 lacks kind, "
                                         r"scope, method, estimate, n_targets \(it has model, layer, head, position"):
        check_frames([ablation, profile], key, "merge_shards", "interp.ablate_bias")
    with pytest.raises(InputError, match="frame 0 lacks layer.*no columns"):
        check_frames([pd.DataFrame()], key, "merge_shards", "interp.ablate_bias")


@pytest.mark.parametrize("given", ["first", ["first"], ("first",), np.array(["first"]), pd.Series(["first"]),
                                   [np.str_("first")]], ids=["str", "list", "tuple", "array", "Series", "np.str_"])
def test_positions_are_names_in_any_container(given):
    from interp.analysis.sink_parts import check_positions

    model = load_model(tiny_hf_model("gpt2"), device="cpu")
    assert check_positions(model, given) == ["first"]
    for index in (0, np.int64(0), [0], (0, "first")):  # issue 38: positions=0 was a TypeError (an InternalError)
        with pytest.raises(InputError, match="not token indices.*position 0, the first real token, is 'first'"):
            check_positions(model, index)
