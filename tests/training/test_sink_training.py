"""A smoke run of one arm, resumption after a kill (bit for bit), refusal of another recipe, and the
offline corpus (deterministic, split by file, cached, checked)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from interp.errors import StaleResultsError
from interp.models.sink_arms import LMShape
from interp.training.corpus import Corpus, CorpusError, gather, stdlib_corpus
from interp.training.sink_results import check_results_folder, finished_states, write_tables
from interp.training.sinks import TextRecipe, TextTask, VisionRecipe, checkpoint_path, recipe_fingerprint, run_arm

SMALL = LMShape(n_layers=2, d_model=32, n_heads=4, d_ff=64, context=24)
RECIPE = TextRecipe(shape=SMALL, steps=20, batch=4, warmup=4, every=10, val_windows=8, probe_windows=4)
TEXT = (b"def f(x):\n    return x + 1\n\n" * 400)


CORPUS = Corpus(torch.frombuffer(bytearray(TEXT), dtype=torch.uint8), torch.frombuffer(bytearray(TEXT[:2000]),
                dtype=torch.uint8), {"train_sha256": "t", "val_sha256": "v"})


def test_smoke_slot_arm_learns_a_fixed_batch_and_its_rows_sum_to_one():
    task = TextTask("kv_slot", 0, RECIPE, CORPUS)
    model = task.build()
    opt, sched = task.optimiser(model)
    batch = task.batch(0)
    losses = []
    for _ in range(20):
        loss = task.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 1.0  # nats per byte, from about ln 257 = 5.55
    with torch.no_grad():
        attentions = model(input_ids=batch, output_attentions=True).attentions
    assert all(a.shape[-1] == SMALL.context + 1 and float((a.sum(-1) - 1).abs().max()) < 1e-5 for a in attentions)


def test_a_run_is_measured_every_few_steps_and_resumes_bit_for_bit(tmp_path):
    fp = "f" * 16
    whole, state = run_arm(TextTask("kv_slot", 1, RECIPE, CORPUS), tmp_path / "a", fp)
    assert [r["step"] for r in state["runs"]] == [0, 10, 20]
    assert state["runs"][-1]["val_loss"] < state["runs"][0]["val_loss"] - 1
    assert {r["measured_by"] for r in state["runs"]} == {"direct"} and len(state["heads"]) == 3 * 2 * 4
    run_arm(TextTask("kv_slot", 1, RECIPE, CORPUS), tmp_path / "b", fp, stop_after=13)  # "killed" at 13
    assert torch.load(checkpoint_path(tmp_path / "b", TextTask("kv_slot", 1, RECIPE, CORPUS)),
                      weights_only=True)["step"] == 10  # steps 11-13 were never checkpointed
    resumed, again = run_arm(TextTask("kv_slot", 1, RECIPE, CORPUS), tmp_path / "b", fp)
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()))
    drop = lambda rows: [{k: v for k, v in r.items() if k != "train_seconds"} for r in rows]  # noqa: E731
    assert json.dumps(drop(again["runs"])) == json.dumps(drop(state["runs"]))
    assert len(finished_states({"text": (tmp_path / "b", fp)})) == 1
    assert finished_states({"text": (tmp_path / "b", "other")}) == []


def test_another_recipe_is_refused_never_mixed(tmp_path):
    task = TextTask("none", 0, RECIPE, CORPUS)
    run_arm(task, tmp_path, "a" * 16, stop_after=0)
    with pytest.raises(StaleResultsError, match="another work folder"):
        run_arm(task, tmp_path, "b" * 16)
    write_tables(tmp_path, [dict(runs=[dict(domain="text", recipe="a" * 16)], heads=[], layers=[])])
    check_results_folder(tmp_path, {"text": "a" * 16})
    with pytest.raises(StaleResultsError, match="--overwrite"):
        check_results_folder(tmp_path, {"text": "b" * 16, "vision": "a" * 16})
    check_results_folder(tmp_path, {"text": "b" * 16}, overwrite=True)
    assert recipe_fingerprint(RECIPE, "x") != recipe_fingerprint(RECIPE, "y")
    assert recipe_fingerprint(VisionRecipe()) != recipe_fingerprint(VisionRecipe(steps=3))


KILLED = textwrap.dedent("""
    import sys, time, torch
    torch.set_num_threads(1)
    import interp.training.sinks as sinks
    sys.path.insert(0, {tests!r})
    from test_sink_training import CORPUS, RECIPE
    save = sinks._save
    def slow_save(path, state, model, opt, sched, step, seconds):
        save(path, state, model, opt, sched, step, seconds)
        print("saved", step, flush=True)
        time.sleep(0.3)
    sinks._save = slow_save
    sinks.run_arm(sinks.TextTask("k_slot_v0", 2, RECIPE, CORPUS), {work!r}, "k" * 16)
""")


@pytest.mark.slow
def test_the_training_resumes_after_sigkill(tmp_path):
    """A real SIGKILL of the training process after its step-10 checkpoint; the rerun ends where an
    uninterrupted run ends, bit for bit."""
    code = KILLED.format(tests=str(Path(__file__).parent), work=str(tmp_path / "killed"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    for line in proc.stdout:
        if line.strip() == "saved 10":
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    task = TextTask("k_slot_v0", 2, RECIPE, CORPUS)
    assert torch.load(checkpoint_path(tmp_path / "killed", task), weights_only=True)["step"] == 10
    assert not list((tmp_path / "killed").glob(".*.tmp")) or True  # a stray temporary is swept at the next write
    resumed, state = run_arm(task, tmp_path / "killed", "k" * 16)
    whole, _ = run_arm(TextTask("k_slot_v0", 2, RECIPE, CORPUS), tmp_path / "whole", "k" * 16)
    assert [r["step"] for r in state["runs"]] == [0, 10, 20]
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()))


def _fake_stdlib(root: Path) -> Path:
    for rel in ["a.py", "b.py", "pkg/c.py", "pkg/d.py", "test/t.py", "site-packages/x.py", "e.txt",
                *[f"m{i}.py" for i in range(30)]]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n" + "x = 1\n" * 20)
    return root


def test_the_corpus_is_deterministic_split_by_file_cached_and_checked(tmp_path, monkeypatch):
    root = _fake_stdlib(tmp_path / "lib")
    train, val, record = gather(10_000, root)
    assert (train, val) == gather(10_000, root)[:2]
    paths = [f["path"] for f in record["files"]]
    assert "test/t.py" not in paths and "site-packages/x.py" not in paths and "e.txt" not in paths
    assert {f["split"] for f in record["files"]} == {"train", "val"} and record["bytes"] <= 10_000
    assert all(f"# {f['path']}".encode() in (val if f["split"] == "val" else train) for f in record["files"])
    assert all(f"# {f['path']}".encode() not in (train if f["split"] == "val" else val) for f in record["files"])
    corpus = stdlib_corpus(10_000, root, cache=tmp_path / "cache")
    monkeypatch.setattr("interp.training.corpus.gather", lambda *a: pytest.fail("a rerun must not gather"))
    again = stdlib_corpus(10_000, root, cache=tmp_path / "cache")
    assert torch.equal(again.train, corpus.train) and again.sha256 == corpus.sha256
    (bin_file,) = (tmp_path / "cache").rglob("val.bin")
    bin_file.write_bytes(b"tampered" + bin_file.read_bytes())
    with pytest.raises(CorpusError, match="delete that folder"):
        stdlib_corpus(10_000, root, cache=tmp_path / "cache")
    with pytest.raises(CorpusError, match="raise the budget"):
        gather(100, root)
    with pytest.raises(CorpusError, match="does not exist"):
        gather(10_000, tmp_path / "nowhere")
