"""The Bigram-Backcopy positive control (experiments.training.backcopy): the task's rule and statistics,
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
from experiments.training.sink_arms import LMShape, set_slot_gate
from experiments.training.backcopy import (
    ARMS, SLOT_ARMS, BackcopyRecipe, BackcopyRun, build_model, copy_positions, generate, make_task,
    recipe_fingerprint, train_run,
)
from experiments.training.backcopy_report import findings_tables, sink_share_figure
from experiments.training.backcopy_results import summarise

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


# ----- the shipped results (docs/results/backcopy, written by experiments/train_backcopy.py) -----------------

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
    for col in ("loss", "copy_accuracy"):
        np.testing.assert_allclose(last[col], last[f"{col}_gate"], rtol=1e-9)
    measured = heads[heads.step == 3000].groupby(["arm", "seed"]).mass_start_with_self.mean()  # the own row in
    gated = gate[gate.gate == "0.0"].set_index(["arm", "seed"]).mean_mass_start_with_self
    np.testing.assert_allclose(measured.sort_index(), gated.sort_index(), rtol=1e-9)
    exact = last[last.mean_mass_start.notna()]  # without the own row: runs.csv from heads.csv, gate.csv exact
    np.testing.assert_allclose(exact.mean_mass_start, exact.mean_mass_start_gate, rtol=1e-9)
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
    assert (runs[runs.arm == "none_no_start"].sink_heads_start == 0).all()  # no sink on x_0
    slot_start = heads[heads.arm.isin(SLOT_ARMS)]
    assert (slot_start.mass_start_high <= 0.3).all()  # no sink on <s> with a slot, even at the upper bound
    near = runs[(runs.arm == "none") & (runs.seed == 0)].set_index("step").sink_near_start
    assert [int(near[s]) for s in (2000, 2500, 3000)] == [4, 2, 3]
    assert (runs[(runs.arm == "none") & (runs.seed > 0) & (runs.step >= 1500)].sink_near_start == 0).all()
    final = heads[heads.step == 3000].groupby("arm")
    assert f"{final.mass_start.max()['none']:.3f} {final.mass_start.mean()['none']:.3f}" == "0.603 0.288"
    assert f"{final.uniform_start.first()['none']:.3f} {final.uniform_start.first()['kv_slot']:.3f}" == "0.059 0.051"
    assert f"{final.mass_start.mean()['none_no_start']:.3f} {final.mass_start.max()['none_no_start']:.3f}" \
        == "0.059 0.061"
    assert f"{final.mass_start_high.mean()['kv_slot']:.3f} {final.mass_start_high.mean()['k_slot_v0']:.3f}" \
        == "0.027 0.009"
    last = runs[runs.step == 3000]
    mean_accuracy = last.groupby("arm").copy_accuracy.mean()
    assert (mean_accuracy.round(3) >= 0.999).all()
    closed, opened = (gate[gate.gate == g].set_index(["arm", "seed"]) for g in ("-inf", "0.0"))
    rise = (closed.loss - opened.loss).dropna()
    assert (rise > 0).all() and (rise["k_slot_v0"] > rise["kv_slot"]).all()  # more in every seed
    assert f"{100 * closed.copy_accuracy.min():.1f}-{100 * closed.copy_accuracy.max():.1f}%" == "63.6-89.0%"
    assert f"{closed.mean_mass_start.min():.3f}-{closed.mean_mass_start.max():.3f}" == "0.071-0.251"
    k = closed.loc["k_slot_v0"]
    assert list(k.sink_heads_start_low) == [1, 1, 1] and list(k.sink_heads_start_high) == [1, 1, 4]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "findings.md").read_text()
    for phrase in ("copy accuracy falls to 63.6-89.0%", "mean mass 0.071-0.251", "largest head of any seed 0.603",
                   "mean over heads 0.288 against a uniform floor of 0.059", "mean 0.059, largest head 0.061",
                   "(mean mass on `<s>` at most 0.027 and 0.009 against 0.288 in `none`)",
                   "at those steps 4, 2 and 3 of its heads are within 0.05 of 0.3", "0.059 on `<s>`",
                   "0.051 with a slot", "one head of seeds 0 and 1 sinks on it, and 1 to 4 of seed 2"):
        assert phrase in " ".join(doc.split()), phrase


@pytest.mark.parametrize("arm", ["none", "none_no_start", "kv_slot"])
def test_floor_heads_recovers_the_new_masses_from_ones_measured_with_the_own_row(arm):
    """floor_heads turns masses measured over every query row (before issue 37) into the current ones:
    equal to a fresh measurement where the first position's own row has mass 1 by construction, bounding
    it with a slot; the floors equal the fresh measurement's."""
    from experiments.training.backcopy import head_masses, with_start
    from experiments.training.backcopy_results import floor_heads

    run = BackcopyRun(arm, 0, TINY)
    model = run.build().eval()
    seq = run.eval_seq[: TINY.probe_sequences]
    new = head_masses(model, run.task, seq, arm)
    probe = with_start(seq, arm, run.task.start_id)
    with torch.no_grad():
        attentions = model(input_ids=probe, output_attentions=True).attentions
    slot = int(arm in SLOT_ARMS)
    dormant = ~run.task.is_trigger(probe)
    old = new.drop(columns=["uniform_start", "uniform_slot"]).assign(arm=arm, seed=0, step=0)
    old["mass_start"] = [float(a.double()[..., slot].mean((0, 2))[h])
                         for a in attentions for h in range(a.shape[1])]
    old["mass_start_dormant"] = [float((a.double()[..., slot] * dormant[:, None]).sum((0, 2))[h] / dormant.sum())
                                 for a in attentions for h in range(a.shape[1])]
    got = floor_heads(old, TINY)
    np.testing.assert_allclose(got.uniform_start, new.uniform_start, rtol=1e-12)
    if slot:
        assert got.mass_start.isna().all()
        assert (got.mass_start_low <= new.mass_start + 1e-9).all() and (new.mass_start <= got.mass_start_high + 1e-9).all()
        assert (got.mass_start_low < got.mass_start_high).all()
    else:
        np.testing.assert_allclose(got.mass_start, new.mass_start, rtol=1e-6)
        np.testing.assert_allclose(got.mass_start_dormant, new.mass_start_dormant, rtol=1e-6)
        assert (old.mass_start > got.mass_start).all()  # the own row (mass 1) had raised every head's mean
