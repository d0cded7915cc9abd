"""Faults: killed sweeps resume to identical results; unwritable outputs fail cleanly."""

import errno
import random
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

import interp
from interp.io import OutputError, write_table
from interp.models import tiny_hf_model, tiny_inputs
from interp.record import record_qkv
from interp.stats import QKVStats

CMD = [sys.executable, "-m", "interp.cli", "ablate", "--model", "digits-vit", "--data", "digits",
       "--kinds", "q,k,v", "--max-batches", "2"]


def test_sweep_killed_with_sigkill_resumes_to_identical_results(tmp_path):
    straight = tmp_path / "straight"
    subprocess.run(CMD + ["--out", str(straight)], check=True, capture_output=True, timeout=600)
    resumed = tmp_path / "resumed"
    log = resumed / "ablation.jsonl"
    rng = random.Random(0)
    kills = 0
    for _ in range(3):
        done_before = len(log.read_text().splitlines()) if log.exists() else 0
        proc = subprocess.Popen(CMD + ["--out", str(resumed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # kill at a random moment once this run has finished some variants (mid-sweep)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if log.exists() and len(log.read_text().splitlines()) > done_before:
                time.sleep(rng.uniform(0.0, 0.5))
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    subprocess.run(CMD + ["--out", str(resumed)], check=True, capture_output=True, timeout=600)
    assert kills >= 1
    a = pd.read_csv(straight / "ablation.csv")
    b = pd.read_csv(resumed / "ablation.csv")
    pd.testing.assert_frame_equal(a, b)
    assert not [p for p in resumed.rglob("*.tmp")]


def test_recording_killed_leaves_no_partial_file_and_rerun_is_identical(tmp_path):
    cmd = [sys.executable, "-m", "interp.cli", "record", "--model", "digits-vit", "--data", "digits"]
    ref = tmp_path / "ref"
    start = time.monotonic()
    subprocess.run(cmd + ["--out", str(ref)], check=True, capture_output=True, timeout=600)
    took = time.monotonic() - start
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd + ["--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.6 * took)  # most of the way through a run like the reference one
    assert proc.poll() is None, "record had already exited: the kill tested nothing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stats_file = out / "qkv_stats.safetensors"
    a = QKVStats.load(ref / "qkv_stats.safetensors")
    if stats_file.exists():  # written before the kill: then whole, and equal to the reference
        _assert_same(a, QKVStats.load(stats_file))
    subprocess.run(cmd + ["--out", str(out)], check=True, capture_output=True, timeout=600)
    _assert_same(a, QKVStats.load(stats_file))


def _assert_same(a: QKVStats, b: QKVStats) -> None:
    assert a.layers == b.layers and a.kinds == b.kinds
    assert all(a.count(l) == b.count(l) for l in a.layers)
    assert all((a.cov(l, k) == b.cov(l, k)).all() and (a.mean(l, k) == b.mean(l, k)).all()
               for l in a.layers for k in a.kinds)


def test_read_only_output_folder(tmp_path):
    df = pd.DataFrame({"a": [1]})
    with pytest.raises(OutputError, match="cannot write to output folder /proc"):
        write_table(df, "/proc/interp-out/table")
    r = subprocess.run([sys.executable, "-m", "interp.cli", "inventory", "--model", "digits-vit",
                        "--out", "/proc/interp-out"], capture_output=True, text=True)
    assert r.returncode == 1 and "cannot write to output folder" in r.stderr and "Traceback" not in r.stderr


def test_full_disk_leaves_nothing_half_written(tmp_path, monkeypatch):
    df = pd.DataFrame({"a": range(1000)})
    real = pd.DataFrame.to_parquet

    def full(self, path, *a, **k):
        with open(path, "wb") as fh:
            fh.write(b"PAR1 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    with pytest.raises(OutputError, match="No space left on device.*nothing was written"):
        write_table(df, tmp_path / "t")
    assert not (tmp_path / "t.parquet").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]  # the csv finished before the disk filled
    monkeypatch.setattr(pd.DataFrame, "to_parquet", real)


def test_truncated_statistics_file(tmp_path):
    model = interp.load_model(tiny_hf_model("vit"), device="cpu")
    path = record_qkv(model, [tiny_inputs("vit")], progress=False).save(tmp_path / "s.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(interp.InterpError, match="not a readable interp statistics file"):
        QKVStats.load(path)


def test_stale_temporaries_from_a_killed_writer_are_removed(tmp_path):
    stale = tmp_path / ".t.csv.abc123.tmp"
    stale.write_text("half a table")
    write_table(pd.DataFrame({"a": [1]}), tmp_path / "t")
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.parquet"]
