"""How the analyses scale (issue 40 item 5): each pass's time and peak memory next to a plain HF forward.

    nice python benchmarks/scale.py [--device cpu] [--runs 25m@128,112m@512] [--batch-size 2] [--batches 2]
    python benchmarks/scale.py --device cuda --runs 0.5b@4096,1.5b@4096 --dtype bfloat16 --batch-size 1
    python benchmarks/scale.py --gpu-check      # `pytest -m cuda`, 0.5B and 1.5B (bf16, 4096 tokens), then the
                                                # sink arms of experiments/gpu_sinks.py (on the GPU machine: first
                                                # pip install --no-deps .whl/*.whl -e ., carrying .whl and the corpus)
    python benchmarks/scale.py --dry-run        # everything at a tiny size on CPU in seconds (tests run it)
    python benchmarks/scale.py --fingerprint 0.4b   # model_fingerprint / load_model cost -> fingerprint_<device>.csv
    nice python benchmarks/scale.py --ablation --label after --runs 25m@128 [--profile]   # -> ablation_<device>.csv

Models are randomly initialised Qwen2 shapes (``SIZES``; q/k/v biases drawn N(0, 0.02^2) so that no pass
sees zero biases), data are random token ids (seed 0), ``--batches`` batches of ``--batch-size`` sequences
of the run's token count. Per run, over the same batches: a plain HF forward (``model.hf_model(ids)``, no
hooks, no gradients: the reference, ratio 1), two references a user would write by hand (TransformerLens'
``run_with_cache``, which keeps every activation; a forward hook on every q/k/v projection summing its
output and its square), and the analyses ``record_qkv``, ``sink_profile``, ``massive_activations``,
``implicit_value_bias``, ``score_decomposition``, ``ablate_bias(estimate="auto")``. Each pass is timed
up to ``--repeats`` times (fewer once it has taken 20 s) and the fastest kept; ``ratio`` = seconds / plain
forward's seconds (compare within one run: machines are noisy). ``peak_mb``: the pass's peak memory above what
was held before it (CUDA: ``torch.cuda.max_memory_allocated``; CPU: the process's peak resident set, VmHWM, reset
through /proc/self/clear_refs before each pass, read in a child process that runs each pass once with glibc's mmap
threshold fixed, while the times come from a process with the allocator at its defaults: the fixed threshold
slowed passes with many large temporaries, e.g. score_decomposition 1.92x a forward against 1.32x, and rows of
cpu.csv before 2026-12-06 were timed so). Written to ``docs/results/scale/<device>.csv``.

``--ablation`` (issue 40 item 1): ``ablate_bias(estimate="auto")`` at its defaults against its floor, one row per
run in ``docs/results/scale/ablation_<device>.csv`` (``--label`` names the code measured, e.g. before / after;
rows are appended). The floor is what any exact sweep must compute: one forward and backward per batch (the
one-pass estimate), and for each patched forward it runs exactly (each exact variant and each of its
``n_control`` matched-control draws, read from the table it returns) the blocks after the patched layer and the
unembedding: floor = t_fwd_bwd + sum over those forwards of ((L - l) / L) t_blocks + t_head, with t_blocks an HF
forward of the decoder without its head and t_head the final norm and unembedding alone (all per batch set,
fastest of ``--repeats``). Times are taken with glibc's allocator at its defaults (as in a user's process), the
peaks in a child process with its mmap threshold fixed (rows before label "times at allocator defaults" timed
everything with the threshold fixed, which slows the sweep's many large temporaries more than the floor's
passes). Columns: forward_s, ablate_s, floor_s, ratio_forward (ablate / forward), ratio_floor (ablate / floor),
n_patched (forwards the table says ran), forward_peak_mb, ablate_peak_mb (the call run a second time in the
process, as the forward is after a warm-up), ablate_cold_peak_mb (the first call, with what it initialises once and
keeps: rows before that label read only this one, as ablate_peak_mb), estimate_peak_mb and memory_ratio
(ablate / forward peak). ``--profile``: cProfile of one more ablate pass, top entries by
cumulative time to ``ablation_profile.txt``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
import transformers

import interp
from interp.data import Batch
from interp.record.fingerprint import CHUNK_BYTES, model_fingerprint

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["device", "size", "params_m", "dtype", "batch_size", "tokens", "n_batches", "pass", "kind",
           "seconds", "ratio", "peak_mb"]
# name: (hidden, layers, heads, kv heads, intermediate, vocab); 0.5b and 1.5b are Qwen2-0.5B / 1.5B's shapes
SIZES = {
    "tiny": (64, 2, 4, 2, 128, 512),
    "25m": (384, 6, 6, 2, 1024, 32000),
    "112m": (768, 12, 12, 4, 2048, 32000),
    "0.4b": (1024, 24, 16, 2, 2816, 151936),  # issue 40's 387M-parameter Qwen2 shape (420M, embedding tied)
    "0.5b": (896, 24, 14, 2, 4864, 151936),
    "1.5b": (1536, 28, 12, 2, 8960, 151936),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build(size: str, device: str, dtype: torch.dtype) -> interp.InterpBridge:
    """A random-init Qwen2 of ``SIZES[size]`` (seed 0), its q/k/v biases N(0, 0.02^2), loaded on ``device``."""
    return interp.load_model(hf_qwen2(size, device).to(dtype=dtype), device=device)


def hf_qwen2(size: str, device: str) -> transformers.Qwen2ForCausalLM:
    hidden, layers, heads, kv, inter, vocab = SIZES[size]
    config = transformers.Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                                      max_position_embeddings=8192, tie_word_embeddings=True,
                                      attn_implementation="eager")
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a 1.5B model's CPU init would take minutes
        hf = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.normal_(0.0, 0.02)
    return hf


def fingerprint_cost(size: str, device: str) -> pd.DataFrame:
    """Seconds to build the HF model, to ``interp.load_model`` it and to fingerprint it; the fingerprint's
    Python-heap peak (tracemalloc: a bytes copy of a parameter shows there) and peak resident set above the
    memory held before it (VmHWM)."""
    t0 = time.perf_counter()
    hf = hf_qwen2(size, device)
    t_hf = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = interp.load_model(hf, device=device)
    t_load = time.perf_counter() - t0
    Path("/proc/self/clear_refs").write_text("5")
    base = _rss_mb("VmRSS")
    tracemalloc.start()
    t0 = time.perf_counter()
    digest = model_fingerprint(model)
    seconds, heap = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    params = sum(p.numel() for p in hf.parameters()) / 1e6
    return pd.DataFrame([dict(device=device, size=size, params_m=round(params, 1), hf_build_seconds=t_hf,
                              load_model_seconds=t_load, fingerprint_seconds=seconds, fingerprint_heap_mb=heap,
                              fingerprint_rss_mb=max(_rss_mb("VmHWM") - base, 0.0), fingerprint=digest,
                              chunk_bytes=CHUNK_BYTES)])


def make_batches(vocab: int, n: int, batch_size: int, tokens: int, device: str) -> list:
    g = torch.Generator().manual_seed(0)
    return [Batch(torch.randint(vocab, (batch_size, tokens), generator=g).to(device),
                  torch.ones(batch_size, tokens, dtype=torch.long, device=device)) for _ in range(n)]


def plain_forward(model, data) -> None:
    with torch.no_grad():
        for b in data:
            model.hf_model(input_ids=b.inputs, attention_mask=b.attention_mask)


def tl_run_with_cache(model, data) -> None:
    with torch.no_grad():
        for b in data:
            _, cache = model.run_with_cache(b.inputs, attention_mask=b.attention_mask)
            del cache


def hand_hook(model, data) -> dict:
    """What a user writes by hand for q/k/v means and variances: a forward hook on every projection
    adding up its output and its square (float64, on the model's device)."""
    sums: dict = {}

    def hook(name):
        def add(module, args, out):
            flat = out.detach().reshape(-1, out.shape[-1]).double()
            s, sq = sums.get(name, (0.0, 0.0))
            sums[name] = (s + flat.sum(0), sq + (flat * flat).sum(0))
        return add

    names = [n for n, m in model.hf_model.named_modules() if n.endswith(("q_proj", "k_proj", "v_proj"))]
    modules = dict(model.hf_model.named_modules())
    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        plain_forward(model, data)
    finally:
        for h in handles:
            h.remove()
    return sums


PASSES: dict[str, tuple[str, Callable]] = {
    "plain_forward": ("reference", plain_forward),
    "run_with_cache": ("reference", tl_run_with_cache),
    "hand_hook": ("reference", hand_hook),
    "record_qkv": ("analysis", lambda m, d: interp.record_qkv(m, d, progress=False)),
    "sink_profile": ("analysis", lambda m, d: interp.sink_profile(m, d, progress=False)),
    "massive_activations": ("analysis", lambda m, d: interp.massive_activations(m, d, progress=False)),
    "implicit_value_bias": ("analysis", lambda m, d: interp.implicit_value_bias(m, d, progress=False)),
    "score_decomposition": ("analysis", lambda m, d: interp.score_decomposition(m, d, progress=False)),
    "ablate_bias": ("analysis", lambda m, d: interp.ablate_bias(m, d, estimate="auto", progress=False)),
}


def forward_backward(model, data) -> None:
    """The one-pass estimate's floor: an HF forward and backward of the next-token loss per batch."""
    for b in data:
        out = model.hf_model(input_ids=b.inputs, attention_mask=b.attention_mask, labels=b.inputs)
        out.loss.backward()
    model.hf_model.zero_grad(set_to_none=True)


def blocks_only(model, data) -> None:
    with torch.no_grad():
        for b in data:
            model.hf_model.model(input_ids=b.inputs, attention_mask=b.attention_mask)


def head_only(model, hidden) -> None:
    with torch.no_grad():
        for h in hidden:
            model.hf_model.lm_head(model.hf_model.model.norm(h))


def patched_forwards(table: pd.DataFrame, n_layers: int) -> tuple[int, float]:
    """(patched forwards per batch, their summed share of the blocks (L - l) / L) of an ablate_bias table's exact
    rows that ran a forward (identity rows did not): each is 1 + n_control forwards starting at its layer."""
    exact = table[(table.estimate == "exact") & (table.identity.fillna("") == "")]
    runs = 1 + exact.n_control.fillna(0).astype(int)
    return int(runs.sum()), float((runs * (n_layers - exact.layer.astype(int)) / n_layers).sum())


def ablation_peaks(size: str, tokens: int, args) -> dict:
    """The ablation row's peaks (MB above what was held before each): a plain forward's (after one warm-up
    forward), the default call's, first in the process (``ablate_cold_peak_mb``: with what its first run
    initialises once and keeps, imports and kernels) and again (``ablate_peak_mb``), and the one-pass estimate's
    alone (top_k = sample_k = 0: no exact stage; its forward and backward set a floor on the sweep's peak that
    no stack changes)."""
    model = build(size, args.device, DTYPES[args.dtype])
    data = make_batches(SIZES[size][5], args.batches, args.batch_size, tokens, args.device)
    plain_forward(model, data[:1])
    _, forward_peak = measure(plain_forward, model, data, args.device, args.repeats)
    peaks = [measure(lambda m, d: interp.ablate_bias(m, d, estimate="auto", progress=False, **_stack_option(args)),
                     model, data, args.device, 1)[1] for _ in range(2)]
    _, estimate_peak = measure(lambda m, d: interp.ablate_bias(m, d, estimate="auto", top_k=0, sample_k=0,
                                                               progress=False), model, data, args.device, 1)
    return dict(forward_peak_mb=forward_peak, ablate_cold_peak_mb=peaks[0], ablate_peak_mb=peaks[1],
                estimate_peak_mb=estimate_peak)


def _stack_option(args) -> dict:
    """ablate_bias's options this run sets: ``--stack``, and ``--exact-heads`` K (top_k = sample_k = K)."""
    options = {} if args.stack is None else {"stack": int(args.stack) if args.stack.isdigit() else args.stack}
    if args.exact_heads is not None:
        options.update(top_k=args.exact_heads, sample_k=args.exact_heads)
    return options


def _peaks_in_child(size: str, tokens: int, args) -> dict:
    """``ablation_peaks`` in a child process whose glibc mmap threshold is fixed (``exact_cpu_peaks``); on CUDA
    here (allocator statistics need no such setting)."""
    if args.device.startswith("cuda"):
        return ablation_peaks(size, tokens, args)
    return _child_json("--ablation-peaks", size, tokens, args, ["--repeats", str(args.repeats)] + (
        ["--stack", args.stack] if args.stack is not None else []) + (
        ["--exact-heads", str(args.exact_heads)] if args.exact_heads is not None else []))


def _child_json(mode: str, size: str, tokens: int, args, extra: list[str]) -> dict:
    """The last stdout line of a child ``scale.py <mode>`` at ``size@tokens`` with this run's batches, device,
    dtype and threads (and ``extra`` flags), as JSON; a failed child stops the run with its stderr's tail."""
    command = [sys.executable, __file__, mode, "--runs", f"{size}@{tokens}", "--device", args.device,
               "--batch-size", str(args.batch_size), "--batches", str(args.batches), "--dtype", args.dtype,
               "--threads", str(args.threads)] + extra
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])  # this checkout's interp
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path))
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[1:4])} ... exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ablation_run(size: str, tokens: int, args) -> dict:
    """One row of the ablation table (module doc): times in this process, glibc's allocator at its defaults as a
    user's process has it (a fixed mmap threshold makes every large temporary a fresh mapping: it slowed the
    sweep's vocabulary tiles by more than the floor's passes), peaks from a child with the threshold fixed."""
    dtype = DTYPES[args.dtype]
    model = build(size, args.device, dtype)
    data = make_batches(SIZES[size][5], args.batches, args.batch_size, tokens, args.device)
    plain_forward(model, data[:1])
    forward_s, _ = measure(plain_forward, model, data, args.device, args.repeats)
    fwd_bwd_s, _ = measure(forward_backward, model, data, args.device, args.repeats)
    blocks_s, _ = measure(blocks_only, model, data, args.device, args.repeats)
    with torch.no_grad():
        hidden = [model.hf_model.model(input_ids=b.inputs, attention_mask=b.attention_mask).last_hidden_state
                  for b in data]
    head_s, _ = measure(head_only, model, hidden, args.device, args.repeats)
    del hidden
    result = {}

    def ablate(m, d):
        result["table"] = interp.ablate_bias(m, d, estimate="auto", progress=False, **_stack_option(args))

    ablate_s, _ = measure(ablate, model, data, args.device, 1)
    peaks = _peaks_in_child(size, tokens, args)
    forward_peak, ablate_peak, ablate_cold_peak, estimate_peak = (
        peaks[k] for k in ("forward_peak_mb", "ablate_peak_mb", "ablate_cold_peak_mb", "estimate_peak_mb"))
    from interp.ablation.memory import auto_stack
    stack_used = (min(auto_stack(model, b.inputs, True, True, backward=True, tiled=True) for b in data)
                  if args.stack in (None, "auto") else int(args.stack))  # the sweep's rule (a linear unembedding)
    n_patched, block_share = patched_forwards(result["table"], SIZES[size][1])
    floor_s = fwd_bwd_s + block_share * blocks_s + n_patched * head_s
    print("interp from", interp.__file__, flush=True)
    row = dict(label=args.label, stack=args.stack or "default",
               exact_heads="default" if args.exact_heads is None else args.exact_heads, device=args.device, size=size,
               dtype=args.dtype, batch_size=args.batch_size, tokens=tokens, n_batches=args.batches, forward_s=forward_s, fwd_bwd_s=fwd_bwd_s, blocks_s=blocks_s,
               head_s=head_s, ablate_s=ablate_s, floor_s=floor_s, n_patched=n_patched,
               ratio_forward=ablate_s / forward_s, floor_forwards=floor_s / forward_s, ratio_floor=ablate_s / floor_s,
               forward_peak_mb=forward_peak, ablate_peak_mb=ablate_peak, ablate_cold_peak_mb=ablate_cold_peak,
               estimate_peak_mb=estimate_peak,
               stack_used=stack_used, memory_ratio=ablate_peak / forward_peak if forward_peak else float("nan"))
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.profile:
        import cProfile
        import io
        import pstats
        profiler = cProfile.Profile()
        profiler.runcall(ablate, model, data)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        out = (Path(args.out).parent if args.out else ROOT / "docs" / "results" / "scale") / "ablation_profile.txt"
        out.write_text(f"# cProfile of ablate_bias(estimate='auto') at {size}@{tokens}, batch {args.batch_size} x "
                       f"{args.batches}, {args.device}, label {args.label}\n" + text.getvalue())
        print(f"wrote {out}")
    return row


def ablation_table(args) -> pd.DataFrame:
    rows = [ablation_run(size, int(tokens), args) for size, tokens in (r.split("@") for r in args.runs.split(","))]
    frame = pd.DataFrame(rows)
    out = Path(args.out or ROOT / "docs" / "results" / "scale" / f"ablation_{args.device.split(':')[0]}.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        frame = pd.concat([pd.read_csv(out), frame], ignore_index=True)
    frame.to_csv(out, index=False, float_format="%.6g")
    print(f"wrote {out}")
    return frame


def exact_cpu_peaks() -> None:
    """Make VmHWM - VmRSS see each pass's own peak on CPU: glibc's mmap threshold fixed at 64 KiB (by default it
    grows to 32 MiB after the first large free, so freed tensors stay in the heap and a later pass reuses them
    without raising the resident set: peaks read as 0), and ``malloc_trim`` before each measurement."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: peaks stay lower bounds
        return
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (also turns off its dynamic growth)
    TRIM.append(libc.malloc_trim)


TRIM: list = []


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(fn: Callable, model, data, device: str, repeats: int, budget: float = 20.0) -> tuple[float, float]:
    """(fastest seconds of up to ``repeats`` runs, stopping once they took ``budget`` seconds in all; peak MB
    above the memory held before the first run, never below 0)."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        for trim in TRIM:
            trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (the peak resident set) to VmRSS
        base = _rss_mb("VmRSS")
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(model, data)
        if cuda:
            torch.cuda.synchronize()
        best, spent = min(best, time.perf_counter() - t0), spent + time.perf_counter() - t0
        if spent > budget:
            break
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else _rss_mb("VmHWM") - base
    return best, max(peak, 0.0)


def run_one(size: str, tokens: int, args, peaks_only: bool = False) -> list[dict]:
    """The table's rows at one size and length. On CPU the times come from this process (glibc's allocator at its
    defaults, as a user's process has it) and the peaks from a child (``--table-peaks``: each pass once, the mmap
    threshold fixed so that VmHWM sees each pass's own peak); on CUDA both from here."""
    dtype = DTYPES[args.dtype]
    model = build(size, args.device, dtype)
    params = sum(p.numel() for p in model.hf_model.parameters()) / 1e6
    data = make_batches(SIZES[size][5], args.batches, args.batch_size, tokens, args.device)
    plain_forward(model, data[:1])  # warm-up: kernels, allocator
    rows = []
    for name, (kind, fn) in PASSES.items():
        if name in args.skip:
            continue
        seconds, peak = measure(fn, model, data, args.device, 1 if peaks_only else args.repeats)
        rows.append(dict(device=args.device, size=size, params_m=round(params, 1), dtype=args.dtype,
                         batch_size=args.batch_size, tokens=tokens, n_batches=args.batches, kind=kind,
                         seconds=seconds, peak_mb=peak, **{"pass": name}))
        peak_said = f"peak {peak:9.1f} MB" if peaks_only or args.device.startswith("cuda") else "(peak: child)"
        print(f"{size}@{tokens} {name:22s} {seconds:8.3f} s  {peak_said}", flush=True)
    plain = rows[0]["seconds"]
    for r in rows:
        r["ratio"] = r["seconds"] / plain
    del model
    if not peaks_only and not args.device.startswith("cuda"):
        peaks = _table_peaks_in_child(size, tokens, args)
        for r in rows:
            r["peak_mb"] = peaks[r["pass"]]
            print(f"{size}@{tokens} {r['pass']:22s} peak {r['peak_mb']:9.1f} MB (child)", flush=True)
    return rows


def _table_peaks_in_child(size: str, tokens: int, args) -> dict:
    return _child_json("--table-peaks", size, tokens, args, ["--skip", ",".join(sorted(args.skip))] if args.skip else [])


def table(args) -> pd.DataFrame:
    rows = []
    for item in args.runs.split(","):
        size, tokens = item.split("@")
        if size not in SIZES:
            raise SystemExit(f"unknown size {size!r}: one of {', '.join(SIZES)}")
        rows += run_one(size, int(tokens), args)
    frame = pd.DataFrame(rows)[COLUMNS]
    out = Path(args.out or ROOT / "docs" / "results" / "scale" / f"{args.device.split(':')[0]}.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.append and out.exists():
        frame = pd.concat([pd.read_csv(out), frame], ignore_index=True)
    frame.to_csv(out, index=False, float_format="%.6g")
    print(f"wrote {out}")
    return frame


def profile_pass(name: str, args) -> str:
    """cProfile's top entries (cumulative time) of pass ``name`` at the first ``--runs`` item, written to
    ``docs/results/scale/<name>_profile.txt`` (or beside ``--out``) and returned."""
    import cProfile
    import io
    import pstats

    if name not in PASSES:
        raise SystemExit(f"--profile {name!r}: one of {', '.join(PASSES)}")
    size, tokens = args.runs.split(",")[0].split("@")
    model = build(size, args.device, DTYPES[args.dtype])
    data = make_batches(SIZES[size][5], args.batches, args.batch_size, int(tokens), args.device)
    plain_forward(model, data[:1])
    profiler = cProfile.Profile()
    profiler.runcall(PASSES[name][1], model, data)
    text = io.StringIO()
    text.write(f"cProfile of {name} at {size}@{tokens}, batch {args.batch_size} x {args.batches} batches, "
               f"{args.device}, {args.dtype}, {args.threads} thread(s); top 25 by cumulative time\n")
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    text.write("top 20 by own time\n")
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
    folder = Path(args.out).parent if args.out else ROOT / "docs" / "results" / "scale"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}_profile.txt").write_text(text.getvalue())
    print(text.getvalue())
    return text.getvalue()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--runs", default="25m@128,112m@512", help="size@tokens, comma separated; sizes: " + ", ".join(SIZES))
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", default="", help="passes left out, comma separated (e.g. ablate_bias at a large size)")
    p.add_argument("--append", action="store_true", help="add the rows to the CSV instead of replacing it")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--out", default=None, help="the CSV (default docs/results/scale/<device>.csv)")
    p.add_argument("--fingerprint", default=None, metavar="SIZE",
                   help="time and memory of model_fingerprint and load_model at SIZE (to fingerprint_<device>.csv)")
    p.add_argument("--profile", default=None, metavar="PASS",
                   help="cProfile PASS at the first --runs item -> docs/results/scale/PASS_profile.txt (with --ablation: "
                        "any PASS, the sweep's profile -> ablation_profile.txt)")
    p.add_argument("--ablation", action="store_true", help="ablate_bias against its floor -> ablation_<device>.csv")
    p.add_argument("--ablation-peaks", action="store_true", help=argparse.SUPPRESS)  # --ablation's child
    p.add_argument("--table-peaks", action="store_true", help=argparse.SUPPRESS)  # the table's child
    p.add_argument("--label", default="", help="--ablation: the code measured (e.g. before, after)")
    p.add_argument("--stack", default=None, help="--ablation: ablate_bias's stack (default: its own default)")
    p.add_argument("--exact-heads", type=int, default=None, metavar="K",
                   help="--ablation: top_k = sample_k = K heads per kind run exactly (default: ablate_bias's, 5 and 5; "
                        "a smaller K makes a large size affordable: the floor counts the forwards the table ran)")
    p.add_argument("--dry-run", action="store_true", help="tiny model, 16 tokens, CPU: seconds")
    p.add_argument("--gpu-check", action="store_true", help="pytest -m cuda, then 0.5b and 1.5b at 4096 tokens in bf16")
    args = p.parse_args(argv)
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - set(PASSES) or "plain_forward" in args.skip:
        raise SystemExit(f"--skip: {sorted(args.skip)}; passes that may be skipped: {', '.join(list(PASSES)[1:])}")
    if args.dry_run:
        args.device, args.runs, args.batch_size, args.batches, args.dtype, args.repeats = \
            "cpu", "tiny@16", 2, 1, "float32", 1
    if args.gpu_check:
        args.device, args.runs, args.batch_size, args.batches, args.dtype, args.repeats = \
            "cuda", "0.5b@4096,1.5b@4096", 1, 1, "bfloat16", 2
    return args


def main(argv=None) -> pd.DataFrame:
    args = parse(argv)
    if not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
        if args.ablation_peaks or args.table_peaks or args.fingerprint:  # times are taken at the defaults
            exact_cpu_peaks()
    if args.table_peaks:  # the table's child: each pass's peak, one JSON line
        size, tokens = args.runs.split(",")[0].split("@")
        print(json.dumps({r["pass"]: r["peak_mb"] for r in run_one(size, int(tokens), args, peaks_only=True)}))
        return pd.DataFrame()
    if args.ablation_peaks:  # that child: one JSON line
        size, tokens = args.runs.split(",")[0].split("@")
        print(json.dumps(ablation_peaks(size, int(tokens), args)))
        return pd.DataFrame()
    if args.gpu_check:
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-x", "-m", "cuda", "-p", "no:cacheprovider",
                                "--tier", "all", str(ROOT / "tests")], cwd=ROOT)
        print(f"pytest -m cuda: exit {code}", flush=True)
    if args.ablation:
        return ablation_table(args)
    if args.profile:
        return profile_pass(args.profile, args)
    if args.fingerprint:
        frame = fingerprint_cost(args.fingerprint, args.device)
        out = Path(args.out or ROOT / "docs" / "results" / "scale" / f"fingerprint_{args.device.split(':')[0]}.csv")
        out.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out, index=False, float_format="%.6g")
        print(frame.T.to_string())
        return frame
    frame = table(args)
    if args.gpu_check:  # then findings 4c's sink arms at the size experiments/gpu_sinks.py plans (about 4 minutes)
        pack = Path(os.environ.get("OUT") or ROOT / "out") / "sinks_text_gpu.tar.gz"
        code = subprocess.call([sys.executable, "-m", "experiments.gpu_sinks", "--run", "--pack", str(pack)],
                               cwd=ROOT)
        print(f"gpu_sinks --run: exit {code}", flush=True)
    return frame


if __name__ == "__main__":
    main()
