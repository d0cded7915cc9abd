"""What loading costs (issue 40 item 4): ``interp.load_model(folder)`` against HF's ``from_pretrained(folder)``.

    nice python benchmarks/load_cost.py [--size 0.4b] [--profile]   # -> docs/results/scale/load_cpu.csv
    python benchmarks/load_cost.py --size tiny --out /tmp/x.csv     # seconds (tests)

A random-init Qwen2 of ``scale.SIZES[size]`` is saved once as safetensors; each way of loading it runs in
its own fresh process (nothing cached between them), three times, in alternation (HF, interp, HF, ...):
the fastest time and each process's peak resident set (VmHWM) are kept. ``--profile`` writes the
cumulative cProfile of one ``load_model`` to ``load_profile.txt``: where the time above HF's goes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, cProfile, pstats, io
way, folder, profile = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
import torch, transformers, interp  # imports are not the load: timed after them
torch.set_num_threads(1)
t0 = time.perf_counter()
prof = cProfile.Profile() if profile else None
if prof: prof.enable()
if way == "hf":
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
else:
    model = interp.load_model(folder, device="cpu")
if prof:
    prof.disable()
seconds = time.perf_counter() - t0
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
out = dict(way=way, seconds=seconds, peak_rss_mb=int(hwm) / 1024)
if prof:
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    out["profile"] = text.getvalue()
print("RESULT " + json.dumps(out))
"""


def _scale():
    spec = importlib.util.spec_from_file_location("scale_benchmark", ROOT / "benchmarks" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _child(way: str, folder: Path, profile: bool = False) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, way, str(folder), "1" if profile else "0"],
                          capture_output=True, text=True, check=True)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="0.4b")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "scale" / "load_cpu.csv"))
    args = ap.parse_args(argv)
    scale = _scale()
    if args.size not in scale.SIZES:
        raise SystemExit(f"unknown size {args.size!r}; sizes: {', '.join(scale.SIZES)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / args.size
        hf = scale.hf_qwen2(args.size, "cpu")
        params = sum(p.numel() for p in hf.parameters()) / 1e6
        hf.save_pretrained(folder, safe_serialization=True)
        del hf
        rows = [_child(way, folder) for _ in range(args.repeats) for way in ("hf", "interp")]
        if args.profile:
            profiled = _child("interp", folder, profile=True)
            Path(args.out).with_name("load_profile.txt").write_text(profiled["profile"])
    runs = pd.DataFrame(rows)
    best = runs.groupby("way").agg(seconds=("seconds", "min"), peak_rss_mb=("peak_rss_mb", "max"))
    frame = pd.DataFrame([dict(
        size=args.size, params_m=round(params, 1), repeats=args.repeats,
        hf_from_pretrained_seconds=best.seconds["hf"], load_model_seconds=best.seconds["interp"],
        ratio=best.seconds["interp"] / best.seconds["hf"], hf_peak_rss_mb=best.peak_rss_mb["hf"],
        load_model_peak_rss_mb=best.peak_rss_mb["interp"],
        rss_ratio=best.peak_rss_mb["interp"] / best.peak_rss_mb["hf"])])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False, float_format="%.6g")
    print(frame.T.to_string())
    return frame


if __name__ == "__main__":
    main()
