"""``interp.io``: writers side by side in one folder (real processes) never break each other; every output is
recorded as it lands; a killed writer leaves no half-written file."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from interp.io import FAULT_ENV, atomic_path, manifest_entries, sha256_file, write_table

# A writer process: ``steps`` is a list of actions run in order; "wait:<name>" / "signal:<name>" synchronise with the
# other process through files in ``sync`` (so the interleaving is the same every run, not a race won by chance).
WRITER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import pandas as pd
    from interp.io import atomic_path, begin_outputs, write_manifest, write_table

    out, sync, command, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    for step in steps:
        kind, _, arg = step.partition(":")
        if kind == "wait":
            deadline = time.time() + 120
            while not (sync / arg).exists():
                assert time.time() < deadline, f"{command}: no {arg}"
                time.sleep(0.01)
        elif kind == "signal":
            (sync / arg).touch()
        elif kind == "begin":
            begin_outputs(out, command)
        elif kind == "table":  # a table named arg, its content naming the writer
            write_table(pd.DataFrame({"writer": [command] * 50, "row": range(50)}), out / arg)
        elif kind == "hold":  # write arg's temporary fully, then wait (inside atomic_path) for the other writer
            name, _, until = arg.partition("@")
            with atomic_path(out / name) as tmp:
                pd.DataFrame({"writer": [command] * 50, "row": range(50)}).to_csv(tmp, index=False)
                (sync / f"{command}-holds").touch()
                deadline = time.time() + 120
                while not (sync / until).exists():
                    assert time.time() < deadline, f"{command}: no {until}"
                    time.sleep(0.01)
        elif kind == "manifest":
            write_manifest(out, dict(command=command))
        elif kind == "loop":  # arg rounds of begin, two tables, manifest (a rerun replaces its own entry)
            for i in range(int(arg)):
                begin_outputs(out, command)
                write_table(pd.DataFrame({"writer": [command], "round": [i]}), out / f"{command}_table")
                write_table(pd.DataFrame({"round": [i]}), out / "shared")
                write_manifest(out, dict(command=command, round=i))
""")


def _start(out, sync, command, steps, env=None):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(out), str(sync), command, json.dumps(steps)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(*procs):
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for rc, err in results:
        assert rc == 0, err


def _whole(path, writer):
    table = pd.read_csv(path)
    return table.writer.tolist() == [writer] * 50 and table.row.tolist() == list(range(50))


def test_two_processes_writing_the_same_files_side_by_side_both_succeed(tmp_path):
    """The training workflow: two processes write the same tables (runs.csv) into one folder. Writer a holds its
    finished temporary of runs.csv while b writes runs.csv twice: b must not remove a's temporary (it used to,
    and a's rename then failed), and each file ends whole, the last writer's."""
    out, sync = tmp_path / "out", tmp_path / "sync"
    sync.mkdir()
    a = _start(out, sync, "a", ["hold:runs.csv@b-done", "table:heads"])
    b = _start(out, sync, "b", ["wait:a-holds", "table:runs", "table:runs", "signal:b-done"])
    _finish(a, b)
    assert _whole(out / "runs.csv", "a")  # a renamed its own temporary last
    assert _whole(out / "heads.csv", "a")
    assert pd.read_parquet(out / "runs.parquet").writer.eq("b").all()
    assert not list(out.glob(".*.tmp"))  # each removed only its own, and left none


def test_two_commands_side_by_side_each_list_exactly_their_own_files(tmp_path):
    """Commands a and b begin, write and finish interleaved in one folder: each manifest entry lists exactly
    the files its own process wrote, with their hashes (a clock marker gave a b's files and lost a's first)."""
    out, sync = tmp_path / "out", tmp_path / "sync"
    sync.mkdir()
    a = _start(out, sync, "a", ["begin", "table:a1", "signal:a1", "wait:b1", "table:a2", "manifest", "signal:a-done"])
    b = _start(out, sync, "b", ["wait:a1", "begin", "table:b1", "signal:b1", "wait:a-done", "table:b2", "manifest"])
    _finish(a, b)
    entries = {e["command"]: e["files"] for e in manifest_entries(out)}
    assert {k: sorted(v) for k, v in entries.items()} == {
        "a": ["a1.csv", "a1.parquet", "a2.csv", "a2.parquet"], "b": ["b1.csv", "b1.parquet", "b2.csv", "b2.parquet"]}
    for files in entries.values():
        assert all(sha256_file(out / name) == digest for name, digest in files.items())
    assert all(_whole(out / f"{n}.csv", n[0]) for n in ("a1", "a2", "b1", "b2"))


def test_commands_finishing_side_by_side_keep_both_entries(tmp_path):
    """Two processes, 15 rounds each of begin / write / manifest into one folder with no coordination: no write
    fails, and the manifest (read and rewritten under the folder's lock) ends with both commands' last rounds."""
    out, sync = tmp_path / "out", tmp_path / "sync"
    sync.mkdir()
    _finish(_start(out, sync, "a", ["loop:15"]), _start(out, sync, "b", ["loop:15"]))
    entries = {e["command"]: e for e in manifest_entries(out)}
    assert sorted(entries) == ["a", "b"]
    assert entries["a"]["meta"]["round"] == entries["b"]["meta"]["round"] == 14
    for name in ("a", "b"):
        assert sorted(entries[name]["files"])[:2] == [f"{name}_table.csv", f"{name}_table.parquet"]
        assert pd.read_csv(out / f"{name}_table.csv")["round"].tolist() == [14]
    assert not list(out.glob(".*.tmp"))


def test_a_killed_writer_leaves_no_half_written_file_and_no_entry(tmp_path):
    """SIGKILL with the new table fully in its temporary, before the rename: the old table is untouched, the
    command has no manifest entry (its old one was removed when it began), and the next write of that file removes
    the dead writer's temporary but never a live writer's."""
    out, sync = tmp_path / "out", tmp_path / "sync"
    sync.mkdir()
    _finish(_start(out, sync, "k", ["begin", "table:t", "manifest"]))
    before = (out / "t.csv").read_bytes()
    env = {**os.environ, FAULT_ENV: "before-replace:t.csv"}
    killed = _start(out, sync, "k", ["begin", "table:t", "manifest"], env=env)
    assert killed.wait(timeout=300) == -signal.SIGKILL
    assert (out / "t.csv").read_bytes() == before and _whole(out / "t.csv", "k")
    assert not os.path.exists(out / "t.parquet") or pd.read_parquet(out / "t.parquet").writer.eq("k").all()
    assert [e["command"] for e in manifest_entries(out)] == []  # begun, never finished: no entry
    dead = list(out.glob(".t.csv.*.tmp"))
    assert len(dead) == 1
    with atomic_path(out / "t.csv") as tmp:  # a live writer (this process) mid-write: its temporary stays
        live = tmp
        write_table(pd.DataFrame({"writer": ["x"]}), out / "t")
        assert live.exists() and not dead[0].exists()
        tmp.write_text("writer\ny\n")
    assert pd.read_csv(out / "t.csv").writer.tolist() == ["y"]
    assert not list(out.glob(".*.tmp"))


def test_manifest_without_begin_is_refused(tmp_path):
    from interp.io import OutputError, write_manifest

    with pytest.raises(OutputError, match="begin_outputs.*was not called first"):
        write_manifest(tmp_path, dict(command="x"))
