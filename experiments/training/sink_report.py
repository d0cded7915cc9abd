"""The sink experiment's tables in the style of Gu et al. 2024's Table 4, and its figures.

Everything here is drawn from ``summary.csv`` / ``runs.csv`` / ``layers.csv`` (``sink_results``);
nothing is computed but formatting, and ``docs/findings.md`` quotes ``findings_tables`` verbatim
(a test keeps them equal).
"""

from __future__ import annotations

import math
import textwrap
from typing import Any, Optional

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from interp.figures import colours
from interp.analysis.sinks import NEAR_BAND, SINK_THRESHOLD, THRESHOLDS
from experiments.training.sink_arms import TEXT_ARMS, VISION_ARMS
from experiments.training.results import t_interval

ADDS = {
    ("text", "none"): "nothing (no q, k, v, o bias)",
    ("text", "qkv"): "q, k, v bias (o bias held at 0)",
    ("text", "kv_slot"): "a learnable key/value slot per head",
    ("text", "k_slot_v0"): "a learnable key slot, value fixed at 0",
    ("text", "sink_token"): "a learnable token before every sequence",
    ("vision", "none"): "nothing (no q, k, v bias; o bias)",
    ("vision", "qkv"): "q, k, v bias",
    ("vision", "kv_slot"): "a learnable key/value slot per head",
    ("vision", "registers"): "4 register tokens after CLS",
}
ARMS = {"text": TEXT_ARMS, "vision": VISION_ARMS}
TARGET = {"kv_slot": "slot", "k_slot_v0": "slot", "sink_token": "first", "registers": "registers"}


def _value(summary: pd.DataFrame, domain: str, arm: str, metric: str) -> pd.Series:
    row = summary[(summary.domain == domain) & (summary.arm == arm) & (summary.metric == metric)]
    return row.iloc[0] if len(row) else pd.Series(dtype=float)


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _num(x: float, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _interval(r: pd.Series, scale: float, digits: int, signed: bool = False, paired: bool = False) -> str:
    keys = ("paired_diff", "paired_ci95_low", "paired_ci95_high") if paired else ("mean", "ci95_low", "ci95_high")
    m, lo, hi = (float(r[k]) * scale for k in keys)
    f = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
    if math.isnan(m):
        return "-"
    if math.isnan(lo) or math.isnan(hi):  # a t-interval needs two seeds
        return f"{f.format(m)} (under 2 seeds: no interval)"
    return f"{f.format(m)} [{f.format(lo)}, {f.format(hi)}]"


QUALITY = {"text": ("val_loss", 1, 3), "vision": ("accuracy", 100, 2)}  # metric, scale, digits
FIRST = {"text": "first_text", "vision": "first"}


HEADERS = {
    "text": ["heads sinking on the first byte (%)", "on the slot / sink token (%)",
             "mass on the first byte: mean / mean of each seed's largest head",
             "on the slot / sink token: mean / mean of each seed's largest head",
             "max / median activation", "validation loss (nats/byte) [95% CI]", "paired difference to `none` [95% CI]"],
    "vision": ["heads sinking on CLS (%)", "on the slot / registers (%)",
               "mass on CLS: mean / mean of each seed's largest head",
               "on the slot / registers: mean / mean of each seed's largest head", "max / median activation",
               "test accuracy (%) [95% CI]", "paired difference to `none` (pp) [95% CI]"],
}


def _cells(summary: pd.DataFrame, domain: str, arm: str) -> tuple[list[str], list[float]]:
    """One arm's cells under ``HEADERS[domain]`` (shares and masses on the first position and on the
    arm's own target, the largest activation ratio, the quality metric and its paired difference to
    ``none``), and the four attention numbers behind the first cells (shares, largest head masses)."""
    def v(metric: str) -> float:
        return float(_value(summary, domain, arm, metric).get("mean", np.nan))

    target, first = TARGET.get(arm), FIRST[domain]
    nan = float("nan")
    share_f, share_t = v(f"sink_share_{first}"), v(f"sink_share_{target}") if target else nan
    top_f, top_t = v(f"max_head_mass_{first}"), v(f"max_head_mass_{target}") if target else nan
    metric, scale, digits = QUALITY[domain]
    quality = _value(summary, domain, arm, metric)
    cells = [_pct(share_f), _pct(share_t), f"{_num(v(f'mean_mass_{first}'))} / {_num(top_f)}",
             f"{_num(v(f'mean_mass_{target}'))} / {_num(top_t)}" if target else "-",
             _num(v("max_over_median"), 1), _interval(quality, scale, digits),
             "(reference)" if arm == "none" else _interval(quality, scale, digits, signed=True, paired=True)]
    return cells, [share_f, share_t, top_f, top_t]


def _arms(summary: pd.DataFrame, domain: str) -> list[str]:
    return [a for a in ARMS[domain] if a in set(summary[summary.domain == domain].arm)]


def value_bias_table(summary: pd.DataFrame) -> str:
    """The implicit value bias beside the explicit ones (head means at the last step, residual units)."""
    lines = ["| domain | arm | implicit, through the first position: ‖mean_i c_i‖ | explicit: ‖b_v W_O‖ "
             "| the slot's constant: ‖mean_i a_i* v* W_O‖ |", "| --- | --- | --- | --- | --- |"]
    for domain in [d for d in ARMS if d in set(summary.domain)]:
        for arm in _arms(summary, domain):
            v = {m: float(_value(summary, domain, arm, m).get("mean", np.nan))
                 for m in ("implicit_norm", "explicit_norm", "slot_norm")}
            explicit = _num(v["explicit_norm"], 4) if arm == "qkv" else "-"
            slot = _num(v["slot_norm"], 4)
            lines.append(f"| {domain} | `{arm}` | {_num(v['implicit_norm'], 4)} | {explicit} | {slot} |")
    return "\n".join(lines)


def findings_tables(summary: pd.DataFrame) -> str:
    """Both Table-4-style tables and the value-bias table (markdown) from ``summary.csv``: means over
    seeds at the last step; shares = % of heads with mean mass > ``SINK_THRESHOLD`` on the position;
    "largest head" = the mean over seeds of each seed's largest head (the largest mean mass one head
    puts there); 95% t-intervals."""
    out = []
    for domain in [d for d in ARMS if d in set(summary.domain)]:
        part = summary[summary.domain == domain]
        out += ["" if out else None, f"{domain.capitalize()} ({int(part.n_seeds.max())} seeds, step "
                f"{int(part.step.max())}):", "", "| arm | adds | " + " | ".join(HEADERS[domain]) + " |",
                "| --- | --- | " + " | ".join("---" for _ in HEADERS[domain]) + " |"]
        out += [f"| `{arm}` | {ADDS[(domain, arm)]} | " + " | ".join(_cells(summary, domain, arm)[0]) + " |"
                for arm in _arms(summary, domain)]
    out += ["", "Value biases (head means, residual-stream units):", "", value_bias_table(summary)]
    return "\n".join(line for line in out if line is not None)


def bounds(frame: pd.DataFrame, column: str) -> tuple[pd.Series, pd.Series]:
    """(low, high) of a mass column: ``<column>_low`` / ``_high`` where a table measured before the own row was left out
    could only bound it (``backcopy_results.floor_heads``), else the column itself twice."""
    if f"{column}_low" not in frame:
        return frame[column], frame[column]
    return frame[f"{column}_low"].fillna(frame[column]), frame[f"{column}_high"].fillna(frame[column])


def count_cell(frame: pd.DataFrame, column: str, threshold: float = SINK_THRESHOLD) -> str:
    """Heads over ``threshold``: one number, or ``low-high`` where bounded masses leave it open; - if unmeasured."""
    low, high = bounds(frame, column)
    if high.isna().all():
        return "-"
    a, b = int((low > threshold).sum()), int((high > threshold).sum())
    return str(a) if a == b else f"{a}-{b}"


def mass_cell(exact: float, high: float) -> str:
    """A mass, or its upper bound (``<=``) where only that is known."""
    return _num(exact) if not math.isnan(exact) else ("-" if math.isnan(high) else f"<={high:.3f}")


def _floor_row(part: pd.DataFrame, cls: str) -> list[str]:
    """One position's cells of ``floor_table``."""
    col = f"mass_{cls}"
    low, high = bounds(part, col)
    exact = part[col].notna().all()
    mean = mass_cell(float(part[col].mean()) if exact else np.nan, float(high.mean()))
    top = mass_cell(float(part[col].max()) if exact else np.nan, float(high.max()))
    per_seed = " / ".join(count_cell(p, col) for _, p in part.sort_values("seed").groupby("seed"))
    over = " / ".join(count_cell(part, col, t) for t in THRESHOLDS)
    near = int((((low - SINK_THRESHOLD).abs() <= NEAR_BAND) & ((high - SINK_THRESHOLD).abs() <= NEAR_BAND)).sum())
    return [f"{float(part[f'uniform_{cls}'].iloc[0]):.3f}", f"{mean} / {top}", per_seed, over, str(near)]


def floor_table(heads: pd.DataFrame) -> str:
    """Against the floor, at each domain's last step, from ``heads.csv`` in the current schema
    (``sink_results.floor_heads``): per arm and position (the first byte or CLS; the arm's own target),
    the uniform floor, the mean mass over heads and seeds and the largest head of any seed (``<=``: an
    upper bound, where the stored masses were measured with the position's own row), heads over
    ``SINK_THRESHOLD`` per seed, over each of ``THRESHOLDS`` (all seeds; ``a-b`` where bounds leave it
    open) and within ``NEAR_BAND`` of the threshold."""
    seeds = " / ".join(str(s) for s in sorted(set(heads.seed)))
    head = ["domain", "arm", "position", "uniform floor", "mass: mean / largest head of any seed",
            f"heads over {SINK_THRESHOLD} (seeds {seeds})",
            f"over {' / '.join(f'{t:g}' for t in THRESHOLDS)} (all seeds)",
            f"within {NEAR_BAND} of {SINK_THRESHOLD}"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for domain in [d for d in ARMS if d in set(heads.domain)]:
        last = heads[(heads.domain == domain) & (heads.step == heads[heads.domain == domain].step.max())]
        for arm in _arms(last.assign(metric=""), domain):
            part = last[last.arm == arm]
            for cls in [FIRST[domain]] + ([TARGET[arm]] if arm in TARGET and TARGET[arm] != FIRST[domain] else []):
                label = "sink token" if arm == "sink_token" and cls == "first" else POSITION_LABELS[cls]
                lines.append(f"| {domain} | `{arm}` | {label} | " + " | ".join(_floor_row(part, cls)) + " |")
    return "\n".join(lines)


# ----- figures ------------------------------------------------------------------------------------------


POSITION_LABELS = {"first_text": "first byte", "first": "CLS", "slot": "slot", "registers": "registers"}


def sink_candidates(runs: pd.DataFrame, heads: pd.DataFrame) -> pd.DataFrame:
    """Long form: per run, step and candidate position (first byte or CLS; the slot, the sink token
    or the registers where the arm has one): ``mean_mass`` (mean over heads), ``largest_head`` (the
    largest mean mass one head puts there) and ``sink_share`` (heads above ``SINK_THRESHOLD``)."""
    keys = ["domain", "arm", "seed", "step"]
    top = heads.groupby(keys)[[f"mass_{c}" for c in POSITION_LABELS]].max().reset_index()
    merged = runs.merge(top, on=keys, how="left")
    rows = []
    for _, r in merged.iterrows():
        classes = ["first_text" if r.domain == "text" else "first"] + ([TARGET[r.arm]] if r.arm in TARGET else [])
        for cls in classes:
            label = "sink token" if r.arm == "sink_token" and cls == "first" else POSITION_LABELS[cls]
            rows.append(dict(domain=r.domain, arm=r.arm, seed=r.seed, step=r.step, position=label,
                             mean_mass=r[f"mean_mass_{cls}"], largest_head=r[f"mass_{cls}"],
                             sink_share=r[f"sink_share_{cls}"]))
    return pd.DataFrame(rows)


PANELS = [("mean_mass", "mean attention mass, mean over heads (share of a row)"),
          ("largest_head", "largest head's mean attention mass (share of a row)"),
          ("sink_share", f"heads with mean mass > {SINK_THRESHOLD} (share of heads)")]


def sink_share_figure(runs: pd.DataFrame, heads: pd.DataFrame, scale: str,
                      context: Optional[int] = None) -> plt.Figure:
    """Attention on each arm's sink candidates vs training step: mean over heads, the largest head
    and Gu et al.'s sink share, per domain, arm and position; the mass panels mark the threshold
    and, for text, the first byte's mass under uniform causal attention, (1/n) sum_{i=1..n} 1/i."""
    long = sink_candidates(runs, heads)
    domains = [d for d in ARMS if d in set(long.domain)]
    fig, axes = plt.subplots(len(domains), 3, figsize=(18, 4.6 * len(domains)), squeeze=False)
    for i, domain in enumerate(domains):
        part = long[long.domain == domain]
        for j, (value, label) in enumerate(PANELS):
            ax = axes[i, j]
            sns.lineplot(data=part, x="step", y=value, hue="arm", style="position", errorbar=("pi", 100),
                         markers=True, dashes=True, hue_order=[a for a in ARMS[domain] if a in set(part.arm)], ax=ax)
            ax.set_xlabel("training step (optimiser updates)")
            ax.set_ylabel(label)
            if value != "sink_share":
                ax.axhline(SINK_THRESHOLD, color="0.4", ls="--", lw=0.8, label=f"sink threshold {SINK_THRESHOLD}")
                if domain == "text" and context:
                    ax.axhline(sum(1 / k for k in range(1, context + 1)) / context, color="0.6", ls=":", lw=1,
                               label="first byte, uniform attention")
                ax.set_ylim(0, max(0.35, float(part[value].max()) * 1.1))
            else:
                ax.set_ylim(-0.02, 1.02)
            ax.set_title(f"{domain}: {label.split(' (')[0]}", fontsize=10)
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"Attention on the sink candidates over training ({scale}); bands: range over seeds")
    fig.tight_layout()
    return fig


def massive_figure(layers: pd.DataFrame, scale: str) -> plt.Figure:
    """Largest |residual value| / median |value| per layer and arm at the last step (log scale)."""
    last = layers[layers.step == layers.groupby("domain").step.transform("max")]
    domains = list(last.domain.unique())
    fig, axes = plt.subplots(1, len(domains), figsize=(6.5 * len(domains), 4.2), squeeze=False)
    for ax, domain in zip(axes[0], domains):
        order = [a for a in ARMS[domain] if a in set(last[last.domain == domain].arm)]
        sns.pointplot(data=last[last.domain == domain], x="layer", y="max_over_median", hue="arm", hue_order=order,
                      errorbar=("pi", 100), dodge=0.4 if len(order) > 1 else False, ax=ax)  # seaborn: 1 arm, no dodge
        ax.set_yscale("log")
        ax.set_xlabel("layer (residual stream after the block)")
        ax.set_ylabel("max |value| / median |value| (ratio, log scale)")
        ax.axhline(1000, color="0.5", ls="--", lw=0.8)
        ax.set_title(f"{domain}: massive activations (Sun et al.: > 1000 and > 100 in value)")
    fig.suptitle(f"Massive activations per layer at the last step ({scale}; bars: range over seeds)")
    fig.tight_layout()
    return fig


def table_cells(summary: pd.DataFrame, domain: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(text of each cell, the attention number behind it or NaN) of one domain's Table-4-style table:
    rows arms, columns ``HEADERS[domain]``; the same cells as ``findings_tables``."""
    arms, columns = _arms(summary, domain), [textwrap.fill(h, 17) for h in HEADERS[domain]]
    text = pd.DataFrame("", index=arms, columns=columns)
    share = pd.DataFrame(np.nan, index=arms, columns=columns)
    for arm in arms:
        cells, numbers = _cells(summary, domain, arm)
        text.loc[arm] = [c.replace(" [", "\n[") for c in cells]
        share.loc[arm, columns[:4]] = numbers
    return text, share


def table_figure(summary: pd.DataFrame) -> plt.Figure:
    """``findings_tables`` as a figure: rows arms, columns measures, every cell's number written in it;
    the attention columns coloured by the library's colour rule (``interp.figures.colours``: viridis, bright = large,
    on 0-1 in every panel): the two share-of-heads columns as ``head_share``, the two mass columns (mean /
    largest head) by the largest head's mass as ``mass``; the other columns left white. Text is white on the
    dark end of the map, black elsewhere."""
    domains = [d for d in ARMS if d in set(summary.domain)]
    fig, axes = plt.subplots(len(domains), 1, figsize=(12, 3.4 * len(domains) + 0.4), squeeze=False)
    label = "share of heads (first 2 columns)\nor largest head's mass (next 2), 0 to 1"
    for ax, domain in zip(axes[:, 0], domains):
        text, share = table_cells(summary, domain)
        meshes = []
        for quantity, cols in (("head_share", share.columns[:2]), ("mass", share.columns[2:4])):
            rule = colours.RULES[quantity]
            part = share[list(cols)].reindex(columns=share.columns)  # NaN (white) outside its columns
            meshes.append(colours.heatmap(ax, part, rule, *colours.limits(rule, part.to_numpy(float)),
                                          cbar=quantity == "mass", cbar_label=label, linewidths=0.5, linecolor="0.8"))
        for i, arm in enumerate(text.index):
            for j, col in enumerate(text.columns):
                value = share.loc[arm, col]
                mesh = meshes[0] if j < 2 else meshes[1]
                dark = np.isfinite(value) and colours.luminance(mesh.cmap(mesh.norm(value))) < 0.45
                ax.text(j + 0.5, i + 0.5, text.loc[arm, col], ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
        ax.set_xlabel(f"measure (mean over seeds at the last step; shares: heads with mean mass > {SINK_THRESHOLD})")
        ax.set_ylabel("arm")
        ax.tick_params(axis="x", labelsize=8, labelrotation=0)
        ax.tick_params(axis="y", labelrotation=0)
        part = summary[summary.domain == domain]
        n, step = int(part.n_seeds.max()), int(part.step.max())
        ax.set_title(f"{domain}: Gu et al. 2024 Table 4 at this scale ({n} seeds, step {step})")
    fig.tight_layout()
    return fig


def model_card(runs: pd.DataFrame, recipe: Any, fingerprint: str, corpus_sha256: str) -> str:
    """``data/sinks/MODEL_CARD.md``: what the shipped seed-0 text arms are, how they were trained,
    their validation loss (from ``runs.csv``) and how to load them."""
    s = recipe.shape
    last = runs[(runs.domain == "text") & (runs.seed == 0)]
    last = last[last.step == last.step.max()].set_index("arm")
    lines = [
        "# Sink-experiment language models (issue 27), seed 0", "",
        f"Five tiny LLaMA-style byte-level language models ({s.n_layers} layers x {s.n_heads} heads, width "
        f"{s.d_model}, MLP {s.d_ff}, context {s.context}, rotary, RMSNorm, vocabulary 256 bytes + 1 sink id), "
        f"one per arm of `experiments/train_sinks.py`, trained from the same initialisation on the same "
        f"{recipe.steps} batches of {recipe.batch} windows of the running interpreter's standard-library "
        f"source (`experiments.training.corpus`, sha256 {corpus_sha256[:16]}...; PSF licence). Recipe fingerprint "
        f"`{fingerprint}`. Stored in float16 (about half the bytes; loaded as float32).", "",
        "```python", "from experiments.training.sink_arms import load_sink_lm",
        "model = load_sink_lm(\"kv_slot\")   # none | qkv | kv_slot | k_slot_v0 | sink_token", "```", "",
        "| arm | adds | validation loss at the last step (nats/byte) | first-byte mass | slot / sink-token mass |",
        "| --- | --- | --- | --- | --- |"]
    for arm in [a for a in TEXT_ARMS if a in last.index]:
        r, target = last.loc[arm], TARGET.get(arm)
        lines.append(f"| `{arm}` | {ADDS[('text', arm)]} | {r.val_loss:.4f} | {r.mean_mass_first_text:.3f} | "
                     f"{_num(r[f'mean_mass_{target}']) if target else '-'} |")
    lines += ["", "The validation loss above is the float32 model's; the float16 file reproduces it within "
              "0.05 nats (`experiments/tests/test_sink_shipped.py`, slow). Intended use: studying attention sinks "
              "in a controlled setting; they are far too small to be useful language models."]
    return "\n".join(lines) + "\n"


# ----- issue 32's text rerun: the count baseline, the stopping rule, every seed ----------------------------


def _range(values: pd.Series, digits: int) -> str:
    """``min-max`` over seeds: for quantities that cannot be negative (counts, masses, ratios), where a
    t-interval over 2-3 seeds could reach below 0."""
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:.{digits}f}" if lo == hi else f"{lo:.{digits}f}-{hi:.{digits}f}"


def baseline_table(baseline: pd.DataFrame) -> str:
    """The count models (``baseline.csv``): one row per order, the best in bold."""
    lines = ["| count model: order n (bytes of context + 1) | Kneser-Ney discount (tuned on the last tenth of "
             "the training split) | that tenth (nats/byte) | validation windows (nats/byte) |",
             "| --- | --- | --- | --- |"]
    for _, r in baseline.iterrows():
        val = f"**{r.val_nats_per_byte:.3f}** (best)" if r.best else f"{r.val_nats_per_byte:.3f}"
        lines.append(f"| {int(r.n)} | {r.discount:.2f} | {r.tune_nats_per_byte:.3f} | {val} |")
    return "\n".join(lines)


def seed_rows(runs: pd.DataFrame, heads: pd.DataFrame) -> pd.DataFrame:
    """Long form, per text arm, seed and measured step: ``n_heads``, the heads sinking (mean mass
    > ``SINK_THRESHOLD``) on the first byte and on the arm's own target (slot or sink token; NaN where none), the
    largest head's mass on each, the validation loss and the largest max/median activation ratio."""
    keys = ["arm", "seed", "step"]
    h = heads[heads.domain == "text"].copy()
    h["target"] = np.nan
    for arm, cls in TARGET.items():
        h.loc[h.arm == arm, "target"] = h.loc[h.arm == arm, f"mass_{cls}"]
    g = h.groupby(keys)
    frame = pd.DataFrame({
        "n_heads": g.size(),
        "sinks_first_byte": g.mass_first_text.apply(lambda m: int((m > SINK_THRESHOLD).sum())),
        "sinks_target": g.target.apply(lambda m: float((m > SINK_THRESHOLD).sum()) if m.notna().all() else np.nan),
        "largest_first_byte": g.mass_first_text.max(),
        "largest_target": g.target.max(),
    }).reset_index()
    r = runs[runs.domain == "text"][keys + ["val_loss", "max_over_median"]]
    return frame.merge(r, on=keys, how="left")


def seed_table(runs: pd.DataFrame, heads: pd.DataFrame, rule: Optional[pd.DataFrame] = None) -> str:
    """Every text run at the last step (markdown): validation loss, whether it met the stopping rule
    (with ``rule``), the heads sinking (mean mass > ``SINK_THRESHOLD``) on the first byte and on the slot or sink
    token, the largest head's mass on each, and the max / median activation ratio at step 0 and at
    the end (step 0 is that ratio's noise floor: an untrained model's)."""
    rows = seed_rows(runs, heads)
    last_step = int(rows.step.max())
    last, first = rows[rows.step == last_step], rows[rows.step == 0].set_index(["arm", "seed"])
    n_heads = int(rows.n_heads.max())
    met = ["rule met | "] if rule is not None else [""]
    out = [f"| arm | seed | validation loss (nats/byte) | {met[0]}heads sinking on the first byte (of {n_heads}) "
           f"| on the slot / sink token (of {n_heads}) | largest head on the first byte | on the slot / sink token "
           "| max / median activation: step 0 -> last |",
           "| --- | --- | --- | " + ("--- | " if rule is not None else "") + "--- | --- | --- | --- | --- |"]
    rule = rule.set_index(["arm", "seed"]) if rule is not None else None
    for arm in [a for a in TEXT_ARMS if a in set(last.arm)]:
        for _, r in last[last.arm == arm].sort_values("seed").iterrows():
            cell = "" if rule is None else ("yes | " if rule.loc[(arm, r.seed)].met else "no | ")
            tgt = "-" if np.isnan(r.sinks_target) else str(int(r.sinks_target))
            out.append(f"| `{arm}` | {int(r.seed)} | {r.val_loss:.3f} | {cell}{int(r.sinks_first_byte)} | {tgt} | "
                       f"{r.largest_first_byte:.3f} | {_num(r.largest_target)} | "
                       f"{first.loc[(arm, r.seed)].max_over_median:.1f} -> {r.max_over_median:.1f} |")
    return "\n".join(out)


def rerun_tables(runs: pd.DataFrame, heads: pd.DataFrame, baseline: pd.DataFrame, rule: pd.DataFrame) -> str:
    """The text rerun (the stopping rule) as markdown, from its CSVs: the count models, every seed at the last step
    (``seed_table`` with the stopping rule), the means over seeds (validation loss: t-intervals;
    counts and masses, which cannot be negative: the range over seeds) and the verdict line the rule
    allows."""
    rows = seed_rows(runs, heads)
    last_step, arms = int(rows.step.max()), [a for a in TEXT_ARMS if a in set(rows.arm)]
    last = rows[rows.step == last_step]
    target = float(rule.target.iloc[0])
    out = [baseline_table(baseline), "",
           f"Every run at step {last_step} (stopping rule: validation loss at or below the best count model "
           f"- {float(rule.margin.iloc[0]):.1f} = {target:.3f} nats/byte):", "", seed_table(runs, heads, rule),
           "", f"Over seeds at step {last_step} (validation loss: mean [95% t-interval]; counts and masses: "
           "range over seeds, since a t-interval over so few seeds would reach below 0):", "",
           "| arm | seeds | validation loss | paired difference to `none` | heads sinking on the first byte "
           "| on the slot / sink token | largest head on the first byte | on the slot / sink token |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    wide = last.pivot_table(index="seed", columns="arm", values="val_loss")
    for arm in arms:
        part = last[last.arm == arm]
        d = "(reference)" if arm == "none" else (_mean_ci((wide[arm] - wide["none"]).dropna(), "{:+.3f}")
                                                 if "none" in wide else "-")
        tgt = "-" if part.sinks_target.isna().all() else _range(part.sinks_target, 0)
        big = "-" if part.largest_target.isna().all() else _range(part.largest_target, 3)
        out.append(f"| `{arm}` | {len(part)} | {_mean_ci(wide[arm].dropna(), '{:.3f}')} | {d} | "
                   f"{_range(part.sinks_first_byte, 0)} "
                   f"| {tgt} | {_range(part.largest_first_byte, 3)} | {big} |")
    init = rows[rows.step == 0].max_over_median
    out += ["", verdict_line(rule, baseline) + f" Max / median activation at initialisation: "
            f"{_range(init, 1)} over every run (the noise floor of that ratio for this model and probe)."]
    return "\n".join(out)


def _mean_ci(values: pd.Series, fmt: str) -> str:
    """``mean [low, high]`` (95% t-interval), or the one value and "(one seed)"."""
    m, lo, hi = t_interval(values)
    if len(values) < 2:
        return f"{fmt.format(m)} (one seed)" if len(values) else "-"
    return f"{fmt.format(m)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def verdict_line(rule: pd.DataFrame, baseline: pd.DataFrame) -> str:
    """What the stopping rule allows: a verdict only where every run met it."""
    best = baseline.loc[baseline.val_nats_per_byte.idxmin()]
    met = int(rule.met.sum())
    head = (f"Best count model: order {int(best.n)}, {best.val_nats_per_byte:.3f} nats/byte; the rule's target "
            f"{float(rule.target.iloc[0]):.3f}; met by {met} of {len(rule)} runs (lowest validation loss "
            f"{rule.val_loss.min():.3f}).")
    if met == len(rule):
        return head + " Every run met the rule: the sink counts above may be read as a verdict at this scale."
    return head + " No verdict: the networks did not get far enough past the count model for an absent sink " \
                  "to mean anything."


def loss_figure(runs: pd.DataFrame, baseline: pd.DataFrame, rule: pd.DataFrame, scale: str) -> plt.Figure:
    """Validation loss vs step per text arm and seed, with the best count model and the stopping
    rule's target (``baseline.csv``, ``rule.csv``) as horizontal lines."""
    text = runs[runs.domain == "text"]
    best = baseline.loc[baseline.val_nats_per_byte.idxmin()]
    fig, ax = plt.subplots(figsize=(8, 5))
    sns.lineplot(data=text, x="step", y="val_loss", hue="arm", units="seed", estimator=None, marker="o",
                 hue_order=[a for a in TEXT_ARMS if a in set(text.arm)], ax=ax)
    ax.axhline(float(best.val_nats_per_byte), color="0.3", ls="--", lw=1,
               label=f"best count model (order {int(best.n)}, Kneser-Ney)")
    ax.axhline(float(rule.target.iloc[0]), color="firebrick", ls=":", lw=1.2,
               label=f"stopping rule: {float(rule.margin.iloc[0]):.1f} below it")
    ax.set_ylim(max(0.0, float(rule.target.iloc[0]) - 0.2), min(float(text.val_loss.max()), 3.5) + 0.1)
    ax.set_xlabel("training step (optimiser updates)")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_title(f"Text arms against the count-model baseline ({scale}); one line per seed", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
