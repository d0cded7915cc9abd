"""The colour rule (``interp.figures.colours``, docs/figures/colour.md) holds in every figure function, static and
interactive, and ``check_colours`` fails on the figures it exists to catch: a viridis delta map, a
full-contrast noise panel, a sink-mass map dark at its large end, bias shares on their own min-max range.

The tables are small and planted (no model runs): b_k's ablation deltas are +-1e-9 (rounding noise beside
effects of 0.05), the no_b_k KL is +-8.7e-9 nats with one -2.8e-9 (beside KLs up to 4.8), bias shares of q
lie in 0.49-0.88 (the range the interactive panels used to stretch to full contrast).
"""

import ast
import functools
import inspect
import json
import re
import types
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import seaborn as sns
from matplotlib.colors import to_hex, to_rgb, to_rgba_array

import interp
from interp import compare, interactive, plots
from interp.figures import colours, single_input_plots
from experiments.training import backcopy_report, sink_report
from interp.figures.colours import NO_EFFECT, check_colours

matplotlib.use("Agg")
RNG = np.random.default_rng(7)
HEADS = [dict(layer=layer, head=h) for layer in range(3) for h in range(4)]
N = len(HEADS)


def _origin():
    share = {"q": RNG.uniform(0.49, 0.88, N), "k": RNG.uniform(0.0, 0.01, N), "v": RNG.uniform(0.1, 0.6, N)}
    ratio = {"q": RNG.uniform(0.1, 2.0, N), "k": RNG.uniform(0, 1e-3, N), "v": RNG.uniform(0.0, 0.5, N)}
    return pd.DataFrame([dict(**lh, kind=k, shift_ratio=ratio[k][i], bias_share=share[k][i], bias_norm=1.0,
                              present=True, shift_ratio_lo=ratio[k][i] * 0.9, shift_ratio_hi=ratio[k][i] * 1.1)
                         for k in "qkv" for i, lh in enumerate(HEADS)])


def _ablation():
    delta = {"q": RNG.normal(0, 0.05, N), "k": RNG.uniform(-1e-9, 1e-9, N), "v": RNG.normal(0.01, 0.02, N)}
    exact = pd.DataFrame([dict(**lh, kind=k, method="zero", estimate="exact", scope="head", metric="cross_entropy",
                               baseline=2.0, delta=delta[k][i], identity="") for k in "qkv" for i, lh in enumerate(HEADS)])
    return pd.concat([exact, exact.assign(estimate="atp", delta=exact.delta * 0.9)], ignore_index=True)


def _decomposition():
    return pd.DataFrame([dict(**lh, term=t, share=RNG.uniform(-0.02, 0.6)) for t in ("content", "key_prior")
                         for lh in HEADS])


def _clustered():
    return pd.DataFrame([dict(**lh, cluster=i % 2, mean_attention_distance=RNG.uniform(1, 9), hf_ratio=RNG.uniform(),
                              bin_0=RNG.normal(-1), bin_1=RNG.normal(-2), bin_2=RNG.normal(-3), distance_unit="tokens")
                         for i, lh in enumerate(HEADS)])


def _specialisation():
    """specialisation_test's table from planted profiles (no model): the untrained copies' features are noise."""
    from interp.analysis.frequency import specialisation_table

    trained = _clustered().drop(columns=["cluster", "distance_unit"])
    untrained = [trained.assign(**{c: RNG.normal(size=len(trained)) for c in ("hf_ratio", "bin_0", "bin_1", "bin_2")})
                 for _ in range(4)]
    return specialisation_table(trained, untrained, [0, 1, 2, 3], model="m")


def _sinks():
    rows = []
    for lh in HEADS:
        for p in ("first", "top_content"):
            m = RNG.uniform(0.05, 0.95)
            rows.append(dict(model="m", **lh, position=p, mass=m, sink=m > 0.3, threshold=0.3, has_b_q=True,
                             mass_without_key_prior=m * 0.5, mass_without_b_q=m * 0.4, uniform_mass=0.05))
    return pd.DataFrame(rows)


def _kl():
    rows = [dict(**lh, condition=c, kl=RNG.uniform(0, 4.8) if c != "no_b_k" else RNG.uniform(-8.7e-9, 8.7e-9))
            for c in ("no_b_q", "no_b_k", "no_key_prior") for lh in HEADS]
    rows[N + 1]["kl"] = -2.8e-9  # a negative KL from rounding (issue 39)
    return pd.DataFrame(rows)


def _implicit():
    return pd.DataFrame([dict(model="m", **lh, explicit_norm=RNG.uniform(), implicit_norm=RNG.uniform(),
                              positions="first", has_b_v=True) for lh in HEADS])


def _massive():
    return pd.DataFrame([dict(layer=layer, hook=f"blocks.{layer}.hook_resid_post", rank=r, abs_value=10.0 * (r + 1) ** -1,
                              median_abs=0.5, massive=r == 0, abs_threshold=5.0, ratio_threshold=100.0)
                         for layer in range(3) for r in range(2)])


def _norms():
    return pd.DataFrame([dict(layer=layer, hook=f"blocks.{layer}.hook_resid_post", rank=r, norm=30.0 + r,
                              mass=RNG.uniform() if layer < 2 else np.nan, k=4.0, n_outliers=2, norm_q05=1.0,
                              norm_q25=2.0, norm_median=3.0, norm_q75=4.0, norm_q95=5.0, norm_max=31.0)
                         for layer in range(3) for r in range(2)])


def fake_view(kind="grid"):
    """A ``single_input`` result by hand: 2 layers x 2 heads, the query row over a CLS token and a 2x2 patch
    grid ("grid"), a 4-token prompt's full pattern ("matrix") or its last row ("bars")."""
    conds = ["intact", "no_b_q", "no_b_k", "no_b_v", "no_key_prior"]
    n = 5 if kind == "grid" else 4
    queries = range(n) if kind == "matrix" else [0 if kind == "grid" else n - 1]
    rows = []
    for layer in range(2):
        for h in range(2):
            for q in queries:
                keys = range(n) if kind == "grid" else range(q + 1)
                base = RNG.dirichlet(np.ones(len(keys)))
                for c in conds:
                    w = base if c in ("intact", "no_b_k", "no_b_v") else RNG.dirichlet(np.ones(len(keys)))
                    for j, k in enumerate(keys):
                        patch = kind == "grid" and k > 0
                        rows.append(dict(layer=layer, head=h, condition=c, query="cls", query_pos=q, key_pos=k,
                                         weight=w[j], delta=w[j] - base[j], key_label="[CLS]" if not patch else
                                         f"patch {k}", key_kind="patch" if patch else ("prefix" if kind == "grid"
                                                                                       else "token"),
                                         key_row=(k - 1) // 2 if patch else -1, key_col=(k - 1) % 2 if patch else -1))
    heads = pd.DataFrame([dict(layer=layer, head=h, condition=c, kl=(RNG.uniform(0.1, 2) if c in ("no_b_q", "no_key_prior")
                                                                      else RNG.uniform(-9e-9, 9e-9)))
                          for layer in range(2) for h in range(2) for c in conds])
    key_prior = pd.DataFrame([dict(layer=layer, head=h, rank=r + 1, key_pos=r, key_prior=1.0 - r,
                                   key_prior_centered=0.5 - r, weight_intact=0.3, weight_no_key_prior=0.2,
                                   u_norm=2.0, label=f"tok{r}") for layer in range(2) for h in range(2) for r in range(3)])
    positions = pd.DataFrame(dict(pos=range(n), label=[f"tok{i}" for i in range(n)]))
    meta = dict(model="fake", modality="vision" if kind == "grid" else "text", query="cls", layers=[0, 1],
                heads=[0, 1], grid=(2, 2) if kind == "grid" else None)
    image = RNG.uniform(size=(16, 16, 3)) if kind == "grid" else None
    return types.SimpleNamespace(patterns=pd.DataFrame(rows), heads=heads, key_prior=key_prior, positions=positions,
                                 image=image, meta=meta)


ORIGIN, ABLATION, DECOMPOSITION, CLUSTERED, SINKS, KL = _origin(), _ablation(), _decomposition(), _clustered(), \
    _sinks(), _kl()
VIEWS = {k: fake_view(k) for k in ("grid", "matrix", "bars")}


def _html_figure(df, spec):
    payload = re.search(r'class="interp-heatmap"[^>]*>(.*)</script>', interactive.heatmap_html(df, spec, "x"), re.S)
    return go.Figure(json.loads(payload.group(1).replace("<\\/", "</"))["figure"])


# every figure function of interp.figures.plots, interp.figures.single_input_plots and interp.figures.interactive: name -> calls
FIGURES = {
    "layer_head_heatmaps": lambda: [plots.layer_head_heatmaps(ABLATION[ABLATION.estimate == "exact"], "delta"),
                                    plots.layer_head_heatmaps(KL, "kl", facet="condition")],
    "origin_shift_figures": lambda: list(plots.origin_shift_figures(ORIGIN, "m").values()),
    "interval_figure": lambda: [plots.interval_figure(ORIGIN, "shift_ratio", "m")],
    "key_prior_share_figure": lambda: [plots.key_prior_share_figure(DECOMPOSITION, "m")],
    "ablation_figures": lambda: list(plots.ablation_figures(ABLATION, "m").values()),
    "spectrum_clustermap": lambda: [plots.spectrum_clustermap(CLUSTERED, "m")],
    "attention_distance_figure": lambda: [plots.attention_distance_figure(CLUSTERED, "m")],
    "cluster_grid_figure": lambda: [plots.cluster_grid_figure(CLUSTERED, "m")],
    "specialisation_figure": lambda: [plots.specialisation_figure(_specialisation())],
    "sink_mass_grid": lambda: [plots.sink_mass_grid(SINKS)],
    "implicit_vs_explicit": lambda: [plots.implicit_vs_explicit(_implicit())],
    "massive_activations_plot": lambda: [plots.massive_activations_plot(_massive())],
    "token_norm_plot": lambda: [plots.token_norm_plot(_norms())],
    "key_prior_sink_plot": lambda: [plots.key_prior_sink_plot(SINKS)],
    "single_input_patterns": lambda: [single_input_plots.single_input_patterns(v, n_heads=2) for v in VIEWS.values()],
    "single_input_overlay": lambda: [single_input_plots.single_input_overlay(VIEWS["grid"])],
    "key_prior_top_tokens": lambda: [single_input_plots.key_prior_top_tokens(VIEWS["grid"], n_heads=2)],
    "single_input_patterns_plotly": lambda: [single_input_plots.single_input_patterns_plotly(v, n_heads=2)
                                             for v in VIEWS.values()],
    "single_input_overlay_plotly": lambda: [single_input_plots.single_input_overlay_plotly(VIEWS["grid"])],
    "key_prior_top_tokens_plotly": lambda: [single_input_plots.key_prior_top_tokens_plotly(VIEWS["grid"], n_heads=2)],
    "heatmap_figure": lambda: [interactive.heatmap_figure(KL, interactive.Heatmap("t", "kl", "KL", "condition"))],
    "heatmap_html": lambda: [_html_figure(ABLATION, interactive.Heatmap("ablation", "delta", "delta",
                                                                        query="estimate == 'exact'"))],
    "layer_head_heatmap": lambda: [interactive.layer_head_heatmap(KL, "kl", facet="condition"),
                                   interactive.layer_head_heatmap(ORIGIN, "bias_norm")],
    "shift_ratio": lambda: [interactive.shift_ratio(ORIGIN)],
    "bias_share": lambda: [interactive.bias_share(ORIGIN)],
    "key_prior_share": lambda: [interactive.key_prior_share(DECOMPOSITION)],
    "frequency": lambda: [interactive.frequency(CLUSTERED), interactive.frequency(CLUSTERED, "mean_attention_distance")],
    "sink_mass": lambda: [interactive.sink_mass(SINKS)],
    "ablation_delta": lambda: [interactive.ablation_delta(ABLATION), interactive.ablation_delta(ABLATION, "exact")],
}

# figure functions outside those three modules (module.name), drawn from the committed result tables
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _csv(folder, name):
    return pd.read_csv(RESULTS / folder / f"{name}.csv")


FIGURES.update({
    "sink_report.table_figure": lambda: [sink_report.table_figure(_csv(d, "summary")) for d in ("sinks", "sinks_text")],
    "sink_report.sink_share_figure": lambda: [sink_report.sink_share_figure(_csv("sinks_text", "runs"),
                                                                            _csv("sinks_text", "heads"), "s", 128)],
    "sink_report.massive_figure": lambda: [sink_report.massive_figure(_csv("sinks_text", "layers"), "s")],
    "sink_report.loss_figure": lambda: [sink_report.loss_figure(_csv("sinks_text", "runs"), _csv("sinks_text", "baseline"),
                                                                _csv("sinks_text", "rule"), "s")],
    "backcopy_report.sink_share_figure": lambda: [backcopy_report.sink_share_figure(_csv("backcopy", "runs"))],
    "compare.comparison_figure": lambda: [compare.comparison_figure(_csv("compare/digits-vit-bias", "compare"))],
})


@functools.cache
def made(name):
    """The figures of ``FIGURES[name]``, drawn once per session (closed in pyplot; still readable)."""
    figs = FIGURES[name]()
    plt.close("all")
    return figs


NOT_FIGURES = {"panel_notes", "save_figure", "bin_labels", "resid_axis_label", "pick_heads", "rows_of", "heatmap_rows",
               "heatmap_grids", "page_scripts", "sortable_table", "check_table"}


def test_every_figure_function_is_checked():
    """A new figure function fails here until it is added to FIGURES (and so checked against the rule)."""
    public = {name for module in (plots, single_input_plots, interactive)
              for name, f in inspect.getmembers(module, inspect.isfunction)
              if not name.startswith("_") and f.__module__.startswith("interp.")
              and f.__module__ in (plots.__name__, single_input_plots.__name__, interactive.__name__)}
    assert public - NOT_FIGURES == {name for name in FIGURES if "." not in name}


def test_every_figure_function_elsewhere_is_checked():
    """Any other public function of the package that returns a figure (by its annotation: ``-> plt.Figure``,
    ``go.Figure``, ``dict[str, plt.Figure]``) is in FIGURES as ``module.name`` (sink_report's table was drawn in
    "Reds", dark = large, outside the rule, until it was)."""
    root = Path(interp.__file__).parent
    found = set()
    for path in [*root.rglob("*.py"), *(root.parent / "experiments" / "training").rglob("*.py")]:  # library + recipes
        if path.stem in ("plots", "single_input_plots", "interactive"):  # the test above
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.returns is not None \
                    and "Figure" in ast.unparse(node.returns):
                found.add(f"{path.stem}.{node.name}")
    assert found == {name for name in FIGURES if "." in name}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_figure_follows_the_colour_rule(name):
    for fig in made(name):
        assert check_colours(fig) == [], name


# ----- figures that break the rule: the check must fail on each ------------------------------------------------

DELTA = ABLATION[(ABLATION.estimate == "exact") & (ABLATION.kind == "q")].pivot(index="layer", columns="head",
                                                                                 values="delta").to_numpy()
NOISE = KL[KL.condition == "no_b_k"].pivot(index="layer", columns="head", values="kl").to_numpy()


def _mpl(values, cmap, lo, hi, quantity):
    fig, ax = plt.subplots()
    colours.tag(ax.imshow(values, cmap=cmap, vmin=lo, vmax=hi), quantity)
    return fig


def _plotly(values, colorscale, lo, hi, quantity):
    return go.Figure(go.Heatmap(z=values.tolist(), colorscale=colorscale, zmin=lo, zmax=hi, meta={"quantity": quantity}))


m = float(np.abs(DELTA).max())
WRONG = {
    "viridis delta map (static)": (lambda: _mpl(DELTA, "viridis", -m, m, "delta"), r"delta is diverging and must use RdBu_r"),
    "viridis delta map (plotly, as interactive.ablation_delta was)": (
        lambda: _plotly(DELTA, "Viridis", float(DELTA.min()), float(DELTA.max()), "delta"),
        r"delta is diverging and must use RdBu_r"),
    "delta map off centre": (lambda: _mpl(DELTA, "RdBu_r", float(DELTA.min()), float(DELTA.max()), "delta"),
                             "not centred on 0"),
    "full-contrast noise panel (static)": (lambda: _mpl(NOISE, "viridis", float(NOISE.min()), float(NOISE.max()), "kl"),
                                           r"below its floor 1e-06 .* drawn in colour"),
    "full-contrast noise panel (plotly, the single-input KL panel)": (
        lambda: _plotly(NOISE, "Viridis", float(NOISE.min()), float(NOISE.max()), "kl"),
        r"below its floor 1e-06 .* drawn in colour"),
    "a negative KL drawn": (lambda: _plotly(NOISE, colours.plotly_colorscale(colours.RULES["kl"], 0, 4.8), 0, 4.8, "kl"),
                            "kl drawn negative"),
    "sink mass dark = large (as sink_mass_grid was)": (
        lambda: _mpl(np.full((2, 2), 0.5), "rocket_r", 0, 1, "mass"), "mass is sequential and must use viridis"),
    "bias share on its own min-max (as interactive.bias_share was)": (
        lambda: _plotly(np.array([[0.49, 0.88]]), "Viridis", 0.49, 0.88, "bias_share"), "not on 0-1"),
    "a size not starting at 0": (lambda: _mpl(np.array([[2.0, 3.0]]), "viridis", 2.0, 3.0, "shift_ratio"),
                                 "must start at 0"),
    "a colour map without its quantity": (lambda: plt.subplots()[1].imshow(DELTA).figure, "without saying its quantity"),
    "sink table in Reds (as sink_report.table_figure was)": (
        lambda: _mpl(np.array([[0.0, 0.03], [0.17, 0.46]]), "Reds", 0, 1, "mass"), "mass is sequential and must use viridis"),
    "sink table in Reds, untagged (sink_report.table_figure's old code)": (
        lambda: sns.heatmap(pd.DataFrame([[0.0, 0.46]]), cmap="Reds", vmin=0, vmax=1).figure, "without saying its quantity"),
}


def _two_ranges():
    fig, (a, b) = plt.subplots(1, 2)
    colours.tag(a.imshow(np.abs(DELTA), vmin=0, vmax=1), "shift_ratio")
    colours.tag(b.imshow(np.abs(DELTA), vmin=0, vmax=0.1), "shift_ratio")
    return fig


WRONG["one quantity on two ranges (as interactive panels were)"] = (_two_ranges, "drawn on 2 ranges")


@pytest.mark.parametrize("case", list(WRONG))
def test_the_check_fails_on_figures_that_break_the_rule(case):
    draw, words = WRONG[case]
    problems = check_colours(draw())
    assert any(re.search(words, p) for p in problems), problems
    plt.close("all")


# ----- what the rule draws ------------------------------------------------------------------------------------


def _plotly_colour(trace, value):
    return colours._colour_at([list(s) for s in trace.colorscale], (value - trace.zmin) / (trace.zmax - trace.zmin))


def test_a_noise_panel_is_grey_beside_real_effects_and_a_negative_kl_is_drawn_0_with_the_floor_stated():
    fig = made("layer_head_heatmap")[0]
    traces = {t.name: t for t in fig.data}
    noise = np.array(traces["no_b_k"].z, dtype=float)
    want = KL[KL.condition == "no_b_k"].pivot(index="layer", columns="head", values="kl").to_numpy()
    np.testing.assert_array_equal(noise, np.where(want < 0, 0.0, want))  # -2.8e-9 drawn as 0; the rest as is
    assert all(np.allclose(_plotly_colour(traces["no_b_k"], v), to_rgb(NO_EFFECT), atol=0.01) for v in noise.ravel())
    assert all("below the numerical floor 1e-06 nats: no effect" in t for row in traces["no_b_k"].text for t in row)
    top = float(KL.kl.max())
    assert traces["no_b_q"].zmax == traces["no_b_k"].zmax == top and traces["no_b_q"].zmin == 0.0  # one range
    np.testing.assert_allclose(_plotly_colour(traces["no_b_q"], top), matplotlib.colormaps["viridis"](1.0)[:3],
                               atol=0.01)
    assert not any(t for row in traces["no_b_q"].text for t in row)  # real effects carry no note
    # the static version: the noise cells are left out of the map and drawn on a grey hatched layer
    static = made("layer_head_heatmaps")[1]
    ax = static.axes[1]
    mesh, layer = ax.collections
    assert mesh.get_gid() == "interp-colour:kl" and layer.get_gid() == "interp-colour:no_effect"
    assert np.ma.getmaskarray(mesh.get_array()).all() and layer.get_hatch() == colours.HATCH
    assert not np.ma.getmaskarray(layer.get_array()).any()
    assert "numerical floor" in static.axes[-1].get_ylabel()
    plt.close("all")


def test_static_and_interactive_draw_a_quantity_on_the_same_range():
    """bias share on 0-1 in both (the interactive q panel was 0.49-0.88); shift ratio and delta on one range over
    every panel, the same in both."""
    shift, share = made("origin_shift_figures")[:2]
    exact, = [f for f in made("ablation_figures") if f._suptitle and "each head's bias (exact)" in f._suptitle.get_text()]
    pairs = [(share, made("bias_share")[0], (0.0, 1.0)),
             (shift, made("shift_ratio")[0], (0.0, ORIGIN.shift_ratio.max())),
             (exact, made("ablation_delta")[1], (-np.abs(DELTA).max(), np.abs(DELTA).max())),
             (made("sink_mass_grid")[0], made("sink_mass")[0], (0.0, 1.0))]
    for static, live, (lo, hi) in pairs:
        meshes = [c for ax in static.axes for c in ax.collections if (c.get_gid() or "").endswith(
            ("bias_share", "shift_ratio", "delta", "mass"))]
        assert meshes and all(np.allclose((c.norm.vmin, c.norm.vmax), (lo, hi)) for c in meshes)
        assert all(np.allclose((t.zmin, t.zmax), (lo, hi)) for t in live.data)
    plt.close("all")


def test_a_delta_below_the_floor_is_no_effect_and_one_above_is_coloured():
    rule = colours.RULES["delta"]
    values = np.array([-2e-6, -5e-7, 0.0, 5e-7, 2e-6, np.nan])
    assert colours.below_floor(rule, values).tolist() == [False, True, True, True, False, False]
    scale = colours.plotly_colorscale(rule, -1e-5, 1e-5)
    grey = to_rgb(NO_EFFECT)
    for v, quiet in [(-2e-6, False), (-5e-7, True), (0.0, True), (5e-7, True), (2e-6, False)]:
        c = colours._colour_at(scale, (v + 1e-5) / 2e-5)
        assert np.allclose(c, grey, atol=0.01) == quiet, v
    # outside the band the plotly scale is the matplotlib map (the static figures' colours)
    for v in (-1e-5, -4e-6, 4e-6, 1e-5):
        x = (v + 1e-5) / 2e-5
        np.testing.assert_allclose(colours._colour_at(scale, x), matplotlib.colormaps["RdBu_r"](x)[:3], atol=0.02)


def test_a_size_cannot_be_negative_beyond_rounding():
    from interp.errors import InputError

    with pytest.raises(InputError, match=r"kl cannot be negative, yet 1 values are \(e.g. -0.1"):
        interactive.layer_head_heatmap(KL.assign(kl=KL.kl.where(KL.index != 0, -0.1)), "kl", facet="condition")


def test_the_colour_page_states_the_rule_in_the_code():
    """docs/figures/colour.md (linked from README) quotes each floor and map as interp.figures.colours defines them."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "figures" / "colour.md").read_text()
    assert "docs/figures/colour.md" in (root / "README.md").read_text()
    for quantity, rule in colours.RULES.items():
        if rule.floor > 0:
            floor = f"{rule.floor:.0e}".replace("e-0", "e-")  # 1e-6
            assert re.search(rf"`{quantity}` \| {floor} {re.escape(rule.unit)}", page), quantity
    for name in (colours.SEQUENTIAL, colours.DIVERGING, colours.CATEGORICAL, NO_EFFECT):
        assert name in page


def test_a_bias_kind_has_one_colour_in_every_figure():
    """The top-heads bars and the exact-vs-estimate points colour q, k, v by KIND_COLOURS, whichever kind comes
    first (seaborn's default would give the first kind drawn blue: q in one figure, v in the next)."""
    figs = made("ablation_figures")
    seen = set()
    for fig in figs:
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None or not ax.patches and not ax.collections:
                continue
            for handle, text in zip(legend.legend_handles, legend.get_texts()):
                if text.get_text() in colours.KIND_COLOURS:
                    colour = handle.get_facecolor() if hasattr(handle, "get_facecolor") else \
                        handle.get_markerfacecolor()  # a bar's patch, a point's marker
                    assert to_hex(to_rgba_array(colour)[0]) == colours.KIND_COLOURS[text.get_text()], (text.get_text(), fig)
                    seen.add(text.get_text())
    assert seen == {"q", "k", "v"}
    v_first = ABLATION[ABLATION.kind == "v"].assign(delta=10.0)  # v now ranks first: still green
    bars = plots.ablation_figures(pd.concat([v_first, ABLATION[ABLATION.kind != "v"]]), "m")
    ax = next(f for k, f in bars.items() if k.startswith("ablation_top")).axes[0]
    top = ax.patches[0]  # the largest effect's bar, a v head
    assert to_hex(top.get_facecolor()) == colours.KIND_COLOURS["v"]
    plt.close("all")
