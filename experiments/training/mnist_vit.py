"""The controlled MNIST experiment: one small ViT recipe in three bias variants.

    python -m experiments.train_mnist_vit --seeds 0 1 2 3 4      # the full experiment
    python -m experiments.training.mnist_vit --seeds 0 --ship           # retrain and ship seed 0

Variants, identical except for the attention biases (every shared parameter starts from the
same initialisation; every variant sees the same data in the same order for a seed):

* ``qkv``: q, k and v bias (``mnist-vit``);
* ``none``: no q, k or v bias (``mnist-vit-nobias``);
* ``qv``: q and v bias, b_k held at exactly zero and never trained (BEiT / EVA style,
  ``mnist-vit-qv``). Under learned positions b_k cannot change the pattern, so ``qv`` and
  ``qkv`` differ only by whatever rounding noise does to b_k.

Recipe: 28 x 28 inputs (3 channels, pixels / 255, mean 0.5, std 0.5), patches of 4 (49
patches + CLS), 4 layers x 4 heads, d_model 64, MLP 128, no dropout; AdamW (lr 2e-3
one-cycle, weight decay 0.05 on every parameter), batch 128, CPU, float32.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
import torch
import torch.nn.functional as F
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from interp.data import mnist
from interp.io import atomic_path
from interp.models.builders import small_vit_classifier_config
from interp.models.zoo import SHIPPED_DIR

IMAGE, PATCH = 28, 4
VARIANTS = ("qkv", "none", "qv")
ZOO_NAMES = {"qkv": "mnist-vit", "none": "mnist-vit-nobias", "qv": "mnist-vit-qv"}


def mnist_vit_config(qkv_bias: bool) -> ViTConfig:
    return small_vit_classifier_config(IMAGE, PATCH, qkv_bias)


def mnist_processor() -> ViTImageProcessor:
    return ViTImageProcessor(size={"height": IMAGE, "width": IMAGE}, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def k_biases(model: ViTForImageClassification) -> list[torch.nn.Parameter]:
    return [layer.attention.k_proj.bias for layer in model.vit.layers]


def build_variant(variant: str, seed: int) -> ViTForImageClassification:
    """The ``variant`` at the seed's shared initialisation (HF initialises biases to zero)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}")
    torch.manual_seed(seed)
    reference = ViTForImageClassification(mnist_vit_config(True))
    model = ViTForImageClassification(mnist_vit_config(variant != "none"))
    model.load_state_dict(reference.state_dict(), strict=False)  # the shared init: only the biases differ
    if variant == "qv":
        for bias in k_biases(model):
            bias.data.zero_()
            bias.requires_grad_(False)  # AdamW skips it: no update, no decay
    return model


@torch.no_grad()
def accuracy(model: ViTForImageClassification, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> float:
    model.eval()
    hits = sum(int((model(pixel_values=x[i:i + batch]).logits.argmax(-1) == y[i:i + batch]).sum())
               for i in range(0, len(x), batch))
    return hits / len(x)


def train_mnist_vit(
    variant: str, seed: int, epochs: int = 3, lr: float = 2e-3, batch_size: int = 128,
    n_train: Optional[int] = None, n_test: Optional[int] = None, on_step: Optional[Callable] = None,
) -> tuple[ViTForImageClassification, float]:
    """Train ``variant`` on MNIST's train split (the first ``n_train`` images); return (model,
    accuracy on the first ``n_test`` test images). ``on_step(step, model)`` runs after each step."""
    x_tr, y_tr = mnist(IMAGE, "train", n_train)
    x_te, y_te = mnist(IMAGE, "test", n_test)
    model = build_variant(variant, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.05)
    steps_per_epoch = (len(x_tr) + batch_size - 1) // batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps_per_epoch)
    gen = torch.Generator().manual_seed(seed)
    step = 0
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(x_tr), generator=gen)
        for i in range(0, len(x_tr), batch_size):
            idx = perm[i:i + batch_size]
            loss = F.cross_entropy(model(pixel_values=x_tr[idx]).logits, y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if on_step is not None:
                on_step(step, model)
    return model.eval(), accuracy(model, x_te, y_te)


def ship(model: ViTForImageClassification, variant: str, out: Path = SHIPPED_DIR) -> Path:
    folder = out / ZOO_NAMES[variant]
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    mnist_processor().save_pretrained(folder)
    return folder


def run_seeds(seeds: list[int], epochs: int, ship_seed: Optional[int], csv: Path,
              n_train: Optional[int] = None) -> pd.DataFrame:
    """Train every variant for every seed; write the per-seed table (CSV) atomically after each run."""
    rows = []
    for seed in seeds:
        for variant in VARIANTS:
            t = time.time()
            model, acc = train_mnist_vit(variant, seed, epochs=epochs, n_train=n_train)
            rows.append(dict(seed=seed, variant=variant, epochs=epochs, n_train=n_train or 60_000,
                             test_accuracy=acc, k_bias_norm_max=max(float(b.detach().norm()) for b in k_biases(model))
                             if variant != "none" else 0.0, seconds=round(time.time() - t, 1)))
            print(rows[-1], flush=True)
            if seed == ship_seed:
                ship(model, variant)
            with atomic_path(csv) as tmp:
                pd.DataFrame(rows).to_csv(tmp, index=False)
    return pd.DataFrame(rows)


def summarise(seeds: pd.DataFrame, reference: str = "qkv") -> pd.DataFrame:
    """Per variant: test accuracy mean, its 95% t-interval over seeds, and the paired difference
    (variant - ``reference``, same seed) with its own 95% t-interval; in percentage points."""
    from scipy import stats

    def interval(values: pd.Series) -> tuple[float, float, float]:
        mean = float(values.mean())
        if len(values) < 2:
            return mean, float("nan"), float("nan")
        half = float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / len(values) ** 0.5)
        return mean, mean - half, mean + half

    wide = seeds.pivot_table(index="seed", columns="variant", values="test_accuracy") * 100
    rows = []
    for variant in [v for v in VARIANTS if v in wide]:
        mean, lo, hi = interval(wide[variant].dropna())
        diff = (wide[variant] - wide[reference]).dropna()
        d_mean, d_lo, d_hi = interval(diff)
        rows.append(dict(variant=variant, zoo_name=ZOO_NAMES[variant], n_seeds=int(wide[variant].notna().sum()),
                         accuracy_pct=mean, ci95_low=lo, ci95_high=hi, paired_diff_pp=d_mean,
                         paired_ci95_low=d_lo, paired_ci95_high=d_hi))
    return pd.DataFrame(rows)


def readme_table(summary: pd.DataFrame) -> str:
    """The README's table of the experiment, from ``summarise``'s frame (a test keeps them equal)."""
    lines = ["| variant | zoo name | seeds | test accuracy, mean [95% CI] (%) "
             "| paired difference to q/k/v [95% CI] (pp) |", "| --- | --- | --- | --- | --- |"]
    names = {"qkv": "q, k, v bias", "none": "no QKV bias", "qv": "q and v bias (b_k held at 0)"}
    for _, r in summary.iterrows():
        diff = "(reference)" if r.variant == "qkv" else \
            f"{r.paired_diff_pp:+.2f} [{r.paired_ci95_low:+.2f}, {r.paired_ci95_high:+.2f}]"
        lines.append(f"| {names[r.variant]} | `{r.zoo_name}` | {r.n_seeds} | {r.accuracy_pct:.2f} "
                     f"[{r.ci95_low:.2f}, {r.ci95_high:.2f}] | {diff} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--ship", action="store_true", help="ship the first seed's weights into interp/models/shipped")
    ap.add_argument("--csv", default="mnist_vit_seeds.csv")
    args = ap.parse_args()
    run_seeds(args.seeds, args.epochs, args.seeds[0] if args.ship else None, Path(args.csv))


if __name__ == "__main__":
    main()
