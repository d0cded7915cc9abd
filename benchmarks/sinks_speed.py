"""Speed and memory of the implicit-bias analyzers: are they close to a plain forward?

    nice python benchmarks/sinks_speed.py [--model smollm2-135m] [--batches 4] [--repeats 2]

In one process, over the same batches of the built-in corpus (python-docs, 64-token windows of 8):
a plain forward (``model(x)``, eager attention, no hooks, no gradients), the same forward ended after the
last block (no final norm, no unembedding: what the analyzers run), ``sink_profile``,
``massive_activations``, their sum, and ``sink_pass`` (both tables from one forward per batch); each timed ``--repeats`` times, the fastest kept; ratios to the
plain forward printed side by side (machines are noisy: compare within one run only).
Memory: ``sink_pass`` in a fresh process on the first 2 and on all 16 of the same 16 prepared batches,
peak RSS of each and its growth (the analyzers stream: it should stay within noise); and, in this process,
the resident memory after each batch of one 16-batch ``sink_pass`` (no allocator peak, no process start).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

import interp
from interp.record.capture import run_until_kept
from interp.data import check_batch
from interp.record.hooks import block_hook


def batches_of(model, n: int, size: int = 8) -> list:
    data = interp.builtin_batches(model, "python-docs", batch_size=size, n=n * size)
    if len(data) < n:  # the corpus is short: repeat it (the same windows again)
        data = (data * (n // len(data) + 1))[:n]
    return data[:n]


def plain(model, data) -> None:
    with torch.no_grad():
        for b in data:
            model(b.inputs, attention_mask=b.attention_mask)


def blocks_only(model, data) -> None:
    """The forward through every block, ending at the last block's output: no final norm, no unembedding
    (what the analyzers run; a language model's unembedding into its vocabulary is a large part of a forward)."""
    last = block_hook(model.interp.n_layers - 1, "hook_out")
    with torch.no_grad():
        for b in data:
            run_until_kept(model, check_batch(model, b), [last])


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def speed(name: str, n: int, repeats: int) -> dict:
    model = interp.load_model(name, device="cpu")
    data = batches_of(model, n)
    plain(model, data[:1])  # warm-up
    runs = {
        "plain forward": lambda: plain(model, data),
        "forward through the blocks only": lambda: blocks_only(model, data),
        "sink_profile": lambda: interp.sink_profile(model, data, progress=False),
        "massive_activations": lambda: interp.massive_activations(model, data, progress=False),
        "sink_pass (both, one forward)": lambda: interp.sink_pass(model, data, progress=False),
    }
    seconds = {key: timed(fn, repeats) for key, fn in runs.items()}
    seconds["sink_profile + massive_activations"] = seconds["sink_profile"] + seconds["massive_activations"]
    return seconds


def child(name: str, n: int) -> None:
    """One fresh process: both analyzers on ``n`` batches; print peak RSS (MiB)."""
    model = interp.load_model(name, device="cpu")
    data = batches_of(model, 16)[:n]  # the same windows prepared either way: only the analyzers' memory differs
    interp.sink_pass(model, data, progress=False)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def rss_mb() -> float:
    """This process's resident memory now (MiB), from /proc (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_along(name: str, n: int = 16) -> list[float]:
    """One ``sink_pass`` over ``n`` prepared batches, fed by a generator that reads the resident memory
    each time the pass asks for the next batch: entry i is the RSS once i batches were consumed."""
    model = interp.load_model(name, device="cpu")
    data = batches_of(model, n)
    marks: list[float] = []

    def tracked():
        for batch in data:
            marks.append(rss_mb())
            yield batch
        marks.append(rss_mb())

    interp.sink_pass(model, tracked(), progress=False)
    return marks


def memory(name: str, sizes: tuple[int, ...] = (2, 16)) -> dict:
    out = {}
    for n in sizes:
        r = subprocess.run([sys.executable, __file__, "--child", str(n), "--model", name], capture_output=True,
                           text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if r.returncode:
            raise SystemExit(r.stderr[-3000:])
        out[n] = json.loads(r.stdout.strip().splitlines()[-1])["peak_rss_mb"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batches", type=int, default=4, help="batches of 8 windows timed (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--memory-only", action="store_true", help="skip the timings")
    args = p.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    if args.child:
        child(args.model, args.child)
        return
    if not args.memory_only:
        seconds = speed(args.model, args.batches, args.repeats)
        base = seconds["plain forward"]
        print(f"{args.model}, {args.batches} batches of 8 x 64 tokens, fastest of {args.repeats}:")
        blocks = seconds["forward through the blocks only"]
        for key, s in seconds.items():
            print(f"  {key:36s} {s:7.2f} s   {s / base:5.2f}x the plain forward   {s / blocks:5.2f}x the blocks only")
    marks = rss_along(args.model)
    print(f"resident memory during one sink_pass: after 2 batches {marks[2]:.0f} MiB, after 16 {marks[16]:.0f} MiB "
          f"(growth {marks[16] - marks[2]:+.0f} MiB; after each batch: {', '.join(f'{m:.0f}' for m in marks[1:])})")
    rss = memory(args.model)
    print(f"peak RSS, fresh process: 2 batches {rss[2]:.0f} MiB, 16 batches {rss[16]:.0f} MiB, "
          f"growth {rss[16] - rss[2]:+.0f} MiB")


if __name__ == "__main__":
    main()
