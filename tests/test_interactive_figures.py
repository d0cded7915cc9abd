"""interp.interactive's notebook figures: each plotly heatmap draws exactly the table's numbers.

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
    rows = [dict(layer=layer, head=h, **{name: f, value: float(RNG.normal())}) for f in facet for layer in layers
            for h in heads]
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
    with pytest.raises(InputError, match=r"no column\(s\) \['shift_ratio'\]"):
        interactive.shift_ratio(pd.DataFrame({"layer": [0], "head": [0]}))
    with pytest.raises(InputError, match="draws a DataFrame"):
        interactive.layer_head_heatmap([1, 2], "x")
