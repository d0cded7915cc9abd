"""Figures of one input looked at closely (``interp.single_input``): static (matplotlib / seaborn, for
reports and papers) and interactive (plotly: hover for the numbers; a notebook shows them inline).

They draw the ``SingleInput`` tables and compute nothing beyond picking rows and pivoting them:

* ``single_input_patterns``: a few heads (rows) x conditions (columns): intact, without b_q, b_k, b_v,
  without the key prior. A ViT's query row is drawn on the patch grid (prefix tokens' weights in the
  title), a prompt's full pattern as a query x key matrix, a single query row as bars over the keys.
* ``single_input_overlay``: a ViT's per-head attention map (the query selection's weights on the
  patches) laid over the image, layers x heads.
* ``key_prior_top_tokens``: per head, the keys the key prior u = W_k b_q favours most (its value minus
  the mean over keys, the part softmax sees), with the attention each gets with and without it.

``*_plotly`` are the interactive versions. Heads default to those the key prior (or b_q) changes most
(largest mean KL between the intact pattern and the pattern without it).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import seaborn as sns
from plotly.subplots import make_subplots

from interp.figures import colours
from interp.errors import InputError
from interp.figures.plot_checks import check_table

CONDITION_TITLES = {
    "intact": "intact",
    "no_b_q": "without b_q",
    "no_b_k": "without b_k",
    "no_b_v": "without b_v\n(pattern unchanged; output\nmoves by -b_v W_O)",
    "no_key_prior": "without the key prior\nb_q . x_j W_k / sqrt(d)",
}
Head = tuple[int, int]
WEIGHT = colours.RULES["weight"]  # attention weights: sequential from 0, one scale per head (a row of panels)
SCALED = colours.RULES["attention_scaled"]  # a head's map over its own maximum, on 0-1


SINGLE_INPUT = "interp.single_input(model, input)"


def _view(view: Any) -> Any:
    """``view`` if it looks like ``interp.single_input``'s result (its tables checked as every plot checks its
    table: columns, one model, each row once), else one clear error."""
    needed = ("patterns", "heads", "key_prior", "positions", "image", "meta")
    if not all(hasattr(view, n) for n in needed) or not isinstance(getattr(view, "patterns"), pd.DataFrame):
        raise InputError(f"expected the result of {SINGLE_INPUT}; got {type(view).__name__}")
    check_table(view.patterns, "the single-input figures' patterns", SINGLE_INPUT,
                ["layer", "head", "condition", "query_pos", "key_pos", "key_kind", "weight", "delta"],
                keys=["layer", "head", "condition", "query_pos", "key_pos"])
    check_table(view.heads, "the single-input figures' heads", SINGLE_INPUT, ["layer", "head", "condition", "kl"],
                keys=["layer", "head", "condition"])
    return view


def pick_heads(view: Any, heads: Optional[Sequence[Head]] = None, n: int = 4) -> list[Head]:
    """``heads`` as (layer, head) pairs present in the view; None: the ``n`` heads whose pattern the key
    prior (else b_q) changes most (largest ``kl``), in layer order."""
    table = _view(view).heads
    have = set(zip(table.layer, table["head"]))
    if heads is not None:
        pairs = [(int(layer), int(h)) for layer, h in heads]
        missing = [p for p in pairs if p not in have]
        if missing or not pairs:
            raise InputError(f"heads must be (layer, head) pairs this view holds (layers {view.meta.get('layers')}, "
                             f"heads {view.meta.get('heads')}); missing: {missing or '(none given)'}")
        return pairs
    cond = "no_key_prior" if (table.condition == "no_key_prior").any() else "no_b_q"
    top = table[table.condition == cond].nlargest(n, "kl", keep="first")
    return sorted(zip(top.layer.astype(int), top["head"].astype(int)))


def _conditions(view: Any) -> list[str]:
    present = set(view.patterns.condition.astype(str))
    return [c for c in CONDITION_TITLES if c in present]


def _rows(view: Any, layer: int, head: int, condition: str) -> pd.DataFrame:
    p = view.patterns
    return p[(p.layer == layer) & (p["head"] == head) & (p.condition == condition)]


def _panel_kind(view: Any) -> str:
    """"grid" (a ViT query row on the patch grid), "matrix" (query x key) or "bars" (one row over keys)."""
    if view.patterns.query_pos.nunique() > 1:
        return "matrix"
    return "grid" if view.meta.get("grid") else "bars"


def _grid_map(rows: pd.DataFrame, grid: tuple[int, int]) -> np.ndarray:
    """The patch weights of one query selection on the [rows, cols] patch grid (mean over query rows)."""
    patches = rows[rows.key_kind == "patch"]
    weights = patches.groupby(["key_row", "key_col"]).weight.mean()
    out = np.full(grid, np.nan)
    out[weights.index.get_level_values(0), weights.index.get_level_values(1)] = weights.to_numpy()
    return out


def _prefix_note(rows: pd.DataFrame) -> str:
    pre = rows[rows.key_kind == "prefix"].groupby("key_label", sort=False).weight.mean()
    return ", ".join(f"{k} {v:.2f}" for k, v in pre.items())


def _matrix(rows: pd.DataFrame, n: int) -> np.ndarray:
    out = np.full((n, n), np.nan)
    out[rows.query_pos.to_numpy(), rows.key_pos.to_numpy()] = rows.weight.to_numpy()
    return out


def _short(label: Any) -> str:
    text = str(label)
    return text.strip() or repr(text)


def _draw_panel(ax: plt.Axes, view: Any, rows: pd.DataFrame, kind: str, vmax: float,
                ticks: tuple[bool, bool] = (True, True)) -> Any:
    """One head and condition: the grid, matrix or bars (see ``_panel_kind``); returns the image drawn.
    ``ticks``: whether to write the keys (x) and queries (y) on this panel (up to 64 positions)."""
    if kind == "grid":
        image = colours.tag(ax.imshow(_grid_map(rows, tuple(view.meta["grid"])), cmap=WEIGHT.cmap, vmin=0, vmax=vmax),
                            WEIGHT.quantity)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("patch column", fontsize=7)
        ax.set_ylabel("patch row", fontsize=7)
        return image
    labels = [_short(x) for x in view.positions.sort_values("pos").label]
    show = len(labels) <= 64
    if kind == "matrix":
        image = colours.tag(ax.imshow(_matrix(rows, len(labels)), cmap=WEIGHT.cmap, vmin=0, vmax=vmax), WEIGHT.quantity)
        y = range(len(labels)) if show and ticks[1] else []
        ax.set_yticks(list(y), [labels[i] for i in y], fontsize=5)
    else:
        image = None
        sns.barplot(x=rows.key_pos.to_numpy(), y=rows.weight.to_numpy(), ax=ax, color="#4c72b0", native_scale=True)
        ax.set_ylim(0, vmax)
    x = range(len(labels)) if show and ticks[0] else []
    ax.set_xticks(list(x), [labels[i] for i in x], rotation=90, fontsize=5)
    ax.set_xlabel("key", fontsize=7)
    ax.set_ylabel("query" if kind == "matrix" else "attention weight", fontsize=7)
    return image


def _pattern_title(view: Any, kind: str) -> str:
    m = view.meta
    what = {"grid": "attention on the patches (colour) and on the prefix tokens (titles)",
            "matrix": "query (rows) x key (columns)", "bars": "attention over the keys"}[kind]
    return (f"{m.get('model')}: one {'image' if m.get('modality') == 'vision' else 'prompt'}, query "
            f"{m.get('query')!r}: {what}; one colour scale per head (row)")


def single_input_patterns(view: Any, *, heads: Optional[Sequence[Head]] = None, n_heads: int = 4) -> plt.Figure:
    """Each picked head (rows) under each condition (columns) side by side, one colour scale per row; the b_v
    column is the intact pattern (b_v is not in the score), its title says the output moves instead. A ViT's
    rows start with the image, the head's intact map laid over it."""
    view, kind = _view(view), _panel_kind(view)
    pairs, conds = pick_heads(view, heads, n_heads), _conditions(view)
    lead = int(kind == "grid" and view.image is not None)
    fig, axes = plt.subplots(len(pairs), len(conds) + lead, figsize=(2.9 * (len(conds) + lead), 2.9 * len(pairs) + 0.9),
                             squeeze=False, constrained_layout=True)
    for r, (layer, head) in enumerate(pairs):
        if lead:
            _overlay_panel(axes[r, 0], view, _rows(view, layer, head, "intact"))
            lead_title = "the input, intact map over it\n" if r == 0 else ""
            axes[r, 0].set_title(f"{lead_title}L{layer} H{head}", fontsize=8)
        per = {c: _rows(view, layer, head, c) for c in conds}
        shown = [p[p.key_kind == "patch"] if kind == "grid" else p for p in per.values()]
        vmax = max(float(p.weight.max()) for p in shown if len(p)) or 1.0
        image = None
        for c, cond in enumerate(conds):
            ax = axes[r, c + lead]
            image = _draw_panel(ax, view, per[cond], kind, vmax, (r == len(pairs) - 1, c == 0)) or image
            note = _prefix_note(per[cond]) if kind == "grid" else ""
            title = (CONDITION_TITLES[cond] + "\n") if r == 0 else ""
            ax.set_title(f"{title}L{layer} H{head}" + (f"  ({note})" if note else ""), fontsize=8)
        if image is not None:
            fig.colorbar(image, ax=list(axes[r, lead:]), shrink=0.8, label="attention weight")
    fig.suptitle(_pattern_title(view, kind), fontsize=10)
    return fig


def _overlay_panel(ax: plt.Axes, view: Any, rows: pd.DataFrame, alpha: float = 0.85) -> float:
    """The image with one head's patch map over it (bilinear; scaled to its maximum, which is returned; the
    more attention, the more opaque)."""
    grid = _grid_map(rows, tuple(view.meta["grid"]))
    scaled = np.nan_to_num(grid / np.nanmax(grid))
    h_px, w_px = view.image.shape[:2]
    # 8-bit RGB, as it is drawn: each panel keeps its own copy of the image (float64: 1.2 MB at 224 px, 24 panels)
    ax.imshow((view.image * 255).round().astype(np.uint8))
    colours.tag(ax.imshow(scaled, cmap=SCALED.cmap, alpha=alpha * (0.3 + 0.7 * scaled), extent=(0, w_px, h_px, 0),
                          interpolation="bilinear", vmin=0, vmax=1), SCALED.quantity)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("x (pixels)", fontsize=7)
    ax.set_ylabel("y (pixels)", fontsize=7)
    return float(np.nanmax(grid))


def _check_vision(view: Any, what: str) -> None:
    if view.image is None or not view.meta.get("grid"):
        raise InputError(f"{what} draws a ViT's attention on its image, but this view is of a "
                         f"{view.meta.get('modality')} model: use single_input_patterns")


def single_input_overlay(view: Any, *, condition: str = "intact", layers: Optional[Sequence[int]] = None,
                         alpha: float = 0.85) -> plt.Figure:
    """Per head (columns) and layer (rows), the query selection's attention on the patches laid over the
    image (bilinear upsampling of the patch grid; each map scaled to its own maximum, which the caption under
    the panel gives with the prefix tokens' weight; the more attention, the more opaque)."""
    view = _view(view)
    _check_vision(view, "single_input_overlay")
    if condition not in _conditions(view):
        raise InputError(f"condition must be one of {', '.join(_conditions(view))}; got {condition!r}")
    layers = list(view.meta["layers"]) if layers is None else [int(x) for x in layers]
    bad = [x for x in layers if x not in view.meta["layers"]]
    if bad or not layers:
        raise InputError(f"layers must be among this view's layers {view.meta['layers']}; got {layers}")
    heads = view.meta["heads"]
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(1.9 * len(heads), 1.95 * len(layers) + 0.8),
                             squeeze=False, constrained_layout=True)
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax, rows = axes[r, c], _rows(view, layer, head, condition)
            top = _overlay_panel(ax, view, rows, alpha)
            # the panel's name above it, its numbers below it (every row has both; none sits between two panels)
            ax.set_title(f"L{layer} H{head}", fontsize=8)
            note = "; ".join(t for t in (f"max {top:.2f}", _prefix_note(rows)) if t)
            ax.set_xlabel(f"{note}\nx (pixels)", fontsize=7)
    m = view.meta
    fig.suptitle(f"{m['model']}: attention of query {m['query']!r} on the patches, {CONDITION_TITLES[condition]}"
                 .replace("\n", " ") + " (each map scaled to its max)", fontsize=9)
    return fig


def _key_prior_rows(view: Any, layer: int, head: int, top: int) -> pd.DataFrame:
    kp = view.key_prior
    return kp[(kp.layer == layer) & (kp["head"] == head)].nsmallest(top, "rank")


def _check_key_prior(view: Any) -> None:
    if view.key_prior.empty:
        notes = "; ".join(view.meta.get("notes", [])) or "no key prior in this view"
        raise InputError(f"this view has no key-prior ranking ({notes}); nothing to draw")


def key_prior_top_tokens(view: Any, *, heads: Optional[Sequence[Head]] = None, n_heads: int = 4,
                         top: int = 8) -> plt.Figure:
    """Per picked head, the ``top`` keys the key prior favours: bars of kp_j minus its mean over keys (the
    part softmax sees: e^that is how much more attention the bias alone gives key j than the average key),
    labelled "token [position]   attention intact -> without the key prior"."""
    view = _view(view)
    _check_key_prior(view)
    pairs = pick_heads(view, heads, n_heads)
    fig, axes = plt.subplots(1, len(pairs), figsize=(3.6 * len(pairs), 0.42 * top + 1.6), squeeze=False,
                             constrained_layout=True)
    for ax, (layer, head) in zip(axes[0], pairs):
        rows = _key_prior_rows(view, layer, head, top)
        labels = [f"{_short(lab)} [{p}]   {a:.3f} -> {b:.3f}" for lab, p, a, b in
                  zip(rows.label, rows.key_pos, rows.weight_intact, rows.weight_no_key_prior)]
        sns.barplot(x=rows.key_prior_centered.to_numpy(), y=labels, ax=ax, color="#dd8452", orient="h")
        u = float(rows.u_norm.iloc[0]) if len(rows) else float("nan")
        ax.set_title(f"L{layer} H{head}  (||W_k b_q|| = {u:.3g})", fontsize=9)
        ax.set_xlabel("key prior - its mean over keys (score units)")
        ax.set_ylabel("key (favoured first)")
        ax.tick_params(axis="y", labelsize=7)
    m = view.meta
    fig.suptitle(f"{m['model']}: keys the key prior u = W_k b_q favours (query {m['query']!r}); labels: key "
                 "[position]   attention intact -> without the key prior", fontsize=9)
    return fig


# ----- interactive (plotly) ----------------------------------------------------------------------------


def _plotly_trace(view: Any, rows: pd.DataFrame, kind: str, vmax: float, colorbar: bool) -> go.BaseTraceType:
    """One head and condition as a plotly trace, hover giving each key's label, weight and change."""
    scale = dict(**colours.plotly_scale(WEIGHT, 0.0, vmax), showscale=colorbar,
                 colorbar=dict(title=dict(text="attention", side="right"), thickness=10))
    if kind == "grid":
        patches = rows[rows.key_kind == "patch"]
        z = np.full(tuple(view.meta["grid"]), np.nan)
        text = np.full(z.shape, "", dtype=object)
        r, c = patches.key_row.to_numpy(), patches.key_col.to_numpy()
        z[r, c] = patches.weight.to_numpy()
        text[r, c] = [f"{lab}<br>weight {w:.4f}<br>change {d:+.4f}" for lab, w, d in
                      zip(patches.key_label, patches.weight, patches.delta)]
        return go.Heatmap(z=np.where(np.isfinite(z), z, None).tolist(), text=text.tolist(),
                          hovertemplate="%{text}<extra></extra>", **scale)
    labels = [_short(x) for x in view.positions.sort_values("pos").label]
    hover = [f"{labels[q] if q >= 0 else 'mean over queries'} -> {labels[k]}<br>weight {w:.4f}<br>change {d:+.4f}"
             for q, k, w, d in zip(rows.query_pos, rows.key_pos, rows.weight, rows.delta)]
    if kind == "bars":
        return go.Bar(x=rows.key_pos.to_numpy(), y=rows.weight.to_numpy(), hovertext=hover, hoverinfo="text",
                      marker_color="#4c72b0", showlegend=False)
    z = _matrix(rows, len(labels))
    text = np.full(z.shape, "", dtype=object)
    text[rows.query_pos.to_numpy(), rows.key_pos.to_numpy()] = hover
    return go.Heatmap(z=np.where(np.isfinite(z), z, None).tolist(), text=text.tolist(),
                      hovertemplate="%{text}<extra></extra>", **scale)


def single_input_patterns_plotly(view: Any, *, heads: Optional[Sequence[Head]] = None,
                                 n_heads: int = 4) -> go.Figure:
    """``single_input_patterns`` with hover (each key's label, weight and change from intact)."""
    view, kind = _view(view), _panel_kind(view)
    pairs, conds = pick_heads(view, heads, n_heads), _conditions(view)
    note = lambda layer, head, c: f"<br>({_prefix_note(_rows(view, layer, head, c))})" if kind == "grid" else ""  # noqa
    titles = [f"L{layer} H{head}: {CONDITION_TITLES[c].splitlines()[0]}{note(layer, head, c)}"
              for layer, head in pairs for c in conds]
    fig = make_subplots(rows=len(pairs), cols=len(conds), subplot_titles=titles, horizontal_spacing=0.02,
                        vertical_spacing=0.08)
    for r, (layer, head) in enumerate(pairs, start=1):
        per = {c: _rows(view, layer, head, c) for c in conds}
        shown = [p[p.key_kind == "patch"] if kind == "grid" else p for p in per.values()]
        vmax = max(float(p.weight.max()) for p in shown if len(p)) or 1.0
        for c, cond in enumerate(conds, start=1):
            fig.add_trace(_plotly_trace(view, per[cond], kind, vmax, colorbar=False), row=r, col=c)
            if kind != "bars":
                fig.update_yaxes(autorange="reversed", showticklabels=False, row=r, col=c)
                fig.update_xaxes(showticklabels=False, row=r, col=c)
    fig.update_annotations(font_size=10)
    fig.update_layout(title=_pattern_title(view, kind), height=260 * len(pairs) + 100,
                      width=230 * len(conds) + 80, margin=dict(l=30, r=30, t=90, b=30))
    return fig


def single_input_overlay_plotly(view: Any, *, condition: str = "intact", opacity: float = 0.55) -> go.Figure:
    """``single_input_overlay`` with hover and a slider over the layers: each head's map (patch weights of
    the query selection, scaled to the head's maximum) over the image; hover gives the patch and weight."""
    view = _view(view)
    _check_vision(view, "single_input_overlay_plotly")
    if condition not in _conditions(view):
        raise InputError(f"condition must be one of {', '.join(_conditions(view))}; got {condition!r}")
    m, (h_px, w_px) = view.meta, view.image.shape[:2]
    layers, heads, (gh, gw) = list(m["layers"]), list(m["heads"]), tuple(m["grid"])
    fig = make_subplots(rows=1, cols=len(heads), subplot_titles=[f"head {h}" for h in heads],
                        horizontal_spacing=0.01)
    pixels = (view.image * 255).round().astype(np.uint8)
    for c in range(1, len(heads) + 1):
        fig.add_trace(go.Image(z=pixels, hoverinfo="skip"), row=1, col=c)
    for i, layer in enumerate(layers):
        for c, head in enumerate(heads, start=1):
            rows = _rows(view, layer, head, condition)
            grid = _grid_map(rows, (gh, gw))
            text = [[f"L{layer} H{head} patch ({r}, {q}): {grid[r, q]:.4f}" for q in range(gw)] for r in range(gh)]
            fig.add_trace(go.Heatmap(
                z=(grid / np.nanmax(grid)).tolist(), x0=w_px / gw / 2, dx=w_px / gw, y0=h_px / gh / 2, dy=h_px / gh,
                **colours.plotly_scale(SCALED, 0.0, 1.0), opacity=opacity, showscale=False, text=text, zsmooth="best",
                hovertemplate="%{text}<extra>" + _prefix_note(rows) + "</extra>", visible=i == len(layers) - 1),
                row=1, col=c)
    n_img = len(heads)
    steps = [dict(method="update", label=f"L{layer}", args=[{"visible": [True] * n_img + [
        j // len(heads) == i for j in range(len(layers) * len(heads))]}]) for i, layer in enumerate(layers)]
    fig.update_layout(sliders=[dict(active=len(layers) - 1, steps=steps, currentvalue=dict(prefix="layer "))],
                      title=f"{m['model']}: attention of query {m['query']!r} on the patches, "
                            f"{CONDITION_TITLES[condition].splitlines()[0]} (each map scaled to its max)",
                      height=400, width=240 * len(heads) + 60, margin=dict(l=20, r=20, t=70, b=20))
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    return fig


def key_prior_top_tokens_plotly(view: Any, *, heads: Optional[Sequence[Head]] = None, n_heads: int = 4,
                                top: int = 8) -> go.Figure:
    """``key_prior_top_tokens`` with hover (key, key prior, attention intact and without the key prior)."""
    view = _view(view)
    _check_key_prior(view)
    pairs = pick_heads(view, heads, n_heads)
    fig = make_subplots(rows=1, cols=len(pairs), subplot_titles=[f"L{a} H{b}" for a, b in pairs],
                        horizontal_spacing=0.12)
    for c, (layer, head) in enumerate(pairs, start=1):
        rows = _key_prior_rows(view, layer, head, top)
        labels = [f"{_short(lab)} [{p}]" for lab, p in zip(rows.label, rows.key_pos)]
        hover = [f"{lab}<br>key prior {k:.3f} ({kc:+.3f} vs the mean key)<br>attention {a:.4f} -> {b:.4f} "
                 "without it" for lab, k, kc, a, b in zip(labels, rows.key_prior, rows.key_prior_centered,
                                                          rows.weight_intact, rows.weight_no_key_prior)]
        fig.add_trace(go.Bar(x=rows.key_prior_centered.to_numpy(), y=labels, orientation="h", hovertext=hover,
                             hoverinfo="text", marker_color="#dd8452", showlegend=False), row=1, col=c)
        fig.update_yaxes(autorange="reversed", row=1, col=c)
        fig.update_xaxes(title_text="key prior - mean (score units)", row=1, col=c)
    fig.update_layout(title=f"{view.meta['model']}: keys the key prior u = W_k b_q favours (query "
                            f"{view.meta['query']!r})", height=40 * top + 180, width=330 * len(pairs) + 80)
    return fig
