"""The Bigram-Backcopy control's findings tables and figure, drawn from ``runs.csv`` and ``gate.csv``
(``experiments.training.backcopy_results``): nothing is computed here but selection and formatting, and
``docs/findings.md`` quotes ``findings_tables`` verbatim (a test keeps them equal)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd

from interp.analysis.sinks import NEAR_BAND, SINK_THRESHOLD, THRESHOLDS, sink_counts
from experiments.training.backcopy import ARMS
from experiments.training.backcopy_results import common_step, summarise
from experiments.training.sink_report import bounds, count_cell, mass_cell

ADDS = {
    "none": "`<s>`, no bias",
    "kv_slot": "`<s>` and a learnable key/value slot per head",
    "k_slot_v0": "`<s>` and a learnable key slot per head, value fixed at 0",
    "none_no_start": "no `<s>` (counted on x_0, the first position)",
}
LABEL = {"start": "on <s> (x_0 without <s>)", "slot": "on the slot"}


def _fmt(x: float, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _counts(part: pd.DataFrame, column: str) -> str:
    return " / ".join("-" if math.isnan(v) else f"{v:.0f}" for v in part.sort_values("seed")[column])


def _seed_counts(heads: pd.DataFrame, column: str) -> str:
    return " / ".join(count_cell(part, column) for _, part in heads.sort_values("seed").groupby("seed"))


def _near(heads: pd.DataFrame, column: str) -> str:
    """Heads within ``NEAR_BAND`` of the threshold per seed (where the masses are known)."""
    cells = []
    for _, part in heads.sort_values("seed").groupby("seed"):
        low, high = bounds(part, column)
        near = ((low - SINK_THRESHOLD).abs() <= NEAR_BAND) & ((high - SINK_THRESHOLD).abs() <= NEAR_BAND)
        cells.append("-" if high.isna().all() else str(int(near.sum())))
    return " / ".join(cells)


def _row(summary: pd.DataFrame, arm: str, metric: str) -> pd.Series:
    return summary[(summary.arm == arm) & (summary.metric == metric)].iloc[0]


TARGET = {"none": "start", "kv_slot": "slot", "k_slot_v0": "slot", "none_no_start": "start"}


def _by_layer(heads: pd.DataFrame, arm: str, step: int) -> str:
    """Heads sinking on the arm's sink (``TARGET``) at ``step`` per layer, summed over seeds."""
    part = heads[(heads.arm == arm) & (heads.step == step)]
    return " / ".join(count_cell(part[part.layer == layer], f"mass_{TARGET[arm]}") for layer in sorted(set(part.layer)))


def _masses(part: pd.DataFrame, target: str) -> str:
    """mean over heads and seeds / the largest head of any seed [the uniform floor]."""
    col = f"mass_{target}"
    if part[col].isna().all() and f"{col}_low" not in part:
        return "-"
    high = bounds(part, col)[1]
    exact = part[col].notna().all()
    mean = mass_cell(float(part[col].mean()) if exact else math.nan, float(high.mean()))
    top = mass_cell(float(part[col].max()) if exact else math.nan, float(high.max()))
    return f"{mean} / {top} [{float(part[f'uniform_{target}'].iloc[0]):.3f}]"


def main_table(runs: pd.DataFrame, heads: pd.DataFrame, step: int) -> str:
    """One row per arm at ``step``: per-seed counts of sinking heads, masses, copy accuracy, loss."""
    summary, at = summarise(runs, step), runs[runs.step == step]
    seeds = " / ".join(str(s) for s in sorted(set(at.seed)))
    head = ["arm", "adds", f"heads sinking on `<s>` (seeds {seeds})", f"on the slot (seeds {seeds})",
            "sinking on its sink, layer 0 / 1 (all seeds)", f"within {NEAR_BAND} of {SINK_THRESHOLD} on its sink",
            "mass on `<s>`: mean / largest head of any seed [uniform floor]", "on the slot: mean / largest [floor]",
            "copy accuracy (%)", "loss (nats/token) [95% CI]", "bigram loss - floor"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for arm in [a for a in ARMS if a in set(at.arm)]:
        h = heads[(heads.arm == arm) & (heads.step == step)]
        v = lambda m: float(_row(summary, arm, m)["mean"])  # noqa: E731
        loss = _row(summary, arm, "loss")
        cells = [f"`{arm}`", ADDS[arm], _seed_counts(h, "mass_start"), _seed_counts(h, "mass_slot"),
                 _by_layer(heads, arm, step), _near(h, f"mass_{TARGET[arm]}"), _masses(h, "start"),
                 _masses(h, "slot"), _fmt(100 * v("copy_accuracy"), 1),
                 f"{loss['mean']:.3f} [{loss['ci95_low']:.3f}, {loss['ci95_high']:.3f}]",
                 f"{v('bigram_loss') - v('bigram_floor'):+.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def trajectory_table(runs: pd.DataFrame, heads: pd.DataFrame, steps: list[int]) -> str:
    """Per arm and target (``<s>``, slot): sinking heads per seed at each of ``steps`` (from ``heads``)."""
    seeds = " / ".join(str(s) for s in sorted(set(runs.seed)))
    head = ["arm", f"heads sinking (seeds {seeds})"] + [f"step {s}" for s in steps]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for arm in [a for a in ARMS if a in set(runs.arm)]:
        for target in ("start", "slot") if arm in ("kv_slot", "k_slot_v0") else ("start",):
            cells = [f"`{arm}`", "on the slot" if target == "slot" else ("on x_0" if arm == "none_no_start"
                                                                          else "on `<s>`")]
            for s in steps:
                cells.append(_seed_counts(heads[(heads.arm == arm) & (heads.step == s)], f"mass_{target}"))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gate_table(gate: pd.DataFrame) -> str:
    """Per slot-arm run: the trained model (gate 0) -> the slot removed (gate -inf)."""
    head = ["arm", "seed", "step", "loss (nats/token)", "copy accuracy (%)", "bigram loss",
            "heads sinking on `<s>` (of 8)", "mass on `<s>`: mean", "largest head on `<s>`", "mass on the slot: mean"]
    gate = gate.copy()
    for col in ("mean_mass_start", "max_mass_start", "sink_heads_start"):  # a table in the current schema
        gate[f"{col}_low"] = gate.get(f"{col}_low", gate[col])
        gate[f"{col}_high"] = gate.get(f"{col}_high", gate[col])
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    keys = ["arm", "seed"]
    opened = gate[gate.gate == "0.0"].set_index(keys)
    closed = gate[gate.gate == "-inf"].set_index(keys)
    for (arm, seed) in sorted(closed.index, key=lambda k: (ARMS.index(k[0]), k[1])):
        a, b = opened.loc[(arm, seed)], closed.loc[(arm, seed)]
        pair = lambda m, d=3, s=1.0: f"{_fmt(s * a[m], d)} -> {_fmt(s * b[m], d)}"  # noqa: E731
        mass = lambda r, m: mass_cell(r[m], r[f"{m}_high"])  # noqa: E731
        count = lambda r: (f"{r.sink_heads_start_low:.0f}" if r.sink_heads_start_low == r.sink_heads_start_high  # noqa: E731
                           else f"{r.sink_heads_start_low:.0f}-{r.sink_heads_start_high:.0f}")
        bound = lambda m: f"{mass(a, m)} -> {mass(b, m)}"  # noqa: E731
        lines.append("| " + " | ".join([f"`{arm}`", str(seed), str(int(a["step"])), pair("loss"),
                                        pair("copy_accuracy", 1, 100.0), pair("bigram_loss"),
                                        f"{count(a)} -> {count(b)}", bound("mean_mass_start"),
                                        bound("max_mass_start"), pair("mean_mass_slot")]) + " |")
    return "\n".join(lines)


def dormancy_table(heads: pd.DataFrame, step: int) -> str:
    """Per arm at ``step``, the heads sinking on the arm's sink (``TARGET``) and the others, over all
    seeds: their mean mass on the sink from the trigger queries (where the copy has work) and from
    the other queries, and on the previous token from the trigger queries (the token to copy)."""
    head = ["arm", "heads (all seeds)", "n", "mass on its sink: after a trigger / elsewhere",
            "mass on the previous token after a trigger"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    at = heads[heads.step == step]
    for arm in [a for a in ARMS if a in set(at.arm)]:
        part, target = at[at.arm == arm], TARGET[arm]
        sinking = part[f"mass_{target}"] > SINK_THRESHOLD
        for name, group in (("sinking", part[sinking]), ("the others", part[~sinking])):
            cells = [f"`{arm}`", name, str(len(group))]
            if len(group):
                cells += [f"{group[f'mass_{target}_active'].mean():.3f} / {group[f'mass_{target}_dormant'].mean():.3f}",
                          f"{group.mass_prev_active.mean():.3f}"]
            else:
                cells += ["-", "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def near_table(heads: pd.DataFrame, steps: list[int]) -> str:
    """Per arm (on its sink, ``TARGET``), seed and step: heads over 0.2 / ``SINK_THRESHOLD`` / 0.4 and within
    ``NEAR_BAND`` of the threshold (``interp.sink_counts`` of the masses; arms whose masses are bounded are
    left out)."""
    lines = ["| arm | seed | " + " | ".join(f"step {s}: > {' / '.join(f'{t:g}' for t in THRESHOLDS)} "
                                          f"(near {SINK_THRESHOLD:g})" for s in steps) + " |",
             "| --- | --- | " + " | ".join("---" for _ in steps) + " |"]
    for arm in [a for a in ARMS if a in set(heads.arm)]:
        col = f"mass_{TARGET[arm]}"
        part = heads[(heads.arm == arm) & heads.step.isin(steps)]
        if part[col].isna().any():
            continue
        counts = sink_counts(part, value=col, by=["seed", "step"]).set_index(["seed", "step", "threshold"])
        for seed in sorted(set(part.seed)):
            cells = [" / ".join(str(int(counts.loc[(seed, s, t), "n_sinks"])) for t in THRESHOLDS)
                     + f" ({int(counts.loc[(seed, s, SINK_THRESHOLD), 'n_near'])})" for s in steps]
            lines.append(f"| `{arm}` | {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def findings_tables(runs: pd.DataFrame, heads: pd.DataFrame, gate: pd.DataFrame) -> str:
    """The three tables ``docs/findings.md`` section 4d quotes, at the step every run has reached."""
    step = common_step(runs)
    steps = [s for s in sorted(set(runs.step)) if s <= step and (s % 500 == 0 or s == 250)]
    n = runs.seed.nunique()
    return (f"At step {step} ({n} seeds; a head sinks when its mean attention there exceeds {SINK_THRESHOLD}, "
            "the first position's own query row left out; 8 heads per model, 4 per layer; `<=`: an upper bound, "
            "where the stored masses (measured with that row) and no checkpoint leave only bounds):\n\n"
            + main_table(runs, heads, step)
            + "\n\nHeads sinking, per seed, during training:\n\n" + trajectory_table(runs, heads, steps)
            + "\n\nHow close the heads sit to the threshold (per seed, on each arm's sink):\n\n"
            + near_table(heads, [s for s in steps if s >= 1000])
            + f"\n\nWhere the heads look at step {step} (means over heads):\n\n" + dormancy_table(heads, step)
            + "\n\nThe causal check: the slot's gate at -inf (the slot removed exactly), same held-out sequences:\n\n"
            + gate_table(gate))


def sink_share_figure(runs: pd.DataFrame) -> plt.Figure:
    """Share of heads sinking vs step, one panel per arm: on the arm's sink (``<s>`` or x_0; the slot
    in slot arms, with ``<s>`` dashed), each seed thin, the mean over seeds thick."""
    arms = [a for a in ARMS if a in set(runs.arm)]
    fig, axes = plt.subplots(1, len(arms), figsize=(4 * len(arms), 3.6), sharey=True, squeeze=False)
    for ax, arm in zip(axes[0], arms):
        part = runs[runs.arm == arm]
        targets = [("slot", "-"), ("start", "--")] if arm in ("kv_slot", "k_slot_v0") else [("start", "-")]
        for target, style in targets:
            col, colour = f"sink_share_{target}", "tab:red" if target == "slot" else "tab:blue"
            for (seed, one), marker in zip(part.groupby("seed"), "osv^D"):
                ax.plot(one.step, 100 * one[col], style, color=colour, alpha=0.4, lw=1, marker=marker, ms=3)
            mean = part.groupby("step")[col].mean()
            name = "on x_0" if arm == "none_no_start" else LABEL[target].split(" (")[0]
            ax.plot(mean.index, 100 * mean.values, style, color=colour, lw=2.5, label=f"{name}: mean of seeds")
        ax.set_title(f"{arm}")
        ax.set_xlabel("training step")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_ylim(-3, 130)  # room for the legend above 100%
        ax.set_yticks(range(0, 101, 20))
    axes[0][0].set_ylabel(f"heads sinking (%; mean mass > {SINK_THRESHOLD})")
    fig.suptitle(f"Bigram-Backcopy: heads sinking vs step (2 layers x 4 heads; thin with markers: each of "
                 f"{runs.seed.nunique()} seeds, thick: their mean)")
    fig.tight_layout()
    return fig
