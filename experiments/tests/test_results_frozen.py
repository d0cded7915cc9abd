"""The training stacks' tables (sink experiment and Bigram-Backcopy control) on a tiny run equal the tables the
code wrote before the two stacks shared one results module (``experiments.training.results``), frozen in
``experiments/tests/frozen/`` by ``python experiments/tests/test_results_frozen.py --freeze`` at that commit. Timing
columns (wall-clock seconds) are left out; the rest must agree to float32 rounding."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import torch

from experiments.training.sink_arms import LMShape
from experiments.training.backcopy import BackcopyRecipe
from experiments.training.corpus import Corpus
from experiments.training.sinks import TextRecipe, VisionRecipe

FROZEN = Path(__file__).resolve().parent / "frozen"
BACKCOPY = BackcopyRecipe(shape=LMShape(n_layers=2, n_heads=2, d_model=32, d_ff=64, context=24), n_tokens=16,
                          n_triggers=2, batch=16, lr=1e-2, warmup=5, steps=4, every=2, eval_sequences=64,
                          probe_sequences=16)
TEXT = TextRecipe(shape=LMShape(n_layers=2, d_model=32, n_heads=4, d_ff=64, context=24), steps=4, batch=4, warmup=2,
                  every=2, val_windows=8, probe_windows=4)
_BYTES = b"def f(x):\n    return x + 1\n\n" * 400
CORPUS = Corpus(torch.frombuffer(bytearray(_BYTES), dtype=torch.uint8),
                torch.frombuffer(bytearray(_BYTES[:2000]), dtype=torch.uint8), {"train_sha256": "t", "val_sha256": "v"})


def tables(work: Path) -> dict[str, pd.DataFrame]:
    """Every table both stacks write on the tiny runs (two arms each, one seed), and their summaries."""
    from experiments.training import backcopy_results, sink_results

    found = {}
    frames = backcopy_results.run_all([("none", 0), ("kv_slot", 0)], BACKCOPY, work / "bc-work", work / "bc-out",
                                      seeds=(0,), log=lambda _: None)
    found.update({f"backcopy_{k}": v for k, v in frames.items()})
    found["backcopy_summary"] = backcopy_results.summarise(frames["runs"])
    for name in backcopy_results.TABLES:
        found[f"backcopy_{name}_csv"] = pd.read_csv(work / "bc-out" / f"{name}.csv")
    frames = sink_results.run_all([("text", "none", 0), ("text", "kv_slot", 0)], TEXT, VisionRecipe(), CORPUS,
                                  work / "sk-work", work / "sk-out", collect=("text",), log=lambda _: None)
    found.update({f"sinks_{k}": v for k, v in frames.items()})
    found["sinks_summary"] = sink_results.summarise(frames["runs"], frames["heads"])
    for name in sink_results.TABLES:
        found[f"sinks_{name}_csv"] = pd.read_csv(work / "sk-out" / f"{name}.csv")
    return {name: _untimed(frame) for name, frame in found.items()}


def _untimed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in frame.columns if "second" in c]).reset_index(drop=True)


def test_the_tables_equal_the_frozen_ones(tmp_path):
    torch.manual_seed(0)
    found = tables(tmp_path)
    assert sorted(found) == sorted(p.stem for p in FROZEN.glob("*.csv"))
    for name, frame in found.items():
        frozen = pd.read_csv(FROZEN / f"{name}.csv")
        pd.testing.assert_frame_equal(pd.read_csv(_roundtrip(frame, tmp_path / f"{name}.csv")), frozen,
                                      check_exact=False, rtol=1e-5, atol=1e-7, obj=name)


def _roundtrip(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_csv(path, index=False)
    return path


if __name__ == "__main__" and sys.argv[1:] == ["--freeze"]:
    import tempfile

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, frame in tables(Path(tmp)).items():
            frame.to_csv(FROZEN / f"{name}.csv", index=False)
    print(f"froze {len(list(FROZEN.glob('*.csv')))} tables into {FROZEN}")
