"""Sinks against their floor (issue 37): the sink's own query row left out, the uniform-attention floor
equal to a brute-force recomputation, counts near the threshold, one threshold constant.

A head whose queries and keys give every score the same value attends uniformly; its mass on a
position class must then equal ``uniform_mass`` (the floor computed from the masks alone), and both
must equal a loop over rows written here: (H_n - 1) / (n - 1) on the first of n causal tokens without
padding, the sink's own row left out.
"""

import re
from pathlib import Path

import pandas as pd
import pytest
import torch

import interp
from interp.analysis import sink_parts, sinks
from interp.errors import InputError
from interp.models import tiny_hf_model
from experiments.training import backcopy, sink_metrics

ROOT = Path(__file__).resolve().parents[2]


def harmonic(n):
    return sum(1 / k for k in range(1, n + 1))


def uniform_model(family):
    """A tiny model whose every head attends uniformly: W_q (and b_q) zeroed, so every score is 0."""
    hf = tiny_hf_model(family)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if re.search(r"(q_proj|attention\.self\.query)\.(weight|bias)$", name):
                p.zero_()
    return interp.load_model(hf, device="cpu")


def brute_floor(lengths, causal, n_pos=None):
    """Mean over the real rows other than the first of each sequence of 1 / |keys the row may attend|."""
    total, rows = 0.0, 0
    for n in lengths:
        for i in range(1, n):
            total += 1 / (i + 1) if causal else 1 / n
            rows += 1
    return total / rows


def test_own_row_left_out_planted_count_falls_below_the_threshold():
    """Uniform causal attention over 6 tokens: the first position gets H_6/6 = 0.408 averaged over every row
    (the old count: every head a sink), but its own row has mass 1 by construction; without it the mass is
    (H_6 - 1)/5 = 0.290, the floor, and no head counts."""
    model = uniform_model("llama")
    ids = torch.randint(3, 97, (4, 6), generator=torch.Generator().manual_seed(0))
    profile = interp.sink_profile(model, [ids], positions="first", progress=False)
    with_own_row = harmonic(6) / 6
    assert with_own_row > sinks.SINK_THRESHOLD  # what counting the row gave
    assert profile.mass.sub((harmonic(6) - 1) / 5).abs().max() < 1e-6
    assert not profile.sink.any() and (profile.n_query_rows == 4 * 5).all() and (profile.n_rows == 24).all()
    assert profile.mass_over_uniform.abs().max() < 1e-6 and profile.mass_to_uniform.sub(1).abs().max() < 1e-5
    counts = interp.sink_counts(profile).set_index("threshold")
    assert counts.loc[sinks.SINK_THRESHOLD, "n_sinks"] == 0 and counts.loc[0.2, "n_sinks"] == 8
    assert counts.loc[sinks.SINK_THRESHOLD, "n_near"] == 8  # 0.290 is within 0.05 of 0.3


@pytest.mark.parametrize("family,causal", [("llama", True), ("bert", False)])
def test_uniform_floor_equals_a_brute_force_recomputation_with_padding(family, causal):
    model = uniform_model(family)
    lengths = [(9, 6, 4), (9, 3)]
    batches = []
    for lens in lengths:
        ids = torch.randint(3, 97, (len(lens), max(lens)), generator=torch.Generator().manual_seed(len(lens)))
        mask = torch.tensor([[1] * n + [0] * (max(lens) - n) for n in lens])
        batches.append({"input_ids": ids * mask, "attention_mask": mask})
    profile = interp.sink_profile(model, batches, positions="first", progress=False)
    want = brute_floor([n for lens in lengths for n in lens], causal)
    assert profile.uniform_mass.sub(want).abs().max() < 1e-12
    assert profile.mass.sub(want).abs().max() < 1e-6  # uniform heads: the mass is the floor
    if causal:  # one length, no padding: the closed form
        one = interp.sink_profile(model, [torch.randint(3, 97, (2, 64))], positions="first", progress=False)
        assert one.uniform_mass.sub((harmonic(64) - 1) / 63).abs().max() < 1e-12


def test_training_measurement_drops_the_own_row_and_gives_the_floor():
    """sink_metrics.class_mass on a planted pattern: uniform causal rows plus a slot column."""
    n, slot = 6, 1
    keys = sink_metrics.visible_keys(n, slot, causal=True).double()
    a = (keys / keys.sum(-1, keepdim=True))[None, None].expand(2, 3, n, n + slot)
    mass, floor = sink_metrics.class_mass(a, [slot], slot, causal=True)  # the first position
    want = sum(1 / (i + 2) for i in range(1, n)) / (n - 1)  # rows 1..n-1 see the slot and i + 1 tokens
    assert abs(floor - want) < 1e-12 and (mass - want).abs().max() < 1e-12
    mass, floor = sink_metrics.class_mass(a, [0], slot, causal=True)  # the slot: no own row, every row counts
    assert abs(floor - sum(1 / (i + 2) for i in range(n)) / n) < 1e-12
    plain = sink_metrics.visible_keys(n, 0, causal=True).double()
    a = (plain / plain.sum(-1, keepdim=True))[None, None]
    assert abs(a[..., 0].mean() - harmonic(n) / n) < 1e-12  # counting the own row: H_n / n
    assert abs(sink_metrics.class_mass(a, [0], 0, causal=True)[0][0] - (harmonic(n) - 1) / (n - 1)) < 1e-12


def test_one_threshold_constant_everywhere():
    """0.3 is written once (sink_parts.SINK_THRESHOLD); every sink module and the pipeline import it."""
    assert sinks.SINK_THRESHOLD is sink_parts.SINK_THRESHOLD == 0.3
    assert backcopy.SINK_THRESHOLD is sinks.SINK_THRESHOLD and sink_metrics.SINK_THRESHOLD is sinks.SINK_THRESHOLD
    import inspect
    for fn in (sinks.sink_profile, sinks.sink_pass):
        assert inspect.signature(inspect.unwrap(fn)).parameters["threshold"].default is sinks.SINK_THRESHOLD
    files = [*(ROOT / "interp/analysis").glob("sink*.py"), *(ROOT / "interp/training").glob("sink*.py"),
             *(ROOT / "interp/training").glob("backcopy*.py"), ROOT / "interp/report/pipeline.py"]
    literal = re.compile(r"(?<![\w.])0\.3(?![\d])")
    found = [f"{f.name}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
             if literal.search(line.split("#")[0]) and "SINK_THRESHOLD = 0.3" not in line
             and "RULE_MARGIN" not in line and 'color="0.3"' not in line]
    assert found == [], f"a threshold written out instead of SINK_THRESHOLD: {found}"


def test_sink_counts_counts_at_each_threshold_and_near_it():
    table = pd.DataFrame({"position": ["first"] * 5, "mass": [0.1, 0.26, 0.31, 0.34, 0.5]})
    got = interp.sink_counts(table).set_index("threshold")
    assert got.n_sinks.to_dict() == {0.2: 4, 0.3: 3, 0.4: 1}
    assert got.n_near.to_dict() == {0.2: 0, 0.3: 3, 0.4: 0}  # 0.26, 0.31, 0.34 within 0.05 of 0.3
    assert (got.largest == 0.5).all() and (got.n_heads == 5).all()
    with pytest.raises(InputError, match="band"):
        interp.sink_counts(table, band=2)
    with pytest.raises(InputError, match="columns"):
        interp.sink_counts(table, value="nope")
    with pytest.raises(InputError, match="no 'mass'"):
        interp.sink_counts(table.assign(mass=[0.1, None, 0.3, 0.4, 0.5]))


def test_the_sink_grid_title_gives_the_floor_of_the_top_positions():
    from interp import plots

    model = uniform_model("llama")
    profile = interp.sink_profile(model, [torch.randint(3, 97, (2, 6))], progress=False)
    title = plots.sink_mass_grid(profile).axes[0].get_title()
    top = profile.loc[profile.groupby(["layer", "head"]).mass.idxmax()]
    assert f"uniform floor {top.uniform_mass.min():.3f}-{top.uniform_mass.max():.3f}" in title
    assert "0 of 8 heads" in title  # uniform heads: no sink once the own row is left out
