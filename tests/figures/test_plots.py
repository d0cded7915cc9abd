"""Plots draw the analyzers' frames: what each figure draws (the arrays in its Axes: heatmap cells, bar
lengths, points, lines) equals the table it was given, read cell by cell with plain pandas lookups, never
through the code under test; and every plot checks the table it draws."""

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

import interp
from interp.figures.plots import origin_shift_figures, save_figure

matplotlib.use("Agg")
RNG = np.random.default_rng(3)


def cell(df, value, **where):
    """The one value of ``df`` at ``where`` (layer=, head=, kind=, ...), by a plain boolean lookup."""
    mask = np.ones(len(df), bool)
    for column, want in where.items():
        mask &= (df[column] == want).to_numpy()
    assert mask.sum() == 1, where
    return float(df.loc[mask, value].iloc[0])


def mesh_values(ax, gid=None):
    """The cells of an Axes' heatmap (its first QuadMesh, or the one tagged ``gid``), rows x columns, masked
    where nothing is drawn in colour."""
    meshes = [c for c in ax.collections if c.get_array() is not None and (gid is None or c.get_gid() == gid)]
    rows, cols = len(ax.get_yticks()), len(ax.get_xticks())
    return np.ma.asarray(meshes[0].get_array()).reshape(rows, cols)


def expected_grid(df, value, layers, heads, **where):
    return np.array([[cell(df, value, layer=la, head=h, **where) for h in heads] for la in layers])


def test_layer_head_heatmaps_draw_each_kinds_cells_and_save(tmp_path):
    df = pd.DataFrame([dict(layer=la, head=h, kind=k, shift_ratio=RNG.uniform(0, 3), bias_share=RNG.uniform())
                       for la in range(3) for h in range(4) for k in "qkv"])
    figs = origin_shift_figures(df, "toy")
    for value in ("shift_ratio", "bias_share"):
        axes = [ax for ax in figs[value].axes if ax.get_title().startswith("kind")]
        assert [ax.get_title() for ax in axes] == ["kind = q", "kind = k", "kind = v"]
        for ax, kind in zip(axes, "qkv"):
            drawn = mesh_values(ax)
            assert not np.ma.getmaskarray(drawn).any()
            np.testing.assert_array_equal(drawn, expected_grid(df, value, range(3), range(4), kind=kind))
            assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2"]
    assert save_figure(figs["shift_ratio"], tmp_path / "f.png").stat().st_size > 1000


ABL = pd.DataFrame([dict(layer=la, head=h, kind=k, method="zero", estimate=e, scope="head", metric="cross_entropy",
                         baseline=2.0, identity="",
                         delta=(RNG.uniform(-1e-9, 1e-9) if k == "k" else RNG.normal(0, 0.05)) * (0.8 if e == "atp" else 1))
                    for la in range(2) for h in range(3) for k in "qkv" for e in ("exact", "atp")])


def test_ablation_figures_draw_the_deltas_the_top_heads_and_estimate_against_exact():
    from interp import plots

    figs = plots.ablation_figures(ABL, "toy", top=4, data="toy data, 6 items")
    exact = ABL[ABL.estimate == "exact"]
    heat = figs["ablation_delta_zero_exact"]
    panels = [ax for ax in heat.axes if ax.get_title().startswith("kind")]
    for ax, kind in zip(panels, "qkv"):
        want = expected_grid(exact, "delta", range(2), range(3), kind=kind)
        drawn = mesh_values(ax, "interp-colour:delta")
        quiet = np.abs(want) < 1e-6  # the floor: b_k's +-1e-9 is rounding, drawn grey, not in colour
        assert quiet.all() if kind == "k" else not quiet.any()
        np.testing.assert_array_equal(np.ma.getmaskarray(drawn), quiet)
        np.testing.assert_array_equal(drawn.compressed(), want[~quiet])
        if kind == "k":
            np.testing.assert_array_equal(~np.ma.getmaskarray(mesh_values(ax, "interp-colour:no_effect")), quiet)
    # the top heads: bar lengths are the 4 largest |delta| of the exact rows, labelled by their head
    ax = figs["ablation_top_zero_exact"].axes[0]
    top = sorted(exact.delta, key=abs, reverse=True)[:4]
    widths = [p.get_width() for p in ax.patches if p.get_height() > 0 and p.get_width() != 0]
    assert sorted(widths) == sorted(top)
    labels = {t.get_text() for t in ax.get_yticklabels()}
    assert labels == {f"L{r.layer} H{r['head']} {r.kind}" for _, r in exact.iterrows() if r.delta in top}
    # estimate against exact: one point per head at (exact delta, atp delta)
    ax = figs["ablation_exact_vs_atp_zero"].axes[0]
    points = {tuple(np.round(p, 12)) for c in ax.collections for p in c.get_offsets()}
    atp = ABL[ABL.estimate == "atp"]
    assert points == {(round(r.delta, 12), round(cell(atp, "delta", layer=r.layer, head=r["head"], kind=r.kind), 12))
                      for _, r in exact.iterrows()}
    assert "(ablated - intact, nats)" in ax.get_xlabel() and ax.get_ylabel().endswith("(nats)")  # cross_entropy
    assert "toy data, 6 items" in ax.get_title()  # what it was measured on, as in the other ablation figures
    plt.close("all")


CLUSTERED = pd.DataFrame([dict(layer=la, head=h, cluster=(2 * la + h) % 3, mean_attention_distance=RNG.uniform(1, 9),
                               bin_0=RNG.normal(), bin_1=RNG.normal(), distance_unit="tokens")  # no symmetry
                          for la in range(3) for h in range(2)])


def test_frequency_figures_draw_clusters_distances_and_spectra():
    from interp import plots

    ax = plots.cluster_grid_figure(CLUSTERED, "toy").axes[0]
    np.testing.assert_array_equal(mesh_values(ax), expected_grid(CLUSTERED, "cluster", range(3), range(2)))
    ax = plots.attention_distance_figure(CLUSTERED, "toy").axes[0]
    points = {tuple(p) for c in ax.collections for p in c.get_offsets()}
    assert points == set(zip(CLUSTERED.layer.astype(float), CLUSTERED.mean_attention_distance))
    fig = plots.spectrum_clustermap(CLUSTERED, "toy")
    heat = [ax for ax in fig.axes if ax.get_ylabel().startswith("head (layer, head)")][0]
    rows = [t.get_text() for t in heat.get_yticklabels()]
    order = sorted(((r.cluster, r.layer, r["head"]) for _, r in CLUSTERED.iterrows()))
    assert rows == [f"L{la}H{h}" for _, la, h in order]  # grouped by family
    drawn = np.ma.asarray(heat.collections[0].get_array()).reshape(len(rows), 2)
    want = [[cell(CLUSTERED, b, layer=la, head=h) for b in ("bin_0", "bin_1")] for _, la, h in order]
    np.testing.assert_array_equal(drawn, want)
    plt.close("all")


SINKS = pd.DataFrame([dict(model="m", layer=la, head=h, position=p, mass=RNG.uniform(0.05, 0.95), threshold=0.5,
                           has_b_q=True) for la in range(2) for h in range(3) for p in ("first", "top_content")])
SINKS = SINKS.assign(sink=SINKS.mass > 0.5, mass_without_key_prior=SINKS.mass * 0.6, mass_without_b_q=SINKS.mass * 0.3)


def test_sink_figures_draw_the_top_mass_its_position_and_the_key_prior_bars():
    from interp import plots

    ax = plots.sink_mass_grid(SINKS).axes[0]
    drawn = mesh_values(ax)
    for la in range(2):
        for h in range(3):
            rows = SINKS[(SINKS.layer == la) & (SINKS["head"] == h)]
            best = rows.loc[rows.mass.idxmax()]
            assert drawn[la, h] == best.mass
            label = [t.get_text() for t in ax.texts][la * 3 + h]
            assert label == {"first": "first", "top_content": "top"}[best.position] + ("*" if best.mass > 0.5 else "")
    ax = plots.key_prior_sink_plot(SINKS, top=3).axes[0]
    sinks = SINKS[SINKS.sink].nlargest(3, "mass")
    widths = sorted(round(p.get_width(), 12) for p in ax.patches if p.get_width() > 0)
    want = sorted(round(v, 12) for c in ("mass", "mass_without_key_prior", "mass_without_b_q") for v in sinks[c])
    assert widths == want
    plt.close("all")


def test_residual_figures_draw_the_tables_points_and_lines():
    from interp import plots

    implicit = pd.DataFrame([dict(model="m", layer=la, head=h, explicit_norm=RNG.uniform(), implicit_norm=RNG.uniform(),
                                  positions="first", has_b_v=True) for la in range(2) for h in range(3)])
    ax = plots.implicit_vs_explicit(implicit).axes[0]
    points = {tuple(p) for c in ax.collections for p in c.get_offsets()}
    assert points == set(zip(implicit.explicit_norm, implicit.implicit_norm))
    massive = pd.DataFrame([dict(layer=la, hook=f"blocks.{la}.hook_resid_post", rank=r, abs_value=RNG.uniform(1, 90),
                                 median_abs=0.5 + la, massive=False, abs_threshold=100.0, ratio_threshold=100.0)
                            for la in range(3) for r in range(2)])
    ax = plots.massive_activations_plot(massive).axes[0]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
    for r in range(2):
        part = massive[massive["rank"] == r]
        assert lines[f"top {r}"] == (list(part.layer), list(part.abs_value))
    assert lines["median |value|"] == ([0, 1, 2], [0.5, 1.5, 2.5])
    norms = pd.DataFrame([dict(layer=la, hook=f"blocks.{la}.hook_resid_post", rank=r, norm=30.0 + r + la,
                               mass=RNG.uniform(), k=4.0, n_outliers=2, norm_q05=1.0, norm_q25=2.0, norm_median=3.0,
                               norm_q75=4.0, norm_q95=5.0, norm_max=31.0 + la) for la in range(2) for r in range(2)])
    ax = plots.token_norm_plot(norms).axes[0]
    points = [c for c in ax.collections if c.get_gid() == "interp-colour:mass"][0]
    assert [tuple(p) for p in points.get_offsets()] == list(zip(norms.layer.astype(float), norms.norm))
    np.testing.assert_array_equal(points.get_array(), norms.mass)  # the colour is the mass each outlier gets
    plt.close("all")


# ----- every plot checks the table it draws (issue 31) --------------------------------------------------------

import types  # noqa: E402

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
    from interp.figures.single_input_plots import single_input_patterns

    view = types.SimpleNamespace(patterns=SINK_PROFILE, heads=SINK_PROFILE, key_prior=SINK_PROFILE,
                                 positions=SINK_PROFILE, image=None, meta={})
    with pytest.raises(InputError, match=r"patterns draws the table of interp.single_input\(model, input\).*lacks "
                                         "condition, query_pos"):
        single_input_patterns(view)


def test_check_table_names_a_missing_column_family_and_passes_the_right_table_through():
    from interp.figures.plot_checks import check_table

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
    plain = interp.figures.plots.sink_mass_grid(table)
    categorical = interp.figures.plots.sink_mass_grid(table.assign(position=table.position.astype("category")))
    drawn = [[t.get_text() for t in fig.axes[0].texts] for fig in (plain, categorical)]
    assert drawn[0] == drawn[1] and "first*" in drawn[0]  # same labels, the sink starred
    plt.close("all")
    with pytest.raises(InputError, match="'mass' holds .* values .* not numbers"):
        interp.figures.plots.sink_mass_grid(table.assign(mass=table.mass.astype(str)))


@pytest.mark.parametrize("n_layers", [2, 3, 7, 12])
def test_attention_distance_ticks_are_whole_layers(n_layers):
    """The x axis is a layer index: every tick drawn inside the axis is an integer (3 layers drew 0.25, 0.5 ...)."""
    from interp import plots

    profile = pd.DataFrame([dict(layer=la, head=h, mean_attention_distance=RNG.uniform(1, 9), cluster=h % 2,
                                 distance_unit="tokens") for la in range(n_layers) for h in range(2)])
    fig = plots.attention_distance_figure(profile, "toy")
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    shown = [(t.get_position()[0], t.get_text()) for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]
    assert len(shown) >= 2
    for x, text in shown:
        assert x == round(x) and text.replace("\u2212", "-") == str(int(round(x))), shown
    plt.close("all")


def _tab10(i):
    return matplotlib.colormaps["tab10"](i)[:3]


@pytest.mark.parametrize("n_layers,run,labels", [
    (4, 1, ["layer 0", "layer 1", "layer 2", "layer 3"]),
    (10, 1, [f"layer {la}" for la in range(10)]),
    (12, 2, ["layers 0-1", "layers 2-3", "layers 4-5", "layers 6-7", "layers 8-9", "layers 10-11"]),
    (23, 3, ["layers 0-2", "layers 3-5", "layers 6-8", "layers 9-11", "layers 12-14", "layers 15-17", "layers 18-20",
             "layers 21-22"]),
    (30, 3, [f"layers {a}-{a + 2}" for a in range(0, 30, 3)]),
    (31, 4, [f"layers {a}-{a + 3}" for a in range(0, 28, 4)] + ["layers 28-30"]),
])
def test_implicit_vs_explicit_colours_layers_as_at_most_ten_categories(n_layers, run, labels):
    """Each head's point has the tab10 colour of its layer's group (layer // run, the runs written out here) and
    the legend names the groups in order."""
    from interp import plots

    table = pd.DataFrame([dict(model="m", layer=la, head=h, explicit_norm=RNG.uniform(), implicit_norm=RNG.uniform(),
                               positions="first", has_b_v=True) for la in range(n_layers) for h in range(3)])
    ax = plots.implicit_vs_explicit(table).axes[0]
    drawn = {}
    for collection in ax.collections:
        colours_of = collection.get_facecolors()
        for i, point in enumerate(collection.get_offsets()):
            drawn[tuple(point)] = tuple(colours_of[i if len(colours_of) > 1 else 0][:3])
    assert len(drawn) == len(table)
    for _, r in table.iterrows():
        np.testing.assert_allclose(drawn[(r.explicit_norm, r.implicit_norm)], _tab10(r.layer // run), atol=1e-9)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [t for t in legend if t != "y = x"] == labels and len(labels) <= 10
    handles = [h for h, t in zip(ax.get_legend().legend_handles, legend) if t != "y = x"]
    for i, handle in enumerate(handles):
        np.testing.assert_allclose(handle.get_facecolor()[0][:3], _tab10(i), atol=1e-9)
    plt.close("all")
