"""Interactive, self-contained pieces of ``report.html``: layer x head heatmaps with hover
values (plotly, its JavaScript embedded once in the page: nothing is fetched) and sortable
tables. Like ``interp.figures.plots``, they only draw DataFrames. The same heatmaps as plotly figures for a
notebook: ``layer_head_heatmap`` (any table with layer, head and a value) and one per report heatmap
(``shift_ratio``, ``bias_share``, ``key_prior_share``, ``frequency``, ``sink_mass``, ``ablation_delta``).

Each heatmap's figure JSON sits in a ``<script type="application/json" class="interp-heatmap">``
element next to its ``<div>``, so the numbers drawn are readable (and testable) as data.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from interp.figures import colours
from interp.errors import InputError
from interp.figures.plot_checks import check_table


@dataclass(frozen=True)
class Heatmap:
    """A layer x head heatmap of ``value`` from the table ``table``, one panel per ``facet`` value."""

    table: str
    value: str
    label: str  # what the colour means, with its unit
    facet: Optional[str] = "kind"
    title: str = ""
    query: str = ""  # rows of the table to draw (a pandas query), "" = all


@dataclass(frozen=True)
class TopTable:
    """The rows of ``table`` with the largest |``sort_by``|, as a sortable HTML table."""

    table: str
    columns: tuple[str, ...]
    sort_by: str
    caption: str = ""
    query: str = ""
    n: int = 20


def rows_of(df: pd.DataFrame, query: str) -> pd.DataFrame:
    """The rows of ``df`` that the pandas ``query`` picks ("" = all); a query pandas cannot run is one
    ``InputError``."""
    if not query:
        return df
    try:
        return df.query(query)
    except Exception as exc:  # pandas raises many kinds (UndefinedVariableError, SyntaxError, TypeError)
        raise InputError(f"the query {query!r} cannot run on this table ({type(exc).__name__}: {exc}); its columns: "
                         f"{', '.join(map(str, df.columns))}") from None


PER_HEAD = "a per-head analyzer (interp.origin_shift, score_decomposition, frequency_profile, ablate_bias, ...)"


def heatmap_rows(df: pd.DataFrame, spec: Heatmap, figure: str = "the heatmap", analyzer: str = PER_HEAD,
                 ) -> pd.DataFrame:
    """The rows a heatmap draws: those ``spec.query`` picks that have a head (a layer-level row has none).
    Checked as ``interp.figures.plots`` checks its tables (``check_table``): the table has layer, head, the value
    (and facet) columns and rows of one model; layers and heads are integers; and each (layer, head, facet)
    is drawn from one row, so two runs' or two models' tables concatenated are refused, never averaged
    into a cell neither produced (the model check applies to the rows the query picks)."""
    columns = ["layer", "head", spec.value] + ([spec.facet] if spec.facet else [])
    check_table(df.head(1) if isinstance(df, pd.DataFrame) else df, figure, analyzer, columns)  # models: after query
    part = rows_of(df, spec.query)
    if part.empty:
        raise InputError(f"{figure}: the query {spec.query!r} picks none of the table's {len(df)} rows: is it the "
                         f"table of {analyzer}?")
    part = part.assign(**{column: _index_column(part, column, figure) for column in ("layer", "head")})
    part = part[part["head"].notna()]
    if not (pd.api.types.is_numeric_dtype(part[spec.value]) or pd.api.types.is_bool_dtype(part[spec.value])):
        raise InputError(f"{figure} draws numbers; column {spec.value!r} holds {part[spec.value].dtype} values "
                         f"(e.g. {part[spec.value].iloc[0]!r}): pass the analyzer's table, or convert the column")
    if spec.facet and part[spec.facet].isna().any():
        raise InputError(f"{figure}: {int(part[spec.facet].isna().sum())} rows have no {spec.facet} (NaN): "
                         f"drop them or fill in their {spec.facet}")
    return check_table(part, figure, analyzer, columns, keys=columns[:2] + columns[3:])


def _index_column(df: pd.DataFrame, column: str, figure: str) -> pd.Series:
    """``column`` (layer or head) as numbers: whole numbers (ints, floats such as 2.0, or strings and objects
    that read as them, e.g. "12" from a text file, ordered as numbers, not as text); NaN only in ``head`` (a
    layer-level row, not drawn). Bools, other text and fractions are one ``InputError``."""
    values = df[column]
    if pd.api.types.is_bool_dtype(values) or values.map(lambda v: isinstance(v, (bool, np.bool_))).any():
        raise InputError(f"{figure}: column {column!r} holds True/False, not integer indices: pass the table's "
                         f"own {column} numbers")
    numbers = pd.to_numeric(values, errors="coerce")
    unread = numbers.isna() & values.notna()
    if unread.any():
        raise InputError(f"{figure}: column {column!r} holds values that are not integer indices (e.g. "
                         f"{values[unread].iloc[0]!r}): convert it, e.g. df[{column!r}].astype(int)")
    if column == "layer" and numbers.isna().any():
        raise InputError(f"{figure}: {int(numbers.isna().sum())} rows have no layer (NaN): drop them, e.g. "
                         "df.dropna(subset=['layer'])")
    finite = numbers.dropna()
    if not (np.isfinite(finite) & (finite == np.round(finite))).all():
        raise InputError(f"{figure}: column {column!r} holds non-integer values (e.g. "
                         f"{finite[finite != np.round(finite)].iloc[0]!r}): layers and heads are whole numbers")
    return numbers


def heatmap_grids(df: pd.DataFrame, spec: Heatmap, figure: str = "the heatmap",
                  analyzer: str = PER_HEAD) -> dict[str, pd.DataFrame]:
    """The layer x head grid of each panel (what the heatmap draws, and what a test compares): each cell
    the value of the one row of that layer, head (and facet value); rows checked by ``heatmap_rows``."""
    df = heatmap_rows(df, spec, figure, analyzer)
    facets = [None] if spec.facet is None else list(dict.fromkeys(df[spec.facet]))
    grids = {}
    for f in facets:
        part = df if f is None else df[df[spec.facet] == f]
        grid = part.pivot(index="layer", columns="head", values=spec.value)
        grids[str(f) if f is not None else spec.value] = grid.sort_index().sort_index(axis=1).astype(float)
    return grids


def heatmap_figure(df: pd.DataFrame, spec: Heatmap, figure: str = "the heatmap",
                   analyzer: str = PER_HEAD) -> go.Figure:
    """One panel per facet, coloured as ``interp.figures.colours`` says for ``spec.value`` and as the static figures
    are: one map per kind of quantity (bright = large; a delta diverging around 0), **one range for every
    panel** (a share on 0-1, a size from 0 to the largest value of any panel), cells below the quantity's
    numerical floor grey ("no effect", the colour bar and the hover say so; a KL's rounding negatives drawn
    as 0). Hover shows layer, head and the value. ``figure`` / ``analyzer``: what an error about the table
    names (the figure, and what makes the table it draws)."""
    grids = heatmap_grids(df, spec, figure, analyzer)
    every = np.concatenate([g.to_numpy(dtype=float).ravel() for g in grids.values()])
    rule = colours.rule_for(spec.value, every)
    lo, hi = colours.limits(rule, every)
    note = colours.floor_note(rule)
    fig = make_subplots(rows=1, cols=len(grids), subplot_titles=[
        f"{spec.facet} = {name}" if spec.facet else name for name in grids], horizontal_spacing=0.08)
    for i, (name, grid) in enumerate(grids.items(), start=1):
        z = colours.drawn_values(rule, grid.to_numpy(dtype=float))
        fig.add_trace(go.Heatmap(
            z=np.where(np.isfinite(z), z, None).tolist(), x=[int(h) for h in grid.columns],
            y=[int(layer) for layer in grid.index], name=name, **colours.plotly_scale(rule, lo, hi),
            text=colours.plotly_hover_notes(rule, z).tolist(), showscale=i == len(grids),
            colorbar=dict(title=dict(text=spec.label + (f"<br>{note}" if note else ""), side="right"), len=0.85,
                          thickness=12),
            hovertemplate=f"layer %{{y}}, head %{{x}}<br>{spec.value} = %{{z:.4g}}%{{text}}<extra>{name}</extra>"),
            row=1, col=i)
        # categories: a selection of layers or heads (layers=, heads=) keeps one equal row / column per index
        fig.update_xaxes(title_text="head", dtick=1, type="category", row=1, col=i)
        fig.update_yaxes(title_text="layer", dtick=1, autorange="reversed", type="category", row=1, col=i)
    fig.update_layout(title=spec.title or spec.value, height=420, width=max(560, 380 * len(grids) + 160),
                      margin=dict(l=50, r=50, t=80, b=50), plot_bgcolor="white")
    return fig


# ----- the same heatmaps in a notebook: a plotly figure of any layer x head table -------------------------


def layer_head_heatmap(df: pd.DataFrame, value: str, *, facet: Optional[str] = "kind", label: str = "",
                       title: str = "", query: str = "", figure: str = "layer_head_heatmap",
                       analyzer: str = PER_HEAD) -> go.Figure:
    """An interactive plotly heatmap (hover: layer, head, value; one panel and colour scale per ``facet``
    value; no facet when the table lacks that column) of ``value`` from a table of interp's: what
    ``report.html`` shows, as a figure a notebook displays inline. ``query`` picks rows (pandas query).
    Each cell is the value of the one row with that layer, head (and facet value); a table holding a
    cell twice (two runs or two models concatenated), an empty table or another analyzer's table is one
    ``InputError`` (``heatmap_rows``), as in ``interp.figures.plots``: pick one run's rows with ``query``."""
    if isinstance(df, pd.DataFrame):
        facet = facet if facet is not None and facet in df.columns else None
    return _drawn(df, value, facet, label, title, query, figure, analyzer)


def _drawn(df: pd.DataFrame, value: str, facet: Optional[str], label: str, title: str, query: str, figure: str,
           analyzer: str) -> go.Figure:
    """``heatmap_figure`` of ``value``; the table must hold the ``facet`` column (an analyzer's always does)."""
    return heatmap_figure(df, Heatmap("", value, label or value, facet, title, query), figure, analyzer)


ORIGIN = "interp.origin_shift(model, stats)"


def shift_ratio(origin: pd.DataFrame, title: str = "shift ratio per head") -> go.Figure:
    """``origin_shift``'s shift_ratio, a panel per kind (the report's heatmap)."""
    return _drawn(origin, "shift_ratio", "kind", "||b|| / RMS(XW)", title, "", "interactive.shift_ratio", ORIGIN)


def bias_share(origin: pd.DataFrame, title: str = "bias share of each head's origin") -> go.Figure:
    return _drawn(origin, "bias_share", "kind", "||b|| / (||b|| + ||E[X]W||)", title, "", "interactive.bias_share",
                  ORIGIN)


def key_prior_share(decomposition: pd.DataFrame, title: str = "key-prior share of score variance") -> go.Figure:
    """``score_decomposition``'s key_prior share per head."""
    return _drawn(decomposition, "share", "term", "share of score variance", title, "term == 'key_prior'",
                  "interactive.key_prior_share", "interp.score_decomposition(model, data)")


def frequency(profile: pd.DataFrame, value: str = "hf_ratio", title: str = "") -> go.Figure:
    """A ``frequency_profile`` column per head (hf_ratio, mean_attention_distance, entropy, sink_mass)."""
    return _drawn(profile, value, None, "", title or f"{value} per head", "", "interactive.frequency",
                  "interp.frequency_profile(model, data)")


def sink_mass(profile: pd.DataFrame, title: str = "attention mass on each position class") -> go.Figure:
    """``sink_profile``'s mass, a panel per position class."""
    return _drawn(profile, "mass", "position", "mean attention mass", title, "", "interactive.sink_mass",
                  "interp.sink_profile(model, data)")


def ablation_delta(results: pd.DataFrame, estimate: Optional[str] = None, title: str = "",
                   method: Optional[str] = None) -> go.Figure:
    """``ablate_bias``'s per-head delta, a panel per kind, for one estimate and one method (defaults: the
    first of each in the table, the estimate being the one that covers every head under ``estimate="auto"``):
    a table of zero and mean ablations holds each head twice, one cell per method."""
    figure, analyzer = "interactive.ablation_delta", "interp.ablate_bias(model, data)"
    check_table(results, figure, analyzer, ["layer", "head", "kind", "delta", "estimate", "scope"])
    estimate = estimate or str(results.estimate.iloc[0])
    query = f"scope == 'head' and estimate == {estimate!r}"
    if "method" in results.columns:
        method = method or str(results.method.iloc[0])
        query += f" and method == {method!r}"
    return _drawn(results, "delta", "kind", "delta (ablated - intact)", title or f"effect of removing each bias "
                  f"({method + ', ' if method else ''}{estimate})", query, figure, analyzer)


def heatmap_html(df: pd.DataFrame, spec: Heatmap, element_id: str) -> str:
    """The heatmap as a ``<div>`` plus its figure JSON; drawn by the page's embedded plotly.js."""
    figure = heatmap_figure(df, spec, f"the report's {spec.table} heatmap",
                            f"the pipeline's {spec.table} step").to_plotly_json()
    payload = json.dumps(dict(table=spec.table, value=spec.value, facet=spec.facet, query=spec.query,
                              figure=figure),
                         default=_json_default).replace("</", "<\\/")
    return (f'<div id="{element_id}" class="interp-plot"></div>\n'
            f'<script type="application/json" class="interp-heatmap" data-target="{element_id}">{payload}</script>')


def _json_default(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def page_scripts() -> str:
    """plotly.js (embedded: no network), the code that draws every heatmap, and the table sorter."""
    return ('<script id="plotly-js">' + get_plotlyjs().replace("</script", "<\\/script") + "</script>\n<script>"
            + _DRAW + "</script>")


_DRAW = """
document.querySelectorAll('script.interp-heatmap').forEach(function (el) {
  var spec = JSON.parse(el.textContent);
  Plotly.newPlot(el.dataset.target, spec.figure.data, spec.figure.layout, {displaylogo: false, responsive: true});
});
document.querySelectorAll('table.interp-sortable th').forEach(function (th, col) {
  th.style.cursor = 'pointer';
  th.addEventListener('click', function () {
    var table = th.closest('table'), body = table.tBodies[0];
    var rows = Array.from(body.rows), asc = th.dataset.asc !== 'true';
    var index = Array.from(th.parentNode.children).indexOf(th);
    rows.sort(function (a, b) {
      var x = a.cells[index].dataset.value, y = b.cells[index].dataset.value;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
      return asc ? c : -c;
    });
    th.dataset.asc = asc;
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


def sortable_table(df: pd.DataFrame, spec: TopTable) -> str:
    """The ``spec.n`` rows with the largest |``sort_by``| as an HTML table whose columns sort on click."""
    df, columns, caption = rows_of(df, spec.query), spec.columns, spec.caption
    shown = df.assign(_abs=df[spec.sort_by].abs()).nlargest(spec.n, "_abs")[list(columns)]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    rows = []
    for _, row in shown.iterrows():
        cells = []
        for c in columns:
            v = row[c]
            text = f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v)
            cells.append(f'<td data-value="{html.escape(str(v))}">{html.escape(text)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f'<table class="interp-sortable">{cap}<thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')
