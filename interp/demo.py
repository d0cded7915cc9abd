"""``interp demo``: the main job on one model, written as tables, figures and report.html.

Steps: bias inventory -> recording -> origin shift -> score decomposition and
invariances -> frequency profiles and head families -> q/k/v bias ablations.
"""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path
from typing import Optional

from interp.io import atomic_path, write_table


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" style="max-width:100%">'


def run_demo(model: Optional[str], data: Optional[str], out: Path, quick: bool = False) -> Path:
    import interp
    from interp.data import builtin_batches
    from interp.models.zoo import ZOO
    from interp.plots import key_prior_share_figure, origin_shift_figures, save_figure

    name = model or "dinov2-s14"
    if model is None and not ZOO[name].available():
        raise interp.errors.MissingWeightsError(
            f"{name} weights are not cached: run `make models` (interp fetch) first"
        )
    t0 = time.time()
    print(f"[1/7] loading {name}")
    m = interp.load_model(name)
    dataset = data or ("photos" if m.interp.modality == "vision" else "python-docs")
    n = 8 if quick else None
    batches = builtin_batches(m, dataset, batch_size=4, n=n)
    out.mkdir(parents=True, exist_ok=True)
    sections: list[tuple[str, str, Optional[Path]]] = []

    print("[2/7] bias inventory")
    spec = interp.bias_spec(m)
    write_table(spec, out / "bias_spec")
    present = spec[spec.present].groupby("kind").norm.agg(["count", "mean", "max"])
    kinds_present = ", ".join(present.index) or "none"
    sections.append(("Bias inventory", f"{name} ({m.interp.family}, {m.interp.n_layers} layers x "
                     f"{m.interp.n_heads} heads) has attention biases on: {kinds_present}. "
                     + "; ".join(f"mean ||b_{k}|| = {r['mean']:.2f} (max {r['max']:.2f})"
                                 for k, r in present.iterrows()), None))

    print(f"[3/7] recording Q/K/V statistics on {dataset}")
    stats = interp.record_qkv(m, batches)
    stats.save(out / "qkv_stats.safetensors")
    write_table(stats.to_frame(), out / "qkv_stats")

    print("[4/7] origin shift")
    origin = interp.origin_shift(m, stats)
    write_table(origin, out / "origin_shift")
    figs = origin_shift_figures(origin, name)
    paths = {k: save_figure(f, out / f"{k}.png") for k, f in figs.items()}
    med = origin.groupby("kind")[["shift_ratio", "bias_share"]].median()
    top = origin.sort_values("shift_ratio", ascending=False).iloc[0]
    sections.append(("Shift ratio", "How far each head's bias moves its origin, in units of the "
                     "RMS of the content XW. Median per kind: " + ", ".join(
                         f"{k}: {r.shift_ratio:.2f}" for k, r in med.iterrows())
                     + f". Largest: layer {top.layer}, head {top['head']}, {top.kind} ({top.shift_ratio:.2f}).",
                     paths["shift_ratio"]))
    sections.append(("Bias share", "Share of the head's origin E[XW + b] set by the bias rather "
                     "than by the data, ||b|| / (||b|| + ||E[X]W||). Median per kind: " + ", ".join(
                         f"{k}: {r.bias_share:.2f}" for k, r in med.iterrows()) + ".",
                     paths["bias_share"]))

    print("[5/7] score decomposition and invariances")
    dec = interp.score_decomposition(m, batches[:1] if quick else batches[:2])
    write_table(dec, out / "score_decomposition")
    kp_path = save_figure(key_prior_share_figure(dec, name), out / "key_prior_share.png")
    shares = dec.groupby("term").share.mean()
    sections.append(("Key prior", "Share of within-row score variance carried by the key-prior term "
                     f"b_q . x_j W_k (mean over heads {shares.get('key_prior', 0):.3f}; content "
                     f"{shares.get('content', 0):.3f}; query_const and const "
                     f"{shares.get('query_const', 0) + shares.get('const', 0):.2e}, which softmax cancels "
                     "without rotary positions).", kp_path))
    inv = interp.bias_invariances(m, batches[:1], progress=True)
    write_table(inv, out / "bias_invariances")
    worst = inv.groupby("check").max_abs_diff.max()
    sections.append(("Invariances (float64)", "Removing b_k changes the pattern by at most "
                     f"{worst.get('k_bias_pattern', float('nan')):.2e}; folding b_v into b_O changes "
                     f"the output by at most {worst.get('v_bias_fold', float('nan')):.2e}. "
                     + ("With rotary positions b_k is not inert." if m.interp.rotary else
                        "b_k is inert weight here: removing it is free."), None))

    print("[6/7] frequency profiles and head families")
    from interp.plots import (
        ablation_figures, attention_distance_figure, cluster_grid_figure, spectrum_clustermap,
    )

    shift = interp.frequency_shift_under_ablation(m, batches[:2], kinds=("q",))
    prof = interp.frequency_profile(m, batches[:2])
    clustered = interp.cluster_heads(prof)
    write_table(clustered, out / "frequency_profile")
    write_table(shift, out / "frequency_shift_q_bias")
    fam = clustered.groupby("cluster")[["hf_ratio", "mean_attention_distance"]].mean()
    unit = clustered.distance_unit.iloc[0]
    sections.append(("Head families", f"k = {clustered.k.iloc[0]} families by frequency profile "
                     f"(mean silhouette {clustered.silhouette_mean.iloc[0]:.2f}); " + "; ".join(
                         f"cluster {c}: hf_ratio {r.hf_ratio:.3f}, distance {r.mean_attention_distance:.1f} {unit}"
                         for c, r in fam.iterrows()) + ". Cluster 0 is the most low-pass.",
                     save_figure(cluster_grid_figure(clustered, name), out / "clusters.png")))
    per_layer = clustered.groupby("layer").mean_attention_distance.mean()
    sections.append(("Mean attention distance", "Per head against layer (ViT paper, Figure 7 style). "
                     f"Layer means range {per_layer.min():.1f}-{per_layer.max():.1f} {unit}. "
                     f"Removing each head's b_q moves its distance by {shift.delta_mean_attention_distance.mean():+.2f} "
                     f"{unit} on average (max |change| {shift.delta_mean_attention_distance.abs().max():.2f}) and its "
                     f"hf_ratio by {shift.delta_hf_ratio.abs().mean():.4f} on average.",
                     save_figure(attention_distance_figure(clustered, name), out / "attention_distance.png")))
    sections.append(("Spectra", "Log amplitude (relative to DC) of each head's output over radial "
                     "frequency bins; rows are heads, coloured by family.",
                     save_figure(spectrum_clustermap(clustered, name), out / "spectrum_clustermap.png")))

    print("[7/7] q/k/v bias ablations (zero, exact)")
    from interp.ablation import ablate_bias

    abl_batches = batches[:1] if quick else batches[:2]
    results = ablate_bias(m, abl_batches, kinds=("q", "k", "v"), method="zero", out=out / "ablation")
    write_table(results, out / "ablation")
    figs = ablation_figures(results, name)
    top = results.assign(a=results.delta.abs()).nlargest(3, "a")
    by_kind = results.groupby("kind").delta.apply(lambda d: d.abs().max())
    sections.append(("Bias ablations", f"Zero-ablating one head's bias at a time ({results.metric.iloc[0]}, "
                     f"baseline {results.baseline.iloc[0]:.4f}). Largest |delta| per kind: " + ", ".join(
                         f"{k}: {v:.2e}" for k, v in by_kind.items()) + ". Most bias-dependent heads: " + "; ".join(
                         f"L{r.layer} H{r['head']} {r.kind} ({r.delta:+.2e})" for _, r in top.iterrows()) + ".",
                     save_figure(figs["ablation_top_zero_exact"], out / "ablation_top.png")))
    save_figure(figs["ablation_delta_zero_exact"], out / "ablation_delta.png")

    body = "\n".join(
        f"<h2>{html.escape(title)}</h2>\n<p>{html.escape(text)}</p>\n" + (_img(p) if p else "")
        for title, text, p in sections
    )
    report = out / "report.html"
    with atomic_path(report) as tmp:
        tmp.write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><title>interp demo: {html.escape(name)}</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}</style>"
            f"</head><body><h1>QKV bias report: {html.escape(name)} on {html.escape(dataset)}</h1>\n{body}"
            f"<p><small>{stats.count(stats.layers[0])} tokens/patches; {time.time() - t0:.0f}s.</small></p>"
            "</body></html>"
        )
    print(f"wrote {report} and tables/figures in {out} ({time.time() - t0:.0f}s)")
    return report
