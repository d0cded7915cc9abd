"""Where an inert b_k comes from: b_k's gradient and norm during training, per optimiser setting.

Under learned positions b_k cancels in the softmax, so its gradient is exactly zero in exact
arithmetic, and any b_k a checkpoint carries was put there by something else. The
hypothesis: the computed gradient is rounding noise, and Adam's normalisation
(m / (sqrt(v) + eps)) turns noise of any size into steps of size ~lr. This script trains the
with-bias MNIST ViT (``experiments.training.mnist_vit``, seed 0, the same init and data order for
every setting) for ``--steps`` steps under each setting and logs, per step, the gradient
norms of b_q, b_k, b_v (over all layers) and ||b_k|| (the largest layer's):

    sgd            SGD, momentum 0.9, lr 0.05, weight decay 5e-4 (an update proportional to the gradient)
    adamw          AdamW, lr 2e-3 (one-cycle), eps 1e-8, weight decay 0.05 on every parameter
    adamw_eps1e-6  the same with eps 1e-6
    adamw_bf16     the same as adamw under bfloat16 autocast (forward and backward in bf16)
    adamw_nodecay  the same as adamw without weight decay on biases
    adamw_fp64     the same as adamw in float64, softmax included (SDPA; rounding ~1e-16 instead of ~1e-7)

Writes ``docs/results/bk_dynamics/trajectories.csv`` (every step), ``summary.csv`` and the
figure ``bk_dynamics.png``.

    python -m experiments.bk_dynamics [--steps 400] [--out docs/results/bk_dynamics]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from interp.data import mnist  # noqa: E402
from interp.io import atomic_path  # noqa: E402
from experiments.training.mnist_vit import build_variant  # noqa: E402
from interp.figures.plots import save_figure  # noqa: E402

SETTINGS = ("sgd", "adamw", "adamw_eps1e-6", "adamw_bf16", "adamw_nodecay", "adamw_fp64")


def optimiser(setting: str, model: torch.nn.Module, steps: int):
    if setting == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=steps)
    eps = 1e-6 if setting == "adamw_eps1e-6" else 1e-8
    if setting == "adamw_nodecay":
        biases = [p for n, p in model.named_parameters() if n.endswith(".bias")]
        others = [p for n, p in model.named_parameters() if not n.endswith(".bias")]
        groups = [dict(params=others, weight_decay=0.05), dict(params=biases, weight_decay=0.0)]
    else:
        groups = [dict(params=list(model.parameters()), weight_decay=0.05)]
    opt = torch.optim.AdamW(groups, lr=2e-3, eps=eps)
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)


def run(setting: str, steps: int, x: torch.Tensor, y: torch.Tensor, batch: int = 128) -> list[dict]:
    model = build_variant("qkv", seed=0)
    dtype = torch.float64 if setting == "adamw_fp64" else torch.float32
    if setting == "adamw_fp64":
        # HF's eager ViT attention softmaxes in float32 even in a float64 model; SDPA's math kernel
        # keeps float64, so rounding is ~1e-16 throughout (training needs no attention patterns)
        model.config._attn_implementation = "sdpa"
    model = model.to(dtype).train()
    opt, sched = optimiser(setting, model, steps)
    layers = model.vit.layers
    gen = torch.Generator().manual_seed(0)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if setting == "adamw_bf16"
                else contextlib.nullcontext())
    rows = []
    perm = torch.randperm(len(x), generator=gen)
    for step in range(steps):
        idx = perm[(step * batch) % len(x):][:batch]
        with autocast:
            loss = F.cross_entropy(model(pixel_values=x[idx].to(dtype)).logits.float(), y[idx])
        opt.zero_grad()
        loss.backward()
        grad = {k: float(torch.stack([getattr(layer.attention, f"{k}_proj").bias.grad.detach().norm()
                                      for layer in layers]).norm()) for k in "qkv"}
        opt.step()
        sched.step()
        rows.append(dict(setting=setting, step=step + 1, loss=float(loss.detach()), grad_q=grad["q"], grad_k=grad["k"],
                         grad_v=grad["v"],
                         k_bias_norm=max(float(layer.attention.k_proj.bias.detach().norm()) for layer in layers),
                         q_bias_norm=max(float(layer.attention.q_proj.bias.detach().norm()) for layer in layers)))
    return rows


def figure(traj: pd.DataFrame) -> plt.Figure:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    sns.lineplot(data=traj, x="step", y="k_bias_norm", hue="setting", ax=axes[0])
    axes[0].set_yscale("log")
    axes[0].set_ylabel("||b_k|| (largest layer, log scale)")
    axes[0].set_title("b_k's norm while training (it cannot change the loss)")
    ratio = traj.assign(ratio=traj.grad_k / traj.grad_q)
    sns.lineplot(data=ratio, x="step", y="ratio", hue="setting", ax=axes[1], legend=False)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("||grad b_k|| / ||grad b_q|| (log scale)")
    axes[1].set_title("b_k's gradient relative to b_q's: rounding noise")
    for ax in axes:
        ax.set_xlabel("training step (batch 128, MNIST)")
    fig.suptitle("With-bias MNIST ViT (4 x 4 heads, seed 0): where an inert b_k comes from")
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--out", default="docs/results/bk_dynamics")
    args = ap.parse_args()
    torch.set_num_threads(2)
    x, y = mnist(28, "train", n=args.steps * 128)
    rows = []
    for setting in args.settings:
        t = time.time()
        rows += run(setting, args.steps, x, y)
        print(f"{setting}: {time.time() - t:.0f}s, final ||b_k|| {rows[-1]['k_bias_norm']:.3g}", flush=True)
    traj = pd.DataFrame(rows)
    summary = traj.groupby("setting", sort=False).agg(
        final_k_bias_norm=("k_bias_norm", "last"), final_q_bias_norm=("q_bias_norm", "last"),
        median_grad_k=("grad_k", "median"), median_grad_q=("grad_q", "median"), final_loss=("loss", "last"))
    summary["median_grad_ratio_k_over_q"] = summary.median_grad_k / summary.median_grad_q
    summary["k_over_q_final_norm"] = summary.final_k_bias_norm / summary.final_q_bias_norm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, df in (("trajectories", traj), ("summary", summary.reset_index())):
        with atomic_path(out / f"{name}.csv") as tmp:
            df.to_csv(tmp, index=False)
    save_figure(figure(traj), out / "bk_dynamics.png")
    print(summary.to_string())


if __name__ == "__main__":
    main()
