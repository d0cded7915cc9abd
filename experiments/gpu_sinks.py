"""Findings 4c's text sink arms at a size that should pass issue 32's stopping rule, on one GPU (issue 40 item 5).

    python -m experiments.gpu_sinks --plan      # here: the extrapolation -> docs/results/sinks_text_gpu/plan.csv
    python -m experiments.gpu_sinks --prepare   # here (CPU, ~10 min): the corpus, its count-model baseline, wheels
    python -m experiments.gpu_sinks --run       # on the GPU machine (``scale.py --gpu-check`` calls it)
    python -m experiments.gpu_sinks --dry-run   # the same command at a tiny size on the CPU, in seconds (tests)

**Why this size** (``plan``, from CPU measurements only: no GPU has run it yet). The width-128 pilot
(``docs/results/sinks_text_pilot/runs.csv``: 4 layers, MLP 512, 16 windows of 128 bytes a step) follows
L(D) = L_inf + A D^-a in the bytes D it has read (fitted from step 500 on); at the corpus's training split it
would end near 1.12 nats/byte, above the rule's target (best count model - 0.3, about 0.92). Kaplan et al.
2020 (L ~ N^-0.076 in non-embedding parameters N) scale that curve to the shape below (8 layers, width 512,
MLP 2048: 32x the pilot's N), which predicts a loss at the end of one pass over the split below the target.
An extrapolation over a 32x step in size is a hypothesis: the run measures it, and ``rule.csv`` (the rule
fixed in issue 32) says whether it held. Each arm reads every training window once (``sampling="disjoint"``).

The corpus is gathered here and carried (``--corpus-from``: the GPU machine's packages would give other
bytes); its count-model baseline is computed here too (it takes minutes of CPU) and committed, so the GPU
machine only trains. Matrix products use TF32 on the GPU (``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "sinks_text_gpu"
PILOT = ROOT / "docs" / "results" / "sinks_text_pilot" / "runs.csv"
COUNT_MODELS = ROOT / "docs" / "results" / "sinks_text" / "count_model_scaling.csv"
WHEELS = ROOT / ".whl"

BUDGET_MIB = 32  # the corpus: with the checkout (~21 MB) and the wheels (~7 MB) under the 64 MiB that travels
SHAPE = dict(d_model=512, n_layers=8, n_heads=8, d_ff=2048, context=256)
PILOT_SHAPE = dict(d_model=128, n_layers=4, d_ff=512)
BATCH = 64  # windows of SHAPE["context"] bytes a step
ARMS = ("none", "k_slot_v0", "sink_token")
KAPLAN_ALPHA_N = 0.076  # Kaplan et al. 2020, eq. 1.1: L(N) = (N_c / N)^0.076
# what the GPU machine lacks of what interp imports (KINDS.md's package list; wandb and plotly are not
# imported by the analyses or the training, and would not fit in the 64 MiB that travels)
DEVICE_WHEELS = ("annotated-types==0.8.0", "beartype==0.23.1", "datasets==5.2.0", "dill==0.4.1",
                 "fancy-einsum==0.0.3", "multiprocess==0.70.19", "platformdirs==4.14.9", "pydantic==2.14.4",
                 "pydantic-core==2.50.5", "sniffio==1.3.1", "transformer-lens==4.3.0", "typeguard==4.6.1",
                 "typing-inspection==0.4.5", "tzdata==2026.6")


def non_embedding_params(d_model: int, n_layers: int, d_ff: int, **_) -> int:
    """q, k, v, o (4 d^2) and the gated MLP (3 d d_ff) per layer."""
    return n_layers * (4 * d_model ** 2 + 3 * d_model * d_ff)


def _power_law(x, floor, scale, exponent):
    return floor + scale * x ** (-exponent)


def plan() -> pd.DataFrame:
    """The extrapolation (module doc) as one row: fit, size ratio, predicted loss, target, steps."""
    from scipy.optimize import curve_fit

    runs = pd.read_csv(PILOT)
    runs = runs[(runs.domain == "text") & (runs.step >= 500)]
    mb = runs.step.to_numpy() * 16 * 128 / 1e6
    (floor, scale, exponent), _ = curve_fit(_power_law, mb, runs.val_loss.to_numpy(), p0=(1.0, 1.0, 0.5),
                                            maxfev=20000)
    counts = pd.read_csv(COUNT_MODELS).set_index("budget_mib")
    # the 32 MiB corpus's target, until --prepare computes it: between the measured 16 and 48 MiB ones
    target = float(np.interp(BUDGET_MIB, counts.index, counts.target))
    train_mb = float(np.interp(BUDGET_MIB, counts.index, counts.train_bytes)) / 1e6
    steps = int(train_mb * 1e6 // (BATCH * SHAPE["context"]))
    ratio = non_embedding_params(**SHAPE) / non_embedding_params(**PILOT_SHAPE)
    pilot_end = _power_law(train_mb, floor, scale, exponent)
    predicted = pilot_end * ratio ** -KAPLAN_ALPHA_N
    return pd.DataFrame([dict(
        pilot_fit_floor=floor, pilot_fit_scale=scale, pilot_fit_exponent=exponent, corpus_mib=BUDGET_MIB,
        train_mb=train_mb, steps=steps, batch=BATCH, **SHAPE, params_ratio=ratio, pilot_loss_at_end=pilot_end,
        kaplan_alpha_n=KAPLAN_ALPHA_N, predicted_loss=predicted, interpolated_target=target,
        predicted_margin=target - predicted)])


def command(corpus: Path, out: Path, figures: Path, steps: int, device: str, shape: dict = SHAPE,
            batch: int = BATCH, every: int = 300, arms=ARMS, work: Path = ROOT / ".cache/interp/sinks-runs") -> list:
    """``train_sinks.py``'s argv for the arms at ``shape`` (the recipe of findings 4c's rerun otherwise)."""
    return [sys.executable, "-m", "experiments.train_sinks", "--recipe", "fresh", "--domains", "text",
            "--collect", "text", "--arms", *arms, "--seeds", "0", "--d-model", str(shape["d_model"]),
            "--n-layers", str(shape["n_layers"]), "--n-heads", str(shape["n_heads"]), "--d-ff", str(shape["d_ff"]),
            "--context", str(shape["context"]), "--text-batch", str(batch), "--corpus-from", str(corpus),
            "--text-steps", str(steps), "--text-every", str(every), "--device", device, "--baseline",
            "--work", str(work), "--out", str(out), "--figures", str(figures), "--no-ship", "--threads",
            str(min(8, os.cpu_count() or 1))]


def corpus_folder(budget_mib: int) -> Path:
    """The cached folder of the packages corpus of ``budget_mib`` MiB (gathered here when missing): the one
    whose record matches the corpus ``packages_corpus`` returns."""
    import json

    from interp.models.zoo import cache_dir
    from experiments.training.corpus import packages_corpus

    corpus = packages_corpus(budget_mib * 2 ** 20)
    for folder in sorted((cache_dir() / "sinks-corpus").glob("packages-*")):
        record = json.loads((folder / "corpus.json").read_text()) if (folder / "corpus.json").is_file() else {}
        if record.get("train_sha256") == corpus.record["train_sha256"] and \
                record.get("val_sha256") == corpus.record["val_sha256"]:
            return folder
    raise SystemExit(f"no cached folder holds the {budget_mib} MiB corpus under {cache_dir() / 'sinks-corpus'}")


def prepare() -> None:
    """Here: the corpus, its count-model baseline at the run's context, and the device's wheels."""
    folder = corpus_folder(BUDGET_MIB)
    WHEELS.mkdir(exist_ok=True)
    subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "--python-version", "3.12", "--platform", "manylinux2014_x86_64", "--platform",
                           "manylinux_2_17_x86_64", "--platform", "any", "-d", str(WHEELS), *DEVICE_WHEELS])
    # the count models under train_sinks.baseline_csv's identity (corpus, 512 windows x context): the GPU run
    # finds the file and reuses it instead of spending minutes of CPU there
    from experiments.training.corpus import load_corpus
    from experiments.training.ngram import count_baseline
    from experiments.training.sinks import val_windows

    corpus = load_corpus(folder)
    OUT.mkdir(parents=True, exist_ok=True)
    val = val_windows(corpus.val, 512, SHAPE["context"]).numpy()
    frame = count_baseline(corpus.train.numpy(), val, SHAPE["context"])
    frame.insert(0, "data", f"{corpus.sha256[:16]}-512x{SHAPE['context']}-orders1to7")
    frame.to_csv(OUT / "baseline.csv", index=False)
    size = sum(f.stat().st_size for f in [*folder.iterdir(), *WHEELS.iterdir()])
    print(f"corpus {folder} and wheels {WHEELS}: {size / 2 ** 20:.1f} MiB to carry; baseline -> {OUT}")


def dry_run(out=None) -> None:
    """The GPU command at a tiny size on the CPU (seconds)."""
    out = Path(out or ROOT / "out" / "gpu_sinks_dry")
    from experiments.training.corpus import packages_corpus

    packages_corpus(2 ** 20)  # 1 MiB: gathered in seconds
    folder = corpus_folder(1)
    argv = command(folder, out, out / "figures", steps=2, device="cpu", every=1, arms=("none",),
                   shape=dict(d_model=16, n_layers=1, n_heads=2, d_ff=32, context=32), batch=2,
                   work=out / "work")
    argv[argv.index("--threads") + 1] = "1"
    subprocess.check_call(argv, cwd=ROOT)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--plan", action="store_true")
    mode.add_argument("--prepare", action="store_true")
    mode.add_argument("--run", action="store_true")
    mode.add_argument("--dry-run", action="store_true")
    ap.add_argument("--out", default=None, help="--run/--dry-run: results folder (default docs/results/sinks_text_gpu)")
    ap.add_argument("--pack", default=None, help="--run: also pack the results into this .tar.gz (for $OUT)")
    args = ap.parse_args(argv)
    if args.plan:
        frame = plan()
        OUT.mkdir(parents=True, exist_ok=True)
        frame.to_csv(OUT / "plan.csv", index=False, float_format="%.6g")
        print(frame.T.to_string())
        return
    if args.prepare:
        return prepare()
    if args.dry_run:
        return dry_run(args.out)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--run trains on a GPU and none is visible here: use --dry-run on a CPU")
    folder = corpus_folder(BUDGET_MIB)
    out = Path(args.out or OUT)
    steps = int(plan().steps.iloc[0])
    env = dict(os.environ, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="1")
    code = subprocess.call(command(folder, out, out / "figures", steps=steps, device="cuda"), cwd=ROOT, env=env)
    if args.pack:
        with tarfile.open(args.pack, "w:gz") as tar:
            tar.add(out, arcname=out.name)
    print(f"train_sinks: exit {code}")
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
