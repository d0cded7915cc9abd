"""The matched control's calls on untrained models, its tail on trained ones, and what it costs.

    python benchmarks/control_calibration.py             # -> docs/results/control_calibration.csv
    python benchmarks/control_calibration.py --tail      # -> docs/results/control_tail.csv
    python benchmarks/control_calibration.py --cost      # -> docs/results/control_cost.csv, <model>/ablation_fdr.csv

Calibration: randomly initialised small models of two architectures (GPT-2: q and v heads, b_k cancels; Qwen2, a
LLaMA-style model with rotary positions and QKV bias: q, k and v heads), 2 layers x 4 heads of width 32, float64,
every bias N(0, 0.5^2), so each head's bias is an isotropic Gaussian: exchangeable with the control's random
directions of its norm, and every head is null. One batch of 8 random sequences of 16 tokens per seed,
``ablate_bias(estimate="exact")`` at the defaults (19 draws, a head stopping once 5 are as large as its delta, the
normal tail for the rest, Benjamini-Hochberg across the heads). One row per architecture and seed: heads tested,
heads at p <= 0.05 before the adjustment (``called_unadjusted``: what the old per-head call would count with this
p), the old rule's calls (``called_old``: the Monte Carlo p of 19 draws <= 0.05, the same draws: a head stopped
early has 5 or more draws as large, so its 19-draw p is at least 6 / 20), heads called after the adjustment
(``called_adjusted``: bias_dependent), the smallest p, and the control forwards run against the old rule's 19 a
head. GPT-2 rows add a planted head (``planted_*``): the same seed's model with head 1 of layer 1 writing only along
its own b_v (W_O's rows for the head = b_v's unit vector times a random vector), so its bias direction matters and a
random direction of the same norm moves it about 1/sqrt(32) as much; its own p, adjusted p and call, and the other
heads' calls in that model.

Tail (``--tail``): the normal tail is a model of the control's draws, so it is checked on the draws of trained
models too. At the defaults' exact heads (``estimate="auto"``: 5 top and 5 sampled heads per kind) of MiniLM
(minilm-l6, 2 batches of 8 python-docs texts) and the demo's setting (dinov2-s14, 2 photographs), every head draws
``--draws`` controls (no early stop; draw d is the same draw a default run takes). The draws of one head are
exchangeable with each other, so each draw in turn is a null "delta" against 19 others of the same head: the
fraction of those null p at or below u, over ``LOO_SETS`` random choices per head, divided by u (1: calibrated;
above 1: too many calls) at u = 0.05, 0.01 and 0.0025 (= 0.05 / 20, what a correction over 20 heads asks of the
smallest p); the draws' skewness and excess kurtosis (0 for a normal).

Cost (``--cost``): ``ablate_bias`` at its defaults on MiniLM and on the demo's setting (as above): heads tested,
control forwards at the defaults against the old rule's (19 a head), calls before and after; per setting the heads
run exactly with their p, Monte Carlo p, adjusted p and the old call: ``docs/results/<model>/ablation_fdr.csv``.
Seconds: one run each on a shared 2-core CPU (read the forwards).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import torch

import interp
import interp.ablation.sweep as sweep
from interp.ablation.options import SweepOptions
from interp.ablation.control import control_forwards, normal_tail_p
from interp.data import builtin_batches
from interp.models import tiny_hf_model, tiny_inputs

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
DEFAULTS = SweepOptions()
OLD_DRAWS = 19  # the old rule: 19 fixed draws a head, each head called at its own Monte Carlo p <= 0.05
ARCHITECTURES = {"gpt2": ("q", "v"), "qwen2": ("q", "k", "v")}
SEEDS = range(8)
SETTINGS = {"minilm": ("minilm-l6", dict(name="python-docs", batch_size=8, n=16)),
            "demo": ("dinov2-s14", dict(name="photos", batch_size=2, n=2))}
LEVELS = (0.05, 0.01, 0.0025)
LOO_SETS = 2000
PER_HEAD = ["layer", "head", "kind", "exact_because", "delta", "delta_lo", "delta_hi", "displacement_norm",
            "control_lo", "control_hi", "delta_z", "control_p", "control_p_empirical", "control_p_adjusted",
            "n_control", "bias_dependent", "old_called", "metric", "baseline", "model_fingerprint",
            "data_fingerprint"]


def tested(table: pd.DataFrame) -> pd.DataFrame:
    """The rows tested against their control: a control p, no identity."""
    return table[table.control_p.notna() & (table.identity.fillna("") == "")]


def forwards(rows: pd.DataFrame) -> int:
    """Control forwards the rows ran at the defaults (``control_forwards`` of each head's draws read)."""
    return int(sum(control_forwards(int(n), DEFAULTS.n_control, DEFAULTS.control_stop) for n in rows.n_control))


def old_called(rows: pd.DataFrame) -> pd.Series:
    """The old call on the same draws: 19 draws read and their Monte Carlo p <= 0.05 (a head stopped early has at
    least 5 draws as large as its delta among its first 19, so its old p is at least 6 / 20)."""
    return (rows.n_control == OLD_DRAWS) & (rows.control_p_empirical <= 0.05)


def planted_value_head(hf: torch.nn.Module, layer: int = 1, head: int = 1, d_head: int = 32) -> torch.nn.Module:
    """A GPT-2 whose head (layer, head) writes only along its own b_v: its W_O rows are b_v's unit vector times a
    random vector (tests/ablation/test_control.py plants the same)."""
    n_embd = hf.config.n_embd
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        attn = hf.transformer.h[layer].attn
        v_bias = attn.c_attn.bias[2 * n_embd + head * d_head:2 * n_embd + (head + 1) * d_head]
        w = 0.02 * torch.randn(n_embd, generator=gen, dtype=hf.dtype)
        attn.c_proj.weight[head * d_head:(head + 1) * d_head] = torch.outer(v_bias / v_bias.norm(), w)
    return hf


def calibration(seeds=SEEDS, out: Path | None = None) -> pd.DataFrame:
    rows = []
    for arch, kinds in ARCHITECTURES.items():
        for seed in seeds:
            def build():
                return tiny_hf_model(arch, n_layers=2, n_heads=4, d_head=32, seed=seed, bias_scale=0.5).double()
            model = interp.load_model(build(), device="cpu")
            data = [tiny_inputs(model, batch=8, pos=16, seed=100 * seed)]
            keywords = dict(kinds=kinds, estimate="exact", progress=False, n_boot=0, stack=8)  # stack: speed only
            t = tested(interp.ablate_bias(model, data, **keywords))
            row = dict(architecture=arch, seed=seed, heads=len(t), called_unadjusted=int((t.control_p <= 0.05).sum()),
                       called_old=int(old_called(t).sum()), called_adjusted=int(t.bias_dependent.sum()),
                       min_p=float(t.control_p.min()), control_forwards=forwards(t),
                       old_control_forwards=OLD_DRAWS * len(t))
            if arch == "gpt2":
                planted = interp.load_model(planted_value_head(build()), device="cpu")
                p = tested(interp.ablate_bias(planted, data, **keywords))
                mine = (p.layer == 1) & (p["head"] == 1) & (p.kind == "v")
                row.update(planted_p=float(p.control_p[mine].iloc[0]),
                           planted_p_empirical=float(p.control_p_empirical[mine].iloc[0]),
                           planted_p_adjusted=float(p.control_p_adjusted[mine].iloc[0]),
                           planted_called=bool(p.bias_dependent[mine].iloc[0]),
                           planted_others_called=int(p.bias_dependent[~mine].sum()))
            rows.append(row)
            print(rows[-1], flush=True)
            if out is not None:  # after every seed: a run cut short keeps its finished seeds
                pd.DataFrame(rows).to_csv(out, index=False)
    return pd.DataFrame(rows)


def recorded_draws(model, batches, n_draws: int) -> tuple[pd.DataFrame, list]:
    """The defaults' exact heads, each with ``n_draws`` control draws (no early stop), and their draws in order."""
    seen: dict[float, list] = {}
    real = sweep.control_columns

    def record(delta, controls, *args, **kwargs):
        if controls:
            seen[float(delta)] = [float(c) for c in controls]
        return real(delta, controls, *args, **kwargs)
    with mock.patch.object(sweep, "control_columns", record):
        table = tested(interp.ablate_bias(model, batches, progress=False, n_control=n_draws, control_stop=0))
    return table, [np.asarray(seen[float(d)]) for d in table.delta]


def leave_one_out(draws: list, n: int = OLD_DRAWS, sets: int = LOO_SETS, seed: int = 0) -> dict:
    """Per u in LEVELS: the fraction of null p (one draw against n others of its head) at or below u, over u."""
    rng = np.random.default_rng(seed)
    hits, total = np.zeros(len(LEVELS)), 0
    for c in draws:
        for _ in range(sets):
            pick = c[rng.permutation(len(c))[:n + 1]]
            p = normal_tail_p(pick[0], pick[1:])
            hits += [p <= u for u in LEVELS]
            total += 1
    return {f"ratio_at_{u}": float(h / total / u) for h, u in zip(hits, LEVELS)}


def tail(n_draws: int) -> pd.DataFrame:
    from scipy import stats

    rows = []
    for setting, (name, data) in SETTINGS.items():
        model = interp.load_model(name)
        table, draws = recorded_draws(model, builtin_batches(model, **data), n_draws)
        rows.append(dict(setting=setting, model=name, data=data["name"], heads=len(draws), draws=n_draws,
                         fitted_on=OLD_DRAWS, sets_per_head=LOO_SETS,
                         skew_median=float(np.median([stats.skew(c) for c in draws])),
                         skew_max_abs=float(np.max(np.abs([stats.skew(c) for c in draws]))),
                         excess_kurtosis_median=float(np.median([stats.kurtosis(c) for c in draws])),
                         excess_kurtosis_max=float(np.max([stats.kurtosis(c) for c in draws])),
                         **leave_one_out(draws)))
        print(rows[-1], flush=True)
        pd.DataFrame(rows).to_csv(RESULTS / "control_tail.csv", index=False)
    return pd.DataFrame(rows)


def cost() -> pd.DataFrame:
    rows = []
    for setting, (name, data) in SETTINGS.items():
        model = interp.load_model(name)
        batches = builtin_batches(model, **data)
        start = time.perf_counter()
        t = tested(interp.ablate_bias(model, batches, progress=False))
        seconds = time.perf_counter() - start
        old = old_called(t)
        rows.append(dict(setting=setting, model=name, data=data["name"], items=data["n"], heads=len(t),
                         old_control_forwards=OLD_DRAWS * len(t), control_forwards=forwards(t),
                         ratio=forwards(t) / (OLD_DRAWS * len(t)), called_old=int(old.sum()),
                         called_unadjusted=int((t.control_p <= 0.05).sum()),
                         called_adjusted=int(t.bias_dependent.sum()), heads_stopped_early=int((t.n_control < 19).sum()),
                         max_p_adjusted_called=float(t.control_p_adjusted[t.bias_dependent.astype(bool)].max()),
                         seconds=round(seconds, 1)))
        print(rows[-1], flush=True)
        per_head = t.assign(old_called=old).sort_values("delta", key=abs, ascending=False)[PER_HEAD]
        per_head.reset_index(drop=True).to_csv(RESULTS / name / "ablation_fdr.csv", index=False)
        pd.DataFrame(rows).to_csv(RESULTS / "control_cost.csv", index=False)  # a run cut short keeps its settings
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cost", action="store_true", help="the cost on the demo and MiniLM instead")
    ap.add_argument("--tail", action="store_true", help="the normal tail checked on trained models' draws instead")
    ap.add_argument("--draws", type=int, default=99, help="--tail: control draws per head")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cost:
        cost()
    elif args.tail:
        tail(args.draws)
    else:
        calibration(out=RESULTS / "control_calibration.csv")


if __name__ == "__main__":
    main()
