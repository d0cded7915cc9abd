"""experiments/gpu_sinks.py: the committed plan is the extrapolation recomputed from the pilot's CSV, and the
GPU command runs end to end at a tiny size on the CPU (its dry run), writing the stopping rule's table."""

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("gpu_sinks", ROOT / "experiments" / "gpu_sinks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_plan_is_the_extrapolation_of_the_pilot():
    gpu = _module()
    committed = pd.read_csv(ROOT / "docs" / "results" / "sinks_text_gpu" / "plan.csv")
    pd.testing.assert_frame_equal(committed, gpu.plan(), check_exact=False, rtol=1e-5, check_dtype=False)
    row = committed.iloc[0]
    # the size ratio is the shapes' parameter counts, computed here by hand: 8 x (4 x 512^2 + 3 x 512 x 2048)
    assert row.params_ratio == 8 * (4 * 512 ** 2 + 3 * 512 * 2048) / (4 * (4 * 128 ** 2 + 3 * 128 * 512))
    assert row.predicted_loss == pytest.approx(row.pilot_loss_at_end * row.params_ratio ** -0.076, rel=1e-5)
    assert row.steps * row.batch * row.context <= row.train_mb * 1e6  # one pass: no window read twice


def test_the_gpu_command_runs_at_a_tiny_size_on_the_cpu(tmp_path):
    _module().main(["--dry-run", "--out", str(tmp_path / "dry")])
    rule = pd.read_csv(tmp_path / "dry" / "rule.csv")
    assert list(rule.arm) == ["none"] and rule.step.iloc[0] == 2
    assert 0 < rule.val_loss.iloc[0] < 6 and rule.target.iloc[0] == pytest.approx(rule.count_model_val.iloc[0] - 0.3)
