"""interp.patching: target checks, and the matched control's directions."""

import numpy as np
import pytest
import torch

import interp
from interp.errors import InputError
from interp.models import tiny_hf_model
from interp.patching import bias_patch_hooks, bias_shift, control_patch_hooks, matched_shift


@pytest.fixture(scope="module")
def gpt2():
    return interp.load_model(tiny_hf_model("gpt2"), device="cpu")


@pytest.mark.parametrize("targets,words", [
    ([(0, 9, "q")], "head 9 out of range for q"),
    ([(0, None, "q")], "needs an integer layer and head"),
    ((0, 1, "q"), "one bare target"),
    ([(0, 1)], "each target is \\(layer, head, kind\\)"),
    ("q", "takes a list of"),
])
@pytest.mark.parametrize("function", [bias_patch_hooks, lambda m, t: control_patch_hooks(m, t, "zero", 0)])
def test_bad_targets_are_one_clear_error(gpt2, targets, words, function):
    with pytest.raises(InputError, match=words):
        function(gpt2, targets)


def test_numpy_integers_are_targets(gpt2):
    numpy = bias_patch_hooks(gpt2, [(np.int64(1), np.int32(2), "v")])
    plain = bias_patch_hooks(gpt2, [(1, 2, "v")])
    assert [name for name, _ in numpy] == [name for name, _ in plain] == ["blocks.1.attn.hook_v"]


def test_a_control_draw_keeps_each_heads_displacement_norm_and_varies_its_direction(gpt2):
    shift = bias_shift(gpt2, 1, "q", "zero").double()
    draws = torch.stack([matched_shift(shift, 1, "q", seed=0, draw=d).double() for d in range(200)])
    torch.testing.assert_close(draws.norm(dim=-1), shift.norm(dim=-1).expand(200, -1), rtol=1e-12, atol=1e-12)
    unit = draws / draws.norm(dim=-1, keepdim=True)
    assert unit.mean(0).norm(dim=-1).max() < 0.25  # isotropic: the mean direction of 200 draws is near 0
    torch.testing.assert_close(matched_shift(shift, 1, "q", 0, 3), draws[3])  # seeded
    assert not torch.allclose(matched_shift(shift, 1, "q", 1, 3).double(), draws[3])
