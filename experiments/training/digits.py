"""Train the controlled pair: small ViTs on scikit-learn digits, identical except ``qkv_bias``.

    python -m experiments.training.digits --seeds 0 1 2 --ship-seed 0

trains each seed with and without QKV bias (same init for every shared parameter, same
data order), prints test accuracy, writes ``interp/models/shipped/digits_vit_results.csv`` and ships the
``--ship-seed`` pair as ``interp/models/shipped/digits-vit`` and ``digits-vit-nobias`` (safetensors).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from transformers import ViTForImageClassification

from interp.data import digits
from interp.io import atomic_path
from interp.models.zoo import SHIPPED_DIR

from interp.models.digits import (  # noqa: F401 (digits_vit_as_timm: the shipped pair as timm)
    IMAGE, PATCH, digits_processor, digits_vit_as_timm, digits_vit_config)


def train_digits_vit(
    qkv_bias: bool, seed: int, epochs: int = 40, lr: float = 2e-3
) -> tuple[ViTForImageClassification, float]:
    """Train on the stratified 75% split; return (model, test accuracy)."""
    torch.manual_seed(seed)
    with_bias = ViTForImageClassification(digits_vit_config(True))
    model = ViTForImageClassification(digits_vit_config(qkv_bias))
    # identical init for every shared parameter: the pair differs only in the bias
    model.load_state_dict(with_bias.state_dict(), strict=False)
    x_tr, y_tr = digits(IMAGE, split="train", seed=0)
    x_te, y_te = digits(IMAGE, split="test", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    steps = epochs * ((len(x_tr) + 63) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x_tr), generator=gen)
        for i in range(0, len(x_tr), 64):
            idx = perm[i : i + 64]
            loss = F.cross_entropy(model(pixel_values=x_tr[idx]).logits, y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(pixel_values=x_te).logits.argmax(-1) == y_te).float().mean())
    return model, acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ship-seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--out", default=str(SHIPPED_DIR))
    args = ap.parse_args()
    torch.set_num_threads(2)
    out = Path(args.out)
    rows = []
    for seed in args.seeds:
        for bias in (True, False):
            t = time.time()
            model, acc = train_digits_vit(bias, seed, epochs=args.epochs)
            rows.append(dict(seed=seed, qkv_bias=bias, test_accuracy=acc, seconds=round(time.time() - t, 1)))
            print(rows[-1], flush=True)
            if seed == args.ship_seed:
                folder = out / ("digits-vit" if bias else "digits-vit-nobias")
                folder.mkdir(parents=True, exist_ok=True)
                model.save_pretrained(folder, safe_serialization=True)
                digits_processor().save_pretrained(folder)
    df = pd.DataFrame(rows)
    with atomic_path(out / "digits_vit_results.csv") as tmp:
        df.to_csv(tmp, index=False)
    print(df.groupby("qkv_bias").test_accuracy.agg(["mean", "std"]))


if __name__ == "__main__":
    main()
