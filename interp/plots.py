"""Figures drawn from the analyzers' DataFrames (they compute nothing themselves)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from interp.io import atomic_path


def _grid(df: pd.DataFrame, value: str) -> pd.DataFrame:
    return df.pivot_table(index="layer", columns="head", values=value, aggfunc="mean").sort_index()


def layer_head_heatmaps(
    df: pd.DataFrame,
    value: str,
    *,
    facet: str = "kind",
    facets: Optional[Sequence[str]] = None,
    title: str = "",
    cbar_label: Optional[str] = None,
    cmap: str = "viridis",
    center: Optional[float] = None,
) -> plt.Figure:
    """One layer x head heatmap of ``value`` per value of ``facet`` (e.g. per kind)."""
    facets = list(facets) if facets is not None else list(dict.fromkeys(df[facet]))
    fig, axes = plt.subplots(1, len(facets), figsize=(4.2 * len(facets) + 0.8, 4.2), squeeze=False)
    vmin, vmax = df[value].min(), df[value].max()
    for ax, f in zip(axes[0], facets):
        grid = _grid(df[df[facet] == f], value)
        sns.heatmap(grid, ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, center=center,
                    cbar_kws={"label": cbar_label or value})
        ax.set_title(f"{facet} = {f}")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    fig.suptitle(title or value)
    fig.tight_layout()
    return fig


def origin_shift_figures(origin: pd.DataFrame, model_name: str) -> dict[str, plt.Figure]:
    """Shift ratio and bias share per kind (q, k, v), as layer x head heatmaps."""
    return {
        "shift_ratio": layer_head_heatmaps(
            origin, "shift_ratio", cbar_label="||b|| / RMS(XW)",
            title=f"{model_name}: how far each head's bias moves its origin (shift ratio)",
        ),
        "bias_share": layer_head_heatmaps(
            origin, "bias_share", cbar_label="||b|| / (||b|| + ||E[X]W||)", cmap="magma",
            title=f"{model_name}: bias share of the head's origin (0 = data only, 1 = bias only)",
        ),
    }


def key_prior_share_figure(decomposition: pd.DataFrame, model_name: str) -> plt.Figure:
    """Share of within-row score variance carried by the key-prior term b_q . x_j W_k."""
    df = decomposition[decomposition.term == "key_prior"].assign(term="key_prior")
    return layer_head_heatmaps(
        df, "share", facet="term", cbar_label="share of score variance", cmap="rocket",
        title=f"{model_name}: key-prior term (b_q . k content) share of score variance",
    )


def save_figure(fig: plt.Figure, path: str | Path, dpi: int = 110) -> Path:
    """Save a figure atomically and close it."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png", bbox_inches="tight")
    plt.close(fig)
    return path


def ablation_figures(results: pd.DataFrame, model_name: str, top: int = 12) -> dict[str, plt.Figure]:
    """From ``ablate_bias`` rows: delta heatmaps per kind, the top heads, estimate vs exact."""
    figs: dict[str, plt.Figure] = {}
    per_head = results[results.scope == "head"] if "scope" in results else results
    most = per_head.groupby(["method", "estimate"]).size().groupby("method").max()
    for (method, estimate), df in per_head.groupby(["method", "estimate"]):
        metric = df.metric.iloc[0]
        if len(df) == most[method]:  # a heatmap of every head; the exact top-k of "auto" would leave holes
            figs[f"ablation_delta_{method}_{estimate}"] = layer_head_heatmaps(
                df, "delta", cmap="vlag", center=0.0, cbar_label=f"delta {metric} (ablated - intact)",
                title=f"{model_name}: effect of {method}-ablating each head's bias ({estimate})",
            )
        figs[f"ablation_top_{method}_{estimate}"] = _top_heads_figure(df, model_name, method, estimate, top)
    for method, df in per_head.groupby("method"):
        for estimate in [e for e in dict.fromkeys(df.estimate) if e != "exact" and "exact" in set(df.estimate)]:
            figs[f"ablation_exact_vs_{estimate}_{method}"] = _estimate_scatter(df, model_name, method, estimate)
    return figs


def _top_heads_figure(df: pd.DataFrame, model_name: str, method: str, estimate: str, top: int) -> plt.Figure:
    ranked = df.assign(abs_delta=df.delta.abs()).nlargest(top, "abs_delta")
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(ranked) + 1.5))
    labels = [f"L{r.layer} H{r['head']} {r.kind}" for _, r in ranked.iterrows()]
    sns.barplot(x=ranked.delta.values, y=labels, hue=ranked.kind.values, dodge=False, ax=ax)
    ax.set_xlabel(f"delta {df.metric.iloc[0]} (ablated - intact)")
    ax.set_ylabel("layer, head, kind")
    ax.set_title(f"{model_name}: the {len(ranked)} most bias-dependent heads ({method}, {estimate})")
    ax.legend(title="kind")
    fig.tight_layout()
    return fig


def _estimate_scatter(df: pd.DataFrame, model_name: str, method: str, estimate: str) -> plt.Figure:
    rows = df[df.estimate.isin(["exact", estimate])]
    wide = rows.pivot_table(index=["layer", "head", "kind"], columns="estimate", values="delta").dropna().reset_index()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    sns.scatterplot(data=wide, x="exact", y=estimate, hue="kind", ax=ax)
    both = wide[["exact", estimate]]
    lo, hi = float(both.min().min()), float(both.max().max())
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
    ax.set_xlabel(f"exact delta {df.metric.iloc[0]}")
    ax.set_ylabel(f"{estimate} estimate")
    ax.set_title(f"{model_name}: {estimate} vs exact ({method}, {len(wide)} heads)")
    ax.legend(title="kind")
    fig.tight_layout()
    return fig


def spectrum_clustermap(clustered: pd.DataFrame, model_name: str):
    """Seaborn clustermap of heads x radial-frequency bins, rows coloured by cluster."""
    bins = [c for c in clustered.columns if c.startswith("bin_")]
    data = clustered.set_index(clustered.apply(lambda r: f"L{int(r.layer)}H{int(r['head'])}", axis=1))[bins]
    data = data.dropna(axis=1, how="all")  # small grids leave some radial bins empty
    data = data.fillna(data.mean())
    palette = sns.color_palette("tab10", int(clustered.cluster.max()) + 1)
    colors = pd.Series([palette[c] for c in clustered.cluster], index=data.index, name="cluster")
    grid = sns.clustermap(data, col_cluster=False, row_colors=colors, cmap="mako",
                          figsize=(7, max(6, 0.12 * len(data))), yticklabels=len(data) <= 80,
                          cbar_kws={"label": "log amplitude - log DC"})
    grid.ax_heatmap.tick_params(axis="y", labelsize=6)
    grid.ax_heatmap.set_xlabel("radial frequency bin (0 = lowest, last = Nyquist)")
    grid.ax_heatmap.set_ylabel("head (layer, head)")
    grid.figure.suptitle(f"{model_name}: head output spectra, rows coloured by cluster", y=1.02)
    return grid.figure


def attention_distance_figure(profile: pd.DataFrame, model_name: str, hue: Optional[str] = "cluster") -> plt.Figure:
    """Mean attention distance of every head against layer (ViT paper, Figure 7 style)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    use_hue = hue if hue in profile.columns else None
    sns.scatterplot(data=profile, x="layer", y="mean_attention_distance", hue=use_hue,
                    palette="tab10" if use_hue else None, ax=ax, s=40)
    unit = profile.distance_unit.iloc[0] if "distance_unit" in profile else "pixels"
    ax.set_xlabel("layer")
    ax.set_ylabel(f"mean attention distance ({unit})")
    ax.set_title(f"{model_name}: mean attention distance per head")
    if use_hue:
        ax.legend(title=use_hue)
    fig.tight_layout()
    return fig


def cluster_grid_figure(clustered: pd.DataFrame, model_name: str) -> plt.Figure:
    """Layer x head grid coloured by head family (cluster 0 = most low-pass)."""
    grid = _grid(clustered, "cluster")
    k = int(clustered.cluster.max()) + 1
    fig, ax = plt.subplots(figsize=(0.5 * grid.shape[1] + 3, 0.35 * grid.shape[0] + 2))
    sns.heatmap(grid, ax=ax, cmap=sns.color_palette("tab10", k), annot=True, fmt=".0f",
                cbar_kws={"label": "cluster (0 = most low-pass)", "ticks": list(range(k))},
                vmin=-0.5, vmax=k - 0.5)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{model_name}: head families by frequency profile")
    fig.tight_layout()
    return fig
