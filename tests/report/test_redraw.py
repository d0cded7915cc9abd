"""The benchmarks' ``--redraw`` (``analyze_real.py``, ``frequency_real.py``, ``ablate_real.py``) draws the PNGs in
docs/results/<model>/ from the CSVs committed beside them, cell for cell, by the colour rule; no model runs.

Expected values are plain pandas pivots of the CSVs; the figures' cells are read back from the drawn artists."""

import importlib.util
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from interp.figures.colours import check_colours

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "results" / "dinov2-s14"  # the one model with all three scripts' tables


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def redrawn():
    figures = {}
    for name in ("analyze_real", "frequency_real", "ablate_real"):
        figures.update(_script(name).redraw(FOLDER, "dinov2-s14"))
    yield figures
    plt.close("all")


def _panels(fig):
    """{panel title: its cells as drawn, NaN where not coloured (below the floor, or none)}."""
    out = {}
    for ax in fig.axes:
        meshes = [c for c in ax.collections if (c.get_gid() or "").startswith("interp-colour:")
                  and c.get_gid() != "interp-colour:no_effect"]  # the map itself, not the grey layer
        if meshes:
            cells = np.ma.filled(np.ma.asarray(meshes[0].get_array(), dtype=float), np.nan)
            out[ax.get_title()] = cells.reshape(len(ax.get_yticks()), len(ax.get_xticks()))
    return out


def _pivot(frame, value):
    return frame.pivot(index="layer", columns="head", values=value).sort_index().to_numpy(float)


def test_every_redrawn_figure_is_a_committed_png_and_follows_the_colour_rule(redrawn):
    assert {"shift_ratio", "bias_share", "key_prior_share", "clusters", "spectrum_clustermap", "attention_distance",
            "ablation_delta_zero_exact", "ablation_delta_mean_exact"} <= set(redrawn)
    for key, fig in redrawn.items():
        assert (FOLDER / f"{key}.png").exists(), key
        assert check_colours(fig) == [], key


def test_the_origin_and_key_prior_maps_are_the_csvs(redrawn):
    origin = pd.read_csv(FOLDER / "origin_shift.csv")
    for value in ("shift_ratio", "bias_share"):
        panels = _panels(redrawn[value])
        assert set(panels) == {"kind = q", "kind = k", "kind = v"}
        for kind in "qkv":
            np.testing.assert_allclose(panels[f"kind = {kind}"], _pivot(origin[origin.kind == kind], value), rtol=1e-12)
    scores = pd.read_csv(FOLDER / "score_decomposition.csv")
    (drawn,) = _panels(redrawn["key_prior_share"]).values()
    np.testing.assert_allclose(drawn, _pivot(scores[scores.term == "key_prior"], "share"), rtol=1e-12)


def test_the_ablation_maps_are_the_csv_with_noise_grey(redrawn):
    ablation = pd.read_csv(FOLDER / "ablation.csv")
    for method in ("zero", "mean"):
        panels = _panels(redrawn[f"ablation_delta_{method}_exact"])
        assert set(panels) == {"kind = q", "kind = v"}  # k: a text panel (inert by identity)
        for kind in "qv":
            want = _pivot(ablation[(ablation.method == method) & (ablation.kind == kind)], "delta")
            want = np.where(np.abs(want) < 1e-6, np.nan, want)  # below the floor: drawn grey, not in the map
            np.testing.assert_allclose(panels[f"kind = {kind}"], want, rtol=1e-12)


def test_the_family_grid_is_the_csv(redrawn):
    profile = pd.read_csv(FOLDER / "frequency_profile.csv")
    (drawn,) = _panels(redrawn["clusters"]).values()
    np.testing.assert_array_equal(drawn, _pivot(profile, "cluster"))


def test_a_model_without_biases_gets_a_note_not_empty_axes():
    """digits-vit-nobias has no q/k/v bias to zero: its top-heads figure says so per kind, with no bars and no
    "0 largest effects" title over empty axes."""
    ablation = pd.read_csv(FOLDER.with_name("digits-vit-nobias") / "ablation.csv")
    assert ablation[ablation.method == "zero"].identity.notna().all()  # every zero row is answered by identity
    fig = _script("ablate_real").redraw(FOLDER.with_name("digits-vit-nobias"), "digits-vit-nobias")[
        "ablation_top_zero_exact"]
    (ax,) = fig.axes
    assert not ax.patches and "no head's bias to rank" in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["\n".join(f"{k}: absent bias: nothing to remove" for k in "qkv")]
    plt.close("all")
