"""Record overhead and memory: ``record_qkv`` against a plain forward and ``run_with_cache``.

Prints ratios measured in one run (machines are noisy; compare within a run only).
GPT-2-small shape (12 layers x 12 heads, d_model 768), random weights.
Memory: on CUDA, peak allocated bytes; on CPU, the bytes each method retains after the
run (the statistics vs the cached q/k/v tensors), plus process peak RSS growth.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
import transformers as tf

import interp
from interp.record.recording import record_qkv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pos", type=int, default=128)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    hf = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=12, n_head=12, n_embd=768, attn_implementation="eager"))
    model = interp.load_model(hf, device=args.device)
    dev = torch.device(args.device)
    data = [torch.randint(0, 50257, (args.batch, args.pos), device=dev) for _ in range(args.batches)]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        model(data[0])  # warm-up
        record_qkv(model, data[:1], progress=False)
        sync()
        t = time.perf_counter()
        for x in data:
            model(x)
        sync()
        t_plain = time.perf_counter() - t
        t = time.perf_counter()
        record_qkv(model, data, progress=False)
        sync()
        t_record = time.perf_counter() - t
    print(f"device={args.device} tokens/batch={args.batch * args.pos} batches={args.batches}")
    print(f"plain forward {t_plain:.3f}s  record_qkv {t_record:.3f}s  ratio {t_record / t_plain:.3f} (goal <= 1.15)")

    names = lambda n: n.endswith(("hook_q", "hook_k", "hook_v")) and ".attn.hook_" in n  # noqa: E731
    for factor in (1, 8):
        batches = [data[i % len(data)] for i in range(factor)]
        if dev.type == "cuda":
            torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with torch.no_grad():
            stats = record_qkv(model, batches, progress=False)
        ours = sum(m.mean.numel() * 8 + m.m2.numel() * 8 for m in stats.moments.values())
        if dev.type == "cuda":
            ours_peak = torch.cuda.max_memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
        caches = []
        with torch.no_grad():
            for x in batches:
                caches.append(model.run_with_cache(x, names_filter=names)[1])
        theirs = sum(v.numel() * v.element_size() for c in caches for v in c.values())
        line = f"{factor}x data: record_qkv retains {ours / 2**20:.1f} MiB; run_with_cache retains {theirs / 2**20:.1f} MiB"
        if dev.type == "cuda":
            line += f"; peak allocated: ours {ours_peak / 2**20:.1f} MiB, theirs {(torch.cuda.max_memory_allocated() - base) / 2**20:.1f} MiB"
        print(line)
        del caches
    print(f"process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
