"""Figures drawn from the analyzers' DataFrames (they compute nothing themselves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter, MaxNLocator

from interp.figures import colours
from interp.errors import InputError
from interp.io import atomic_path
from interp.figures.plot_checks import check_table

PER_HEAD = "a per-head analyzer (interp.origin_shift, score_decomposition, frequency_profile, ablate_bias)"
ORIGIN = "interp.origin_shift(model, stats)"
ABLATION = "interp.ablate_bias(model, data)"
CLUSTERS = "interp.cluster_heads(interp.frequency_profile(model, data))"
SINKS = "interp.sink_profile(model, data)"
SPECIALISATION = "interp.specialisation_test(model, data)"


def _grid(df: pd.DataFrame, value: str) -> pd.DataFrame:
    return df.pivot_table(index="layer", columns="head", values=value, aggfunc="mean").sort_index()


def panel_notes(df: pd.DataFrame, facet: str = "kind") -> dict[str, str]:
    """What to write instead of drawing a flat field, per facet value: "no b_k in this model" where
    the bias is absent (``present`` False), "present but exactly zero" where every head's
    ``bias_norm`` is 0, or the identity that answered every row (``identity``)."""
    notes: dict[str, str] = {}
    for f, part in df.groupby(facet, sort=False):
        if "present" in part and not part.present.astype(bool).any():
            notes[str(f)] = f"no b_{f} in this model"
        elif "bias_norm" in part and (part.bias_norm == 0).all():
            notes[str(f)] = f"b_{f} is present but exactly zero\nin every head"
        elif "identity" in part and part.identity.fillna("").ne("").all():
            notes[str(f)] = f"inert by identity:\n{part.identity.iloc[0]}"
    return notes


def _text_panel(ax: plt.Axes, title: str, note: str) -> None:
    ax.text(0.5, 0.5, note, ha="center", va="center", wrap=True, fontsize=11, transform=ax.transAxes,
            bbox=dict(boxstyle="round", facecolor="#f2f2f2", edgecolor="#999999"))
    ax.set_title(title)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks([])
    ax.set_yticks([])


def layer_head_heatmaps(
    df: pd.DataFrame,
    value: str,
    *,
    facet: str = "kind",
    facets: Optional[Sequence[str]] = None,
    title: str = "",
    subtitle: str = "",
    cbar_label: Optional[str] = None,
    quantity: Optional[str] = None,
    limits: Optional[tuple[float, float]] = None,
    notes: Optional[dict[str, str]] = None,
) -> plt.Figure:
    """One layer x head heatmap of ``value`` per value of ``facet`` (e.g. per kind).

    Colours follow ``interp.figures.colours`` (the quantity is ``quantity``, default ``value``): one map per kind of
    quantity (bright = large; deltas diverging around 0), **one range for every panel** (a k panel of 1e-3
    beside a q panel of 1 looks like 1e-3: the same colour means the same number), from 0 for a size and 0-1
    for a share, or ``limits``; values below the quantity's numerical floor grey and hatched (no effect), the
    colour bar saying so. A facet in ``notes`` is drawn as a text panel ("no b_k in this model", "inert by
    identity") instead of a flat field; ``subtitle`` says the data (e.g. "photos, 2,056 patches").
    """
    check_table(df, "layer_head_heatmaps", PER_HEAD, ["layer", "head", facet, value], keys=["layer", "head", facet])
    facets = [str(f) for f in (list(facets) if facets is not None else list(dict.fromkeys(df[facet])))]
    df = df.assign(**{facet: df[facet].astype(str)})
    notes = notes or {}
    drawn = [f for f in facets if f not in notes]
    shown = df[df[facet].isin(drawn)][value]
    rule = colours.rule_for(quantity or value, shown)
    lo, hi = limits if limits is not None else colours.limits(rule, shown)
    fig, axes = plt.subplots(1, len(facets), figsize=(4.2 * len(facets) + 1.2, 4.4), squeeze=False)
    for ax, f in zip(axes[0], facets):
        if f in notes:
            _text_panel(ax, f"{facet} = {f}", notes[f])
            continue
        colours.heatmap(ax, _grid(df[df[facet] == f], value), rule, lo, hi, cbar=f == drawn[-1],
                        cbar_label=cbar_label or value)
        ax.set_title(f"{facet} = {f}")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    fig.suptitle(title + (f"\n{subtitle}" if subtitle else "") if title else value)
    fig.tight_layout()
    return fig


def origin_shift_figures(origin: pd.DataFrame, model_name: str, data: str = "") -> dict[str, plt.Figure]:
    """Shift ratio and bias share per kind (q, k, v), as layer x head heatmaps (one scale per figure: shift ratio
    from 0, bias share on 0-1); where the
    frame has bootstrap intervals, also the top heads with them (``shift_ratio_intervals``, ...)."""
    check_table(origin, "origin_shift_figures", ORIGIN, ["layer", "head", "kind", "shift_ratio", "bias_share"],
                keys=["layer", "head", "kind"])
    notes = panel_notes(origin)
    return {
        "shift_ratio": layer_head_heatmaps(
            origin, "shift_ratio", cbar_label="||b|| / RMS(XW)", notes=notes, subtitle=data,
            title=f"{model_name}: how far each head's bias moves its origin (shift ratio)",
        ),
        "bias_share": layer_head_heatmaps(
            origin, "bias_share", cbar_label="||b|| / (||b|| + ||E[X]W||)", notes=notes, subtitle=data,
            title=f"{model_name}: bias share of the head's origin (0 = data only, 1 = bias only)",
        ),
        **{f"{value}_intervals": interval_figure(origin, value, model_name, label=label, data=data)
           for value, label in (("shift_ratio", "||b|| / RMS(XW)"), ("bias_share", "||b|| / (||b|| + ||E[X]W||)"))
           if f"{value}_lo" in origin and origin[f"{value}_lo"].notna().any()},
    }


def interval_figure(frame: pd.DataFrame, value: str, model_name: str, *, facet: str = "kind", top: int = 12,
                    label: str = "", data: str = "") -> plt.Figure:
    """The ``top`` heads per panel by ``value``, each a dot with its 95% bootstrap interval over items
    (``value``_lo to ``value``_hi) as a line: the uncertainty a heatmap of the same values cannot show."""
    check_table(frame, "interval_figure", "an analyzer with bootstrap intervals (interp.origin_shift(model, stats, "
                "data=data), interp.score_decomposition)", ["layer", "head", facet, value, f"{value}_lo",
                                                            f"{value}_hi"], keys=["layer", "head", facet])
    facets = [f for f in dict.fromkeys(frame[facet]) if frame[frame[facet] == f][f"{value}_lo"].notna().any()]
    fig, axes = plt.subplots(1, max(len(facets), 1), figsize=(3.6 * max(len(facets), 1) + 0.6,
                                                             0.32 * top + 1.8), squeeze=False)
    for ax, f in zip(axes[0], facets):
        df = frame[frame[facet] == f].dropna(subset=[value]).nlargest(top, value).iloc[::-1]
        y = range(len(df))
        xerr = np.stack([(df[value] - df[f"{value}_lo"]).clip(lower=0), (df[f"{value}_hi"] - df[value]).clip(lower=0)])
        ax.errorbar(df[value], list(y), xerr=np.nan_to_num(xerr), fmt="o", color="k", ms=3.5, ecolor="#3182bd",
                    elinewidth=2, capsize=4, label="estimate, 95% interval")
        ax.set_yticks(list(y), [f"L{r.layer} H{r.head}" for r in df.itertuples()], fontsize=8)
        ax.set_title(f"{facet} = {f}", fontsize=10)
        ax.set_xlabel(label or value)
        ax.set_ylabel("layer, head")
    if not facets:
        _text_panel(axes[0][0], "no intervals", f"{value}_lo / {value}_hi are NaN (no data or n_boot=0)")
    else:
        axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{model_name}: {value}, the top {top} heads per panel\n95% percentile bootstrap intervals over "
                 "items (caps; some narrower than the dot)"
                 + (f"\n{data}" if data else ""), fontsize=10)
    fig.tight_layout()
    return fig


def key_prior_share_figure(decomposition: pd.DataFrame, model_name: str, data: str = "") -> plt.Figure:
    """Share of within-row score variance carried by the key-prior term b_q . x_j W_k, on 0-1."""
    check_table(decomposition, "key_prior_share_figure", "interp.score_decomposition(model, data)",
                ["layer", "head", "term", "share"], keys=["layer", "head", "term"])
    df = decomposition[decomposition.term == "key_prior"].assign(term="key_prior")
    return layer_head_heatmaps(
        df, "share", facet="term", cbar_label="share of score variance",  # 0-1: a 1% effect looks like 1%
        subtitle=data, title=f"{model_name}: key-prior term (b_q . k content) share of score variance",
    )


def save_figure(fig: plt.Figure, path: str | Path, dpi: int = 110) -> Path:
    """Save a figure atomically and close it."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png", bbox_inches="tight")
    plt.close(fig)
    return path


UNITS = {"next_token_ce": "nats", "cross_entropy": "nats", "feature_cosine": "cosine", "embedding_cosine": "cosine"}


def ablation_figures(results: pd.DataFrame, model_name: str, top: int = 12, data: str = "") -> dict[str, plt.Figure]:
    """From ``ablate_bias`` rows: delta heatmaps per kind, the top heads (with the 95% bootstrap interval
    over items where there is one, and each exact head's matched control, ``control_lo`` to ``control_hi``, as a
    grey band; heads called ``bias_dependent``, adjusted p <= 0.05 across the heads, are starred), estimate vs
    exact."""
    check_table(results, "ablation_figures", ABLATION, ["layer", "head", "kind", "method", "estimate", "metric",
                                                        "delta", "baseline"],
                keys=["layer", "head", "kind", "method", "estimate", "scope"])
    figs: dict[str, plt.Figure] = {}
    per_head = results[results.scope == "head"] if "scope" in results else results
    most = per_head.groupby(["method", "estimate"]).size().groupby("method").max()
    for (method, estimate), df in per_head.groupby(["method", "estimate"]):
        metric = df.metric.iloc[0]
        unit = UNITS.get(metric, "metric units")
        if len(df) == most[method]:  # a heatmap of every head; the exact top-k of "auto" would leave holes
            figs[f"ablation_delta_{method}_{estimate}"] = layer_head_heatmaps(
                df, "delta", cbar_label=f"delta {metric} ({unit})",
                notes=panel_notes(df), subtitle=_ablation_subtitle(df, data),
                title=f"{model_name}: effect of {method}-ablating each head's bias ({estimate})",
            )
        figs[f"ablation_top_{method}_{estimate}"] = _top_heads_figure(df, model_name, method, estimate, top, data)
    for method, df in per_head.groupby("method"):
        for estimate in [e for e in dict.fromkeys(df.estimate) if e != "exact" and "exact" in set(df.estimate)]:
            figs[f"ablation_exact_vs_{estimate}_{method}"] = _estimate_scatter(df, model_name, method, estimate, data)
    return figs


def _ablation_subtitle(df: pd.DataFrame, data: str) -> str:
    metric = df.metric.iloc[0]
    base = f"{metric} of the intact model: {df.baseline.iloc[0]:.4g} {UNITS.get(metric, '')}".strip()
    return f"{data}; {base}" if data else base


def _spread(ranked: pd.DataFrame) -> tuple[Optional[np.ndarray], str]:
    """(xerr [2, n], what it is): the 95% bootstrap interval over items where the rows have one, else the
    standard error over items, else none."""
    if "delta_lo" in ranked and ranked.delta_lo.notna().any():
        lo, hi = (ranked.delta - ranked.delta_lo).clip(lower=0), (ranked.delta_hi - ranked.delta).clip(lower=0)
        return np.stack([lo.fillna(0).to_numpy(), hi.fillna(0).to_numpy()]), "; bars: 95% bootstrap interval over items"
    if "delta_se" in ranked and ranked.delta_se.notna().any():
        se = ranked.delta_se.fillna(0).to_numpy()
        return np.stack([se, se]), " ± standard error over items"
    return None, ""


CONTROL_LABEL = "matched control: up to {n} random directions,\nsame displacement norm (min to max)"


def _control_bands(ax: plt.Axes, ranked: pd.DataFrame) -> None:
    """Each shown head's matched control, ``control_lo`` to ``control_hi``, as a grey band behind its bar."""
    if "control_lo" not in ranked or ranked.control_lo.isna().all():
        return
    y = np.arange(len(ranked))
    has = ranked.control_lo.notna().to_numpy()
    n = int(ranked.n_control[has].max())
    ax.hlines(y[has], ranked.control_lo[has], ranked.control_hi[has], colors="0.55", lw=9, alpha=0.45, zorder=3,
              label=CONTROL_LABEL.format(n=n))


def _head_label(row: Any) -> str:
    star = " *" if "bias_dependent" in row and row.bias_dependent is True else ""
    return f"L{row.layer} H{row['head']} {row.kind}{star}"


def _top_heads_figure(df: pd.DataFrame, model_name: str, method: str, estimate: str, top: int,
                      data: str = "") -> plt.Figure:
    metric = df.metric.iloc[0]
    runnable = df[df.identity.fillna("") == ""] if "identity" in df else df
    ranked = runnable.assign(abs_delta=runnable.delta.abs()).nlargest(top, "abs_delta")
    if ranked.empty:  # no bias to rank (every kind absent or inert): a note, not empty axes
        fig, ax = plt.subplots(figsize=(9.5, 2.8))
        notes = [f"{k}: {note.splitlines()[-1]}" for k, note in panel_notes(df).items()]
        _text_panel(ax, f"{model_name}: no head's bias to rank ({method}, {estimate})\n" + _ablation_subtitle(df, data),
                    "\n".join(notes) or "no rows")
        ax.set_xlabel(f"delta {metric}")
        ax.set_ylabel("")
        fig.tight_layout()
        return fig
    fig, ax = plt.subplots(figsize=(9.5, 0.35 * max(len(ranked), 1) + 2.3))
    labels = [_head_label(r) for _, r in ranked.iterrows()]
    sns.barplot(x=ranked.delta.values, y=labels, hue=ranked.kind.values, dodge=False, ax=ax,
                palette=colours.KIND_COLOURS, hue_order=[k for k in colours.KIND_COLOURS if k in set(ranked.kind)],
                saturation=1)
    xerr, spread = _spread(ranked)
    if xerr is not None:  # spread over items (exact rows)
        ax.errorbar(ranked.delta.values, range(len(ranked)), xerr=xerr, fmt="none", ecolor="k", elinewidth=1, capsize=3)
    _control_bands(ax, ranked)
    ax.axvline(0.0, color="k", lw=0.8)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))  # small deltas: short tick labels
    ax.set_xlabel(f"delta {metric} (ablated - intact, {UNITS.get(metric, 'metric units')}){spread}")
    ax.set_ylabel("layer, head, kind (* bias-dependent: matched control, BH-adjusted p <= 0.05)")
    ax.set_title(f"{model_name}: the {len(ranked)} largest effects of {method}-ablating a head's bias ({estimate})\n"
                 + _ablation_subtitle(df, data), fontsize=10)
    if len(ranked):
        ax.legend(loc="best", fontsize=8, framealpha=0.9)
    left_out = [f"{k}: {note.splitlines()[-1]}" for k, note in panel_notes(df).items()]
    if left_out:  # say which kinds have nothing to show, and why
        fig.text(0.01, 0.005, "not shown: " + "; ".join(left_out), fontsize=8, va="bottom")
    fig.tight_layout(rect=(0, 0.04 if left_out else 0, 1, 1))
    return fig


def _estimate_scatter(df: pd.DataFrame, model_name: str, method: str, estimate: str, data: str = "") -> plt.Figure:
    """Each head's ``estimate`` delta against its exact delta (both ablated - intact, in the metric's units)."""
    rows = df[df.estimate.isin(["exact", estimate])]
    wide = rows.pivot_table(index=["layer", "head", "kind"], columns="estimate", values="delta").dropna().reset_index()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    sns.scatterplot(data=wide, x="exact", y=estimate, hue="kind", ax=ax, palette=colours.KIND_COLOURS,
                    hue_order=[k for k in colours.KIND_COLOURS if k in set(wide.kind)])
    both = wide[["exact", estimate]]
    lo, hi = float(both.min().min()), float(both.max().max())
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
    metric = df.metric.iloc[0]
    unit = UNITS.get(metric, "metric units")
    ax.set_xlabel(f"exact delta {metric} (ablated - intact, {unit})")
    ax.set_ylabel(f"{estimate} estimate of the delta ({unit})")
    ax.set_title(f"{model_name}: {estimate} vs exact ({method}, {len(wide)} heads)\n{_ablation_subtitle(df, data)}",
                 fontsize=10)
    ax.legend(title="kind")
    fig.tight_layout()
    return fig


def bin_labels(n_bins: int, unit: str = "patch") -> list[str]:
    """Radial frequency range of each bin, in cycles per patch (or token): bin i = (i, i+1] * 0.5 / n."""
    return [f"{0.5 * i / n_bins:.2f}-{0.5 * (i + 1) / n_bins:.2f}" for i in range(n_bins)]


def spectrum_clustermap(clustered: pd.DataFrame, model_name: str, data: str = ""):
    """Heads x radial-frequency bins (cycles per patch or token), rows grouped by k-means family
    (so the strip and the rows agree; no dendrogram), with a legend for the family strip."""
    check_table(clustered, "spectrum_clustermap", CLUSTERS, ["layer", "head", "cluster"], keys=["layer", "head"],
                prefix="bin_", finite=["layer", "head", "cluster"])
    bins = [c for c in clustered.columns if c.startswith("bin_")]
    ordered = clustered.sort_values(["cluster", "layer", "head"])
    data_rows = ordered.set_index(ordered.apply(lambda r: f"L{int(r.layer)}H{int(r['head'])}", axis=1))[bins]
    empty = [c for c in bins if data_rows[c].isna().all()]  # small grids leave some radial bins empty
    unit = "token" if ordered.get("distance_unit", pd.Series(["pixels"])).iloc[0] == "tokens" else "patch"
    data_rows = data_rows.drop(columns=empty).rename(columns=dict(zip(bins, bin_labels(len(bins), unit))))
    data_rows = data_rows.fillna(data_rows.mean())
    palette = sns.color_palette("tab10", int(clustered.cluster.max()) + 1)
    colors = pd.Series([palette[c] for c in ordered.cluster], index=data_rows.index, name="family")
    rule = colours.RULES["log_amplitude"]
    lo, hi = colours.limits(rule, data_rows.to_numpy())
    grid = sns.clustermap(data_rows, row_cluster=False, col_cluster=False, row_colors=colors, cmap=rule.cmap,
                          vmin=lo, vmax=hi,
                          figsize=(8, max(6, 0.12 * len(data_rows))), yticklabels=len(data_rows) <= 80,
                          cbar_kws={"label": "log amplitude - log DC"}, dendrogram_ratio=(0.04, 0.04),
                          cbar_pos=(1.02, 0.5, 0.025, 0.35))
    grid.ax_heatmap.tick_params(axis="y", labelsize=6)
    colours.tag(grid.ax_heatmap.collections[0], rule.quantity)
    for mesh in grid.ax_row_colors.collections:
        colours.tag(mesh, "cluster")
    grid.ax_cbar.set_label("<colorbar>")  # as matplotlib names its own colour-bar axes
    grid.ax_heatmap.set_xlabel(f"radial frequency (cycles per {unit}; Nyquist 0.5)")
    grid.ax_heatmap.set_ylabel("head (layer, head), grouped by family")
    handles = [plt.Rectangle((0, 0), 1, 1, color=palette[c]) for c in range(len(palette))]
    names = [f"family {c}" + (" (most low-pass)" if c == 0 else "") for c in range(len(palette))]
    grid.ax_heatmap.legend(handles, names, title="k-means family", loc="upper left", bbox_to_anchor=(1.12, 0.42),
                           fontsize=8)
    note = f"{len(empty)} of {len(bins)} bins hold no frequency on this grid (not shown)" if empty else ""
    below = "; ".join(x for x in (data, note) if x)
    grid.figure.suptitle(f"{model_name}: head output spectra by frequency family" + (f"\n{below}" if below else ""),
                         y=1.03, fontsize=10)
    return grid.figure


def attention_distance_figure(profile: pd.DataFrame, model_name: str, hue: Optional[str] = "cluster",
                              data: str = "") -> plt.Figure:
    """Mean attention distance of every head against layer (ViT paper, Figure 7 style)."""
    check_table(profile, "attention_distance_figure", "interp.frequency_profile(model, data)",
                ["layer", "head", "mean_attention_distance"], keys=["layer", "head"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    use_hue = hue if hue in profile.columns else None
    sns.scatterplot(data=profile, x="layer", y="mean_attention_distance", hue=use_hue,
                    palette="tab10" if use_hue else None, ax=ax, s=40)
    unit = profile.distance_unit.iloc[0] if "distance_unit" in profile else "pixels"
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a layer index: no tick at 0.5
    ax.set_xlabel("layer")
    ax.set_ylabel(f"mean attention distance ({unit})")
    ax.set_title(f"{model_name}: mean attention distance per head" + (f"\n{data}" if data else ""))
    if use_hue:
        ax.legend(title=use_hue)
    fig.tight_layout()
    return fig


def cluster_grid_figure(clustered: pd.DataFrame, model_name: str, data: str = "") -> plt.Figure:
    """Layer x head grid coloured by head family (cluster 0 = most low-pass)."""
    check_table(clustered, "cluster_grid_figure", CLUSTERS, ["layer", "head", "cluster"], keys=["layer", "head"],
                finite=["layer", "head", "cluster"])
    grid = _grid(clustered, "cluster")
    k = int(clustered.cluster.max()) + 1
    fig, ax = plt.subplots(figsize=(0.5 * grid.shape[1] + 3, 0.35 * grid.shape[0] + 2))
    sns.heatmap(grid, ax=ax, cmap=sns.color_palette(colours.CATEGORICAL, k), annot=True, fmt=".0f",
                cbar_kws={"label": "cluster (0 = most low-pass)", "ticks": list(range(k))},
                vmin=-0.5, vmax=k - 0.5)
    colours.tag(ax.collections[0], "cluster")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{model_name}: head families by frequency profile" + _family_verdict(clustered)
                 + (f"\n{data}" if data else ""))
    fig.tight_layout()
    return fig


def _family_verdict(clustered: pd.DataFrame) -> str:
    """What the family test says, for the title: families only where ``structure`` holds."""
    if "family_p" not in clustered or clustered.family_p.isna().all():
        return ""
    first = clustered.iloc[0]
    k = int(clustered.cluster.nunique())
    said = f"{k} families" if bool(first.get("structure", False)) else "one family (no families pass the test)"
    return f"\n{said}: family_p {first.family_p:.3g} against one Gaussian ({int(first.n_null)} draws)"


def specialisation_figure(table: pd.DataFrame, *, model_name: Optional[str] = None, data: str = "") -> plt.Figure:
    """The trained model's statistics against their distribution over untrained copies of its architecture: one
    panel per statistic, the untrained seeds as points with their mean +- 2 SD, the trained value as a diamond; the
    title says z (in the untrained SD) and the Holm-adjusted p."""
    check_table(table, "specialisation_figure", SPECIALISATION,
                ["statistic", "weights", "seed", "value", "z", "p_holm", "specialised", "untrained_mean",
                 "untrained_sd", "n_random"], keys=["statistic", "weights", "seed"], finite=["value"])
    stats = list(dict.fromkeys(table.statistic))
    fig, axes = plt.subplots(1, len(stats), figsize=(3.4 * len(stats) + 0.6, 3.6), squeeze=False)
    for ax, name in zip(axes[0], stats):
        rows = table[table.statistic == name]
        untrained, trained = rows[rows.weights == "untrained"], rows[rows.weights == "trained"]
        first = rows.iloc[0]
        mean, sd = float(first.untrained_mean), float(first.untrained_sd)
        ax.axhspan(mean - 2 * sd, mean + 2 * sd, color="0.65", alpha=0.25, lw=0,
                   label="untrained mean +- 2 SD")
        jitter = np.linspace(-0.15, 0.15, len(untrained)) if len(untrained) > 1 else np.zeros(len(untrained))
        ax.scatter(jitter, untrained.value, color="0.65", edgecolor="black", s=28,
                   label=f"untrained ({len(untrained)} seeds)")
        ax.scatter([0.0] * len(trained), trained.value, marker="D", s=70, color="tab:red", edgecolor="black",
                   zorder=3, label="trained")
        ax.set_xlim(-0.6, 0.6)
        ax.set_xticks([])
        verdict = "specialised" if bool(first.specialised) else "within untrained range"
        ax.set_title(f"{name}\nz = {float(first.z):.1f}, Holm p = {float(first.p_holm):.3g}: {verdict}", fontsize=9)
        ax.set_ylabel("value")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"{_model_of(table, model_name)}: trained against untrained copies of its architecture"
                 + (f"\n{data}" if data else ""), fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


# ----- implicit biases: sinks, implicit value bias, massive activations ------------------------------------

SHORT_POSITION = {"first": "first", "cls": "cls", "sep": "sep", "bos": "bos", "distillation": "dist",
                  "top_content": "top"}


def _model_of(frame: pd.DataFrame, model_name: Optional[str]) -> str:
    return model_name or (str(frame.model.iloc[0]) if "model" in frame and len(frame) else "model")


def sink_mass_grid(profile: pd.DataFrame, *, model_name: Optional[str] = None, data: str = "") -> plt.Figure:
    """From ``sink_profile``: per layer x head, the position class that receives the most attention
    (the cell's label; * where its mass exceeds the profile's threshold, i.e. a sink) and that mass
    (the colour, on 0-1, bright = large as in every figure: ``interp.figures.colours``). Where the profile has
    ``uniform_mass`` the title gives the range of the top positions' floors (the mass uniform attention would
    give them, the position's own row left out)."""
    check_table(profile, "sink_mass_grid", SINKS, ["layer", "head", "position", "mass", "sink", "threshold"],
                keys=["layer", "head", "position"], finite=["layer", "head", "mass", "threshold"])
    threshold = float(profile.threshold.iloc[0])
    top = profile.loc[profile.groupby(["layer", "head"]).mass.idxmax()]
    grid = _grid(top, "mass")
    short = top.position.astype(str).map(  # categorical too
        lambda p: SHORT_POSITION.get(p, p.replace("register_", "r")))
    labels = (short + top.sink.astype(bool).map({True: "*", False: ""}).astype(str)).to_numpy()
    annot = pd.DataFrame(labels.reshape(grid.shape), index=grid.index, columns=grid.columns)
    fig, ax = plt.subplots(figsize=(max(7.0, 0.62 * grid.shape[1] + 3), max(3.5, 0.3 * grid.shape[0] + 2.4)))
    rule = colours.RULES["mass"]
    colours.heatmap(ax, grid, rule, *colours.limits(rule, grid.to_numpy()), annot=annot, fmt="",
                    annot_kws={"fontsize": 7}, cbar_label="attention mass (share of a row, mean over queries)")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    n_sinks = int(profile.groupby(["layer", "head"]).sink.any().sum())
    floor = (f"; uniform floor {top.uniform_mass.min():.3f}-{top.uniform_mass.max():.3f}"
             if "uniform_mass" in top else "")
    ax.set_title(f"{_model_of(profile, model_name)}: where each head parks its attention\n"
                 f"label: most-attended position (top = top content token)\n* = sink (mass > {threshold:g}): "
                 f"{n_sinks} of {len(grid.stack())} heads{floor}" + (f"; {data}" if data else ""), fontsize=10)
    fig.tight_layout()
    return fig


MAX_LAYER_GROUPS = 10  # the categorical palette's colours (tab10)


def _layer_groups(layers: Sequence[int]) -> list[tuple[str, list[int]]]:
    """The distinct ``layers`` as at most ``MAX_LAYER_GROUPS`` categories, in order: one per layer ("layer 3")
    where there are at most that many, else runs of r = ceil(n / MAX_LAYER_GROUPS) consecutive layers
    ("layers 0-2"; the last run may be shorter, "layer 29" when it holds one)."""
    distinct = sorted({int(la) for la in layers})
    run = -(-len(distinct) // MAX_LAYER_GROUPS)
    groups = []
    for i in range(0, len(distinct), run):
        part = distinct[i:i + run]
        contiguous = part == list(range(part[0], part[-1] + 1))
        label = (f"layer {part[0]}" if len(part) == 1 else f"layers {part[0]}-{part[-1]}" if contiguous
                 else "layers " + ", ".join(map(str, part)))
        groups.append((label, part))
    return groups


def implicit_vs_explicit(frame: pd.DataFrame, *, model_name: Optional[str] = None, data: str = "") -> plt.Figure:
    """From ``implicit_value_bias``: each head's implicit value bias ||mean c_i|| against its explicit
    ||b_v W_O||, both in residual-stream units on the same axes (y = x dashed). Points are coloured by layer as
    categories (``colours.CATEGORICAL``, in order): "layer l" for at most 10 layers, else runs of consecutive layers
    ("layers 0-2") so that there are at most 10 groups; the legend names them."""
    check_table(frame, "implicit_vs_explicit", "interp.implicit_value_bias(model, data)",
                ["layer", "head", "explicit_norm", "implicit_norm", "positions", "has_b_v"], keys=["layer", "head"],
                finite=["explicit_norm", "implicit_norm"])
    fig, ax = plt.subplots(figsize=(6, 5.5))
    palette = plt.get_cmap(colours.CATEGORICAL).colors
    for i, (label, layers) in enumerate(_layer_groups(frame.layer)):
        part = frame[frame.layer.isin(layers)]
        ax.scatter(part.explicit_norm, part.implicit_norm, color=palette[i], s=35, label=label,
                   edgecolors="white", linewidths=0.5)
    hi = 1.05 * float(max(frame.explicit_norm.max(), frame.implicit_norm.max(), 1e-12))
    ax.plot([0, hi], [0, hi], "k--", lw=0.8, label="y = x")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("explicit value bias ||b_v W_O|| (residual-stream units)")
    ax.set_ylabel(f"implicit value bias ||mean c_i|| from {frame.positions.iloc[0]} (same units)")
    if not frame.has_b_v.any():
        ax.text(0.03, 0.5, "no b_v in this model:\nevery head sits at explicit = 0", transform=ax.transAxes,
                fontsize=9, bbox=dict(boxstyle="round", facecolor="#f2f2f2", edgecolor="#999999"))
    ax.legend(title="layer", fontsize=8, title_fontsize=8)
    ax.set_title(f"{_model_of(frame, model_name)}: implicit (sink) vs explicit (b_v) value bias, one point per head"
                 + (f"\n{data}" if data else ""), fontsize=10)
    fig.tight_layout()
    return fig


def resid_axis_label(frame: pd.DataFrame) -> str:
    """The x label of a per-layer residual table: which residual point its ``hook`` column names
    (``hook_resid_post``: after block l; ``hook_resid_pre``: entering block l)."""
    points = set(frame.hook.str.rsplit(".", n=1).str[-1])
    if len(points) != 1:
        raise InputError(f"the table mixes residual points {sorted(points)}: draw one (its 'hook' column) at a time")
    point = points.pop()
    where = {"hook_resid_post": "after block l", "hook_resid_pre": "entering block l"}.get(point, point)
    return f"layer l (residual stream {where}: blocks.l.{point})"


def massive_activations_plot(frame: pd.DataFrame, *, model_name: Optional[str] = None, data: str = "") -> plt.Figure:
    """From ``massive_activations``: the top |residual values| per layer and the median |value|, log scale
    (Sun et al. 2024, Fig. 1); ringed points are flagged massive."""
    check_table(frame, "massive_activations_plot", "interp.massive_activations(model, data)",
                ["layer", "hook", "rank", "abs_value", "median_abs", "massive", "abs_threshold", "ratio_threshold"],
                keys=["layer", "rank"], finite=["layer", "abs_value", "median_abs"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for rank, part in frame.groupby("rank"):
        ax.plot(part.layer, part.abs_value, marker="o", ms=4, label=f"top {rank}")
    per_layer = frame.drop_duplicates("layer").sort_values("layer")
    ax.plot(per_layer.layer, per_layer.median_abs, "k--", lw=1, label="median |value|")
    flagged = frame[frame.massive]
    if len(flagged):
        ax.scatter(flagged.layer, flagged.abs_value, s=120, facecolors="none", edgecolors="red", lw=1.5,
                   label=f"massive (> {frame.abs_threshold.iloc[0]:g} and > {frame.ratio_threshold.iloc[0]:g}x median)")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(resid_axis_label(frame))
    ax.set_ylabel("|residual-stream value| (log scale)")
    ax.legend(fontsize=8)
    ax.set_title(f"{_model_of(frame, model_name)}: largest residual-stream magnitudes per layer"
                 + (f"\n{data}" if data else ""), fontsize=10)
    fig.tight_layout()
    return fig



def token_norm_plot(frame: pd.DataFrame, *, model_name: Optional[str] = None, data: str = "") -> plt.Figure:
    """From ``high_norm_tokens``: per layer the token-norm distribution (5-95% and 25-75% bands, median,
    max) and the kept outliers (norm > k x median) as points coloured by the attention mass they receive;
    log scale when the largest norm is over 20x the median."""
    check_table(frame, "token_norm_plot", "interp.high_norm_tokens(model, data)",
                ["layer", "hook", "rank", "norm", "mass", "k", "n_outliers", "norm_q05", "norm_q25", "norm_median",
                 "norm_q75", "norm_q95", "norm_max"], keys=["layer", "rank"])
    per_layer = frame.drop_duplicates("layer").sort_values("layer")
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    x = per_layer.layer
    ax.fill_between(x, per_layer.norm_q05, per_layer.norm_q95, color="#9ecae1", alpha=0.5, label="5-95% of tokens")
    ax.fill_between(x, per_layer.norm_q25, per_layer.norm_q75, color="#3182bd", alpha=0.5, label="25-75%")
    ax.plot(x, per_layer.norm_median, color="#08519c", lw=1.5, label="median")
    ax.plot(x, per_layer.norm_max, "k:", lw=1, label="max")
    k = float(frame.k.iloc[0])
    ax.plot(x, k * per_layer.norm_median, color="#d95f02", lw=1, ls="--", label=f"outlier cut: {k:g} x median")
    kept = frame.dropna(subset=["norm"])
    unread = kept[kept.mass.isna()]  # after the last block: no attention reads them
    if len(kept) > len(unread):
        read = kept.dropna(subset=["mass"])
        rule = colours.RULES["mass"]
        lo, hi = colours.limits(rule, read.mass.to_numpy())
        points = ax.scatter(read.layer, read.norm, c=colours.drawn_values(rule, read.mass), cmap=rule.cmap, vmin=lo,
                            vmax=hi, s=28, edgecolors="k", linewidths=0.4, zorder=3,
                            label=f"outliers ({int(per_layer.n_outliers.sum())} in all)")
        colours.tag(points, rule.quantity)
        fig.colorbar(points, ax=ax, label="attention mass from the block reading them")
    if len(unread):
        ax.scatter(unread.layer, unread.norm, facecolors="none", edgecolors="k", s=28, zorder=3,
                   label="outliers no block reads (after the last)")
    if kept.empty:
        ax.text(0.98, 0.5, f"no token above {k:g} x median\nin any layer", transform=ax.transAxes, ha="right",
                fontsize=9, bbox=dict(boxstyle="round", facecolor="#f2f2f2", edgecolor="#999999"))
    if float(per_layer.norm_max.max()) > 20 * float(per_layer.norm_median.min()):
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(resid_axis_label(frame))
    ax.set_ylabel("token norm ||x_i|| (residual-stream units" + (", log scale)" if ax.get_yscale() == "log" else ")"))
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"{_model_of(frame, model_name)}: token norms per layer and high-norm tokens"
                 + (f"\n{data}" if data else ""), fontsize=10)
    fig.tight_layout()
    return fig


KEY_PRIOR_BARS = {"mass": "intact", "mass_without_key_prior": "key prior removed", "mass_without_b_q": "b_q zeroed"}


def key_prior_sink_plot(profile: pd.DataFrame, *, model_name: Optional[str] = None, data: str = "",
                        top: int = 16) -> plt.Figure:
    """From ``sink_profile(remove="key_prior")``: for the ``top`` sinks (head x position with mass over the
    threshold, in layers with b_q) the mass intact, with the key-prior term b_q W_k^T x_j removed from the
    scores, and with b_q zeroed; the label gives the key prior's share (intact - removed) / intact."""
    check_table(profile, "key_prior_sink_plot", "interp.sink_profile(model, data, remove='key_prior')",
                ["layer", "head", "position", "mass", "sink", "has_b_q", "threshold"],
                keys=["layer", "head", "position"], finite=["layer", "head", "mass", "threshold"])
    name = _model_of(profile, model_name)
    fig, ax = plt.subplots(figsize=(7.5, max(3.0, 0.32 * min(top, 40) + 1.8)))
    title = f"{name}: how much of each sink the query bias writes (key prior b_q W_k^T x_j)"
    need = set(KEY_PRIOR_BARS) - set(profile.columns)
    sinks = profile[profile.sink & profile.has_b_q] if not need else profile.iloc[:0]
    if sinks.empty:
        why = ("no b_q in this model: no key prior to remove" if not profile.has_b_q.any() else
               f"the profile lacks {', '.join(sorted(need))}: run sink_profile(remove='key_prior')" if need else
               "no sink in a layer with b_q: nothing for the key prior to write")
        _text_panel(ax, title, why)
        ax.set_xlabel("attention mass")
        ax.set_ylabel("sink (layer, head, position)")
        return fig
    sinks = sinks.nlargest(top, "mass").sort_values(["layer", "head"])
    labels = [f"L{r.layer} H{r.head} {r.position} ({(r.mass - r.mass_without_key_prior) / r.mass:+.0%})"
              for r in sinks.itertuples()]
    long = sinks.assign(sink=labels).melt(id_vars="sink", value_vars=list(KEY_PRIOR_BARS), var_name="scores",
                                          value_name="attention mass")
    long["scores"] = long.scores.map(KEY_PRIOR_BARS)
    sns.barplot(data=long, y="sink", x="attention mass", hue="scores", ax=ax, orient="h",
                palette=["#444444", "#d95f02", "#7570b3"])
    ax.axvline(float(profile.threshold.iloc[0]), color="k", ls="--", lw=0.8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("attention mass on the sink position (share of a row, mean over queries; dashed: threshold)")
    ax.set_ylabel("sink: layer, head, position (key prior's share)")
    ax.legend(fontsize=8, title="scores", loc="lower right")
    ax.set_title(title + (f"\n{data}" if data else ""), fontsize=10)
    fig.tight_layout()
    return fig


# one input, looked at closely (interp.single_input): static and interactive (plotly) figures
from interp.figures.single_input_plots import (  # noqa: E402, F401
    key_prior_top_tokens,
    key_prior_top_tokens_plotly,
    pick_heads,
    single_input_overlay,
    single_input_overlay_plotly,
    single_input_patterns,
    single_input_patterns_plotly,
)
