"""Where the demo's one-pass estimate grows glibc's heap: its own work, or the checkpointed forward and backward
it rests on. Each case runs in a fresh process on the demo's model and sample (``interp demo``'s first batches),
after a plain forward over them; glibc's heap (``mallinfo2().arena``) and its bytes in use (``uordblks``) are read
before the case and after it:

* ``backward``: each item alone, the blocks checkpointed as the estimate's are (``_checkpointed_blocks``), its
  final hidden states summed and one backward to a zero added to layer 0's values;
* ``backward_pairs``: the same, with the estimate's shape of backward: its default 8 random directions,
  ``PROJECTIONS_PER_BACKWARD`` (2) to a batched backward (``is_grads_batched``), the graph kept between them;
* ``estimate``: ``ablate_bias(estimate="atp_distance")``, the demo's estimate, on the same batches.

Rows (case, model, items, heap_start_mb, heap_end_mb, heap_growth_mb, in_use_growth_mb) go to
``docs/results/scale/estimate_heap.csv`` (``--out``), one per case and repeat.

    python benchmarks/estimate_heap.py [--repeats 2] [--batches N] [--cases a,b] [--out FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

from heap_alignment import _Mallinfo2, child_row, write_rows  # this script's folder is first on sys.path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("backward", "backward_pairs", "estimate")
MODEL = "dinov2-s14"


def _heap() -> tuple[float, float]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return info.arena / 2**20, info.uordblks / 2**20


def child(case: str, batches: int) -> dict:
    """One case in this process (module doc)."""
    sys.path.insert(0, str(ROOT))
    import inspect

    import torch

    from interp import ablate_bias
    from interp.ablation.attribution import PROJECTIONS_PER_BACKWARD, _checkpointed_blocks
    from interp.ablation.metrics import run_forward
    from interp.models.loading import load_model
    from interp.record.hooks import hook_name
    from interp.report.pipeline import DEMO_BATCHES, make_context

    torch.set_num_threads(1)
    ctx = make_context(load_model(MODEL), max_batches=batches or DEMO_BATCHES, command="demo")
    sample = list(ctx.first())
    with torch.no_grad():
        for batch in sample:
            run_forward(ctx.model, batch, [], False)
    start, used = _heap()
    if case == "estimate":
        ablate_bias(ctx.model, sample, kinds=("q", "k", "v"), method="zero", estimate="atp_distance")
    else:
        generator = torch.Generator().manual_seed(0)
        # the estimate's own shape: its default projections, PROJECTIONS_PER_BACKWARD to a backward
        n_backwards = inspect.signature(ablate_bias).parameters["n_projections"].default // PROJECTIONS_PER_BACKWARD
        for batch in sample:
            for lo in range(int(batch.inputs.shape[0])):
                zero = torch.zeros(1, requires_grad=True)
                hooks = [(hook_name(0, "v"), lambda t, hook: t + zero)]
                with torch.enable_grad(), _checkpointed_blocks(ctx.model, True):
                    _, hidden = run_forward(ctx.model, batch.items(lo, lo + 1), hooks, True)
                    if case == "backward":
                        torch.autograd.grad(hidden.sum(), [zero])
                    for r in range(n_backwards if case == "backward_pairs" else 0):
                        directions = torch.randn((PROJECTIONS_PER_BACKWARD, *hidden.shape), generator=generator,
                                                 dtype=hidden.dtype)
                        torch.autograd.grad(hidden, [zero], grad_outputs=directions, is_grads_batched=True,
                                            retain_graph=r < n_backwards - 1)
    end, used_end = _heap()
    items = sum(int(b.inputs.shape[0]) for b in sample)
    return dict(case=case, model=MODEL, items=items, heap_start_mb=round(start, 2), heap_end_mb=round(end, 2),
                heap_growth_mb=round(end - start, 2), in_use_growth_mb=round(used_end - used, 2))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batches", type=int, default=None, help="the demo's sample's first N batches (default: the demo's own)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "scale" / "estimate_heap.csv")
    parser.add_argument("--child", choices=CASES)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.batches)))
        return
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; choose among {', '.join(CASES)}")
    rows = []
    for repeat in range(args.repeats):
        for case in cases:
            command = [sys.executable, __file__, "--child", case] + (
                ["--batches", str(args.batches)] if args.batches else [])
            row = child_row(command, case, env=dict(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"))
            rows.append(dict(row, repeat=repeat + 1))
            print(rows[-1])
    write_rows(rows, args.out)

if __name__ == "__main__":
    main()
