"""The one-pass estimate's time against its floor, before and after a change, one process each (issue 40 item 1).

    nice python benchmarks/estimate_time.py --before aa9bc7d [--runs 112m@512] [--out docs/results/scale/estimate_time_cpu.csv]

For each code (``--before REF``: a git worktree of REF under /tmp; ``after``: this checkout) a child process builds
``scale.py``'s random-init Qwen2 shape on the CPU (one thread), times a plain HF forward and an HF forward and
backward of the next-token loss (fastest of 2, over the same batches), warms the sweep up on one batch, then times
``ablate_bias(estimate="auto", top_k=0, sample_k=0)`` once: the intact run and the one-pass estimate, no exact
stage. Rows: code, commit, size, tokens, batch, forward_s, fwd_bwd_s, estimate_s, ratio_fwd_bwd (estimate /
forward and backward), load (1-minute load average at the start). Times are taken with glibc's allocator at its
defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ablation_phases import child_json, codes  # noqa: E402  (the same before/after plumbing)


def child(size: str, tokens: int) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scale
    import torch

    import interp

    torch.set_num_threads(1)
    model = scale.build(size, "cpu", torch.float32)
    data = scale.make_batches(scale.SIZES[size][5], 2, 2, tokens, "cpu")
    scale.plain_forward(model, data[:1])
    forward_s, _ = scale.measure(scale.plain_forward, model, data, "cpu", 2)
    fwd_bwd_s, _ = scale.measure(scale.forward_backward, model, data, "cpu", 2)
    interp.ablate_bias(model, data[:1], estimate="auto", top_k=0, sample_k=0, progress=False)  # warm-up
    start = time.perf_counter()
    interp.ablate_bias(model, data, estimate="auto", top_k=0, sample_k=0, progress=False)
    estimate_s = time.perf_counter() - start
    print(json.dumps(dict(interp=interp.__file__, forward_s=forward_s, fwd_bwd_s=fwd_bwd_s, estimate_s=estimate_s)))


def run(code: str, path: Path, size: str, tokens: int) -> dict:
    load = os.getloadavg()[0]
    got, commit = child_json(__file__, path, f"{size}@{tokens}")
    return dict(code=code, commit=commit, size=size, tokens=tokens, batch="2 x 2",
                forward_s=round(got["forward_s"], 3), fwd_bwd_s=round(got["fwd_bwd_s"], 3),
                estimate_s=round(got["estimate_s"], 3), ratio_fwd_bwd=round(got["estimate_s"] / got["fwd_bwd_s"], 3),
                load=round(load, 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=False, help="git ref of the code before")
    p.add_argument("--runs", default="112m@512")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "scale" / "estimate_time_cpu.csv"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        size, tokens = args.child.split("@")
        return child(size, int(tokens))
    import pandas as pd

    rows = [run(code, path, size, int(tokens)) for size, tokens in (r.split("@") for r in args.runs.split(","))
            for code, path in codes(args.before)]
    frame = pd.DataFrame(rows)
    print(frame.to_string(index=False))
    frame.to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
