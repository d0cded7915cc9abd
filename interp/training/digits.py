"""Train the controlled pair: small ViTs on scikit-learn digits, identical except ``qkv_bias``.

    python -m interp.training.digits --seeds 0 1 2 --ship-seed 0

trains each seed with and without QKV bias (same init for every shared parameter, same
data order), prints test accuracy, writes ``interp/models/shipped/digits_vit_results.csv`` and ships the
``--ship-seed`` pair as ``interp/models/shipped/digits-vit`` and ``digits-vit-nobias`` (safetensors).
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from interp.data import digits
from interp.io import atomic_path
from interp.models.builders import small_vit_classifier_config
from interp.models.zoo import SHIPPED_DIR, ZOO

IMAGE, PATCH = 8, 2


def digits_vit_config(qkv_bias: bool) -> ViTConfig:
    return small_vit_classifier_config(IMAGE, PATCH, qkv_bias)


def digits_processor() -> ViTImageProcessor:
    """The pair's preprocessing: 8x8, pixels / 255, standardised with mean 0.5, std 0.5."""
    return ViTImageProcessor(size={"height": IMAGE, "width": IMAGE}, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def digits_vit_as_timm(name: str = "digits-vit") -> nn.Module:
    """A shipped digits ViT (``digits-vit`` or ``digits-vit-nobias``) as a timm ``VisionTransformer``
    with the same trained weights: q, k and v fused into timm's ``qkv``, the rest one to one.

    Offline, so timm paths can be tried on a trained model (timm's hub weights do not download
    here); the HF and the timm model give the same logits.
    """
    from timm.models.vision_transformer import VisionTransformer  # timm: the `vision` extra

    hf = ViTForImageClassification.from_pretrained(ZOO[name].folder(), use_safetensors=True).eval()
    cfg, vit = hf.config, hf.vit
    model = VisionTransformer(
        img_size=cfg.image_size, patch_size=cfg.patch_size, in_chans=cfg.num_channels, embed_dim=cfg.hidden_size,
        depth=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
        mlp_ratio=cfg.intermediate_size / cfg.hidden_size, qkv_bias=cfg.qkv_bias, num_classes=cfg.num_labels,
        norm_layer=partial(nn.LayerNorm, eps=cfg.layer_norm_eps))
    state = {"cls_token": vit.embeddings.cls_token, "pos_embed": vit.embeddings.position_embeddings,
             "patch_embed.proj.weight": vit.embeddings.patch_embeddings.projection.weight,
             "patch_embed.proj.bias": vit.embeddings.patch_embeddings.projection.bias,
             "norm.weight": vit.layernorm.weight, "norm.bias": vit.layernorm.bias,
             "head.weight": hf.classifier.weight, "head.bias": hf.classifier.bias}
    for i, layer in enumerate(vit.layers):
        attn, pre = layer.attention, f"blocks.{i}."
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        state[pre + "attn.qkv.weight"] = torch.cat([p.weight for p in projections])
        if cfg.qkv_bias:
            state[pre + "attn.qkv.bias"] = torch.cat([p.bias for p in projections])
        for ours, theirs in (("norm1", layer.layernorm_before), ("norm2", layer.layernorm_after),
                             ("attn.proj", attn.o_proj), ("mlp.fc1", layer.mlp.fc1), ("mlp.fc2", layer.mlp.fc2)):
            state[f"{pre}{ours}.weight"], state[f"{pre}{ours}.bias"] = theirs.weight, theirs.bias
    model.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)
    return model.eval()


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
