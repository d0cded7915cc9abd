"""The Bigram-Backcopy positive control (interp.training.backcopy): the task's rule and statistics,
a short training that learns the copy, the slot's gate, checkpoints bound to their run, and the
findings' numbers equal to the shipped CSVs."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from interp.errors import CheckpointError, InputError
from interp.models.sink_arms import LMShape, set_slot_gate
from interp.training.backcopy import (
    ARMS, SLOT_ARMS, BackcopyRecipe, BackcopyRun, build_model, copy_positions, generate, make_task,
    recipe_fingerprint, train_run,
)
from interp.training.backcopy_report import findings_tables, sink_share_figure
from interp.training.backcopy_results import summarise

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
    with pytest.raises(CheckpointError, match="another recipe, arm or seed"):
        train_run("none", 0, TINY, tmp_path)
    shutil.copy(source, folder / "backcopy-k_slot_v0-seed1.pt")  # another seed's
    with pytest.raises(CheckpointError, match="another recipe, arm or seed"):
        train_run("k_slot_v0", 1, TINY, tmp_path)
    data = source.read_bytes()
    for damaged in (b"", data[: len(data) // 2]):
        target.write_bytes(damaged)
        with pytest.raises(CheckpointError, match="truncated, empty"):
            train_run("none", 0, TINY, tmp_path)


def test_an_unknown_arm_is_refused():
    with pytest.raises(InputError, match="Bigram-Backcopy arms"):
        BackcopyRun("sink_token", 0, TINY)


# ----- the shipped results (docs/results/backcopy, written by benchmarks/train_backcopy.py) -----------------

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "backcopy"


@pytest.fixture(scope="module")
def shipped():
    return (pd.read_csv(RESULTS / "runs.csv"), pd.read_csv(RESULTS / "gate.csv", dtype={"gate": str}),
            pd.read_csv(RESULTS / "heads.csv"))


def test_the_findings_quote_the_tables_generated_from_the_csvs(shipped):
    runs, gate, heads = shipped
    tables = findings_tables(runs, heads, gate)
    assert tables in (Path(__file__).resolve().parents[2] / "docs" / "findings.md").read_text()
    assert (RESULTS / "tables.md").read_text().strip() == tables
    pd.testing.assert_frame_equal(summarise(runs), pd.read_csv(RESULTS / "summary.csv", keep_default_na=False,
                                                               na_values=[""]), check_dtype=False, rtol=1e-9)


def test_the_shipped_runs_cover_every_arm_and_seed_of_one_recipe(shipped):
    runs, gate, heads = shipped
    assert runs.recipe.nunique() == 1 and set(runs.arm) == set(ARMS) and set(runs.seed) == {0, 1, 2}
    assert (runs.groupby(["arm", "seed"]).fingerprint.nunique() == 1).all() and runs.fingerprint.nunique() == 12
    assert (runs.groupby(["arm", "seed"]).step.max() == 3000).all()
    slot = runs.arm.isin(SLOT_ARMS)
    assert runs[slot].sink_share_slot.notna().all() and runs[~slot].sink_share_slot.isna().all()
    # the gate check's open-slot row is the run's own last measurement, re-read from its checkpoint
    last = runs.merge(gate[gate.gate == "0.0"], on=["arm", "seed", "step"], suffixes=("", "_gate"))
    assert len(last) == 12
    for col in ("loss", "copy_accuracy", "mean_mass_start", "sink_heads_start"):
        np.testing.assert_allclose(last[col], last[f"{col}_gate"], rtol=1e-9)
    closed = gate[gate.gate == "-inf"]
    assert set(closed.arm) == set(SLOT_ARMS) and len(closed) == 6 and (closed.mean_mass_slot == 0).all()


def test_the_figure_draws_from_the_csv(shipped):
    fig = sink_share_figure(shipped[0])
    assert fig._suptitle.get_text() and all(ax.get_title() and ax.get_xlabel() for ax in fig.axes)
    assert fig.axes[0].get_ylabel()


def test_the_findings_prose_follows_the_csvs(shipped):
    """Section 4d's sentences that are not table cells."""
    runs, gate, heads = shipped
    counts = runs.pivot_table(index=["arm", "step"], columns="seed", values="sink_heads_start")
    assert (counts.loc["none"].loc[[1500, 1750, 2000, 3000]] == 4).all().all()  # half the heads, every seed
    assert (counts.loc["none"].loc[2500, 0], counts.loc["none"].loc[2000, 0]) == (0, 4)
    assert (runs[runs.arm != "none"].sink_heads_start == 0).all()  # no sink on <s> or x_0 outside `none`
    last = runs[runs.step == 3000]
    mean_accuracy = last.groupby("arm").copy_accuracy.mean()
    assert (mean_accuracy.round(3) >= 0.999).all()
    closed, opened = (gate[gate.gate == g].set_index(["arm", "seed"]) for g in ("-inf", "0.0"))
    rise = (closed.loss - opened.loss).dropna()
    assert (rise > 0).all() and (rise["k_slot_v0"] > rise["kv_slot"]).all()  # more in every seed
    assert f"{100 * closed.copy_accuracy.min():.1f}-{100 * closed.copy_accuracy.max():.1f}%" == "63.6-89.0%"
    assert f"{closed.mean_mass_start.min():.3f}-{closed.mean_mass_start.max():.3f}" == "0.085-0.262"
    doc = (Path(__file__).resolve().parents[2] / "docs" / "findings.md").read_text()
    for phrase in ("copy accuracy falls to 63.6-89.0%", "mean mass 0.085-0.262", "largest head 0.522",
                   "(mean mass on `<s>` 0.027 and 0.009 against 0.299 in `none`)"):
        assert phrase in " ".join(doc.split()), phrase
