"""Why glibc's heap grows past the live tensors at its defaults: a freed block does not serve the next request of
its own size when the request is aligned, as torch's CPU allocator asks for every tensor (``posix_memalign`` to 64
bytes), once a small block has been made beside it.

Each case runs in a fresh process: one 20 MiB block is made and freed (the dynamic mmap threshold rises past the
blocks below, as after a model's first forward, so they come from the heap), then ``--iterations`` times a block
of ``--block-mib`` is made (and written), a 256-byte block made and kept, and the large block freed:

* ``malloc``: ``malloc`` and ``free``;
* ``posix_memalign``: ``posix_memalign(64)`` and ``free`` (what ``c10::alloc_cpu`` calls);
* ``torch.empty``: a float32 tensor filled and let go (the small block: torch's own bookkeeping, and a kept
  256-byte tensor).

Rows (case, block_mib, iterations, arena_start_mb, arena_end_mb, growth_mb: glibc's heap, ``mallinfo2().arena``,
after the first and the last iteration) go to ``docs/results/scale/heap_alignment.csv`` (``--out``).

    python benchmarks/heap_alignment.py [--block-mib 12] [--iterations 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
CASES = ("malloc", "posix_memalign", "torch.empty")
ALIGNMENT = 64  # c10's gAlignment on CPU


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def child(case: str, block_mib: int, iterations: int) -> dict:
    """One case in this process (module doc): glibc's arena after the first and the last iteration, MB."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    size = block_mib * 2**20
    libc.free(libc.malloc(20 * 2**20))  # the threshold rises past the blocks below
    kept, arenas = [], []
    if case == "torch.empty":
        import torch
    for _ in range(iterations):
        if case == "torch.empty":
            block = torch.empty(size // 4).fill_(1.0)
            kept.append(torch.empty(64))
            del block
        else:
            if case == "malloc":
                address = libc.malloc(size)
            else:
                out = ctypes.c_void_p()
                if libc.posix_memalign(ctypes.byref(out), ALIGNMENT, size):
                    raise SystemExit("posix_memalign failed")
                address = out.value
            ctypes.memset(address, 1, size)
            kept.append(libc.malloc(256))
            libc.free(address)
        arenas.append(libc.mallinfo2().arena / 2**20)
    return dict(case=case, block_mib=block_mib, iterations=iterations, arena_start_mb=round(arenas[0], 2),
                arena_end_mb=round(arenas[-1], 2), growth_mb=round(arenas[-1] - arenas[0], 2))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-mib", type=int, default=12)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "scale" / "heap_alignment.csv")
    parser.add_argument("--child", choices=CASES)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.block_mib, args.iterations)))
        return
    rows = []
    for case in CASES:
        rows.append(child_row([sys.executable, __file__, "--child", case, "--block-mib", str(args.block_mib),
                               "--iterations", str(args.iterations)], case))
        print(rows[-1])
    write_rows(rows, args.out)


def child_row(command: list[str], what: str, env: Optional[dict] = None) -> dict:
    """The JSON row a fresh child process prints last, glibc as every user runs it: no MALLOC_* setting, no
    preloaded allocator (those would change the figures); ``env``: more variables for the child."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    done = subprocess.run(command, capture_output=True, text=True, env={**clean, **(env or {})})
    if done.returncode:
        raise SystemExit(f"{what} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_rows(rows: list[dict], out: Path) -> None:
    """The table, written whole or not at all."""
    import pandas as pd

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    pd.DataFrame(rows).to_csv(tmp, index=False)
    tmp.replace(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
