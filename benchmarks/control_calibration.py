"""The matched control's calls on untrained models, and what the sequential draws cost on trained ones.

    nice python benchmarks/control_calibration.py             # -> docs/results/control_calibration.csv
    nice python benchmarks/control_calibration.py --cost      # -> docs/results/control_cost.csv

Calibration: randomly initialised small GPT-2s (4 layers x 4 heads of width 32, float64, every bias N(0, 0.5^2), so
each head's bias is an isotropic Gaussian: exchangeable with the control's random directions of its norm, and every
head is null), 2 batches of 8 random sequences of 32 tokens, ``ablate_bias(kinds=("q", "v"), estimate="exact")``
per seed, twice: at the defaults (sequential draws, up to ``n_control`` = 199, stop at ``control_stop`` = 5 draws as
large as the head's delta; Benjamini-Hochberg across the heads) and under the old rule (19 draws each,
``control_stop=0``). One row per seed and rule: heads tested, heads at p <= 0.05 before the adjustment
(``called_unadjusted``), heads called after it (``called_adjusted``: bias_dependent), and the control forwards run
(``control_forwards``: draws read plus draws of a head's last stage past its stop, ``control_forwards``).

Cost (``--cost``): ``ablate_bias`` at its defaults (``estimate="auto"``: 5 top and 5 sampled heads per kind run
exactly) on the demo's setting (dinov2-s14, 2 photographs, one batch) and on MiniLM (minilm-l6, 2 batches of 8
python-docs texts), new rule against old, same heads: heads tested, control forwards, all patched forwards of the
exact stage (each head's own one too), seconds (one run each on a shared 2-core CPU: read the forwards), calls.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import interp
from interp.ablation.sweep import control_forwards
from interp.data import builtin_batches
from interp.models import tiny_hf_model, tiny_inputs

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
RULES = {"sequential_bh": dict(), "fixed_19": dict(n_control=19, control_stop=0)}
SEEDS = range(8)


def tested(table: pd.DataFrame) -> pd.DataFrame:
    """The rows tested against their control: a control p, no identity."""
    return table[table.control_p.notna() & (table.identity.fillna("") == "")]


def forwards(rows: pd.DataFrame, keywords: dict) -> int:
    """Control forwards the rows ran (``control_forwards`` of each head's draws read)."""
    n_max, stop = keywords.get("n_control", 199), keywords.get("control_stop", 5)
    return int(sum(control_forwards(int(n), n_max, stop) for n in rows.n_control))


def calibration(seeds=SEEDS) -> pd.DataFrame:
    rows = []
    for seed in seeds:
        model = interp.load_model(tiny_hf_model("gpt2", n_layers=4, n_heads=4, d_head=32, seed=seed,
                                                bias_scale=0.5).double(), device="cpu")
        data = [tiny_inputs(model, batch=8, pos=32, seed=100 * seed + b) for b in range(2)]
        for rule, keywords in RULES.items():
            t = tested(interp.ablate_bias(model, data, kinds=("q", "v"), estimate="exact", progress=False,
                                          n_boot=0, **keywords))
            rows.append(dict(seed=seed, rule=rule, heads=len(t), called_unadjusted=int((t.control_p <= 0.05).sum()),
                             called_adjusted=int(t.bias_dependent.sum()), min_p=float(t.control_p.min()),
                             mean_draws=float(t.n_control.mean()), control_forwards=forwards(t, keywords)))
            print(rows[-1])
    return pd.DataFrame(rows)


def cost() -> pd.DataFrame:
    rows = []
    settings = {"demo": ("dinov2-s14", dict(name="photos", batch_size=2, n=2)),
                "minilm": ("minilm-l6", dict(name="python-docs", batch_size=8, n=16))}
    for setting, (name, data) in settings.items():
        model = interp.load_model(name)
        batches = builtin_batches(model, **data)
        for rule, keywords in RULES.items():
            start = time.perf_counter()
            table = interp.ablate_bias(model, batches, progress=False, **keywords)
            seconds = time.perf_counter() - start
            t = tested(table)
            control = forwards(t, keywords)
            rows.append(dict(setting=setting, model=name, data=data["name"], items=data["n"], rule=rule,
                             heads=len(t), control_forwards=control, patched_forwards=control + len(t),
                             seconds=round(seconds, 1), called_unadjusted=int((t.control_p <= 0.05).sum()),
                             called_adjusted=int(t.bias_dependent.sum()), min_p=float(t.control_p.min()),
                             heads_at_max=int((t.n_control == keywords.get("n_control", 199)).sum())))
            print(rows[-1])
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cost", action="store_true", help="the cost on the demo and MiniLM instead")
    args = ap.parse_args()
    if args.cost:
        cost().to_csv(RESULTS / "control_cost.csv", index=False)
    else:
        calibration().to_csv(RESULTS / "control_calibration.csv", index=False)


if __name__ == "__main__":
    main()
