"""The matched control's calls on untrained models, and what the sequential draws cost on trained ones.

    nice python benchmarks/control_calibration.py             # -> docs/results/control_calibration.csv
    nice python benchmarks/control_calibration.py --cost      # -> docs/results/control_cost.csv

Calibration: randomly initialised small GPT-2s (2 layers x 4 heads of width 32, float64, every bias N(0, 0.5^2), so
each head's bias is an isotropic Gaussian: exchangeable with the control's random directions of its norm, and every
head is null), one batch of 8 random sequences of 16 tokens, ``ablate_bias(kinds=("q", "v"), estimate="exact")``
per seed, twice: at the defaults (sequential draws, up to ``n_control`` = 199, stop at ``control_stop`` = 5 draws as
large as the head's delta; Benjamini-Hochberg across the heads) and under the old rule (19 draws each,
``control_stop=0``). One row per seed and rule: heads tested, heads at p <= 0.05 before the adjustment
(``called_unadjusted``), heads called after it (``called_adjusted``: bias_dependent), and the control forwards run
(``control_forwards``: draws read plus draws of a head's last stage past its stop, ``control_forwards``).

Cost (``--cost``): ``ablate_bias`` at its defaults (``estimate="auto"``: 5 top and 5 sampled heads per kind run
exactly) on MiniLM (minilm-l6, 2 batches of 8 python-docs texts) and on the demo's setting (dinov2-s14, 2
photographs, one batch), new rule against old, same heads: heads tested, control forwards, all patched forwards of the
exact stage (each head's own one too), seconds (one run each on a shared 2-core CPU: read the forwards), calls.
Per setting, the heads run exactly with both rules' p and calls: ``docs/results/<model>/ablation_fdr.csv``.
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
PER_HEAD = ["layer", "head", "kind", "exact_because", "delta", "delta_lo", "delta_hi", "displacement_norm", "control_lo",
            "control_hi", "delta_z", "control_p", "control_p_adjusted", "n_control", "bias_dependent", "old_control_p",
            "old_n_control", "old_called", "metric", "baseline", "model_fingerprint", "data_fingerprint"]


def tested(table: pd.DataFrame) -> pd.DataFrame:
    """The rows tested against their control: a control p, no identity."""
    return table[table.control_p.notna() & (table.identity.fillna("") == "")]


def forwards(rows: pd.DataFrame, keywords: dict) -> int:
    """Control forwards the rows ran (``control_forwards`` of each head's draws read)."""
    n_max, stop = keywords.get("n_control", 199), keywords.get("control_stop", 5)
    return int(sum(control_forwards(int(n), n_max, stop) for n in rows.n_control))


def calibration(seeds=SEEDS, out: Path | None = None) -> pd.DataFrame:
    rows = []
    for seed in seeds:
        model = interp.load_model(tiny_hf_model("gpt2", n_layers=2, n_heads=4, d_head=32, seed=seed,
                                                bias_scale=0.5).double(), device="cpu")
        data = [tiny_inputs(model, batch=8, pos=16, seed=100 * seed)]
        for rule, keywords in RULES.items():
            t = tested(interp.ablate_bias(model, data, kinds=("q", "v"), estimate="exact", progress=False,
                                          n_boot=0, stack=8, **keywords))  # stack: speed only, the same rows
            rows.append(dict(seed=seed, rule=rule, heads=len(t), called_unadjusted=int((t.control_p <= 0.05).sum()),
                             called_adjusted=int(t.bias_dependent.sum()), min_p=float(t.control_p.min()),
                             mean_draws=float(t.n_control.mean()), control_forwards=forwards(t, keywords)))
            print(rows[-1])
        if out is not None:  # after every seed: a run cut short keeps its finished seeds
            pd.DataFrame(rows).to_csv(out, index=False)
    return pd.DataFrame(rows)


def cost() -> pd.DataFrame:
    rows = []
    settings = {"minilm": ("minilm-l6", dict(name="python-docs", batch_size=8, n=16)),
                "demo": ("dinov2-s14", dict(name="photos", batch_size=2, n=2))}
    for setting, (name, data) in settings.items():
        model = interp.load_model(name)
        batches = builtin_batches(model, **data)
        heads = {}
        for rule, keywords in RULES.items():
            start = time.perf_counter()
            table = interp.ablate_bias(model, batches, progress=False, **keywords)
            seconds = time.perf_counter() - start
            t = heads[rule] = tested(table)
            control = forwards(t, keywords)
            rows.append(dict(setting=setting, model=name, data=data["name"], items=data["n"], rule=rule,
                             heads=len(t), control_forwards=control, patched_forwards=control + len(t),
                             seconds=round(seconds, 1), called_unadjusted=int((t.control_p <= 0.05).sum()),
                             called_adjusted=int(t.bias_dependent.sum()), min_p=float(t.control_p.min()),
                             heads_at_max=int((t.n_control == keywords.get("n_control", 199)).sum())))
            print(rows[-1])
        per_head(*heads.values()).to_csv(RESULTS / name / "ablation_fdr.csv", index=False)
        pd.DataFrame(rows).to_csv(RESULTS / "control_cost.csv", index=False)  # a run cut short keeps its settings
    return pd.DataFrame(rows)


def per_head(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """The heads run exactly at the defaults, with the old rule's p and call (19 draws, p <= 0.05 unadjusted) on the
    same heads (``auto`` chooses them by the one-pass estimate alone), largest |delta| first."""
    key = ["layer", "head", "kind"]
    old = old.set_index(key)[["control_p", "n_control"]].rename(columns=lambda c: f"old_{c}")
    table = new.join(old, on=key).assign(old_called=lambda t: t.old_control_p <= 0.05)
    return table.sort_values("delta", key=abs, ascending=False)[PER_HEAD].reset_index(drop=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cost", action="store_true", help="the cost on the demo and MiniLM instead")
    args = ap.parse_args()
    if args.cost:
        cost()
    else:
        calibration(out=RESULTS / "control_calibration.csv")


if __name__ == "__main__":
    main()
