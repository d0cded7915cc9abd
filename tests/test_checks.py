"""interp.checks: index and count checks accept what the docs say and refuse the rest, naming the fix."""

import pytest

from interp.checks import check_count, check_heads, check_kinds, check_layers
from interp.errors import InputError
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
