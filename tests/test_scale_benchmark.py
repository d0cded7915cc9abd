"""benchmarks/scale.py: its dry run writes the table's columns with positive, finite ratios and memory
figures (no timed assertions), and README's scale figures are the committed CSV's."""

import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _scale():
    spec = importlib.util.spec_from_file_location("scale_benchmark", ROOT / "benchmarks" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_writes_every_pass_with_positive_finite_ratios(tmp_path):
    scale = _scale()
    out = tmp_path / "cpu.csv"
    scale.main(["--dry-run", "--out", str(out)])
    table = pd.read_csv(out)
    assert list(table.columns) == scale.COLUMNS
    assert list(table["pass"]) == list(scale.PASSES)  # each pass once, the plain forward first
    assert set(table["kind"]) == {"reference", "analysis"}
    for column in ("seconds", "ratio"):
        assert all(math.isfinite(v) and v > 0 for v in table[column]), column
    assert all(math.isfinite(v) and v >= 0 for v in table["peak_mb"])
    plain = table.loc[table["pass"] == "plain_forward"].iloc[0]
    assert plain["ratio"] == 1.0
    ratio = table["seconds"] / plain["seconds"]
    assert ((ratio - table["ratio"]).abs() <= 1e-5 * ratio).all()  # ratio is seconds over the plain forward's


def test_ablation_mode_counts_the_patched_forwards_of_its_floor(tmp_path):
    """--ablation on the tiny shape: finite ratios, and the floor's patched forwards are those the table ran
    (each exact row that ran a forward: 1 + n_control of them)."""
    scale = _scale()
    out = tmp_path / "ablation_cpu.csv"
    scale.main(["--ablation", "--runs", "tiny@16", "--batches", "1", "--repeats", "1", "--label", "t", "--out",
                str(out)])
    row = pd.read_csv(out).iloc[0]
    for column in ("forward_s", "ablate_s", "floor_s", "ratio_forward", "ratio_floor", "floor_forwards"):
        assert math.isfinite(row[column]) and row[column] > 0, column
    table = pd.DataFrame(dict(estimate=["exact", "exact", "exact", "atp"], identity=["", "b_k cancels", "", ""],
                              n_control=[19, 19, 0, 0], layer=[0, 1, 1, 0]))
    assert scale.patched_forwards(table, n_layers=2) == (21, 20 * 2 / 2 + 1 * 1 / 2)


def test_unknown_size_is_one_clear_line(tmp_path):
    with pytest.raises(SystemExit, match="unknown size 'huge'"):
        _scale().main(["--runs", "huge@16", "--out", str(tmp_path / "x.csv")])


def test_fingerprint_mode_writes_finite_costs(tmp_path):
    out = tmp_path / "fingerprint_cpu.csv"
    _scale().main(["--fingerprint", "tiny", "--out", str(out)])
    row = pd.read_csv(out, dtype={"fingerprint": str}).iloc[0]
    for column in ("hf_build_seconds", "load_model_seconds", "fingerprint_seconds"):
        assert math.isfinite(row[column]) and row[column] > 0, column
    assert row["fingerprint_heap_mb"] >= 0 and len(row["fingerprint"]) == 16


def test_readme_scale_table_is_the_csv():
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from test_docs import README, agrees, numbers, row

    table = pd.read_csv(ROOT / "docs" / "results" / "scale" / "cpu.csv")
    for label in ("record_qkv", "run_with_cache", "score_decomposition", "ablate_bias"):
        cells = row(README, label)
        size, tokens = cells[1].split("@")
        hit = table[(table["pass"] == label) & (table["size"] == size) & (table["tokens"] == int(tokens))]
        assert len(hit) == 1, label
        ratio, peak = numbers(cells[2])[0], numbers(cells[3])[0]
        assert agrees(ratio, hit["ratio"].iloc[0]) and agrees(peak, hit["peak_mb"].iloc[0]), label
