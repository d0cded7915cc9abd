"""Plots draw the analyzers' frames: one titled panel per kind, axes labelled."""

import pandas as pd
import pytest

import interp
from interp.plots import layer_head_heatmaps, origin_shift_figures, save_figure


def test_heatmaps_have_titles_labels_and_one_panel_per_kind(tmp_path):
    df = pd.DataFrame(
        [dict(layer=l, head=h, kind=k, shift_ratio=l + h / 10, bias_share=0.5)
         for l in range(3) for h in range(4) for k in "qkv"]
    )
    figs = origin_shift_figures(df, "toy")
    fig = figs["shift_ratio"]
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["kind = q", "kind = k", "kind = v"]
    assert all(ax.get_xlabel() == "head" and ax.get_ylabel() == "layer" for ax in axes)
    assert "toy" in fig._suptitle.get_text()
    path = save_figure(fig, tmp_path / "f.png")
    assert path.stat().st_size > 1000
    # the grid really is layer x head of the value
    single = layer_head_heatmaps(df[df.kind == "q"], "shift_ratio")
    mesh = single.axes[0].collections[0]
    assert mesh.get_array().reshape(3, 4)[2, 3] == 2.3


# ----- every plot checks the table it draws (issue 31) --------------------------------------------------------

import types  # noqa: E402

import pytest  # noqa: E402

from interp import plots  # noqa: E402
from interp.errors import InputError  # noqa: E402

HEADS = [dict(layer=layer, head=h) for layer in range(2) for h in range(3)]
SINK_PROFILE = pd.DataFrame([dict(model="m", **lh, position=p, mass=0.4, sink=True, threshold=0.3, has_b_q=True)
                             for lh in HEADS for p in ("first", "top_content")])
ORIGIN = pd.DataFrame([dict(**lh, kind=k, shift_ratio=1.0, bias_share=0.5, shift_ratio_lo=0.9, shift_ratio_hi=1.1)
                       for lh in HEADS for k in "qkv"])
# each figure, how it is called, and the analyzer its refusal must name
FIGURES = {
    "layer_head_heatmaps": (lambda f: plots.layer_head_heatmaps(f, "shift_ratio"), "origin_shift"),
    "origin_shift_figures": (lambda f: plots.origin_shift_figures(f, "m"), "origin_shift"),
    "interval_figure": (lambda f: plots.interval_figure(f, "shift_ratio", "m"), "origin_shift"),
    "key_prior_share_figure": (lambda f: plots.key_prior_share_figure(f, "m"), "score_decomposition"),
    "ablation_figures": (lambda f: plots.ablation_figures(f, "m"), "ablate_bias"),
    "spectrum_clustermap": (lambda f: plots.spectrum_clustermap(f, "m"), "cluster_heads"),
    "attention_distance_figure": (lambda f: plots.attention_distance_figure(f, "m"), "frequency_profile"),
    "cluster_grid_figure": (lambda f: plots.cluster_grid_figure(f, "m"), "cluster_heads"),
    "implicit_vs_explicit": (lambda f: plots.implicit_vs_explicit(f), "implicit_value_bias"),
    "massive_activations_plot": (lambda f: plots.massive_activations_plot(f), "massive_activations"),
    "token_norm_plot": (lambda f: plots.token_norm_plot(f), "high_norm_tokens"),
    "sink_mass_grid": (lambda f: plots.sink_mass_grid(f), "sink_profile"),
    "key_prior_sink_plot": (lambda f: plots.key_prior_sink_plot(f), r"sink_profile\(model, data, remove='key_prior'\)"),
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_a_plot_given_another_analyzers_table_names_the_analyzer_that_makes_its_own(name):
    """implicit_vs_explicit, massive_activations_plot and token_norm_plot given a sink profile raised KeyError or
    AttributeError from pandas; every figure now says what its table lacks and which analyzer makes it."""
    call, analyzer = FIGURES[name]
    wrong = ORIGIN if "sink" in name else SINK_PROFILE
    with pytest.raises(InputError, match=rf"{name} draws the table of .*{analyzer}.*lacks"):
        call(wrong)
    with pytest.raises(InputError, match="not a DataFrame"):
        call(wrong.to_dict())
    with pytest.raises(InputError, match="no rows|lacks"):
        call(wrong.iloc[:0])


def test_a_plot_refuses_two_models_rows_and_a_table_given_twice():
    """sink_mass_grid on two models' rows drew one grid of the larger mass per cell, silently."""
    two = pd.concat([SINK_PROFILE, SINK_PROFILE.assign(model="other", mass=0.9)], ignore_index=True)
    with pytest.raises(InputError, match=r"sink_mass_grid .* for one model; this table holds rows of 2 .*m, other"):
        plots.sink_mass_grid(two)
    with pytest.raises(InputError, match=r"each \(layer, head, position\) once; 24 rows share"):
        plots.sink_mass_grid(pd.concat([SINK_PROFILE, SINK_PROFILE]))
    with pytest.raises(InputError, match=r"origin_shift_figures .* each \(layer, head, kind\) once"):
        plots.origin_shift_figures(pd.concat([ORIGIN, ORIGIN]), "m")  # no model column: the repeat says it
    assert plots.sink_mass_grid(SINK_PROFILE).axes  # the right table still draws
    assert plots.origin_shift_figures(ORIGIN, "m")["shift_ratio_intervals"].axes


def test_the_single_input_figures_check_the_views_tables():
    from interp.single_input_plots import single_input_patterns

    view = types.SimpleNamespace(patterns=SINK_PROFILE, heads=SINK_PROFILE, key_prior=SINK_PROFILE,
                                 positions=SINK_PROFILE, image=None, meta={})
    with pytest.raises(InputError, match=r"patterns draws the table of interp.single_input\(model, input\).*lacks "
                                         "condition, query_pos"):
        single_input_patterns(view)


def test_check_table_names_a_missing_column_family_and_passes_the_right_table_through():
    from interp.plot_checks import check_table

    clustered = pd.DataFrame([dict(**lh, cluster=0, bin_0=1.0) for lh in HEADS])
    assert check_table(clustered, "f", "a", ["layer", "head"], keys=["layer", "head"], prefix="bin_") is clustered
    with pytest.raises(InputError, match=r"lacks bin_\*"):
        check_table(clustered.drop(columns="bin_0"), "f", "a", ["layer"], prefix="bin_")


IMPLICIT = pd.DataFrame([dict(model="m", **lh, explicit_norm=1.0 + lh["head"], implicit_norm=0.5, positions="first",
                              has_b_v=True) for lh in HEADS])


@pytest.mark.parametrize("rows", ["one", "all"])
def test_a_missing_number_is_refused_not_drawn_around(rows):
    """issue 38: sink_mass_grid labelled a head by its second-largest position when the largest mass was NaN
    (and failed in pandas when all were); implicit_vs_explicit set NaN axis limits (a ValueError)."""
    where = slice(None) if rows == "all" else 0
    profile, implicit = SINK_PROFILE.copy(), IMPLICIT.copy()
    profile.loc[where, "mass"] = float("nan")
    implicit.loc[where, "implicit_norm"] = float("inf") if rows == "one" else float("nan")
    with pytest.raises(InputError, match=r"sink_mass_grid .*'mass' is missing, not a number or infinite in "
                                         rf"{12 if rows == 'all' else 1} rows, e.g. \{{'layer': 0, 'head': 0, "
                                         r"'position': 'first'\}"):
        plots.sink_mass_grid(profile)
    with pytest.raises(InputError, match=r"implicit_vs_explicit .*'implicit_norm' is missing"):
        plots.implicit_vs_explicit(implicit)
    assert plots.implicit_vs_explicit(IMPLICIT).axes  # the analyzer's own table still draws


def test_the_generic_heatmap_refuses_a_cell_held_twice():
    """issue 38 (adversarial pass): layer_head_heatmaps averaged two runs' rows of a cell into a number
    neither produced, as interactive's heatmaps did."""
    with pytest.raises(InputError, match=r"layer_head_heatmaps .*each \(layer, head, kind\) once"):
        plots.layer_head_heatmaps(pd.concat([ORIGIN, ORIGIN.assign(shift_ratio=3.0)]), "shift_ratio")
    assert plots.layer_head_heatmaps(ORIGIN, "shift_ratio").axes


def test_figures_refuse_missing_keys_and_values_the_analyzers_never_leave_empty():
    """Adversarial pass: a NaN cluster failed inside spectrum_clustermap (TypeError) and drew a gap in
    cluster_grid_figure; a NaN layer dropped a row of sink_mass_grid, so another position took its label."""
    clustered = pd.DataFrame([dict(**lh, cluster=lh["head"] % 2, bin_0=1.0, bin_1=0.5) for lh in HEADS])
    no_cluster = clustered.assign(cluster=clustered.cluster.where(clustered.index != 0))
    for draw in (plots.spectrum_clustermap, plots.cluster_grid_figure):
        with pytest.raises(InputError, match=r"'cluster' is missing, not a number or infinite in 1 rows"):
            draw(no_cluster, "m")
        assert draw(clustered, "m") is not None
    no_layer = SINK_PROFILE.assign(layer=SINK_PROFILE.layer.where(SINK_PROFILE.index != 0))
    for draw in (plots.sink_mass_grid, plots.key_prior_sink_plot):
        with pytest.raises(InputError, match=r"'layer' is missing"):
            draw(no_layer)


def test_cluster_grid_title_says_what_the_family_test_found():
    import pandas as pd
    from interp import plots

    base = pd.DataFrame(dict(layer=[0, 0, 1, 1], head=[0, 1, 0, 1], cluster=[0, 0, 0, 0]))
    tested = base.assign(family_p=0.305, n_null=199, structure=False)
    title = plots.cluster_grid_figure(tested, "toy").axes[0].get_title()
    assert "one family (no families pass the test): family_p 0.305" in title and "199 draws" in title
    found = base.assign(cluster=[0, 1, 0, 1], family_p=0.005, n_null=199, structure=True)
    assert "2 families: family_p 0.005" in plots.cluster_grid_figure(found, "toy").axes[0].get_title()
    assert "family_p" not in plots.cluster_grid_figure(base, "toy").axes[0].get_title()  # untested: nothing said


def test_a_sink_table_with_categorical_positions_or_text_numbers_is_drawn_or_said():
    """issue 38 (round-five pass): a categorical ``position`` column crashed sink_mass_grid in pandas
    ('radd' not supported for dtype category), and a ``mass`` column of strings (a CSV read with dtype=str)
    crashed seaborn; the first draws the same grid, the second is one InputError."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from interp.errors import InputError

    rows = [dict(model="m", layer=layer, head=head, position=pos, mass=mass, sink=mass > 0.3, threshold=0.3)
            for layer in range(2) for head in range(2)
            for pos, mass in (("first", 0.1 + 0.3 * layer + 0.1 * head), ("top_content", 0.2))]
    table = pd.DataFrame(rows)
    plain = interp.plots.sink_mass_grid(table)
    categorical = interp.plots.sink_mass_grid(table.assign(position=table.position.astype("category")))
    drawn = [[t.get_text() for t in fig.axes[0].texts] for fig in (plain, categorical)]
    assert drawn[0] == drawn[1] and "first*" in drawn[0]  # same labels, the sink starred
    plt.close("all")
    with pytest.raises(InputError, match="'mass' holds .* values .* not numbers"):
        interp.plots.sink_mass_grid(table.assign(mass=table.mass.astype(str)))
