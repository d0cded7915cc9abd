"""The stacked variants' per-tile sums (``logits._torch_tile_sums``) in plain torch against the same arithmetic under
``torch.compile`` (inductor, CPU), on the vocabulary tiles of the two ablation shapes, in one run; seconds for every
tile of one ``patched_stack`` call beyond the tile products (the tiles are made beforehand).

    python benchmarks/tile_sums_compile.py [--repeats 5] [--threads 1,2] [--out docs/results/scale/tile_sums_compile_cpu.csv]

Shapes (``benchmarks/scale.py``'s ablation rows): 112m@512 at stack 1 (1,024 real positions, one variant) and
25m@128 at stack 3 (256 positions, three variants), vocabulary 32,000 in tiles of ``TILE_VOCAB``. The compiled
function is the tile's two sums written as one expression (widen, subtract lse, exp, multiply, reduce: inductor
fuses them into one loop per row); the last tile is narrower, so ``dynamic=False`` compiles two shapes, both
before the timing (``compile_s``: the first calls, compilation included). Columns: shape, rows, variants, threads,
torch_s and compiled_s (fastest of ``--repeats``), ratio (torch / compiled: above 1, the compiled path is faster),
compile_s, max_rel_diff (the two paths' sums, relative), load_1min (the machine's load average as the child
started: on a shared machine the two-thread timings suffer most). Each thread count runs in its own child process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "results" / "scale" / "tile_sums_compile_cpu.csv"
SHAPES = {"112m@512, stack 1": (1024, 1), "25m@128, stack 3": (256, 3)}
VOCAB = 32000


def tile_sums(z: torch.Tensor, zp: torch.Tensor, lse64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_v exp(z_v - lse), sum_v p_v (z_v - lse)) per stacked row, p_v = exp(z_p,v - lse), in float64."""
    p = (zp.to(torch.float64) - lse64[:, None]).exp()
    s = z.to(torch.float64) - lse64[None, :, None]
    return s.exp().sum(-1), (s * p).sum(-1)


def measure(rows: int, variants: int, repeats: int) -> dict:
    from interp.ablation import logits
    g = torch.Generator().manual_seed(0)
    intact_z = torch.randn(rows, VOCAB, generator=g) * 3
    lse = intact_z.logsumexp(-1)
    patched = intact_z[None] + 0.01 * torch.randn(variants, rows, VOCAB, generator=g)
    tiles = [(lo, min(lo + logits.TILE_VOCAB, VOCAB)) for lo in range(0, VOCAB, logits.TILE_VOCAB)]
    tiles = [(lo, hi, patched[:, :, lo:hi].contiguous()) for lo, hi in tiles]
    space, lse64 = logits._TileBuffers(torch.device("cpu")), lse.double()
    compiled = torch.compile(tile_sums, dynamic=False)
    start = time.perf_counter()
    for lo, hi, z in (tiles[0], tiles[-1]):
        compiled(z, intact_z[:, lo:hi], lse64)
    compile_s = time.perf_counter() - start
    times, sums = {}, {}
    for path in ("torch", "compiled") * repeats:
        out = (torch.zeros(variants, rows, dtype=torch.float64), torch.zeros(variants, rows, dtype=torch.float64))
        start = time.perf_counter()
        for lo, hi, z in tiles:
            if path == "compiled":
                e, b = compiled(z, intact_z[:, lo:hi], lse64)
                out[0].add_(e)
                out[1].add_(b)
            else:
                p = logits.log_p64(intact_z[:, lo:hi], lse, out=space.take("p", (rows, hi - lo))).exp_()
                logits._torch_tile_sums(space, z, p, lse, *out)
        times[path] = min(times.get(path, float("inf")), time.perf_counter() - start)
        sums[path] = out
    diff = max(float(((a - b).abs() / b.abs()).max()) for a, b in zip(sums["torch"], sums["compiled"]))
    return dict(torch_s=times["torch"], compiled_s=times["compiled"], compile_s=compile_s, max_rel_diff=diff)


def child(threads: int, repeats: int) -> list[dict]:
    import os

    torch.set_num_threads(threads)
    load = os.getloadavg()[0]
    return [dict(shape=name, rows=rows, variants=variants, threads=threads, load_1min=load,
                 **measure(rows, variants, repeats))
            for name, (rows, variants) in SHAPES.items()]


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
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
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"--child {threads} exited {done.returncode}:\n{done.stderr[-3000:]}")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    frame = pd.DataFrame(rows)
    frame["ratio"] = frame.torch_s / frame.compiled_s
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False, float_format="%.6g")
    print(frame.to_string(index=False))
    return frame


if __name__ == "__main__":
    main()
