"""Prefix reuse: replaying the intact outputs of the layers below a patch gives the same deltas
as recomputing them, on a tiny model of every registered family (float64)."""

import pytest
import torch

import interp
from interp.ablation import ablate_bias
from interp.record.capture import record_block_outputs, replay_blocks
from interp.models import TINY_FAMILIES, tiny_hf_model, tiny_inputs
from interp.models.loading import clone_model


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_prefix_reuse_gives_the_same_deltas_as_full_forwards(name):
    model = clone_model(interp.load_model(tiny_hf_model(name, n_layers=3), device="cpu"), torch.float64)
    batches = [tiny_inputs(name, batch=2, seed=s) for s in range(2)]
    # one control draw per variant: the control's patched forwards replay the same prefix (19 draws, the default,
    # cost 19x the forwards and test the same replay 19 times: 4 s of ~4.5 s per family)
    kw = dict(kinds=("q", "v"), scope="head", method="zero", stack=3, force_exact=True, estimate="exact",
              n_control=1, progress=False)
    reused = ablate_bias(model, batches, reuse_prefix=True, **kw)
    full = ablate_bias(model, batches, reuse_prefix=False, **kw)
    assert len(reused) == len(full) > 0
    assert (reused[["layer", "head", "kind"]].values == full[["layer", "head", "kind"]].values).all()
    assert (reused.delta - full.delta).abs().max() <= 1e-10
    assert (reused.n_control == full.n_control).all()
    controlled = full.n_control == 1  # the control's draws replay the same prefix: the same deltas
    assert ((reused.control_lo - full.control_lo)[controlled].abs() <= 1e-10).all()
    if set("qv") & set(interp.models.get_family(name).default_biases):
        assert reused.delta.abs().max() > 1e-6  # the patches do something, so the agreement means something
        assert controlled.any() and full.control_lo[controlled].abs().max() > 1e-6  # and so do the control's
    else:
        assert (reused.delta == 0).all()  # no q or v bias to remove


def test_replayed_blocks_are_restored_and_skip_their_computation():
    model = interp.load_model(tiny_hf_model("gpt2", n_layers=3), device="cpu")
    x = tiny_inputs("gpt2", batch=2)
    with torch.no_grad(), record_block_outputs(model) as outputs:
        intact = model(x)
    calls = []
    handle = model.blocks[0].attn.register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad(), replay_blocks(model, outputs, start=2, n=1, batch_size=2):
            replayed = model(x)
        assert calls == []  # block 0 did not run
        assert torch.equal(replayed, intact)
        assert all("forward" not in vars(model.blocks[layer]) for layer in range(3))
        with torch.no_grad():
            assert torch.equal(model(x), intact)
        assert calls == [1]
    finally:
        handle.remove()


def test_prefix_reuse_streams_one_batch_of_block_outputs_at_a_time(monkeypatch):
    """Issue 40: the block outputs a patched forward replays are recorded per batch and dropped before the next
    batch's (never held for the whole data set), and the deltas equal recomputing every layer."""
    import weakref
    from contextlib import contextmanager

    import interp.ablation.sweep as sweep

    model = interp.load_model(tiny_hf_model("gpt2", n_layers=3), device="cpu")
    batches = [tiny_inputs("gpt2", batch=2, seed=s) for s in range(3)]
    kw = dict(kinds=("q",), estimate="exact", n_control=1, progress=False)
    recorded, alive_at_entry = [], []
    original = sweep.record_block_outputs

    @contextmanager
    def watched(m):
        alive_at_entry.append(sum(r() is not None for r in recorded))
        with original(m) as outputs:
            yield outputs
        recorded.extend(weakref.ref(o) for o in outputs if isinstance(o, torch.Tensor))

    monkeypatch.setattr(sweep, "record_block_outputs", watched)
    reused = ablate_bias(model, batches, **kw)
    assert len(alive_at_entry) == len(batches) and recorded  # one recording per batch (one round)
    assert alive_at_entry == [0] * len(batches)  # the previous batch's outputs were gone when the next was recorded
    full = ablate_bias(model, batches, reuse_prefix=False, **kw)
    assert (recomputed := (full.delta - reused.delta).abs().max()) <= 1e-6, recomputed
