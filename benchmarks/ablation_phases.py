"""Which phase of ``ablate_bias`` sets its peak memory, before and after a change, in one run.

    nice python benchmarks/ablation_phases.py --before aa859e5 [--runs 25m@128] [--out docs/results/scale/ablation_phases_cpu.csv]

For each code (``--before REF``: a git worktree of REF made under /tmp; ``after``: this checkout) and each run, a
child process builds ``scale.py``'s random-init Qwen2 shape, times a plain forward's peak, then runs
``ablate_bias(estimate="auto", top_k=0, sample_k=0)`` (the intact run and the one-pass estimate) and
``ablate_bias(estimate="exact")`` on one head with 7 control draws at ``stack="auto"`` (the intact run and the
exact stage), reading the peak resident set above the memory held before each wrapped phase (VmHWM reset per
phase; glibc's mmap threshold fixed so freed tensors leave the resident set: ``scale.exact_cpu_peaks``).
Rows: code, commit, size, tokens, batch, phase, peak_mb, forward_mb, ratio (peak / forward), load (1-minute load
average at the start).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ["_run_intact", "_run_estimate", "_exact"]


def child(size: str, tokens: int) -> None:
    """In the child: print one JSON line per phase."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scale
    import torch

    import interp
    import interp.ablation.sweep as sweep

    scale.exact_cpu_peaks()
    model = scale.build(size, "cpu", torch.float32)
    data = scale.make_batches(scale.SIZES[size][5], 2, 2, tokens, "cpu")
    scale.plain_forward(model, data[:1])
    _, forward = scale.measure(scale.plain_forward, model, data, "cpu", 2)
    peaks: dict[str, float] = {}

    def wrap(name: str) -> None:
        original = getattr(sweep, name)

        @functools.wraps(original)
        def measured(*args, **kwargs):
            for trim in scale.TRIM:
                trim(0)
            Path("/proc/self/clear_refs").write_text("5")
            base = scale._rss_mb("VmRSS")
            out = original(*args, **kwargs)
            peaks[name] = max(peaks.get(name, 0.0), scale._rss_mb("VmHWM") - base)
            return out
        setattr(sweep, name, measured)

    for name in PHASES:
        wrap(name)
    interp.ablate_bias(model, data, estimate="auto", top_k=0, sample_k=0, progress=False)
    interp.ablate_bias(model, data, estimate="exact", layers=[1], heads=[0], kinds=("q",), n_control=7,
                       progress=False)
    print(json.dumps(dict(interp=interp.__file__, forward_mb=forward, **peaks)))


def codes(before: str | None) -> list[tuple[str, Path]]:
    """("before", a git worktree of ``before`` under /tmp) when asked, then ("after", this checkout)."""
    found = [("after", ROOT)]
    if before:
        path = Path(f"/tmp/interp-before-{before}")
        if not path.exists():
            subprocess.run(["git", "worktree", "add", "--detach", str(path), before], cwd=ROOT, check=True)
        found.insert(0, ("before", path))
    return found


def child_json(script: str, path: Path, spec: str) -> tuple[dict, str]:
    """(the last stdout line of ``script --child spec`` run on the code at ``path``, as JSON; that code's commit)."""
    env = dict(os.environ, PYTHONPATH=str(path))
    out = subprocess.run([sys.executable, script, "--child", spec], env=env, cwd=path,
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    got = json.loads(out)
    assert got["interp"].startswith(str(path)), got["interp"]  # the code meant, not the installed one
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True,
                            text=True).stdout.strip()
    return got, commit


def run(code: str, path: Path, size: str, tokens: int) -> list[dict]:
    got, commit = child_json(__file__, path, f"{size}@{tokens}")
    return [dict(code=code, commit=commit, size=size, tokens=tokens, batch="2 x 2", phase=phase,
                 peak_mb=round(got[phase], 1), forward_mb=round(got["forward_mb"], 1),
                 ratio=round(got[phase] / got["forward_mb"], 2), load=round(os.getloadavg()[0], 1))
            for phase in PHASES]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=False, help="git ref of the code before")
    p.add_argument("--runs", default="25m@128")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "scale" / "ablation_phases_cpu.csv"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        size, tokens = args.child.split("@")
        return child(size, int(tokens))
    import pandas as pd

    rows = [row for size, tokens in (r.split("@") for r in args.runs.split(","))
            for code, path in codes(args.before) for row in run(code, path, size, int(tokens))]
    frame = pd.DataFrame(rows)
    print(frame.to_string(index=False))
    frame.to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
