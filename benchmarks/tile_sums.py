"""The stacked variants' per-tile sums, torch's arithmetic against the fused kernel (``interp.ablation.fused``), on
the vocabulary tiles of the two ablation shapes, at 1 and 2 CPU threads, in one run; seconds for every tile of one
``patched_stack`` call, beyond the tile products (the tiles are made beforehand in the tile buffer's layout).

    python benchmarks/tile_sums.py [--repeats 3] [--out docs/results/scale/tile_sums_cpu.csv]

Shapes (``benchmarks/scale.py``'s ablation rows): 112m@512 at stack 1 (1,024 real positions, one variant) and
25m@128 at stack 3 (256 positions, three variants), vocabulary 32,000 in tiles of ``TILE_VOCAB``. Columns: shape,
rows, variants, threads, omp_wait_policy (as the process found it), torch_s and fused_s (fastest of ``--repeats``),
ratio (torch / fused), max_rel_diff (the two paths' sums, relative). Each thread count runs in its own child
process (torch's thread pool is set once a process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "results" / "scale" / "tile_sums_cpu.csv"
SHAPES = {"112m@512, stack 1": (1024, 1), "25m@128, stack 3": (256, 3)}
VOCAB = 32000


def measure(rows: int, variants: int, repeats: int) -> dict:
    """(fastest torch seconds, fastest fused seconds, their sums' largest relative difference) for one call's tiles."""
    from interp.ablation import fused, logits
    g = torch.Generator().manual_seed(0)
    intact_z = torch.randn(rows, VOCAB, generator=g) * 3
    lse = intact_z.logsumexp(-1)
    intact = logits.IntactLogits(None, None, None, None, intact_z, 1, lse, None, None)
    patched = intact_z[None] + 0.01 * torch.randn(variants, rows, VOCAB, generator=g)
    tiles = [(lo, min(lo + logits.TILE_VOCAB, VOCAB)) for lo in range(0, VOCAB, logits.TILE_VOCAB)]
    tiles = [(lo, hi, patched[:, :, lo:hi].contiguous()) for lo, hi in tiles]
    space, lse64 = logits._TileBuffers(torch.float32, torch.device("cpu")), lse.double()
    times, sums = {}, {}
    for path in ("torch", "fused") * repeats:
        out = (torch.zeros(variants, rows, dtype=torch.float64), torch.zeros(variants, rows, dtype=torch.float64))
        start = time.perf_counter()
        for lo, hi, z in tiles:
            if path == "fused":
                fused.tile_sums(z.view(variants * rows, hi - lo), intact_z, lo, lse64, *out)
            else:
                logits._torch_tile_sums(space, z, intact, lo, hi, *out)
        times[path] = min(times.get(path, float("inf")), time.perf_counter() - start)
        sums[path] = out
    diff = max(float(((a - b).abs() / b.abs()).max()) for a, b in zip(sums["torch"], sums["fused"]))
    return dict(torch_s=times["torch"], fused_s=times["fused"], max_rel_diff=diff)


def child(threads: int, repeats: int) -> list[dict]:
    torch.set_num_threads(threads)
    return [dict(shape=name, rows=rows, variants=variants, threads=threads,
                 omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "default"), **measure(rows, variants, repeats))
            for name, (rows, variants) in SHAPES.items()]


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", default="1,2", help="comma separated; each in its own process")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.repeats)))
        return pd.DataFrame()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        done = subprocess.run([sys.executable, __file__, "--child", str(threads), "--repeats", str(args.repeats)],
                              capture_output=True, text=True, check=True)
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    frame = pd.DataFrame(rows)
    frame["ratio"] = frame.torch_s / frame.fused_s
    frame.to_csv(args.out, index=False, float_format="%.6g")
    print(frame.to_string(index=False))
    return frame


if __name__ == "__main__":
    main()
