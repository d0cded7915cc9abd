"""The demo's ablation step the old way and the new way, side by side in one run.

Old: every per-head q/k/v variant run exactly, every layer recomputed (``force_exact=True``,
``reuse_prefix=False``). New (the demo's default): b_k answered by the identity, every other
head estimated in one pass (``estimate="auto"``: AtP* through random projections for
DINOv2's distance metric), then the top ``--top-k`` heads per kind run exactly with prefix
reuse. Prints both times, their ratio (goal: new <= 25% of old), how the new exact rows
agree with the old ones (identical up to rounding), whether the new top heads are the old
top heads, and the estimate's Spearman correlation with the old exact deltas per kind.

    python benchmarks/demo_time.py [--model dinov2-s14] [--top-k 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch
from scipy.stats import spearmanr

import interp
from interp.ablation import ablate_bias
from interp.report.pipeline import DEMO_BATCHES, make_context


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dinov2-s14")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    model = interp.load_model(args.model, device=args.device)
    batches = list(make_context(model, max_batches=DEMO_BATCHES).batches)  # the demo's sample, which its steps read
    t = time.perf_counter()
    old = ablate_bias(model, batches, force_exact=True, reuse_prefix=False, progress=False, estimate="exact")
    old_s = time.perf_counter() - t
    t = time.perf_counter()
    new = ablate_bias(model, batches, estimate="auto", top_k=args.top_k, progress=False)
    new_s = time.perf_counter() - t
    keys = ["layer", "head", "kind"]
    exact = new[new.estimate == "exact"].set_index(keys).delta
    estimated = new[new.estimate != "exact"]
    old_delta = old.set_index(keys).delta
    print(f"model={args.model} device={args.device} threads={torch.get_num_threads()} variants={len(old)} "
          f"batches={len(batches)} metric={old.metric.iloc[0]}")
    print(f"  old (every variant exact, every layer)  {old_s:7.1f} s")
    print(f"  new (identities + {estimated.estimate.iloc[0]} + exact top {args.top_k}/kind, prefix reuse) "
          f"{new_s:7.1f} s   new/old = {new_s / old_s:.3f}")
    print(f"  new exact rows: {len(exact)}; max |delta - old delta| {(exact - old_delta.loc[exact.index]).abs().max():.1e}")
    for kind in "qkv":
        o = old[old.kind == kind]
        e = estimated[estimated.kind == kind]
        rho = spearmanr(o.delta, e.delta).statistic if e.delta.nunique() > 1 else float("nan")
        old_top = set(map(tuple, o.assign(a=o.delta.abs()).nlargest(args.top_k, "a")[["layer", "head"]].values))
        new_top = {(la, h) for la, h, k in exact.index if k == kind}
        print(f"  {kind}: max |old delta| {o.delta.abs().max():.2e}; estimate spearman vs old exact {rho:.3f}; "
              f"old top-{args.top_k} heads found by the new way {len(old_top & new_top)}/{len(old_top)}"
              + ("" if new_top else " (answered by identity)"))


if __name__ == "__main__":
    main()
