"""``stack="auto"`` (``interp.ablation.memory``): the estimate of a plain forward's peak counts the tensors the
eager forward materialises, the stack it picks keeps the sweep's estimate within the budget, and the sweep's numbers
do not depend on the stack."""

import argparse

import pytest
import torch

import interp
from interp.ablation import memory
from interp.ablation.options import SweepOptions, add_flags, flag_values
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs


def _qwen(**config):
    return interp.load_model(tiny_hf_model("qwen2", n_layers=2, **config), device="cpu")


def test_forward_estimate_counts_logits_and_one_block_by_hand():
    model = _qwen()
    info, config = model.interp, model.hf_model.config
    inputs = tiny_inputs("qwen2", batch=3, pos=10, seed=0)
    est = memory.estimate_bytes(model, inputs, logits=True, reuse_prefix=True)
    t, e = 10, 4  # tokens, float32
    block = t * (3 * info.n_heads * t * 4 + 3 * config.intermediate_size * e + 6 * config.hidden_size * e)
    logits = t * config.vocab_size * 4
    assert est["forward"] == max(block, logits)
    assert est["fixed"] == logits + config.num_hidden_layers * t * config.hidden_size * e
    assert est["per_variant"] == block + t * config.hidden_size * 4
    assert est["backward"] == config.num_hidden_layers * block + 3 * logits
    no_prefix = memory.estimate_bytes(model, inputs, logits=False, reuse_prefix=False)
    assert no_prefix["fixed"] == 0  # a hidden-state metric keeps no logits; no prefix kept


def test_auto_stack_is_the_largest_within_the_budget():
    model = _qwen()
    for pos in (4, 16, 64):
        inputs = tiny_inputs("qwen2", batch=2, pos=pos, seed=0)
        stack = memory.auto_stack(model, inputs, logits=True, reuse_prefix=True)
        est = memory.estimate_bytes(model, inputs, logits=True, reuse_prefix=True)
        total = lambda s: 2 * (est["fixed"] + s * est["per_variant"]) + est["tile"]  # noqa: E731
        budget = memory.BUDGET * 2 * est["forward"]
        assert 1 <= stack <= memory.MAX_STACK
        assert stack == 1 or total(stack) <= budget  # within the budget, or 1 when nothing fits
        assert stack == memory.MAX_STACK or total(stack + 1) > budget  # and no larger stack would be
        under_backward = memory.auto_stack(model, inputs, logits=True, reuse_prefix=True, backward=True)
        assert under_backward >= stack  # a backward's peak is a budget at least as large
        wider = max(budget, 2 * est["backward"])
        assert under_backward == memory.MAX_STACK or total(under_backward + 1) > wider


@pytest.mark.parametrize("stack", ["auto", 3])
def test_sweep_numbers_do_not_depend_on_the_stack(stack):
    model = interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu").to(torch.float64)
    data = [tiny_inputs("qwen2", batch=2, pos=8, seed=s) for s in range(2)]
    keywords = dict(kinds=("q", "v"), estimate="exact", n_control=2, n_boot=0, progress=False)
    one = interp.ablate_bias(model, data, stack=1, **keywords)
    other = interp.ablate_bias(model, data, stack=stack, **keywords)
    for column in ("ablated", "delta", "kl", "control_lo", "control_hi"):
        assert (one[column] - other[column]).abs().max() <= 1e-12, column


def test_stack_option_reads_auto_a_count_or_refuses():
    assert SweepOptions().stack == "auto"
    assert SweepOptions(stack="8").stack == 8  # the command line's text
    assert SweepOptions(stack=2).stack == 2
    for bad in ("big", 0, 1.5, True):
        with pytest.raises(InputError, match="stack"):
            SweepOptions(stack=bad)
    parser = argparse.ArgumentParser()
    add_flags(parser)
    assert flag_values(parser.parse_args(["--stack", "auto"]))["stack"] == "auto"
    assert SweepOptions(**{"stack": flag_values(parser.parse_args(["--stack", "4"]))["stack"]}).stack == 4
