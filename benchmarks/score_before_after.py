"""``score_decomposition`` before and after its row-block rework (issue 40 item 2), against a plain forward.

    nice python benchmarks/score_before_after.py [--runs 25m@128,25m@512,112m@128,112m@512] [--repeats 3]
        [--batch-size 2] [--batches 2] [--before aa859e5] [--out docs/results/scale/score_before_after.csv]
    nice python benchmarks/score_before_after.py --profile      # -> docs/results/scale/score_decomposition_profile.txt
    python benchmarks/score_before_after.py --dry-run            # tiny model, 16 tokens, seconds (tests run it)

The code before is ``interp/analysis/scores.py`` at ``--before`` (a commit, read with ``git show``, or a .py file),
loaded as a module beside the current ``interp.analysis.scores``: one process, the same random-init Qwen2 models of
``benchmarks/scale.py`` (``SIZES``, float32, q/k/v biases N(0, 0.02^2)) and the same batches of random token ids.
One CPU thread. Each repeat runs, in turn, a plain HF forward (``model.hf_model(ids)``, with its unembedding: the
reference), the pass before and the pass after; per pass the fastest wall and CPU (process) seconds over the repeats
are kept, with glibc's allocator at its defaults (as a user runs it). Then, for every run, each pass runs once more
for its peak memory: the process's peak resident set above what it held before the pass, scale.py's method (VmHWM
reset through /proc/self/clear_refs, glibc's mmap threshold fixed at 64 KiB so that freed tensors go back to the
system and each pass sees its own peak). That setting is kept out of the timings: with it every temporary above 64
KiB is a fresh mmap, and the row blocks' many temporaries ran 2x slower (the same code at 112m@512: 15.2 s of CPU
with it, 7.5 s without), which says more about the setting than about the code. With ``--batches`` 2 the pattern
check (first batch) runs on one of the two batches, in both versions. Ratios are to the forward: ``*_wall_ratio``,
``*_cpu_ratio`` (CPU time is less sensitive to other jobs than wall time), ``*_memory_ratio``. ``max_abs_diff``: the
largest |after - before| over the table's number columns (variance, share, total_variance, kl_without_key_prior and
the bootstrap bounds). ``load_1min_*``: the machine's 1-minute load average before and after the run (the machine is
shared; a load above its core count slows every pass). One row per size@tokens.

``--profile``: cProfile of one pass before and one after at the first ``--runs`` item (one batch, so the pattern
check is in both), the top entries by own time and the per-layer reduction's cumulative line
(``_accumulate_terms`` before and after), written to ``score_decomposition_profile.txt`` beside ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # this checkout's interp, even beside an installed one
import scale  # noqa: E402

import interp  # noqa: E402
import interp.analysis.scores as after_module  # noqa: E402

#: the functions of the per-layer reduction, before and after, in the profile's cumulative listing
REDUCTION = r"scores.*\((_accumulate_terms|_term_sums|_layer_sums|_block_terms|_block_gram|_kl_without_key_prior|_pattern_gap)\)"
NUMBERS = ["variance", "share", "total_variance", "kl_without_key_prior", "share_lo", "share_hi"]


def load_before(before: str):
    """``interp/analysis/scores.py`` at commit ``before`` (or the file ``before``) as a module of its own."""
    if before.endswith(".py"):
        source = Path(before).read_text()
    else:
        source = subprocess.run(["git", "show", f"{before}:interp/analysis/scores.py"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as folder:  # a file, so that profiles name its functions' lines
        path = Path(folder) / f"scores_{Path(before).stem}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("scores_before", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def _commit() -> str:
    """This checkout's commit, with "+" when interp/ has changes not committed."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "interp") else "")


def timed(fn) -> tuple[float, float, float, object]:
    """(wall seconds, CPU seconds, peak MB above what was held before, result) of ``fn()``."""
    for trim in scale.TRIM:
        trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    base = scale._rss_mb("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, max(scale._rss_mb("VmHWM") - base, 0.0), result


def _passes(size: str, tokens: int, before, args) -> dict:
    """The three passes of one run on a fresh model and batches (after a warm-up forward)."""
    model = scale.build(size, "cpu", torch.float32)
    data = scale.make_batches(scale.SIZES[size][5], args.batches, args.batch_size, tokens, "cpu")
    scale.plain_forward(model, data[:1])
    return {"forward": lambda: scale.plain_forward(model, data),
            "before": lambda: before.score_decomposition(model, data, progress=False),
            "after": lambda: after_module.score_decomposition(model, data, progress=False)}


def time_run(size: str, tokens: int, before, args) -> dict:
    """One row's times: the three passes, ``args.repeats`` times in turn, the fastest wall and CPU seconds of each
    (module doc), and the largest table difference."""
    passes, tables = _passes(size, tokens, before, args), {}
    best = {name: [float("inf"), float("inf")] for name in passes}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for name, fn in passes.items():
            wall, cpu, _, tables[name] = timed(fn)
            best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
    diff = (tables["after"][NUMBERS] - tables["before"][NUMBERS]).abs().max().max()
    row = dict(size=size, tokens=tokens, batch_size=args.batch_size, n_batches=args.batches, repeats=args.repeats,
               threads=torch.get_num_threads(), cores=os.cpu_count(), before=args.before, after=_commit(),
               max_abs_diff=diff, load_1min_before=load_before, load_1min_after=os.getloadavg()[0])
    for name in passes:
        row.update({f"{name}_wall_s": best[name][0], f"{name}_cpu_s": best[name][1]})
    for name in ("before", "after"):
        row.update({f"{name}_wall_ratio": row[f"{name}_wall_s"] / row["forward_wall_s"],
                    f"{name}_cpu_ratio": row[f"{name}_cpu_s"] / row["forward_cpu_s"]})
    return row


def add_peaks(row: dict, before, args) -> dict:
    """``row`` with each pass's peak MB (one more run each, glibc's mmap threshold fixed: module doc) and the
    memory ratios to the forward's."""
    passes = _passes(row["size"], int(row["tokens"]), before, args)
    for name, fn in passes.items():
        row[f"{name}_peak_mb"] = timed(fn)[2]
    for name in ("before", "after"):
        forward = row["forward_peak_mb"]
        row[f"{name}_memory_ratio"] = row[f"{name}_peak_mb"] / forward if forward else float("nan")
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def profile(before, args) -> str:
    """cProfile of one pass before and one after at the first ``--runs`` item, one batch (module doc)."""
    size, tokens = args.runs.split(",")[0].split("@")
    model = scale.build(size, "cpu", torch.float32)
    data = scale.make_batches(scale.SIZES[size][5], 1, args.batch_size, int(tokens), "cpu")
    scale.plain_forward(model, data)
    text = io.StringIO()
    for name, module in (("before", before), ("after", after_module)):
        module.score_decomposition(model, data, progress=False)  # warm-up
        profiler = cProfile.Profile()
        profiler.runcall(lambda: module.score_decomposition(model, data, progress=False))
        text.write(f"===== {name} ({args.before if name == 'before' else 'this commit'}): score_decomposition at "
                   f"{size}@{tokens}, batch {args.batch_size} x 1, cpu, float32, 1 thread\n")
        stats = pstats.Stats(profiler, stream=text).strip_dirs()
        text.write("-- the per-layer reduction (cumulative)\n")
        stats.sort_stats("cumulative").print_stats(REDUCTION)
        text.write("-- top 20 by own time\n")
        stats.sort_stats("tottime").print_stats(20)
    return text.getvalue()


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="25m@128,25m@512,112m@128,112m@512")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--before", default="aa859e5", help="a commit (git show) or a scores.py file")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "scale" / "score_before_after.csv"))
    p.add_argument("--profile", action="store_true", help="cProfile before/after -> score_decomposition_profile.txt")
    p.add_argument("--dry-run", action="store_true", help="tiny@16, one batch, one repeat")
    args = p.parse_args(argv)
    if args.dry_run:
        args.runs, args.batches, args.repeats = "tiny@16", 1, 1
    torch.set_num_threads(1)
    before = load_before(args.before)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.profile:
        (out.parent / "score_decomposition_profile.txt").write_text(profile(before, args))
        print(f"wrote {out.parent / 'score_decomposition_profile.txt'}")
        return pd.DataFrame()
    rows = [time_run(size, int(tokens), before, args) for size, tokens in (r.split("@") for r in args.runs.split(","))]
    scale.exact_cpu_peaks()  # from here on: peaks only (module doc)
    frame = pd.DataFrame([add_peaks(row, before, args) for row in rows])
    frame.to_csv(out, index=False, float_format="%.6g")
    print(f"wrote {out}")
    return frame


if __name__ == "__main__":
    assert interp.__file__.startswith(str(ROOT)), f"interp imported from {interp.__file__}, not this checkout"
    main()
