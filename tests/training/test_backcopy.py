"""The Bigram-Backcopy positive control (interp.training.backcopy): the task's rule and statistics,
a short training that learns the copy, the slot's gate, checkpoints bound to their run, and the
findings' numbers equal to the shipped CSVs."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from interp.errors import InputError, StaleResultsError
from interp.models.sink_arms import LMShape, set_slot_gate
from interp.training.backcopy import (
    BackcopyRecipe, BackcopyRun, build_model, copy_positions, generate, make_task, recipe_fingerprint, train_run,
)

TINY = BackcopyRecipe(shape=LMShape(n_layers=2, n_heads=2, d_model=32, d_ff=64, context=24), n_tokens=16,
                      n_triggers=2, batch=16, lr=1e-2, warmup=5, steps=4, every=2, eval_sequences=64,
                      probe_sequences=16)


def test_every_sequence_follows_the_backcopy_rule_and_bigram_statistics_match_P():
    recipe = BackcopyRecipe()
    task = make_task(recipe)
    seq = generate(task, 4000, recipe.shape.context, torch.Generator().manual_seed(0))
    trig = task.is_trigger(seq)
    assert not trig[:, 0].any()  # x_0 is an ordinary token
    assert not (trig[:, 1:] & trig[:, :-1]).any()  # never two triggers in a row
    copy = copy_positions(task, seq)  # target x_j, j >= 1, follows a trigger
    assert copy.any()
    assert torch.equal(seq[:, 2:][copy[:, 1:]], seq[:, :-2][copy[:, 1:]])  # x_j = x_{j-2} after a trigger
    # the bigram positions: counts of (x_{j-1}, x_j) against P, row by row, within 5 standard errors
    prev, nxt = seq[:, :-1][~copy], seq[:, 1:][~copy]
    counts = torch.zeros(task.n_tokens, task.n_tokens, dtype=torch.float64)
    counts.index_put_((prev, nxt), torch.ones(len(prev), dtype=torch.float64), accumulate=True)
    n = counts.sum(1, keepdim=True)
    rows = n[:, 0] > 500
    assert rows.sum() >= task.n_tokens - len(task.triggers) - 2
    p, p_hat = task.transition[rows], counts[rows] / n[rows]
    se = (p * (1 - p) / n[rows]).sqrt()
    assert ((p_hat - p).abs() <= 5 * se + 1 / n[rows]).all()
    assert not counts[list(task.triggers)].any()  # a trigger is never followed by a bigram draw


def test_the_task_is_one_per_recipe_and_triggers_are_the_most_frequent_tokens():
    a, b = make_task(BackcopyRecipe()), make_task(BackcopyRecipe())
    assert torch.equal(a.transition, b.transition) and a.triggers == b.triggers
    assert torch.allclose(a.transition.sum(1), torch.ones(a.n_tokens, dtype=torch.float64))
    with pytest.raises(InputError, match="n_triggers"):
        make_task(replace(BackcopyRecipe(), n_triggers=0))


def test_a_short_training_learns_the_copy(tmp_path):
    recipe = replace(TINY, steps=40, every=40)
    _, state, _ = train_run("none", 0, recipe, tmp_path)
    first, last = state["runs"][0], state["runs"][-1]
    assert first["copy_accuracy"] < 0.2 and last["copy_accuracy"] > 0.6
    assert last["copy_loss"] < first["copy_loss"] - 1.0


@pytest.mark.parametrize("arm", ["kv_slot", "k_slot_v0"])
def test_the_gate_at_minus_inf_removes_the_slot_exactly(arm):
    """With g = -inf a slot arm is the `none` arm with the same shared weights (module doc of sink_arms)."""
    torch.manual_seed(1)
    slotted, plain = build_model(arm, 0, TINY), build_model("none", 0, TINY)
    with torch.no_grad():  # a slot that matters: large key, nonzero value
        for m in slotted.model.layers:
            m.self_attn.slot_key.mul_(200)
            if arm == "kv_slot":
                m.self_attn.slot_value.normal_()
    plain.load_state_dict(slotted.state_dict(), strict=False)
    seq = generate(make_task(TINY), 8, TINY.shape.context, torch.Generator().manual_seed(3))
    ids = torch.cat([torch.full((8, 1), TINY.n_tokens), seq], 1)
    with torch.no_grad():
        open_slot = slotted(input_ids=ids).logits
        set_slot_gate(slotted, float("-inf"))
        gated, reference = slotted(input_ids=ids).logits, plain(input_ids=ids).logits
    assert (open_slot - reference).abs().max() > 1e-3  # the slot changes the output ...
    torch.testing.assert_close(gated, reference, atol=1e-6, rtol=0)  # ... and the gate removes it exactly


def test_an_extended_run_equals_a_longer_one_bit_for_bit(tmp_path):
    """Constant learning rate after warm-up: steps is not in the fingerprint, a run can be extended."""
    assert recipe_fingerprint(TINY) == recipe_fingerprint(replace(TINY, steps=8))
    train_run("k_slot_v0", 0, TINY, tmp_path / "a")
    extended, _, _ = train_run("k_slot_v0", 0, replace(TINY, steps=8), tmp_path / "a")
    straight, _, _ = train_run("k_slot_v0", 0, replace(TINY, steps=8), tmp_path / "b")
    for (name, x), y in zip(extended.state_dict().items(), straight.state_dict().values()):
        assert torch.equal(x, y), name


def test_a_checkpoint_of_another_arm_or_a_damaged_one_is_refused(tmp_path):
    train_run("k_slot_v0", 0, TINY, tmp_path)
    folder = tmp_path / recipe_fingerprint(TINY)
    source, target = folder / "backcopy-k_slot_v0-seed0.pt", folder / "backcopy-none-seed0.pt"
    shutil.copy(source, target)
    with pytest.raises(StaleResultsError, match="another recipe, arm or seed"):
        train_run("none", 0, TINY, tmp_path)
    shutil.copy(source, folder / "backcopy-k_slot_v0-seed1.pt")  # another seed's
    with pytest.raises(StaleResultsError, match="another recipe, arm or seed"):
        train_run("k_slot_v0", 1, TINY, tmp_path)
    data = source.read_bytes()
    for damaged in (b"", data[: len(data) // 2]):
        target.write_bytes(damaged)
        with pytest.raises(StaleResultsError, match="empty or truncated"):
            train_run("none", 0, TINY, tmp_path)


def test_an_unknown_arm_is_refused():
    with pytest.raises(InputError, match="Bigram-Backcopy arms"):
        BackcopyRun("sink_token", 0, TINY)
