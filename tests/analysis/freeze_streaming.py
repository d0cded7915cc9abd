"""Freeze the streaming passes' numbers on the shipped zoo models before their memory rework (issue 40 items 2-3).

    nice python tests/analysis/freeze_streaming.py        # -> docs/results/scale/frozen/<model>_<table>.csv

Tables: ``score_decomposition`` (n_boot=200), ``sink_profile`` (every position class, ``top_content`` too;
``remove="key_prior"`` where the model has b_q), ``implicit_value_bias``; on ``minilm-l6`` (2 batches x 4
right-padded python-docs sequences) and ``smollm2-135m`` (2 batches x 2). ``tests/analysis/test_frozen_streaming.py``
recomputes them with the current code and compares to 1e-6; ``SOURCE.txt`` names the commit that wrote them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd

import interp

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "results" / "scale" / "frozen"
MODELS = {"minilm-l6": 4, "smollm2-135m": 2}  # sequences per batch
#: columns that hold numbers the rework must keep (per table); the rest are keys or provenance
NUMBERS = {
    "score_decomposition": ["variance", "share", "total_variance", "kl_without_key_prior", "share_lo", "share_hi"],
    "sink_profile": ["mass", "uniform_mass", "mass_over_uniform", "mass_to_uniform", "mass_without_key_prior",
                     "mass_without_b_q", "n_query_rows"],
    "implicit_value_bias": ["sink_mass", "implicit_norm", "constancy", "explicit_norm", "cos_to_explicit",
                            "output_rms", "n_rows"],
}
KEYS = {"score_decomposition": ["layer", "head", "term"], "sink_profile": ["layer", "head", "position"],
        "implicit_value_bias": ["layer", "head"]}


def batches(model, size: int) -> list[dict]:
    """The first 2 built-in python-docs batches, their first ``size`` sequences (right-padded: masks are real)."""
    return [{"input_ids": b.inputs[:size], "attention_mask": b.attention_mask[:size]}
            for b in interp.builtin_batches(model, "python-docs")[:2]]


def tables(name: str) -> dict[str, pd.DataFrame]:
    model = interp.load_model(name, device="cpu")
    data = batches(model, MODELS[name])
    has_b_q = bool(interp.bias_spec(model).query("kind == 'q'").present.any())
    positions = [p for p in ("first", "cls", "sep", "bos", "top_content")
                 if p in interp.analysis.sink_parts.position_classes(model)]
    return {
        "score_decomposition": interp.score_decomposition(model, data, n_boot=200, progress=False),
        "sink_profile": interp.sink_profile(model, data, positions=positions,
                                            remove="key_prior" if has_b_q else None, progress=False),
        "implicit_value_bias": interp.implicit_value_bias(model, data, progress=False),
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        for table, frame in tables(name).items():
            cols = KEYS[table] + [c for c in NUMBERS[table] if c in frame]
            frame[cols].to_csv(OUT / f"{name}_{table}.csv", index=False, float_format="%.17g")
            print(name, table, len(frame), flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "interp"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    (OUT / "SOURCE.txt").write_text(f"written by tests/analysis/freeze_streaming.py at commit {commit}"
                                    f"{' (interp/ modified!)' if dirty else ' (interp/ unmodified)'}\n")


if __name__ == "__main__":
    main()
