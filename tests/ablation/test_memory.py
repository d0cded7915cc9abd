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
    assert no_prefix["fixed"] == 0 and no_prefix["tile"] == 0  # a hidden-state metric keeps no logits; no prefix
    # read through one linear unembedding: the intact normed rows and one tile with its probabilities, not the
    # logits, and the stacked final states waiting; per stacked variant a tile of float32 logits and two float64 tiles (z - lse_p, p (z - lse_p))
    tiled = memory.estimate_bytes(model, inputs, logits=True, reuse_prefix=True, tiled=True)
    prefix = config.num_hidden_layers * t * config.hidden_size * e
    waiting = 0.25 * logits  # stacked final states waiting for one pass over the vocabulary: a quarter of the logits
    assert tiled["fixed"] == t * (config.hidden_size * 4 + 512 * (4 + 8)) + waiting + prefix
    assert tiled["tile"] == t * 512 * (4 + 8 + 8)
    assert tiled["per_variant"] == est["per_variant"] and tiled["forward"] == est["forward"]


def test_auto_stack_is_the_largest_within_the_budget():
    model = _qwen()
    for pos in (4, 16, 64):
        inputs = tiny_inputs("qwen2", batch=2, pos=pos, seed=0)
        stack = memory.auto_stack(model, inputs, logits=True, reuse_prefix=True)
        est = memory.estimate_bytes(model, inputs, logits=True, reuse_prefix=True)
        assert est["tile"] == 2 * pos * 512 * 4  # a tile of the logits and its difference, float32
        total = lambda s: 2 * (est["fixed"] + s * (est["per_variant"] + est["tile"]))  # noqa: E731
        budget = memory.STACK_BUDGET * 2 * est["forward"]
        assert 1 <= stack <= memory.MAX_STACK
        assert stack == 1 or total(stack) <= budget  # within the budget, or 1 when nothing fits
        assert stack == memory.MAX_STACK or total(stack + 1) > budget  # and no larger stack would be
        under_backward = memory.auto_stack(model, inputs, logits=True, reuse_prefix=True, backward=True)
        assert under_backward >= stack  # a backward's peak is a budget at least as large
        wider = max(budget, 2 * est["backward"])
        assert under_backward == memory.MAX_STACK or total(under_backward + 1) > wider
        # read through one linear unembedding: the same rule over that path's estimate (no intact logits held)
        tiled = memory.estimate_bytes(model, inputs, logits=True, reuse_prefix=True, tiled=True)
        total_tiled = lambda s: 2 * (tiled["fixed"] + s * (tiled["per_variant"] + tiled["tile"]))  # noqa: E731
        stack_tiled = memory.auto_stack(model, inputs, logits=True, reuse_prefix=True, tiled=True)
        assert stack_tiled == 1 or total_tiled(stack_tiled) <= budget
        assert stack_tiled == memory.MAX_STACK or total_tiled(stack_tiled + 1) > budget


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


def test_estimate_items_is_the_most_whose_backward_fits_one_forward():
    model = _qwen()
    config = model.hf_model.config
    for pos, batch in ((4, 2), (16, 4), (64, 8)):
        inputs = tiny_inputs("qwen2", batch=batch, pos=pos, seed=0)
        est = memory.estimate_bytes(model, inputs, logits=True, reuse_prefix=False)
        block = est["per_variant"] - pos * config.hidden_size * 4  # one block of one sequence (by hand above)
        layers, width = config.num_hidden_layers, config.hidden_size
        dz = 2 * layers * pos * width * 8  # AtP*'s (A' - A) V of q and k per layer, float64
        tiled_head = pos * (3 * width + 2 * 512) * 4
        assert est["backward_tiled"] == layers * block + tiled_head + dz
        assert est["backward_checkpointed"] == layers * pos * width * 4 + 3 * block + tiled_head + dz
        budget = memory.BUDGET * batch * est["forward"]
        checkpoint = memory.estimate_checkpoint(model, inputs)
        assert checkpoint == (est["backward_tiled"] > budget and est["backward_checkpointed"] < est["backward_tiled"])
        per_item = est["backward_checkpointed" if checkpoint else "backward_tiled"]
        items = memory.estimate_items(model, inputs)
        part = memory.PART_BUDGET * batch * est["forward"]  # a part's backward: within one forward of the batch
        assert 1 <= items <= batch
        assert items == 1 or items * per_item <= part
        assert items == batch or (items + 1) * per_item > part
        assert memory.backward_peak(model, inputs, tiled=True) == items * per_item


def test_a_long_sequence_checkpoints_the_estimate_and_fits_more_items():
    """Where one item's backward through every block's kept activations exceeds two forwards of the batch, the
    estimate recomputes its blocks (the blocks' inputs and three blocks kept instead of every block)."""
    model = interp.load_model(tiny_hf_model("qwen2", n_layers=8, config={"vocab_size": 5000}), device="cpu")
    short, long = tiny_inputs("qwen2", batch=2, pos=8, seed=0), tiny_inputs("qwen2", batch=2, pos=256, seed=0)
    assert not memory.estimate_checkpoint(model, short)
    assert memory.estimate_checkpoint(model, long)
    est = memory.estimate_bytes(model, long, logits=True, reuse_prefix=False)
    assert est["backward_checkpointed"] < est["backward_tiled"]
    assert memory.estimate_items(model, long, checkpoint=False) <= memory.estimate_items(model, long)
    # a model too shallow for recomputing to hold less (it keeps three blocks; the last is never recomputed)
    shallow = interp.load_model(tiny_hf_model("qwen2", n_layers=2, config={"vocab_size": 5000}), device="cpu")
    one = tiny_inputs("qwen2", batch=1, pos=512, seed=0)
    est = memory.estimate_bytes(shallow, one, logits=True, reuse_prefix=False)
    assert est["backward_tiled"] > memory.BUDGET * est["forward"]  # over the budget, and yet
    assert not memory.estimate_checkpoint(shallow, one)


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
@pytest.mark.parametrize("estimate", ["atp", "attribution"])
def test_one_pass_estimate_in_parts_equals_the_whole_batch_and_the_full_head(monkeypatch, family, estimate):
    """The one-pass estimate with the tiled metric, run a batch at a time, an item at a time, or an item at a time
    with its blocks recomputed in the backward (checkpointed), equals the one through the full head (the
    forward's logits and their log-softmax), float64, 1e-10: the parts add up, and a recomputation changes
    nothing (it runs in the backward, without the estimate's hooks, which only read or clone)."""
    import interp.ablation.attribution as attribution
    import interp.ablation.sweep as sweep

    model = interp.load_model(tiny_hf_model(family, n_layers=3), device="cpu").to(torch.float64)
    ids = tiny_inputs(family, batch=3, pos=9, seed=0)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    data = [interp.Batch(ids, mask), interp.Batch(tiny_inputs(family, batch=3, pos=9, seed=1))]
    keywords = dict(kinds=("q", "k", "v"), estimate=estimate, progress=False)
    tiled = sweep._tiled_metric
    seen = []

    def spy(run, items, checkpoint=False):
        out = tiled(run)
        seen.append(out)
        return {**out, "items_per_part": items, "checkpoint": checkpoint} if out else out

    monkeypatch.setattr(sweep, "_tiled_metric", lambda run: spy(run, 1))
    by_item = interp.ablate_bias(model, data, **keywords)
    assert seen and all(s for s in seen)  # the tiled path ran
    recomputed = []
    checkpoint = attribution._checkpoint
    monkeypatch.setattr(attribution, "_checkpoint", lambda *a, **k: recomputed.append(1) or checkpoint(*a, **k))
    monkeypatch.setattr(sweep, "_tiled_metric", lambda run: spy(run, 1, checkpoint=True))
    checkpointed = interp.ablate_bias(model, data, **keywords)
    assert len(recomputed) == 2 * 3 * 2  # blocks 0 and 1 of every item (3 a batch) of both batches
    monkeypatch.setattr(sweep, "_tiled_metric", lambda run: spy(run, 0))
    whole = interp.ablate_bias(model, data, **keywords)
    monkeypatch.setattr(sweep, "_tiled_metric", lambda run: {})
    full_head = interp.ablate_bias(model, data, **keywords)
    assert full_head["delta"].abs().max() > 1e-6  # the estimates are not all 0
    for got in (by_item, whole, checkpointed):
        assert (got["delta"] - full_head["delta"]).abs().max() <= 1e-10
        assert (got["baseline"] - full_head["baseline"]).abs().max() <= 1e-10


def test_the_estimate_runs_on_a_model_with_frozen_weights():
    """A model whose weights do not require gradients (``requires_grad_(False)``) gets the same one-pass estimates,
    checkpointed or not: the estimate differentiates activations, never weights (it raised an InternalError)."""
    import interp.ablation.sweep as sweep

    model = interp.load_model(tiny_hf_model("gpt2", n_layers=3), device="cpu").to(torch.float64)
    data = [interp.Batch(tiny_inputs("gpt2", batch=2, pos=8, seed=0))]
    keywords = dict(kinds=("q", "k", "v"), estimate="atp", progress=False)
    trainable = interp.ablate_bias(model, data, **keywords)
    model.requires_grad_(False)
    frozen = interp.ablate_bias(model, data, **keywords)
    tiled = sweep._tiled_metric
    sweep._tiled_metric = lambda run: {**tiled(run), "checkpoint": True, "items_per_part": 1}
    try:
        frozen_checkpointed = interp.ablate_bias(model, data, **keywords)
    finally:
        sweep._tiled_metric = tiled
    assert trainable["delta"].abs().max() > 1e-8
    for got in (frozen, frozen_checkpointed):
        assert (got["delta"] - trainable["delta"]).abs().max() <= 1e-12
    assert not any(p.requires_grad for p in model.parameters())  # left frozen
    assert all(p.grad is None for p in model.parameters())  # and no weight gradient was formed


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])  # rotary with grouped kv heads; learned positions
def test_atp_pattern_shift_a_block_of_heads_at_a_time_equals_the_whole_layer_formula(monkeypatch, family):
    """AtP*'s dz = (softmax(log A + dS) - A) V, taken a block of query heads at a time (in place, to keep the heap
    small), equals the whole layer's formula written out here in float64 (every head at once), bit for bit within
    float64 rounding, whatever the block (one head, two, all)."""
    from interp.ablation import attribution
    from interp.analysis.scores import apply_rotary
    from interp.record.heads import kv_group
    from interp.record.hooks import hook_name
    from interp.record.patching import bias_shift

    model = interp.load_model(tiny_hf_model(family, n_layers=2), device="cpu")
    info = model.interp
    cache: dict = {}
    read = ("q", "k", "v", "pattern") + (("cos", "sin") if info.rotary else ())
    hooks = [(hook_name(1, n), attribution._store(cache, hook_name(1, n))) for n in read]
    with torch.no_grad():
        model.run_with_hooks(tiny_inputs(family, batch=2, pos=9, seed=0), fwd_hooks=hooks)
    shift = {(1, kind): bias_shift(model, 1, kind, "zero") for kind in ("q", "k")}
    want = {}
    for kind in ("q", "k"):
        q, k = cache[hook_name(1, "q")].double(), cache[hook_name(1, "k")].double()
        delta = shift[(1, kind)].double()[None, None].expand_as(q if kind == "q" else k)
        q, k = (delta, k) if kind == "q" else (q, delta)
        if info.rotary:
            cos, sin = cache[hook_name(1, "cos")].double(), cache[hook_name(1, "sin")].double()
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        group = kv_group(info.n_heads, info.n_kv_heads)
        ds = torch.einsum("bihd,bjhd->bhij", q, k[:, :, group]) * info.score_scale(1)
        pattern = cache[hook_name(1, "pattern")].double()
        log_a = torch.where(pattern > 0, pattern.clamp_min(1e-300).log(), torch.full_like(pattern, -torch.inf))
        patched = torch.where(pattern > 0, (log_a + ds).softmax(-1), torch.zeros_like(pattern))
        want[(1, kind)] = torch.einsum("bhij,bjhd->bihd", patched - pattern,
                                       cache[hook_name(1, "v")].double()[:, :, group])
    per_head = 2 * 9 * 9 * 8  # float64 scores of one query head over the batch
    for block in (1, 2, info.n_heads):
        monkeypatch.setattr(attribution, "HEAD_BLOCK_BYTES", block * per_head)
        got = attribution._pattern_dz(model, cache, [(1, "q"), (1, "k")], shift)
        for site in want:
            torch.testing.assert_close(got[site], want[site], rtol=1e-13, atol=1e-15)
            assert got[site].abs().max() > 0  # the shift moves the pattern
