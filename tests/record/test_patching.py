"""interp.record.patching: target checks, and the matched control's directions."""

import numpy as np
import pytest
import torch

import interp
from interp.errors import InputError
from interp.models import tiny_hf_model
from interp.record.heads import attention_weights
from interp.record.patching import bias_patch_hooks, bias_shift, matched_shift


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
def test_bad_targets_are_one_clear_error(gpt2, targets, words):
    with pytest.raises(InputError, match=words):
        bias_patch_hooks(gpt2, targets)


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


# ----- an absent bias is shifted by 0 under every method -------------------------------------------------------

SHIFT_METHODS = ("zero", "mean", "layer_mean", "random")  # and "fold", v only


def _every_shift_is_zero(model, stats):
    """bias_shift and a control draw are exactly 0 at every site of a model without biases."""
    info = model.interp
    for layer in range(info.n_layers):
        for kind in "qkv":
            for method in SHIFT_METHODS + (("fold",) if kind == "v" else ()):
                shift = bias_shift(model, layer, kind, method, stats, seed=3)
                assert shift.shape == (info.heads(kind), info.d_head) and not shift.any(), (layer, kind, method)
                assert not matched_shift(shift, layer, kind, seed=0, draw=1).any()


def test_an_absent_bias_is_shifted_by_zero_under_every_method():
    llama = interp.load_model(tiny_hf_model("llama"), device="cpu")  # SmolLM2's architecture: no q, k, v bias
    assert not interp.bias_spec(llama).present.any()
    stats = interp.record_qkv(llama, [interp.tiny_inputs("llama", seed=s) for s in range(2)], progress=False)
    assert stats.mean(0, "q", "content").abs().max() > 0.01  # E[XW] is there: "mean" used to add it
    _every_shift_is_zero(llama, stats)


@pytest.mark.slow
def test_smollm2_has_no_bias_and_every_method_shifts_it_by_zero():
    smol = interp.load_model("smollm2-135m")
    assert not interp.bias_spec(smol).present.any()
    batches = interp.builtin_batches(smol, "python-docs", batch_size=2, n=2, seq_len=16)
    _every_shift_is_zero(smol, interp.record_qkv(smol, batches, progress=False))


def _brute_content_mean(model, batches, layer, kind):
    """E[XW] of every head at (layer, kind), by hand: the hook's activations a = XW + b over every position,
    averaged in float64, minus b."""
    seen = []
    with torch.no_grad():
        for x in batches:
            model.run_with_hooks(x, fwd_hooks=[(f"blocks.{layer}.attn.hook_{kind}",
                                                lambda t, hook: seen.append(t.double().flatten(0, 1)))])
    bias = attention_weights(model, layer).bias(kind).double()
    return torch.cat(seen).mean(0) - bias, bias


@pytest.mark.parametrize("kind", ["q", "v"])
def test_mean_still_replaces_a_present_bias_by_the_data_origin(gpt2, kind):
    """Where the bias is there, "mean" moves a by E[XW] - b: the brute-force content mean minus b."""
    batches = [interp.tiny_inputs("gpt2", seed=s) for s in range(2)]
    stats = interp.record_qkv(gpt2, batches, progress=False)
    content, bias = _brute_content_mean(gpt2, batches, 1, kind)
    assert bias.abs().max() > 0.1
    shift = bias_shift(gpt2, 1, kind, "mean", stats).double()
    torch.testing.assert_close(shift, content - bias, rtol=1e-5, atol=1e-5)
