"""Issue 37 for the sink experiment (docs/findings.md 4c): the stored heads re-expressed without the own
query row and beside their floor (``sink_results.floor_heads``, ``sink_report.floor_table``); the tables
and the numbers the prose quotes equal the CSVs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.training.sink_arms import LMShape
from experiments.training.sink_metrics import direct_tables
from experiments.training.sink_report import floor_table
from experiments.training.sink_results import floor_heads

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("sinks", "sinks_long", "sinks_text")


def floored(name):
    return floor_heads(pd.read_csv(ROOT / "docs" / "results" / name / "heads.csv"), 128)


@pytest.mark.parametrize("name", FOLDERS)
def test_the_floor_tables_are_generated_from_the_csvs_and_quoted(name):
    table = floor_table(floored(name))
    assert (ROOT / "docs" / "results" / name / "floor.md").read_text().strip() == table
    assert table in (ROOT / "docs" / "findings.md").read_text()


def test_the_prose_numbers_follow_the_csvs():
    h = floored("sinks_long")
    last = h[(h.domain == "text") & (h.step == h[h.domain == "text"].step.max())]
    for arm, want in (("kv_slot", (7, 5, 3)), ("k_slot_v0", (5, 3, 2))):
        m = last[last.arm == arm].mass_slot
        assert ((m > 0.2).sum(), (m > 0.3).sum(), ((m - 0.3).abs() <= 0.05).sum()) == want
    for name in ("sinks", "sinks_long"):
        h = floored(name)
        text = h[(h.domain == "text") & (h.step == h[h.domain == "text"].step.max())]
        high = text.mass_first_text_high.fillna(text.mass_first_text)
        assert high.max() <= 0.04
        assert (text.groupby("arm").mass_first_text_high.mean() < text.groupby("arm").uniform_first_text.first()).all()
    doc = " ".join((ROOT / "docs" / "findings.md").read_text().split())
    assert "of the 7 `kv_slot` heads over 0.2 (all seeds), 5 are over 0.3 and 3 within 0.05 of it" in doc
    assert "(its floor: 0.035, 0.031 with a slot)" in doc


@pytest.mark.parametrize("arm", ["none", "sink_token", "kv_slot"])
def test_floor_heads_recovers_a_fresh_measurement(arm):
    """Masses measured over every row, passed through floor_heads, equal (or bound) the current measurement."""
    from experiments.training.sink_arms import build_lm_arm

    shape = LMShape(n_layers=2, n_heads=2, d_model=32, d_ff=64, context=12)
    model = build_lm_arm(arm, 0, shape).eval()
    probe = torch.randint(0, 256, (5, 12), generator=torch.Generator().manual_seed(0))
    if arm == "sink_token":
        probe = torch.cat([torch.full((5, 1), 256), probe], 1)
    new, _ = direct_tables(model, probe, "text", arm)
    with torch.no_grad():
        att = model(input_ids=probe, output_attentions=True).attentions
    slot = int(arm == "kv_slot")
    old = new.drop(columns=[c for c in new if c.startswith("uniform_")]).assign(domain="text", arm=arm, seed=0, step=0)
    first_text = slot + int(arm == "sink_token")
    old["mass_first"] = [float(a.double()[..., slot].mean((0, 2))[h]) for a in att for h in range(a.shape[1])]
    old["mass_first_text"] = [float(a.double()[..., first_text].mean((0, 2))[h]) for a in att for h in range(2)]
    got = floor_heads(old, 12)
    for cls in ("first", "first_text"):
        np.testing.assert_allclose(got[f"uniform_{cls}"], new[f"uniform_{cls}"], rtol=1e-12)
        if got[f"mass_{cls}"].notna().all():
            np.testing.assert_allclose(got[f"mass_{cls}"], new[f"mass_{cls}"], rtol=1e-6)
        else:
            assert (got[f"mass_{cls}_low"] <= new[f"mass_{cls}"] + 1e-9).all()
            assert (new[f"mass_{cls}"] <= got[f"mass_{cls}_high"] + 1e-9).all()
    assert got.mass_first.notna().all() == (arm != "kv_slot")  # exact wherever the own row's mass is 1
