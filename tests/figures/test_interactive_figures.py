"""interp.figures.interactive's notebook figures: each plotly heatmap draws exactly the table's numbers.

For every panel, the trace's z (rows: layers, columns: heads, in the axes' order) must equal the
DataFrame's values at those layers and heads (NaN drawn as a gap), the x / y axes must be the
table's heads and layers (a selection keeps its own indices), and a panel per facet value.
"""

import numpy as np
import pandas as pd
import pytest

from interp import interactive
from interp.errors import InputError

RNG = np.random.default_rng(0)


def _table(layers=(0, 1, 2), heads=(0, 1, 2, 3), facet=("q", "k", "v"), name="kind", value="shift_ratio"):
    signed = value in ("delta", "share")  # the other quantities are sizes (>= 0: interp.figures.colours refuses negatives)
    rows = [dict(layer=layer, head=h, **{name: f, value: float(RNG.normal() if signed else RNG.exponential())})
            for f in facet for layer in layers for h in heads]
    df = pd.DataFrame(rows)
    df.loc[3, value] = np.nan  # a gap
    return df


def _check_panels(fig, df, value, facet, query=""):
    df = df.query(query) if query else df
    panels = list(dict.fromkeys(df[facet])) if facet else [None]
    assert len(fig.data) == len(panels)
    for trace, panel in zip(fig.data, panels):
        part = df if panel is None else df[df[facet] == panel]
        assert list(trace.y) == sorted(set(part.layer)) and list(trace.x) == sorted(set(part["head"]))
        for i, layer in enumerate(trace.y):
            for j, head in enumerate(trace.x):
                want = part[(part.layer == layer) & (part["head"] == head)][value]
                got = trace.z[i][j]
                assert len(want) == 1
                assert (got is None and np.isnan(want.iloc[0])) or got == want.iloc[0], (panel, layer, head)


def test_each_panel_draws_the_tables_values():
    origin = _table()
    origin["bias_share"] = RNG.uniform(size=len(origin))
    _check_panels(interactive.shift_ratio(origin), origin, "shift_ratio", "kind")
    _check_panels(interactive.bias_share(origin), origin, "bias_share", "kind")


def test_a_selection_keeps_its_own_layers_and_heads():
    part = _table(layers=(2, 5), heads=(1, 3))
    fig = interactive.shift_ratio(part)
    _check_panels(fig, part, "shift_ratio", "kind")
    assert list(fig.data[0].y) == [2, 5] and list(fig.data[0].x) == [1, 3]


def test_query_and_facet_pick_the_rows_drawn():
    dec = _table(facet=("content", "query_const", "key_prior", "const"), name="term", value="share")
    fig = interactive.key_prior_share(dec)
    _check_panels(fig, dec, "share", "term", "term == 'key_prior'")
    abl = pd.concat([_table(value="delta").assign(estimate=e, scope="head") for e in ("atp", "exact")])
    _check_panels(interactive.ablation_delta(abl), abl, "delta", "kind", "estimate == 'atp'")
    _check_panels(interactive.ablation_delta(abl, "exact"), abl, "delta", "kind", "estimate == 'exact'")
    sinks = _table(facet=("cls", "first"), name="position", value="mass")
    _check_panels(interactive.sink_mass(sinks), sinks, "mass", "position")
    profile = _table(facet=("x",), name="unused", value="hf_ratio").drop(columns="unused")
    _check_panels(interactive.frequency(profile), profile, "hf_ratio", None)


def test_a_table_it_cannot_draw_is_refused():
    with pytest.raises(InputError, match=r"interactive.shift_ratio draws the table of interp.origin_shift.*lacks "
                                         r"shift_ratio"):
        interactive.shift_ratio(pd.DataFrame({"layer": [0], "head": [0]}))
    with pytest.raises(InputError, match="not a DataFrame"):
        interactive.layer_head_heatmap([1, 2], "x")


def _sinks(mass, data="a"):
    return _table(facet=("first", "top_content"), name="position", value="mass").assign(
        mass=mass, model="m", data_fingerprint=data)


@pytest.mark.parametrize("column,other", [("data_fingerprint", "b"), ("model", "another model")])
def test_two_runs_or_models_concatenated_are_refused_not_averaged(column, other):
    # issue 38: the mean of two runs' cells (0.3623 from 0.3146 and 0.4101) is a number neither run produced
    one, two = _sinks(0.3146), _sinks(0.4101).assign(**{column: other})
    both = pd.concat([one, two], ignore_index=True)
    with pytest.raises(InputError, match=r"interactive.sink_mass draws .*sink_profile.*(each \(layer, head, "
                                         r"position\) once|for one model)"):
        interactive.sink_mass(both)
    _check_panels(interactive.sink_mass(one), one, "mass", "position")  # each run alone draws its own numbers
    origin = _table().assign(bias_share=0.5)
    twice = pd.concat([origin, origin.assign(shift_ratio=origin.shift_ratio + 1)], ignore_index=True)
    for draw in (interactive.shift_ratio, interactive.bias_share,
                 lambda t: interactive.layer_head_heatmap(t, "shift_ratio")):
        with pytest.raises(InputError, match=r"each \(layer, head, kind\) once.*two runs"):
            draw(twice)
    abl = _table(value="delta").assign(estimate="exact", scope="head")
    with pytest.raises(InputError, match=r"interactive.ablation_delta .*each \(layer, head, kind\) once"):
        interactive.ablation_delta(pd.concat([abl, abl], ignore_index=True))
    spec = interactive.Heatmap("sink_profile", "mass", "mass", facet="position")
    with pytest.raises(InputError, match="the report's sink_profile heatmap.*once"):
        interactive.heatmap_html(pd.concat([one, _sinks(0.4101, "b")]), spec, "x")


@pytest.mark.parametrize("draw,table,words", [
    (interactive.sink_mass, _sinks(0.3).iloc[:0], "has no rows"),
    (interactive.sink_mass, _table(facet=("x",), name="unused", value="implicit_norm"), "lacks mass, position"),
    (interactive.shift_ratio, _sinks(0.3), "lacks shift_ratio.*origin_shift"),
    (interactive.ablation_delta, _sinks(0.3), "ablation_delta draws .*ablate_bias.*lacks kind, delta, estimate, "
                                              "scope"),
    (interactive.ablation_delta, _table(value="delta").assign(estimate="exact", scope="layer"), "picks none"),
    (lambda t: interactive.layer_head_heatmap(t, "shift_ratio", query="nope == 1"), _table(), "query 'nope == 1' "
                                                                                                "cannot run"),
    (interactive.shift_ratio, _table().assign(layer=lambda t: t.layer.map({0: "0", 1: "one", 2: "2"})),
     "'layer' holds values that are not integer indices \\(e.g. 'one'\\)"),
    (interactive.shift_ratio, _table().assign(head=lambda t: t["head"] > 1), "'head' holds True/False"),
    (interactive.shift_ratio, _table().assign(layer=lambda t: t.layer.where(t.index != 2)), "1 rows have no layer"),
    (interactive.shift_ratio, _table().assign(head=lambda t: t["head"] + 0.5), "'head' holds non-integer"),
    (interactive.shift_ratio, _table().assign(shift_ratio="big"), "draws numbers"),
    (interactive.shift_ratio, _table().assign(kind=lambda t: t.kind.where(t.index != 0)), "1 rows have no kind"),
], ids=["empty", "another analyzer's", "sinks as origin", "sinks as ablation", "query picks nothing", "bad query",
        "text layers", "bool heads", "NaN layer", "fractional heads", "string values", "NaN facet"])
def test_tables_it_cannot_draw_are_one_input_error(draw, table, words):
    with pytest.raises(InputError, match=words):
        draw(table)


def test_a_head_without_any_value_keeps_its_column():
    origin = _table()
    origin.loc[origin["head"] == 2, "shift_ratio"] = np.nan  # every value of head 2 missing: a gap, not a lost head
    fig = interactive.shift_ratio(origin)
    assert all(list(trace.x) == [0, 1, 2, 3] for trace in fig.data)
    assert all(row[2] is None for trace in fig.data for row in trace.z)


def test_layers_written_as_text_draw_in_number_order_and_a_query_can_pick_one_model():
    origin = _table(layers=(2, 10, 9))
    as_text = origin.assign(layer=origin.layer.astype(str))  # "10" < "2" < "9" as text
    fig = interactive.shift_ratio(as_text)
    _check_panels(fig, origin, "shift_ratio", "kind")
    assert list(fig.data[0].y) == [2, 9, 10]
    sinks = pd.concat([_sinks(0.3146), _sinks(0.4101).assign(model="other")], ignore_index=True)
    picked = interactive.layer_head_heatmap(sinks, "mass", facet="position", query="model == 'other'")
    assert {z for trace in picked.data for row in trace.z for z in row} == {0.4101}
