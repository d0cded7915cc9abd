"""The main job as steps: each step runs one analysis and returns ``Section``s that hold
its numbers as data (``numbers``), its tables, its figures and the prose made from them.

``run_steps`` runs every step on one model (``interp demo``); ``interp record`` and
``interp ablate`` reuse the recording and ablation steps. ``interp.report.html`` writes the
sections out: tables (CSV + Parquet), figures (PNG), ``report.html`` and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd

from interp.figures import plots
from interp.figures.interactive import Heatmap, TopTable
from interp.ablation.sweep import ablate_bias
from interp.analysis.frequency import (
    N_RANDOM, cluster_heads, family_test, frequency_profile, frequency_shift_under_ablation, one_family,
    specialisation_test,
)
from interp.analysis.single_input import single_input
from interp.analysis.origin import origin_shift
from interp.analysis.scores import bias_invariances, score_decomposition
from interp.analysis.sinks import (
    SINK_THRESHOLD, implicit_value_bias, massive_activations, sink_profile, sink_shares,
)
from interp.bootstrap import Resampler
from interp.data import open_data
from interp.checks import check_heads, check_layers, check_max_batches
from interp.record.heads import bias_spec
from interp.io import begin_outputs
from interp.models.bridge import InterpBridge
from interp.record.recording import record_qkv
from interp.report.sections import Context, DataBatches, Section
from interp.record.stats import QKVStats


# The demo's sample: its first 2 batches (8 images or sequences at its batch size of 4; 1 batch with --quick),
# read by every step. --max-batches changes it for every step but the invariances (INVARIANCE_BATCHES).
DEMO_BATCHES = 2
# The float64 identity checks cost two forwards per layer and batch: at most the demo's sample, whatever was read.
INVARIANCE_BATCHES = DEMO_BATCHES


def _inventory_step(ctx: Context) -> list[Section]:
    spec = bias_spec(ctx.model)
    present = spec[spec.present].groupby("kind").norm.agg(["mean", "max"])
    info = ctx.model.interp
    numbers = dict(kinds_present=list(present.index),
                   mean_bias_norm={k: float(r["mean"]) for k, r in present.iterrows()},
                   max_bias_norm={k: float(r["max"]) for k, r in present.iterrows()})
    norms = "; ".join(f"mean ||b_{k}|| = {numbers['mean_bias_norm'][k]:.2f} (max {numbers['max_bias_norm'][k]:.2f})"
                      for k in numbers["kinds_present"])
    text = (f"{ctx.name} ({info.family}, {info.n_layers} layers x {info.n_heads} heads, {info.positions} "
            f"positions) has attention biases on: {', '.join(numbers['kinds_present']) or 'none'}. {norms}")
    return [Section("inventory", "Bias inventory", text, numbers, tables={"bias_spec": spec})]


def summarise_recording(stats: QKVStats, dataset: str) -> Section:
    """The recording step's section, from statistics recorded anywhere (one process or many)."""
    count = stats.count(stats.layers[0])
    numbers = dict(positions_counted=count, layers=len(stats.layers), kinds=list(stats.kinds))
    text = (f"Per-head Q/K/V statistics over {count} positions (tokens or patches, padding excluded) of "
            f"{dataset}, {len(stats.layers)} layers, kinds {', '.join(stats.kinds)}.")
    return Section("recording", "Recording", text, numbers, tables={"qkv_stats": stats.to_frame()},
                   stats={"qkv_stats": stats})


def _recording_step(ctx: Context) -> list[Section]:
    ctx.stats = record_qkv(ctx.model, ctx.first(), layers=ctx.layers)
    return [summarise_recording(ctx.stats, ctx.dataset)]


def referenced_recording(stats: QKVStats, path: Path, dataset: str) -> Section:
    """The recording section for statistics read from ``path`` (``interp origin|scores --stats``): the numbers
    and the reference, no copy of the statistics."""
    count = stats.count(stats.layers[0])
    numbers = dict(positions_counted=count, layers=len(stats.layers), kinds=list(stats.kinds), stats_file=str(path),
                   model_fingerprint=stats.model_fingerprint, data_fingerprint=stats.data_fingerprint)
    text = (f"Per-head Q/K/V statistics read from {path} (not copied here): {count} positions of {dataset}, "
            f"{len(stats.layers)} layers, kinds {', '.join(stats.kinds)}; recorded on this model (weights "
            f"{stats.model_fingerprint}) and this data (fingerprint {stats.data_fingerprint}).")
    return Section("recording", "Recording", text, numbers)


def _origin_step(ctx: Context) -> list[Section]:
    origin = origin_shift(ctx.model, ctx.stats, layers=ctx.layers, heads=ctx.heads, data=ctx.first())
    figs = plots.origin_shift_figures(origin, ctx.name, ctx.data_label())
    med = origin.groupby("kind")[["shift_ratio", "bias_share"]].median()
    top = origin.sort_values("shift_ratio", ascending=False).iloc[0]
    numbers = dict(median_shift_ratio=med.shift_ratio.to_dict(),
                   largest_shift_ratio=dict(layer=int(top.layer), head=int(top["head"]), kind=top.kind,
                                            shift_ratio=float(top.shift_ratio)))
    share_numbers = dict(median_bias_share=med.bias_share.to_dict())
    largest = numbers["largest_shift_ratio"]
    shift = Section(
        "origin_shift", "Shift ratio",
        "How far each head's bias moves its origin, in units of the RMS of the content XW. Median per kind: "
        + ", ".join(f"{k}: {v:.2f}" for k, v in numbers["median_shift_ratio"].items())
        + f". Largest: layer {largest['layer']}, head {largest['head']}, {largest['kind']} "
          f"({largest['shift_ratio']:.2f}).",
        numbers, tables={"origin_shift": origin}, shown=[n for n in figs if n == "shift_ratio_intervals"],
        figures={n: f for n, f in figs.items() if n.startswith("shift_ratio")},  # with its intervals, when there are
        heatmaps=[Heatmap("origin_shift", "shift_ratio", "||b|| / RMS(XW)",
                          title=f"{ctx.name}: shift ratio per head (hover for values; one colour scale, all kinds)")],
        top_tables=[TopTable("origin_shift", ("layer", "head", "kind", "bias_norm", "content_rms", "shift_ratio",
                                              "bias_share"), "shift_ratio", "The largest shift ratios")],
        headline=f"The largest bias shift is {largest['shift_ratio']:.2f} content-RMS units "
                 f"(layer {largest['layer']}, head {largest['head']}, {largest['kind']})"
                 + (": a b_k, which cannot change the pattern here." if largest["kind"] == "k"
                    and ctx.model.interp.spec.k_bias_inert else "."),
    )
    share = Section(
        "bias_share", "Bias share",
        "Share of the head's origin E[XW + b] set by the bias rather than by the data, ||b|| / (||b|| + "
        "||E[X]W||). Median per kind: "
        + ", ".join(f"{k}: {v:.2f}" for k, v in share_numbers["median_bias_share"].items()) + ".",
        share_numbers, figures={n: f for n, f in figs.items() if n.startswith("bias_share")},
        shown=[n for n in figs if n == "bias_share_intervals"],  # the heatmap is interactive; its PNG a download
        heatmaps=[Heatmap("origin_shift", "bias_share", "||b|| / (||b|| + ||E[X]W||)",
                          title=f"{ctx.name}: bias share of each head's origin")])
    return [shift, share]


def _scores_step(ctx: Context) -> list[Section]:
    family = ctx.model.interp.spec
    if family.score_refusal:  # said in the report, not skipped silently
        return [Section("key_prior", "Key prior", f"Not computed for {family.label}: {family.score_refusal}.",
                        dict(refused=family.score_refusal))]
    batches = ctx.first()
    dec = score_decomposition(ctx.model, batches, layers=ctx.layers, heads=ctx.heads)
    label = ctx.data_label(batches)
    shares = dec.groupby("term").share.mean()
    numbers = dict(mean_share={t: float(v) for t, v in shares.items()})
    kp = numbers["mean_share"].get("key_prior", 0.0)
    cancel = numbers["mean_share"].get("query_const", 0.0) + numbers["mean_share"].get("const", 0.0)
    text = (f"Share of within-row score variance carried by the key-prior term b_q . x_j W_k (mean over heads "
            f"{kp:.3f}; content {numbers['mean_share'].get('content', 0.0):.3f}; query_const and const {cancel:.2e}, "
            "which softmax cancels without rotary positions).")
    return [Section("key_prior", "Key prior", text, numbers, tables={"score_decomposition": dec},
                    figures={"key_prior_share": plots.key_prior_share_figure(dec, ctx.name, label),
                             "key_prior_share_intervals": plots.interval_figure(
                                 dec[dec.term == "key_prior"], "share", ctx.name, facet="term",
                                 label="key-prior share of score variance", data=label)},
                    shown=["key_prior_share_intervals"],  # the heatmap is interactive; its PNG a download
                    heatmaps=[Heatmap("score_decomposition", "share", "share of score variance", facet="term",
                                      query="term == 'key_prior'",
                                      title=f"{ctx.name}: key-prior share of each head's score variance")],
                    headline=f"The key prior u = W_k b_q carries {kp:.1%} of the score variance on average.")]


def _invariance_step(ctx: Context) -> list[Section]:
    # the identities hold per item, and checking them costs two float64 forwards per layer and batch (24 forwards
    # of a 12-layer model): the first INVARIANCE_BATCHES of the sample (in the demo, all of it)
    inv = bias_invariances(ctx.model, ctx.first(INVARIANCE_BATCHES), layers=ctx.layers, max_batches=None)
    worst = inv.groupby("check").max_abs_diff.max()
    family = ctx.model.interp.spec
    numbers = dict(k_bias_pattern_max_abs_diff=float(worst["k_bias_pattern"]),
                   v_bias_fold_max_abs_diff=float(worst["v_bias_fold"]), positions=family.positions,
                   k_bias_inert=family.k_bias_inert,
                   max_k_bias_norm=float(inv[inv.check == "k_bias_pattern"].bias_norm.max()))
    verdict = (f"Under {family.positions} positions b_k is inert weight: removing it is free." if family.k_bias_inert
               else f"Under {family.positions} positions b_k rotates with the key and is not inert.")
    numbers["softmax_dtype"] = str(inv.softmax_dtype.iloc[0])
    text = (f"Removing b_k changes the pattern by at most {numbers['k_bias_pattern_max_abs_diff']:.2e}; folding b_v "
            f"into b_O changes the output by at most {numbers['v_bias_fold_max_abs_diff']:.2e} (float64 model, "
            f"softmax in {numbers['softmax_dtype']}). {verdict}")
    headline = "" if not family.k_bias_inert or numbers["max_k_bias_norm"] == 0 else (
        f"b_k (norm up to {numbers['max_k_bias_norm']:.3g} per layer) is inert: removing it moves the pattern by "
        f"{numbers['k_bias_pattern_max_abs_diff']:.1e} (softmax in {numbers['softmax_dtype']}).")
    return [Section("invariances", "Invariances (float64)", text, numbers, headline=headline,
                    tables={"bias_invariances": inv})]


def _families(profile: pd.DataFrame, model: Any = None, batches: Any = None,
              aim: Optional[dict] = None) -> pd.DataFrame:
    """``family_test`` (with the model and its batches: families must replicate on halves of them) or
    ``cluster_heads``, or one family said as such when fewer than 3 heads are selected (--heads)."""
    if len(profile) < 3:
        return one_family(profile)
    return cluster_heads(profile) if model is None else family_test(model, batches, progress=False, **(aim or {}))


def _families_text(numbers: dict, families: str) -> str:
    if np.isnan(numbers["p_value"]):
        return f"Too few heads selected to compare families (fewer than 3); {families}."
    ari = [numbers.get(f"replication_{c}", np.nan) for c in ("ari", "lo", "hi")]
    test = (f"Gaussian null p = {numbers['p_value']:.3f}, halves agree ARI {ari[0]:.2f} [{ari[1]:.2f}, {ari[2]:.2f}] "
            f"(>= 0.5 at the low end needed), separation {numbers['separation']:.1f} resolution units (>= 1 needed)")
    if not numbers["structure"]:
        return f"No family structure: the best split is noise or too small to see ({test}); {families}."
    return (f"k = {numbers['k']} families by frequency profile (mean silhouette {numbers['silhouette']:.2f}; "
            f"{test}); {families}. Cluster 0 is the most low-pass.")


def _frequency_step(ctx: Context) -> list[Section]:
    aim, batches = dict(layers=ctx.layers, heads=ctx.heads), ctx.first()
    label = ctx.data_label(batches)
    shift = frequency_shift_under_ablation(ctx.model, batches, kinds=("q",), **aim)
    clustered = _families(frequency_profile(ctx.model, batches, **aim), ctx.model, batches, aim)
    fam = clustered.groupby("cluster")[["hf_ratio", "mean_attention_distance"]].mean()
    per_layer = clustered.groupby("layer").mean_attention_distance.mean()
    unit = clustered.distance_unit.iloc[0]
    numbers = dict(
        k=int(clustered.k.iloc[0]), silhouette=float(clustered.silhouette_mean.iloc[0]), distance_unit=unit,
        structure=bool(clustered.structure.iloc[0]), p_value=float(clustered.p_value.iloc[0]),
        separation=float(clustered.separation.iloc[0]),
        **{c: float(clustered[c].iloc[0]) for c in ("replication_ari", "replication_lo", "replication_hi")},
        families={int(c): dict(hf_ratio=float(r.hf_ratio), mean_attention_distance=float(r.mean_attention_distance))
                  for c, r in fam.iterrows()})
    distance = dict(
        distance_unit=unit, layer_distance_range=[float(per_layer.min()), float(per_layer.max())],
        q_bias_removal_distance_change_mean=float(shift.delta_mean_attention_distance.mean()),
        q_bias_removal_distance_change_max_abs=float(shift.delta_mean_attention_distance.abs().max()),
        q_bias_removal_hf_ratio_change_mean_abs=float(shift.delta_hf_ratio.abs().mean()),
    )
    families = "; ".join(
        f"cluster {c}: hf_ratio {f['hf_ratio']:.3f}, distance {f['mean_attention_distance']:.1f} {unit}"
        for c, f in numbers["families"].items())
    lo, hi = distance["layer_distance_range"]
    bins = [c for c in clustered.columns if c.startswith("bin_")]
    spectra = dict(n_bins=len(bins), empty_bins=[c for c in bins if clustered[c].isna().all()])
    tables = {"frequency_profile": clustered, "frequency_shift_q_bias": shift}
    return [
        Section("head_families", "Head families", _families_text(numbers, families), numbers, tables=tables,
                figures={"clusters": plots.cluster_grid_figure(clustered, ctx.name, label)},
                shown=["clusters"],
                heatmaps=[Heatmap("frequency_profile", "hf_ratio", "high-frequency share of output power", facet=None,
                                  title=f"{ctx.name}: hf_ratio per head")],
                headline=(f"Heads form {numbers['k']} frequency families (silhouette {numbers['silhouette']:.2f}, "
                          f"Gaussian-null p = {numbers['p_value']:.3f})." if numbers["structure"] else
                          "Heads form no frequency families beyond noise (one family).")),
        Section("attention_distance", "Mean attention distance",
                f"Per head against layer (ViT paper, Figure 7 style). Layer means range {lo:.1f}-{hi:.1f} {unit}. "
                "Removing each head's b_q moves its distance by "
                f"{distance['q_bias_removal_distance_change_mean']:+.2f} {unit} on average (max |change| "
                f"{distance['q_bias_removal_distance_change_max_abs']:.2f}) and its "
                f"hf_ratio by {distance['q_bias_removal_hf_ratio_change_mean_abs']:.4f} on average.", distance,
                figures={"attention_distance": plots.attention_distance_figure(
                    clustered, ctx.name, data=label)},
                shown=["attention_distance"]),  # each head's distance drawn once, here (no heatmap of it)
        Section("spectra", "Spectra", "Log amplitude (relative to DC) of each head's output over radial frequency "
                f"bins; rows are heads, coloured by family. {_bins_text(spectra)}", spectra,
                figures={"spectrum_clustermap": plots.spectrum_clustermap(clustered, ctx.name, label)},
                shown=["spectrum_clustermap"]),
    ]


def _bins_text(spectra: dict) -> str:
    """What the spectrum's bins cover: "All 8 radial bins hold frequencies of this grid." or which are empty."""
    empty, n = spectra["empty_bins"], spectra["n_bins"]
    if not empty:
        return f"All {n} radial bins hold frequencies of this grid."
    return (f"{len(empty)} of the {n} radial bins hold no frequency of this grid and are left out of the figure "
            f"({', '.join(empty)}).")


# ----- implicit biases: sinks, the value bias they imply, massive activations ---------------------------


def _sink_numbers(shares: pd.DataFrame, implicit: pd.DataFrame, massive: pd.DataFrame) -> dict[str, Any]:
    """The implicit-biases section's headline numbers, from the three analyzers' tables."""
    biased = implicit[implicit.has_b_v & (implicit.explicit_norm > 0)]
    top = massive.loc[massive.abs_value.idxmax()]
    per_layer = massive[massive["rank"] == 1]
    return dict(
        threshold=float(shares.threshold.iloc[0]),
        sink_share={str(r.position): float(r.share) for r in shares.itertuples()},
        implicit_positions=str(implicit.positions.iloc[0]),
        implicit_norm_median=float(implicit.implicit_norm.median()),
        implicit_norm_max=float(implicit.implicit_norm.max()),
        constancy_median=float(implicit.constancy.median()),
        explicit_norm_median=float(biased.explicit_norm.median()) if len(biased) else 0.0,
        implicit_over_explicit_median=float((biased.implicit_norm / biased.explicit_norm).median())
        if len(biased) else None,
        massive_count=int(massive.massive.sum()),
        largest_activation=dict(layer=int(top.layer), value=float(top.value), channel=int(top.channel),
                                position=int(top.position), token=None if pd.isna(top.token) else str(top.token),
                                ratio_to_median=float(top.ratio_to_median)),
        max_ratio_to_median_by_layer={int(r.layer): float(r.ratio_to_median) for r in per_layer.itertuples()},
    )


def _sinks_text(n: dict[str, Any]) -> str:
    shares = ", ".join(f"{p} {s:.0%}" for p, s in n["sink_share"].items())
    explicit = (f"; the explicit ||b_v W_O|| has median {n['explicit_norm_median']:.3g}, so the implicit one is "
                f"{n['implicit_over_explicit_median']:.2g}x it (median over heads)"
                if n["implicit_over_explicit_median"] is not None else "; the model has no b_v to compare")
    top = n["largest_activation"]
    return (f"Share of heads whose mean attention on a position exceeds {n['threshold']:g} (Gu et al. 2024): "
            f"{shares}. The value bias the sink ({n['implicit_positions']}) writes, ||mean c_i||, has median "
            f"{n['implicit_norm_median']:.3g} over heads (max {n['implicit_norm_max']:.3g}; constancy median "
            f"{n['constancy_median']:.2f}, 1 = a pure bias){explicit}. Largest residual value: "
            f"{top['value']:.4g} at layer {top['layer']}, channel {top['channel']}, position {top['position']} "
            f"({top['ratio_to_median']:.0f}x the layer's median |value|); {n['massive_count']} top values are "
            "massive by Sun et al.'s criterion (> 100 and > 1000x median).")


def _sinks_step(ctx: Context) -> list[Section]:
    """Attention sinks (threshold ``SINK_THRESHOLD``), the implicit value bias beside b_v W_O, and massive activations,
    on the sample (``Context.first``); no removal runs (``sink_profile(remove=...)`` is costly)."""
    batches = ctx.first()
    label = ctx.data_label(batches)
    aim = dict(layers=ctx.layers, heads=ctx.heads)
    profile = sink_profile(ctx.model, batches, threshold=SINK_THRESHOLD, progress=False, **aim)
    shares = sink_shares(profile)
    implicit = implicit_value_bias(ctx.model, batches, progress=False, **aim)
    massive = massive_activations(ctx.model, batches, layers=ctx.layers, progress=False)
    numbers = _sink_numbers(shares, implicit, massive)
    best = max(numbers["sink_share"].items(), key=lambda kv: kv[1])
    headline = (f"{best[1]:.0%} of heads sink on '{best[0]}' (mean attention above {numbers['threshold']:g}); "
                f"{numbers['massive_count']} massive activations." if best[1] > 0 else
                f"No head puts more than {numbers['threshold']:g} of its attention on one position class.")
    figures = {"sink_mass_grid": plots.sink_mass_grid(profile, model_name=ctx.name, data=label),
               "implicit_vs_explicit": plots.implicit_vs_explicit(implicit, model_name=ctx.name, data=label),
               "massive_activations": plots.massive_activations_plot(massive, model_name=ctx.name, data=label)}
    return [Section(
        "implicit_biases", "Implicit biases", _sinks_text(numbers), numbers, headline=headline,
        tables={"sink_profile": profile, "sink_shares": shares, "implicit_value_bias": implicit,
                "massive_activations": massive},
        figures=figures, shown=["implicit_vs_explicit", "massive_activations"],  # the sink masses: interactive below
        heatmaps=[Heatmap("sink_profile", "mass", "mean attention mass on the position (share of a row)",
                          facet="position", title=f"{ctx.name}: attention mass per head on each position class"),
                  Heatmap("implicit_value_bias", "implicit_norm", "||mean c_i|| (residual-stream units)", facet=None,
                          title=f"{ctx.name}: implicit value bias per head")],
        top_tables=[TopTable("implicit_value_bias", ("layer", "head", "sink_mass", "implicit_norm", "constancy",
                                                     "explicit_norm", "output_rms"), "implicit_norm",
                             "The largest implicit value biases (click a column to sort)")])]


def estimate_vs_exact(per_head: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """How the one-pass estimate compares with the exact deltas on the heads run both ways (identity rows
    left out): under "auto" the estimate's own top_k per kind ("top") and sample_k per kind drawn at random
    ("sample"). Spearman on all of them (``n_compared``) and on the random ones alone (``sample_*``: a set
    the estimate did not choose), each with a 95% percentile bootstrap interval over heads."""
    others = [e for e in dict.fromkeys(per_head.estimate) if e != "exact"]
    if not others or "exact" not in set(per_head.estimate):
        return {}
    keys = ["layer", "head", "kind"]
    est = per_head[per_head.estimate == others[0]].set_index(keys).delta
    exact = per_head[(per_head.estimate == "exact") & (per_head.identity.fillna("") == "")].set_index(keys)
    why = exact.exact_because if "exact_because" in exact else pd.Series("", index=exact.index)
    both = pd.concat([exact.delta.rename("exact"), est.rename("estimate"), why.rename("why")], axis=1, join="inner")
    if both.empty:
        return {}
    out = dict(estimate=others[0], n_top=int((both.why == "top").sum()),
               **_rank_agreement(both, "", n_boot, seed), **_rank_agreement(both[both.why == "sample"], "sample_",
                                                                          n_boot, seed))
    out["n_compared"] = out.pop("n")
    return out


def _rank_agreement(both: pd.DataFrame, prefix: str, n_boot: int, seed: int) -> dict[str, Any]:
    """Spearman between ``both.exact`` and ``both.estimate`` (NaN below 3 heads), its 95% percentile bootstrap
    interval over the heads (``interp.bootstrap``), n, median ratio and largest absolute error."""
    def spearman(take: np.ndarray) -> float:
        pair = both.iloc[take]
        return float(pair.exact.rank().corr(pair.estimate.rank())) if len(pair) > 2 else float("nan")
    resampler = Resampler([f"{layer}/{head}/{kind}" for layer, head, kind in both.index], n_boot, seed)
    lo, hi = resampler.interval(resampler.resampled(spearman))
    ratio = (both.estimate / both.exact).median() if len(both) else float("nan")
    error = (both.estimate - both.exact).abs().max() if len(both) else float("nan")
    return {f"{prefix}n": len(both), f"{prefix}spearman": spearman(np.arange(len(both))), f"{prefix}spearman_lo":
            float(lo), f"{prefix}spearman_hi": float(hi), f"{prefix}median_ratio": float(ratio),
            f"{prefix}max_abs_error": float(error)}


def summarise_ablation(results: pd.DataFrame, model_name: str, data: str = "") -> Section:
    """The ablation step's section, from ``ablate_bias`` rows (one method; one estimate, or a one-pass
    estimate of every head plus exact rows for the top heads). Headline numbers come from exact rows
    where there are any; a head is called bias-dependent only outside its matched control, its p adjusted across the
    heads run exactly (``control_p_adjusted``, Benjamini-Hochberg)."""
    per_head = results[results.scope == "head"]
    # the best-known delta per head: exact where it was run, else the estimate (or the identity's 0)
    best = (per_head.assign(_estimated=per_head.estimate != "exact").sort_values("_estimated", kind="stable")
            .drop_duplicates(["layer", "head", "kind"]))
    top = best.assign(a=best.delta.abs()).nlargest(3, "a")
    first = (best if len(best) else results).iloc[0]
    numbers = dict(
        metric=first.metric, method=first.method, estimate=first.estimate, baseline=float(first.baseline),
        estimates=list(dict.fromkeys(results.estimate)), n_variants=int(len(results)),
        max_abs_delta={k: float(v) for k, v in best.groupby("kind").delta.apply(lambda d: d.abs().max()).items()},
        top_heads=[dict(layer=int(r.layer), head=int(r["head"]), kind=r.kind, delta=float(r.delta))
                   for _, r in top.iterrows()],
        identity_answered=int((results.identity.fillna("") != "").sum()),
        estimate_vs_exact=estimate_vs_exact(per_head), matched_control=_control_numbers(per_head),
    )
    figs = plots.ablation_figures(results, model_name, data=data)
    heads = "; ".join(f"L{t['layer']} H{t['head']} {t['kind']} ({t['delta']:+.2e})" for t in numbers["top_heads"])
    text = (f"{first.method.capitalize()}-ablating one head's bias at a time ({first.metric}, baseline "
            f"{numbers['baseline']:.4f}; {numbers['identity_answered']} of {numbers['n_variants']} rows answered "
            "by an identity, without a forward). " + _estimate_text(numbers) + " Largest |delta| per kind: "
            + ", ".join(f"{k}: {v:.2e}" for k, v in numbers["max_abs_delta"].items())
            + f". Largest effects: {heads}." + _control_text(numbers["matched_control"]))
    top_name = next((n for n in (f"ablation_top_{first.method}_exact", f"ablation_top_{first.method}_{first.estimate}")
                     if n in figs), None)
    comparison = [n for n in figs if n.startswith("ablation_exact_vs_") and n.endswith(f"_{first.method}")]
    headline = "" if not numbers["top_heads"] else (
        f"The largest effect is layer {numbers['top_heads'][0]['layer']}, head "
        f"{numbers['top_heads'][0]['head']} ({numbers['top_heads'][0]['kind']}): removing its bias changes "
        f"{first.metric} by {numbers['top_heads'][0]['delta']:+.2e} ({first.estimate})." + _headline_control(numbers))
    every = numbers["estimates"][0]  # the estimate that covers every head
    tables = {"ablation": results}
    return Section("ablation", "Bias ablations", text, numbers, headline=headline, tables=tables,
                   figures=figs, shown=[n for n in [top_name] + comparison if n],
                   heatmaps=[Heatmap("ablation", "delta", f"delta {first.metric} (ablated - intact)",
                                     query=f"scope == 'head' and estimate == '{every}' and method == '{first.method}'",
                                     title=f"{model_name}: effect of removing each head's bias ({every})")],
                   # the heads run exactly, each with its matched control (the heatmap above: every head, estimated)
                   top_tables=[TopTable("ablation", ("layer", "head", "kind", "delta", "delta_lo", "delta_hi",
                                                     "control_lo", "control_hi", "delta_z", "control_p",
                                                     "control_p_empirical", "control_p_adjusted",
                                                     "bias_dependent"),
                                        "delta", "The largest effects of the heads run exactly, with their matched "
                                        "control (click a column to sort)",
                                        query=f"scope == 'head' and estimate == 'exact' and method == '{first.method}' "
                                        "and identity.fillna('') == ''")])


def _control_numbers(per_head: pd.DataFrame) -> dict:
    """The matched control over the exact per-head rows it ran on (identity rows left out: their controls are 0 by
    the identity, not measured): per kind, heads tested and heads called bias-dependent (Benjamini-Hochberg adjusted
    control_p <= 0.05), the heads whose unadjusted p is at most 0.05, and the fewest and most draws a head took."""
    if "control_p" not in per_head:
        return {}
    tested = per_head[(per_head.estimate == "exact") & per_head.control_p.notna()
                      & (per_head.identity.fillna("") == "")]
    if tested.empty:
        return {}
    kinds = {k: dict(tested=int(len(g)), bias_dependent=int(g.bias_dependent.fillna(False).sum()))
             for k, g in tested.groupby("kind")}
    first = tested.options.iloc[0] if "options" in tested else None
    options = json.loads(first) if isinstance(first, str) else {}  # the rule its p was read by
    return dict(n_control=int(tested.n_control.max()), n_control_min=int(tested.n_control.min()), kinds=kinds,
                tested=int(len(tested)), bias_dependent=int(tested.bias_dependent.fillna(False).sum()),
                uncorrected=int((tested.control_p <= 0.05).sum()), control_p=options.get("control_p", "normal"),
                control_stop=int(options.get("control_stop", 0)))


def _control_text(control: dict) -> str:
    if not control:
        return " No matched control was run (estimated rows only, or n_control=0): no head is called bias-dependent."
    per_kind = ", ".join(f"{k}: {v['bias_dependent']} of {v['tested']}" for k, v in control["kinds"].items())
    stop = control.get("control_stop", 0)
    stops = f" (a head stops once {stop} draws move the metric as much as it does)" if stop else ""
    read = ("its p read from the tail of a normal fitted to its draws" if control.get("control_p") == "normal" else
            "its p the Monte Carlo p of its draws")
    return (f" Matched control: each exact head rerun with random directions of the same displacement norm, "
            f"{_draws(control)}{stops}, {read}; bias-dependent, with the false discovery rate across the "
            f"{control['tested']} heads held at 5% (Benjamini-Hochberg adjusted p ≤ 0.05): {per_kind} "
            f"({control['uncorrected']} at p ≤ 0.05 before the adjustment).")


def _draws(control: dict) -> str:
    lo, hi = control.get("n_control_min", control["n_control"]), control["n_control"]
    return f"{hi} draws each" if lo == hi else f"{lo} to {hi} draws a head"


def _headline_control(numbers: dict) -> str:
    control = numbers["matched_control"]
    if not control:
        return " No matched control was run, so no head is called bias-dependent."
    return (f" {control['bias_dependent']} of {control['tested']} heads run exactly move it more than random "
            "directions of the same displacement norm (Benjamini-Hochberg adjusted p ≤ 0.05 across those heads).")


def _estimate_text(numbers: dict) -> str:
    cmp = numbers["estimate_vs_exact"]
    if not cmp:
        return f"Estimate: {numbers['estimate']}."
    interval = lambda p: f"{cmp[p + 'spearman']:.2f} [{cmp[p + 'spearman_lo']:.2f}, {cmp[p + 'spearman_hi']:.2f}]"  # noqa
    sample = (f"on the {cmp['sample_n']} heads drawn at random Spearman {interval('sample_')} between estimate and "
              "exact, ") if cmp["sample_n"] else ""
    return (f"Every head estimated in one pass ({cmp['estimate']}); run exactly on the {cmp['n_top']} it ranks "
            f"highest and {cmp['sample_n']} drawn at random: {sample}on all {cmp['n_compared']} heads run both ways "
            f"Spearman {interval('')} (95% bootstrap over heads), median ratio {cmp['median_ratio']:.2f}.")


def _ablation_step(ctx: Context) -> list[Section]:
    """Zero-ablation of every head's bias; the heads run exactly carry their matched control (``n_control``
    random directions of the same displacement norm, ``ablate_bias``'s default). Quick mode runs 2 top and 2 sampled
    heads per kind exactly (each costs at most 20 forwards with its control)."""
    batches = ctx.first()
    quick = dict(top_k=min(ctx.top_k, 2), sample_k=2) if ctx.quick else dict(top_k=ctx.top_k)  # quick: 2 + 2 exact
    chosen = quick if ctx.ablation_estimate == "auto" else {}  # top_k and sample_k apply under auto only
    results = ablate_bias(ctx.model, batches, kinds=("q", "k", "v"), method="zero", estimate=ctx.ablation_estimate,
                          out=ctx.out, **chosen)  # its log (ablation.jsonl) beside the one table, ablation.csv
    return [summarise_ablation(results, ctx.name, ctx.data_label(batches))]


Step = Callable[[Context], list[Section]]
STEPS: dict[str, Step] = {
    "inventory": _inventory_step, "recording": _recording_step, "origin": _origin_step, "scores": _scores_step,
    "invariances": _invariance_step, "frequency": _frequency_step, "sinks": _sinks_step,
    "ablation": _ablation_step,
}


def make_context(model: InterpBridge, dataset: Optional[str] = None, quick: bool = False,
                 out: Optional[Path] = None, ablation_estimate: str = "auto", top_k: int = 5,
                 data_options: Optional[dict[str, Any]] = None, layers: Any = None, heads: Any = None,
                 max_batches: Optional[int] = None, command: Optional[str] = None) -> Context:
    """The shared context for ``model`` on a built-in dataset (its modality's default when None) or a
    researcher's own (anything ``open_data`` takes), read up to ``max_batches`` batches (None: all; quick mode:
    the first batch of at most 8 items), lazily and never whole (``DataBatches``: each step's pass reads the
    batches it analyses). The batches read are the sample: every step reads all of them (``Context.first``),
    except the invariances, at most ``INVARIANCE_BATCHES``.
    ``ablation_estimate`` / ``top_k``: how the ablation step measures (see ``ablate_bias``);
    ``data_options``: ``resolve_data``'s options (text_column, batch_size, max_items, ...); ``layers`` /
    ``heads`` (None: all): the rows the analysis steps compute (checked here, before any step); ``command``: the
    command writing into ``out`` (its entry in the folder's manifest)."""
    aim = dict(layers=None if layers is None else check_layers(layers, model.interp),
               heads=None if heads is None else check_heads(heads, model.interp))
    max_batches = check_max_batches(max_batches)
    if quick:  # one batch (of at most 8 items), whatever was asked
        max_batches = 1
    if dataset is None or (isinstance(dataset, str) and not dataset):
        dataset = "photos" if model.interp.modality == "vision" else "python-docs"
    options = {"batch_size": 4, **{k: v for k, v in (data_options or {}).items() if v is not None}}
    batches = DataBatches(model, open_data(model, dataset, options, n=8 if quick else None), max_batches)
    if out is not None:
        begin_outputs(out, command)  # the command starts here: its steps write (ablation logs) before the report
    label = str(dataset) if isinstance(dataset, (str, Path)) else type(dataset).__name__  # an array: its type
    return Context(model, label, batches, quick, out, ablation_estimate=ablation_estimate, top_k=top_k, **aim)


def run_steps(ctx: Context, steps: Optional[list[str]] = None, log: Callable[[str], None] = print,
              keep_partial: bool = False,
              after_step: Optional[Callable[[list[Section]], None]] = None) -> list[Section]:
    """Run ``steps`` (default all, in order) and return every section they made.

    ``keep_partial``: a step that raises ends the run without losing the earlier steps: the
    sections made so far are returned with a last ``failed`` section naming the step and the error
    (later steps read earlier steps' results, so none runs after a failure). Otherwise the error
    propagates. ``after_step``: called with each step's sections as soon as it has made them (``run_demo``
    writes them then: ``interp.report.html.write_and_release``)."""
    names = [n for n in STEPS if n not in OPT_IN_STEPS] if steps is None else steps
    sections: list[Section] = []
    for i, name in enumerate(names, 1):
        log(f"[{i}/{len(names)}] {name}")
        t0, ctx.step = time.time(), name
        try:
            made = STEPS[name](ctx)
        except Exception as exc:  # noqa: BLE001 - reported in the partial report, then raised by the caller
            if not keep_partial:
                raise
            sections.append(_failed_section(name, names[i:], exc))
            return sections
        for section in made:
            section.seconds = round(time.time() - t0, 1)
            section.sample = section.sample or ctx.sample_label(name)
        if after_step is not None:
            after_step(made)
        sections += made
    return sections


def _failed_section(step: str, skipped: list[str], exc: BaseException) -> Section:
    """The report's account of a failed step: which, why, and what did not run."""
    error = f"{type(exc).__name__}: {exc}"
    text = (f"Step '{step}' failed: {error}. The sections above are complete; "
            f"{'steps not run: ' + ', '.join(skipped) if skipped else 'it was the last step'}.")
    return Section("failed", f"Step '{step}' failed", text, dict(failed_step=step, error=error, not_run=skipped),
                   headline=f"Incomplete: step '{step}' failed ({type(exc).__name__}); see the last section.")


# ----- one input, looked at closely (interp.single_input) ---------------------------------------------


def _first_item(ctx: Context) -> Any:
    """The data's first image, or its first sequence's real tokens."""
    batch = next(iter(ctx.batches))
    if ctx.model.interp.modality == "vision":
        return batch.inputs[0]
    mask = batch.attention_mask
    return batch.inputs[0] if mask is None else batch.inputs[0][mask[0].bool()]


def single_input_step(ctx: Context) -> list[Section]:
    """Each head's pattern with and without its bias on one input (a few layers, evenly spaced; 2 in quick
    mode), the keys the key prior favours, and for a ViT the attention maps over the image."""
    n = ctx.model.interp.n_layers
    layers = sorted({round(i * (n - 1) / (1 if ctx.quick else 3)) for i in range(2 if ctx.quick else 4)})
    view = single_input(ctx.model, _first_item(ctx), layers=layers, query="last" if ctx.model.interp.causal else None)
    heads = view.heads
    kp = heads[heads.condition == ("no_key_prior" if (heads.condition == "no_key_prior").any() else "no_b_q")]
    top = kp.loc[kp.kl.idxmax()]
    numbers = dict(layers=layers, query=view.meta["query"], n_positions=view.meta["n_positions"],
                   largest_kl=dict(layer=int(top.layer), head=int(top["head"]), condition=str(top.condition),
                                   kl=float(top.kl)),
                   no_b_k_max_abs_diff=float(heads[heads.condition == "no_b_k"].max_abs_diff.max()),
                   no_b_v_max_abs_diff=float(heads[heads.condition == "no_b_v"].max_abs_diff.max()),
                   no_b_v_output_change_rms_max=float(heads[heads.condition == "no_b_v"].output_change_rms.max()))
    favoured = view.key_prior[(view.key_prior.layer == top.layer) & (view.key_prior["head"] == top["head"])]
    first = f"; its key prior favours {favoured.label.iloc[0].strip()!r} most" if len(favoured) else ""
    text = (f"One {'image' if view.image is not None else 'sequence'} of {ctx.dataset} ({view.meta['n_positions']} "
            f"positions), layers {layers}, query {view.meta['query']!r}. Removing "
            f"{'the key prior' if top.condition == 'no_key_prior' else 'b_q'} changes layer {int(top.layer)}, head "
            f"{int(top['head'])} most (mean KL {top.kl:.3g} nats){first}. "
            f"Without b_k the pattern moves by at most {numbers['no_b_k_max_abs_diff']:.2g}; without b_v by "
            f"{numbers['no_b_v_max_abs_diff']:.2g} (v is not in the score), while the head's output moves by up to "
            f"{numbers['no_b_v_output_change_rms_max']:.3g} (b_v W_O).")
    figures = {"single_input_patterns": plots.single_input_patterns(view)}
    if not view.key_prior.empty:
        figures["single_input_key_prior"] = plots.key_prior_top_tokens(view)
    if view.image is not None:
        figures["single_input_overlay"] = plots.single_input_overlay(view)
    unit = "image" if view.image is not None else "sequence"
    return [Section("single_input", "One input, closely", text, numbers, figures=figures, shown=list(figures),
                    sample=f"1 {unit} ({view.meta['n_positions']} positions)",
                    tables={"single_input_patterns": view.patterns, "single_input_heads": view.heads,
                            "single_input_key_prior": view.key_prior},
                    heatmaps=[Heatmap("single_input_heads", "kl", "mean KL(intact || without), nats",
                                      facet="condition", query="condition in ('no_b_q', 'no_b_k', 'no_key_prior')",
                                      title=f"{ctx.name}: how much removing each bias changes the pattern on "
                                            "this input")],
                    top_tables=[TopTable("single_input_key_prior", ("layer", "head", "label", "key_prior_centered",
                                                                    "weight_intact", "weight_no_key_prior"),
                                         "key_prior_centered", "The keys the key prior favours most (rank 1 per head)",
                                         query="rank == 1")])]


STEPS["single_input"] = single_input_step


# ----- what training made: the model against untrained copies of its architecture (opt-in: n_random passes) ----

OPT_IN_STEPS = {"specialisation"}  # not run by default (the demo, the report): asked for by name


def _specialisation_step(ctx: Context) -> list[Section]:
    """``specialisation_test`` on the context's batches (``ctx.n_random`` untrained copies, default
    ``N_RANDOM``; quick mode: 3), its table and figure."""
    batches = ctx.first()
    n_random = 3 if ctx.quick else int(getattr(ctx, "n_random", None) or N_RANDOM)
    table = specialisation_test(ctx.model, batches, n_random=n_random, layers=ctx.layers, heads=ctx.heads,
                                progress=False)
    return [_specialisation_section(table, ctx.name, ctx.data_label(batches))]


def _specialisation_section(table: pd.DataFrame, name: str, label: str) -> Section:
    """The report's section of a ``specialisation_test`` table: each statistic against the untrained copies."""
    summary = table[table.weights == "trained"].set_index("statistic")
    per_stat = {stat: dict(trained=float(r.trained_value), untrained_mean=float(r.untrained_mean),
                          untrained_sd=float(r.untrained_sd), z=float(r.z), p_holm=float(r.p_holm),
                          specialised=bool(r.specialised)) for stat, r in summary.iterrows()}
    numbers = dict(per_stat, n_random=int(summary.n_random.iloc[0]), n_features=int(summary.n_features.iloc[0]))
    said = "; ".join(f"{stat} {r['trained']:.3g} against {r['untrained_mean']:.3g} +- {r['untrained_sd']:.2g} "
                     f"(z {r['z']:.1f}, Holm p {r['p_holm']:.3g})" for stat, r in per_stat.items())
    made = [stat for stat, r in per_stat.items() if r["specialised"]]
    verdict = (f"Beyond every untrained copy: {', '.join(made)}." if made else
               "Within what untrained copies of the architecture give: no specialisation that training made.")
    text = (f"The model against {numbers['n_random']} randomly initialised copies of its architecture on the same "
            f"data ({numbers['n_features']} features): {said}. {verdict}")
    return Section("specialisation", "Specialisation against the untrained architecture", text, numbers,
                   tables={"specialisation": table},
                   figures={"specialisation": plots.specialisation_figure(table, model_name=name, data=label)},
                   shown=["specialisation"], headline=verdict)


STEPS["specialisation"] = _specialisation_step
