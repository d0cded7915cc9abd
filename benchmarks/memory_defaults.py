"""Peak resident memory of ``ablate_bias`` and ``interp demo`` as a user's process meets it: glibc's allocator at its
defaults (no ``MALLOC_*`` variable, no ``mallopt``), with the fixed-threshold figure (``MALLOC_MMAP_THRESHOLD_=65536``:
every freed block above 64 KiB goes back to the system at once, so the resident set follows the live tensors)
beside it. Each row is one fresh process.

    nice python benchmarks/memory_defaults.py --runs 25m@128 [--batches 2] [--exact-heads K] [--label L]
    nice python benchmarks/memory_defaults.py --runs 112m@512 --batches 1 --exact-heads 1 --label L
    nice python benchmarks/memory_defaults.py --demo --label L          # interp demo (its default model)
    python benchmarks/memory_defaults.py --dry-run --out DIR            # the tiny shape in seconds (tests run it)

In each child: the model is built (``scale.py``'s random-init Qwen2 shapes, or the demo's model loaded), then
``base`` = the resident set (VmRSS); a plain forward over the batches (HF's forward; the demo: the bridge's forward
over the demo's sample) sets ``forward_mb`` = its peak (VmHWM) - base, "the forward's own"; then the call
(``ablate_bias(estimate="auto")`` at its defaults, first in the process, or every step of the demo) sets
``above_forward_mb`` = the process's peak after it - the forward's peak, and ``total_mb`` = that peak - base;
``ratio`` = total / forward (the goal: at most 2, i.e. above_forward_mb at most forward_mb).

``--profile``: the child also records the resident set per phase: every call of the sweep's phases (the intact
run, the one-pass estimate and its batches, the exact stage, each round's intact forward, each stacked forward and
its tiled metric; the demo's steps and the writing of each one's files) closes a segment, whose peak is VmHWM read
then (reset through /proc/self/clear_refs at each boundary, so the process's peak is the largest segment's), with
glibc's own accounting (``mallinfo2``: heap bytes, mmapped bytes, bytes in use, free bytes kept in the heap) and
the resident set's two parts above the base (``rss_anon_mb``: anonymous memory, the heap, mmapped blocks and
Python's arenas; ``rss_file_mb``: pages of files, the libraries' code first run and mapped data) at the boundary.
Rows to ``memory_profile_<label>.csv`` beside the table (``--out``'s folder, default docs/results/scale/), one per
segment; the summary per phase (its largest peak, and how often it ran) is printed.

Rows are appended to ``docs/results/scale/memory_defaults_cpu.csv`` (``--out``): label, target, size, tokens,
batch_size, n_batches, exact_heads, threads, allocator (defaults / fixed / jemalloc), malloc_env (the MALLOC_* and
LD_PRELOAD variables the child saw), forward_mb, total_mb, above_forward_mb, ratio, seconds (the call's wall time in that child; the machine may be shared), stack_used.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's interp, whatever the environment has installed
OUT = ROOT / "docs" / "results" / "scale" / "memory_defaults_cpu.csv"
FIXED = {"MALLOC_MMAP_THRESHOLD_": "65536"}
# a measured supplement, not how the goal is met: the same call with jemalloc in place of glibc's allocator (the
# system's libjemalloc2 preloaded into the child; the profile's heap columns are then glibc's, i.e. empty)
JEMALLOC = {"LD_PRELOAD": "libjemalloc.so.2"}
COLUMNS = ["label", "target", "size", "tokens", "batch_size", "n_batches", "exact_heads", "threads", "allocator",
           "malloc_env", "forward_mb", "total_mb", "above_forward_mb", "ratio", "seconds", "stack_used"]
# (module, function): the phases a profile segments the call by (the innermost running one names a segment)
SWEEP_PHASES = [("interp.ablation.sweep", n) for n in ("_run_intact", "_run_estimate", "_exact", "_intact_batch",
                                                       "_stacked_forward", "intact_logits", "patched_stacks")] + [
    ("interp.ablation.attribution", "batch_estimates")]


def _status(*fields: str) -> list[float]:
    """Fields of /proc/self/status in MB, read at one instant."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            found[key] = int(value.split()[0]) / 1024
    return [found.get(f, float("nan")) for f in fields]


def _status_mb(field: str) -> float:
    return _status(field)[0]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo() -> dict:
    """glibc's accounting, MB: heap (arena: obtained with brk), mmapped (hblkhd), in use (uordblks + hblkhd), free
    bytes the heap keeps (fordblks); empty where glibc has no mallinfo2 (read only: the allocator is not changed)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    m = fn()
    mb = 2.0 ** -20
    return dict(heap_mb=m.arena * mb, mmap_mb=m.hblkhd * mb, in_use_mb=(m.uordblks + m.hblkhd) * mb,
                heap_free_mb=m.fordblks * mb)


class Phases:
    """Segments of the resident set between calls of the wrapped functions (module doc, ``--profile``)."""

    def __init__(self, base: float):
        self.base, self.stack, self.rows, self.t0 = base, ["forward"], [], time.perf_counter()
        # the resident set's two parts at the base: anonymous (the heap, mmapped blocks, Python's arenas) and
        # file-backed (the libraries' code and data pages, first touched when a kernel first runs)
        self.base_anon, self.base_file = _status("RssAnon", "RssFile")
        self.reset()

    def reset(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS

    def close(self) -> None:
        """Close the running segment (the innermost phase's): its peak, and the allocator's state now."""
        hwm, rss, anon, file = _status("VmHWM", "VmRSS", "RssAnon", "RssFile")
        self.rows.append(dict(seq=len(self.rows), phase=self.stack[-1], path="/".join(self.stack),
                              t_s=round(time.perf_counter() - self.t0, 3), peak_mb=hwm - self.base,
                              rss_mb=rss - self.base, rss_anon_mb=anon - self.base_anon,
                              rss_file_mb=file - self.base_file, **_mallinfo()))
        trace = os.environ.get("MEMORY_TRACE")
        if trace:  # a live view of a long run (the rows reach the CSV only at its end)
            with open(trace, "a") as f:
                f.write(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in self.rows[-1].items()) + "\n")
        self.reset()

    def wrap(self, module: str, name: str, label=None) -> None:
        import importlib

        mod = importlib.import_module(module)
        original = getattr(mod, name)

        @functools.wraps(original)
        def phase(*args, **kwargs):
            self.close()
            self.stack.append(label(args) if label else name)
            try:
                return original(*args, **kwargs)
            finally:
                self.close()
                self.stack.pop()
        setattr(mod, name, phase)

    def peak(self) -> float:
        return max(r["peak_mb"] for r in self.rows)


def _estimate_label(args) -> str:
    return "exact" if args[2] == "exact" else f"estimate ({args[2]})"


def child_ablation(size: str, tokens: int, args) -> dict:
    """One ablation row in this process (module doc)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scale
    import torch

    import interp
    from interp.ablation.memory import auto_stack

    torch.set_num_threads(args.threads)
    model = scale.build(size, "cpu", torch.float32)
    data = scale.make_batches(scale.SIZES[size][5], args.batches, args.batch_size, tokens, "cpu")
    options = {} if args.exact_heads is None else dict(top_k=args.exact_heads, sample_k=args.exact_heads)
    base = _status_mb("VmRSS")
    phases = Phases(base) if args.profile else None
    Path("/proc/self/clear_refs").write_text("5")
    scale.plain_forward(model, data)
    forward = _status_mb("VmHWM") - base
    if phases:
        phases.close()
        for module, name in SWEEP_PHASES:
            phases.wrap(module, name, _estimate_label if name == "_run_estimate" else None)
        phases.stack = ["ablate_bias"]
    t0 = time.perf_counter()
    interp.ablate_bias(model, data, estimate="auto", progress=False, **options)
    seconds = time.perf_counter() - t0
    if phases:
        phases.close()
        peak = phases.peak()
    else:
        peak = _status_mb("VmHWM") - base
    stack = min(auto_stack(model, b.inputs, True, True, backward=True, tiled=True) for b in data)
    return dict(target="ablate_bias", size=size, tokens=tokens, batch_size=args.batch_size, n_batches=args.batches,
                exact_heads="default" if args.exact_heads is None else args.exact_heads, forward_mb=forward,
                total_mb=peak, seconds=seconds, stack_used=stack, profile=phases.rows if phases else None)


def child_demo(args) -> dict:
    """``interp demo`` (its default model and data, ``run_demo``) in this process: the forward over the demo's
    sample first, then every step."""
    import tempfile

    import torch

    import interp.report.demo as demo
    import interp.report.pipeline as pipeline
    from interp.ablation.metrics import run_forward

    torch.set_num_threads(args.threads)
    said: dict = {}
    original_steps = pipeline.run_steps

    def run_steps(ctx, *a, **kw):
        said["base"] = base = _status_mb("VmRSS")
        phases = Phases(base) if args.profile else None
        Path("/proc/self/clear_refs").write_text("5")
        with torch.no_grad():
            for batch in ctx.first():
                run_forward(ctx.model, batch, [], False)
        said["forward"] = _status_mb("VmHWM") - base
        said["batches"] = len(list(ctx.first()))
        if phases:
            phases.close()
            for name in pipeline.STEPS:
                pipeline.STEPS[name] = _step_phase(phases, name, pipeline.STEPS[name])
            for module, name in SWEEP_PHASES:
                phases.wrap(module, name, _estimate_label if name == "_run_estimate" else None)
            phases.wrap("interp.report.demo", "write_and_release", lambda args: "files written")  # after each step
        said["t0"] = time.perf_counter()
        try:
            return original_steps(ctx, *a, **kw)
        finally:
            said["seconds"] = time.perf_counter() - said["t0"]
            if phases:
                phases.stack = ["report"]
            said["phases"] = phases

    demo.run_steps = run_steps
    with tempfile.TemporaryDirectory() as out:
        demo.run_demo(None, None, Path(out) / "demo")
    phases = said["phases"]
    if phases:
        phases.close()
        peak = phases.peak()
    else:
        peak = _status_mb("VmHWM") - said["base"]
    return dict(target="interp demo", size=demo.DEFAULT_MODEL, tokens="", batch_size="", n_batches=said["batches"],
                exact_heads="default", forward_mb=said["forward"], total_mb=peak, seconds=said["seconds"],
                stack_used="", profile=phases.rows if phases else None)


def _step_phase(phases: Phases, name: str, step):
    @functools.wraps(step)
    def run(ctx):
        phases.close()
        phases.stack.append(f"step {name}")
        try:
            return step(ctx)
        finally:
            phases.close()
            phases.stack.pop()
    return run


def run_child(run: str, allocator: str, args) -> dict:
    """One row: a fresh process with the allocator as given (module doc)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    if allocator not in ("defaults", "fixed", "jemalloc"):
        raise SystemExit(f"unknown allocator {allocator!r}: defaults, fixed or jemalloc")
    env.update(FIXED if allocator == "fixed" else JEMALLOC if allocator == "jemalloc" else {})
    command = [sys.executable, __file__, "--child", run, "--threads", str(args.threads), "--batch-size",
               str(args.batch_size), "--batches", str(args.batches)] + (
        ["--exact-heads", str(args.exact_heads)] if args.exact_heads is not None else []) + (
        ["--profile"] if args.profile else [])
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{run} ({allocator}) exited {done.returncode}:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(row, allocator=allocator)


def main(argv=None):
    import pandas as pd

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="25m@128", help="size@tokens, comma separated (scale.py's SIZES)")
    p.add_argument("--demo", action="store_true", help="interp demo instead of --runs")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--exact-heads", type=int, default=None, metavar="K", help="top_k = sample_k = K (default: 5, 5)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--allocators", default="defaults,fixed", help="defaults, fixed, jemalloc (comma separated)")
    p.add_argument("--label", default="")
    p.add_argument("--profile", action="store_true", help="the resident set per phase -> memory_profile_<label>.csv")
    p.add_argument("--out", default=None, help=f"the CSV (default {OUT.relative_to(ROOT)})")
    p.add_argument("--dry-run", action="store_true", help="tiny@16, one batch: seconds")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dry_run:
        args.runs, args.batches, args.exact_heads = "tiny@16", 1, 1
    if args.child:
        if args.child == "demo":
            row = child_demo(args)
        else:
            size, tokens = args.child.split("@")
            row = child_ablation(size, int(tokens), args)
        row["malloc_env"] = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                                     if k.startswith("MALLOC_") or k == "LD_PRELOAD")
        print(json.dumps(row))
        return None
    out = Path(args.out) if args.out else OUT
    if out.suffix != ".csv":
        out = out / OUT.name
    runs = ["demo"] if args.demo else args.runs.split(",")
    rows, profiles = [], []
    for run in runs:
        for allocator in args.allocators.split(","):
            row = run_child(run, allocator, args)
            profile = row.pop("profile")
            row.update(label=args.label, threads=args.threads, above_forward_mb=row["total_mb"] - row["forward_mb"],
                       ratio=row["total_mb"] / row["forward_mb"] if row["forward_mb"] > 0 else float("nan"))
            rows.append(row)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
            if profile:
                frame = pd.DataFrame(profile).assign(run=run, allocator=allocator)
                profiles.append(frame)
                summary = frame.groupby("phase", sort=False).agg(peak_mb=("peak_mb", "max"), segments=("seq", "size"))
                print(summary.to_string(float_format=lambda v: f"{v:.1f}"), flush=True)
    frame = pd.DataFrame(rows)[COLUMNS]
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        frame = pd.concat([pd.read_csv(out), frame], ignore_index=True)
    frame.to_csv(out, index=False, float_format="%.6g")
    print(f"wrote {out}")
    if profiles:
        name = f"memory_profile_{args.label or 'run'}.csv".replace(" ", "_")
        pd.concat(profiles, ignore_index=True).to_csv(out.parent / name, index=False, float_format="%.4g")
        print(f"wrote {out.parent / name}")
    return frame


if __name__ == "__main__":
    main()
