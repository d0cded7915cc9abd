"""A 7B model on one GPU, extrapolated from the CPU scale table (issue 40): each pass's time and peak memory
for 1,000 sequences x 512 tokens on one H200, written to ``docs/results/scale/extrapolation_7b.csv``.

    python benchmarks/extrapolate_7b.py [--table docs/results/scale/cpu.csv] [--at 112m@512]

and ``ablate_bias`` at its defaults, from ``ablation_cpu.csv``, to ``extrapolation_7b_ablation.csv``
(``extrapolate_ablation``).

No GPU was at hand: nothing here was measured on one. The rule, stated so it can be checked and replaced by
measurement (``benchmarks/scale.py --gpu-check``):

* Time. A plain forward's cost is its FLOPs, 2 x parameters per token (the attention's 4 x layers x d_model
  x context/2 per token added), at ``UTILISATION`` of the H200's dense bf16 peak (``PEAK_FLOPS``). A pass's
  measured CPU ratio r (pass / plain forward at ``--at``) splits into the forward (1) and its own work
  (r - 1); its own work is per attention entry (layers x heads x context per token: the score terms, the
  pattern sums), the forward's per parameter, so r - 1 is scaled by
  (layers x heads x context / parameters) at 7B over the same at the measured shape:
  r_7B = 1 + (r - 1) x that factor. Passes that stop the forward early (r < 1) keep their measured saving,
  scaled the same way.
* Memory. Weights in bf16 (2 bytes a parameter) plus the pass's measured peak over the plain forward's
  peak (``peak_mb`` ratio at ``--at``) times a 7B forward's activation peak at ``BATCH`` sequences of 512:
  float32 logits (batch x context x vocabulary x 4 bytes; HF upcasts them) plus one layer's float32 scores
  and pattern (2 x batch x heads x context^2 x 4) plus the MLP's intermediates (4 x batch x context x
  d_ff x 2 bytes), the same model of the forward that at the measured shape is compared with its measured
  peak (``forward_model_mb`` / ``forward_measured_mb`` in the CSV).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "scale" / "extrapolation_7b.csv"
OUT_ABLATION = ROOT / "docs" / "results" / "scale" / "extrapolation_7b_ablation.csv"
# Qwen2-7B: hidden, layers, heads, kv heads, intermediate, vocabulary, parameters
QWEN2_7B = dict(hidden=3584, layers=28, heads=28, kv=4, inter=18944, vocab=152064, params=7.62e9)
# the measured shapes (benchmarks/scale.py SIZES), parameters from the table's params_m
SHAPES = {"25m": dict(hidden=384, layers=6, heads=6, inter=1024, vocab=32000),
          "112m": dict(hidden=768, layers=12, heads=12, inter=2048, vocab=32000),
          "0.4b": dict(hidden=1024, layers=24, heads=16, inter=2816, vocab=151936)}
PEAK_FLOPS = 989e12  # H200 dense bf16 (NVIDIA's datasheet, without sparsity)
UTILISATION = 0.4
SEQUENCES, CONTEXT, BATCH = 1000, 512, 8


def forward_flops(shape: dict, params: float, context: int) -> float:
    """FLOPs per token of a forward: 2 x parameters plus the causal attention's QK^T and AV."""
    return 2 * params + 4 * shape["layers"] * shape["hidden"] * context / 2


def activation_mb(shape: dict, batch: int, context: int, bytes_mlp: int) -> float:
    logits = batch * context * shape["vocab"] * 4
    pattern = 2 * batch * shape["heads"] * context**2 * 4
    mlp = 4 * batch * context * shape["inter"] * bytes_mlp
    return (logits + pattern + mlp) / 2**20


def extrapolate(table: pd.DataFrame, at: str) -> pd.DataFrame:
    size, tokens = at.split("@")
    rows = table[(table["size"] == size) & (table["tokens"] == int(tokens))]
    if rows.empty:
        raise SystemExit(f"no rows at {at} in the table")
    plain = rows[rows["pass"] == "plain_forward"].iloc[0]
    shape, params = SHAPES[size], float(plain["params_m"]) * 1e6
    per_entry = lambda s, p, c: s["layers"] * s["heads"] * c / p  # noqa: E731
    factor = per_entry(QWEN2_7B, QWEN2_7B["params"], CONTEXT) / per_entry(shape, params, int(tokens))
    tokens_7b = SEQUENCES * CONTEXT
    forward_s = tokens_7b * forward_flops(QWEN2_7B, QWEN2_7B["params"], CONTEXT) / (PEAK_FLOPS * UTILISATION)
    model_mb = activation_mb(shape, int(plain["batch_size"]), int(tokens), 4)
    forward_mb_7b = activation_mb(QWEN2_7B, BATCH, CONTEXT, 2)
    weights_mb = QWEN2_7B["params"] * 2 / 2**20
    out = []
    for r in rows.to_dict("records"):
        ratio_7b = 1 + (r["ratio"] - 1) * factor
        mem_ratio = r["peak_mb"] / plain["peak_mb"] if plain["peak_mb"] > 0 else float("nan")
        out.append({"pass": r["pass"], "measured_at": at,
                    "cpu_ratio": r["ratio"], "cpu_peak_mb": r["peak_mb"], "peak_ratio": mem_ratio,
                    "overhead_factor": factor, "ratio_7b": ratio_7b, "forward_seconds_7b": forward_s,
                    "seconds_7b": ratio_7b * forward_s, "weights_gb": weights_mb / 1024,
                    "forward_activation_gb_7b": forward_mb_7b / 1024,
                    "peak_gb_7b": (weights_mb + mem_ratio * forward_mb_7b) / 1024,
                    "forward_model_mb": model_mb, "forward_measured_mb": plain["peak_mb"],
                    "sequences": SEQUENCES, "context": CONTEXT, "batch": BATCH, "utilisation": UTILISATION,
                    "peak_flops": PEAK_FLOPS})
    return pd.DataFrame(out)


def extrapolate_ablation(ablation: pd.DataFrame, at: str) -> pd.DataFrame:
    """``ablate_bias(estimate="auto")`` at its defaults on the 7B model (one row a layer assumption), from
    ``ablation_<device>.csv``: its patched forwards per batch at the defaults (the last row run at the defaults:
    top_k = sample_k = 5 heads per kind, 19 control draws each; the count does not grow with the model), each costing
    the 7B blocks after its layer plus the head; one forward and backward for the one-pass estimate (the measured
    ratio at ``at``); all times the measured ratio to that floor at ``at``. Memory: the bf16 weights plus the
    measured peak over the forward's (``memory_ratio`` at ``at``) times a 7B forward's activations, as for the
    other passes. Layers: "uniform" puts the exact heads' layers evenly over the model (mean share of the blocks
    (L + 1) / 2L), "first layer" all at layer 0 (every patched forward a whole one: the most it can cost)."""
    size, tokens = at.split("@")
    rows = ablation[(ablation["size"] == size) & (ablation["tokens"] == int(tokens))]
    defaults = ablation[ablation["exact_heads"].astype(str) == "default"]
    if rows.empty or defaults.empty:
        raise SystemExit(f"ablation table: no row at {at}, or none at ablate_bias's defaults")
    measured, n_patched = rows.iloc[-1], int(defaults.iloc[-1]["n_patched"])
    forward_s = SEQUENCES * CONTEXT * forward_flops(QWEN2_7B, QWEN2_7B["params"], CONTEXT) / (PEAK_FLOPS * UTILISATION)
    head = 2 * QWEN2_7B["hidden"] * QWEN2_7B["vocab"] / forward_flops(QWEN2_7B, QWEN2_7B["params"], CONTEXT)
    fwd_bwd = float(measured["fwd_bwd_s"] / measured["forward_s"])
    layers = QWEN2_7B["layers"]
    weights_mb = QWEN2_7B["params"] * 2 / 2**20
    forward_mb_7b = activation_mb(QWEN2_7B, BATCH, CONTEXT, 2)
    out = []
    for name, block_share in (("uniform", (layers + 1) / (2 * layers)), ("first layer", 1.0)):
        floor = fwd_bwd + n_patched * (block_share * (1 - head) + head)
        ratio_7b = floor * float(measured["ratio_floor"])
        out.append({"pass": f"ablate_bias ({name})", "measured_at": at, "label": measured["label"],
                    "n_patched": n_patched, "head_share_7b": head, "block_share": block_share,
                    "fwd_bwd_forwards": fwd_bwd, "floor_forwards_7b": floor, "ratio_floor": measured["ratio_floor"],
                    "peak_ratio": measured["memory_ratio"], "ratio_7b": ratio_7b, "forward_seconds_7b": forward_s,
                    "seconds_7b": ratio_7b * forward_s, "weights_gb": weights_mb / 1024,
                    "forward_activation_gb_7b": forward_mb_7b / 1024,
                    "peak_gb_7b": (weights_mb + measured["memory_ratio"] * forward_mb_7b) / 1024,
                    "sequences": SEQUENCES, "context": CONTEXT, "batch": BATCH, "utilisation": UTILISATION,
                    "peak_flops": PEAK_FLOPS})
    return pd.DataFrame(out)


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", default=str(ROOT / "docs" / "results" / "scale" / "cpu.csv"))
    p.add_argument("--ablation-table", default=str(ROOT / "docs" / "results" / "scale" / "ablation_cpu.csv"))
    p.add_argument("--at", default="112m@512")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--ablation-out", default=str(OUT_ABLATION))
    args = p.parse_args(argv)
    frame = extrapolate(pd.read_csv(args.table), args.at)
    frame.to_csv(args.out, index=False, float_format="%.6g")
    ablation = extrapolate_ablation(pd.read_csv(args.ablation_table), args.at)
    ablation.to_csv(args.ablation_out, index=False, float_format="%.6g")
    print(ablation[["pass", "floor_forwards_7b", "ratio_7b", "seconds_7b", "peak_gb_7b"]].to_string(index=False))
    print(frame[["pass", "cpu_ratio", "ratio_7b", "seconds_7b", "peak_gb_7b"]].to_string(index=False))
    return frame


if __name__ == "__main__":
    main()
