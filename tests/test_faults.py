"""Faults: killed sweeps resume to identical results; unwritable outputs fail cleanly."""

import errno
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest

import interp
from interp.io import FAULT_ENV, OutputError, write_table
from interp.models import tiny_hf_model, tiny_inputs
from interp.record.recording import record_qkv
from interp.record.stats import QKVStats

CMD = [sys.executable, "-m", "interp.cli", "ablate", "--model", "digits-vit", "--data", "digits",
       "--kinds", "q,k,v", "--max-batches", "2", "--n-control", "2"]  # rows with their control draws resume too
# the killed process runs on one thread, like the uninterrupted reference and the resumed run (``run_cli``): same sums


def _killed_at(cmd: list, fault: str) -> None:
    """Run the CLI command ``cmd`` with the fault point ``fault`` armed (interp.io.fault_point) in a process forked
    from this one, on one thread: it must die by SIGKILL there. A fork starts from this process's imports (a fresh
    ``python -m interp.cli`` imported torch, transformers and interp again: ~15 s of CPU a process, for nothing the
    kill tests); what the killed process leaves on disk is the same."""
    import time

    import torch

    from interp.cli import main

    assert cmd[:3] == [sys.executable, "-m", "interp.cli"]
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.environ[FAULT_ENV] = fault
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            torch.set_num_threads(1)
            code = main([str(a) for a in cmd[3:]])
        finally:
            os._exit(code if isinstance(code, int) else 1)
    deadline = time.monotonic() + 600
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError(f"{fault}: the forked CLI process did not finish in 600 s")
    status = done[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
        f"{fault} was never reached: the kill tested nothing (status {status})"


def test_sweep_killed_with_sigkill_resumes_to_identical_results(tmp_path, run_cli):
    """SIGKILL after the 2nd, 5th and 9th result rows (three runs), then a run to the end: the table
    equals an uninterrupted run's. The runs never killed (the reference and the last) run in this process: a
    process start costs ~10 s and proves nothing a killed one does not."""
    straight = tmp_path / "straight"
    assert run_cli(CMD[3:] + ["--out", straight]) == 0
    resumed = tmp_path / "resumed"
    log = resumed / "ablation.jsonl"
    for rows in (2, 5, 9):
        _killed_at(CMD + ["--out", str(resumed)], f"after-row:{rows}")
        assert len(log.read_text().splitlines()) == 1 + rows  # the header and every row before the kill
    assert run_cli(CMD[3:] + ["--out", resumed]) == 0
    a = pd.read_csv(straight / "ablation.csv")
    b = pd.read_csv(resumed / "ablation.csv")
    assert len(a) > 9
    pd.testing.assert_frame_equal(a, b)
    assert not [p for p in resumed.rglob("*.tmp")]


def test_recording_killed_leaves_no_partial_file_and_rerun_is_identical(tmp_path, run_cli):
    """SIGKILL at the worst moment: the statistics fully written to a temporary, not yet renamed. The
    reference and the rerun are recorded in this process."""
    cmd = [sys.executable, "-m", "interp.cli", "record", "--model", "digits-vit", "--data", "digits"]
    ref = tmp_path / "ref"
    assert run_cli(cmd[3:] + ["--out", ref]) == 0
    out = tmp_path / "killed"
    stats_file = out / "qkv_stats.safetensors"
    _killed_at(cmd + ["--out", str(out)], f"before-replace:{stats_file.name}")
    assert not stats_file.exists() and list(out.glob(f".{stats_file.name}.*.tmp"))  # only the temporary
    assert run_cli(cmd[3:] + ["--out", out]) == 0  # the rerun, never killed, in this process
    _assert_same(QKVStats.load(ref / "qkv_stats.safetensors"), QKVStats.load(stats_file))
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))


def _assert_same(a: QKVStats, b: QKVStats) -> None:
    assert a.layers == b.layers and a.kinds == b.kinds
    assert all(a.count(l) == b.count(l) for l in a.layers)
    assert all((a.cov(l, k) == b.cov(l, k)).all() and (a.mean(l, k) == b.mean(l, k)).all()
               for l in a.layers for k in a.kinds)


def test_read_only_output_folder(tmp_path, run_cli, capsys):
    df = pd.DataFrame({"a": [1]})
    with pytest.raises(OutputError, match="cannot write to output folder /proc"):
        write_table(df, "/proc/interp-out/table")
    # the CLI's own handling (interp.cli.main), in this process: a new process only imported torch again (~15 s)
    code = run_cli(["inventory", "--model", "digits-vit", "--out", "/proc/interp-out"])
    err = capsys.readouterr().err
    assert code == 1 and "cannot write to output folder" in err and "Traceback" not in err


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
    """A temporary whose writer is gone is removed; one of a live writer (this process), or not of this form, stays."""
    from interp.io import _HOST

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".t.csv.{_HOST}-{int(gone.stdout)}-0123456789ab.tmp"
    live = tmp_path / f".t.csv.{_HOST}-{os.getpid()}-0123456789ab.tmp"
    other = tmp_path / ".t.csv.abc123.tmp"
    for path in (stale, live, other):
        path.write_text("half a table")
    write_table(pd.DataFrame({"a": [1]}), tmp_path / "t")
    assert not stale.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".tmp")) == ["t.csv", "t.parquet"]
