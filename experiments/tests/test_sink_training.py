"""A smoke run of one arm, resumption after a kill (bit for bit), refusal of another recipe, and the
offline corpus (deterministic, split by file, cached, checked)."""

import importlib.util
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp.errors import CheckpointError, InputError, StaleResultsError
from experiments.training.sink_arms import LMShape
from experiments.training.corpus import Corpus, CorpusError, gather, load_corpus, packages_corpus, stdlib_corpus
from experiments.training.sink_results import check_results_folder, finished_states, write_tables
from experiments.training.sinks import (
    TextRecipe, TextTask, VisionRecipe, _text_schedule, checkpoint_path, fresh_text_recipe, recipe_fingerprint, run_arm,
    train_offsets,
)

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


def _killed_training(work: Path) -> int:
    """Train k_slot_v0 (seed 2) into ``work`` in a process forked from this one, each checkpoint save reported
    ("saved <step>") and held until the test writes a line back; SIGKILL it right after the step-10 checkpoint.
    Returns the child's wait status. A fork starts from this process's imports (a fresh interpreter imported torch,
    transformers and the experiment again: ~12 s of CPU, for nothing the kill tests); the kill is as real."""
    import experiments.training.sinks as sinks

    to_test, from_child = os.pipe()
    to_child, from_test = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: trains until killed, never returns into pytest
        try:
            os.close(to_test)
            os.close(from_test)
            save = sinks._save

            def slow_save(path, state, model, opt, sched, step, seconds):
                save(path, state, model, opt, sched, step, seconds)
                os.write(from_child, f"saved {step}\n".encode())
                os.read(to_child, 1)  # held here until the test says go on (or kills it): no race with a timer

            sinks._save = slow_save
            torch.set_num_threads(1)
            sinks.run_arm(sinks.TextTask("k_slot_v0", 2, RECIPE, CORPUS), work, "k" * 16)
        finally:
            os._exit(1)
    os.close(from_child)
    os.close(to_child)
    with os.fdopen(to_test) as reports:
        for line in reports:
            if line.strip() == "saved 10":  # the child waits right after this checkpoint: kill it there
                os.kill(pid, signal.SIGKILL)
                break
            os.write(from_test, b"\n")
    os.close(from_test)
    return os.waitpid(pid, 0)[1]


@pytest.mark.slow
def test_the_training_resumes_after_sigkill(tmp_path):
    """A real SIGKILL of the training process after its step-10 checkpoint; the rerun ends where an
    uninterrupted run ends, bit for bit."""
    status = _killed_training(tmp_path / "killed")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    task = TextTask("k_slot_v0", 2, RECIPE, CORPUS)
    assert torch.load(checkpoint_path(tmp_path / "killed", task), weights_only=True)["step"] == 10
    assert not list((tmp_path / "killed").glob(".*.tmp"))  # killed after the save returned: nothing half-written
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
    monkeypatch.setattr("experiments.training.corpus.gather", lambda *a: pytest.fail("a rerun must not gather"))
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


def test_a_bad_checkpoint_is_one_clear_error_and_checkpoints_are_keyed_by_arm_and_seed(tmp_path):
    slot = TextTask("kv_slot", 1, RECIPE, CORPUS)
    run_arm(slot, tmp_path, "c" * 16, stop_after=10)  # checkpointed at step 10
    good = checkpoint_path(tmp_path, slot).read_bytes()
    other = TextTask("k_slot_v0", 1, RECIPE, CORPUS)  # another arm, same recipe and seed
    path = checkpoint_path(tmp_path, other)
    path.write_bytes(good)  # a copied or renamed file
    with pytest.raises(CheckpointError, match="renamed or copied"):
        run_arm(other, tmp_path, "c" * 16)
    seed2 = TextTask("kv_slot", 2, RECIPE, CORPUS)  # another seed, same recipe and arm
    checkpoint_path(tmp_path, seed2).write_bytes(good)
    with pytest.raises(CheckpointError, match="renamed or copied"):
        run_arm(seed2, tmp_path, "c" * 16)
    checkpoint_path(tmp_path, seed2).unlink()
    for damaged in (good[: len(good) // 2], b"", b"not a checkpoint"):
        path.write_bytes(damaged)
        with pytest.raises(CheckpointError, match="truncated, empty"):
            run_arm(other, tmp_path, "c" * 16)
        with pytest.raises(CheckpointError, match="truncated, empty"):
            finished_states({"text": (tmp_path, "c" * 16)})
    state = torch.load(checkpoint_path(tmp_path, slot), weights_only=True)
    torch.save({k: v for k, v in state.items() if k != "arm"}, path)  # written before checkpoints had keys
    with pytest.raises(CheckpointError, match="lacks arm"):
        run_arm(other, tmp_path, "c" * 16)
    torch.save(dict(state, arm="k_slot_v0"), path)  # keys edited: the weights still do not fit
    with pytest.raises(CheckpointError, match="does not fit"):
        run_arm(other, tmp_path, "c" * 16)
    assert run_arm(slot, tmp_path, "c" * 16, stop_after=0)[1]["step"] == 10  # the good one still resumes


def test_the_fresh_recipe_reads_no_window_twice_at_a_constant_rate():
    fresh = fresh_text_recipe(shape=SMALL, steps=20, batch=4, warmup=4)
    starts = train_offsets(20 * 4 * 24 + 23, fresh, 0).flatten()
    assert len(set(starts.tolist())) == 80 and (starts % 24 == 0).all() and int(starts.max()) + 24 <= 20 * 4 * 24 + 23
    assert not torch.equal(starts, train_offsets(20 * 4 * 24 + 23, fresh, 1).flatten())
    with pytest.raises(InputError, match="raise corpus_budget"):
        train_offsets(20 * 4 * 24 - 1, fresh, 0)
    constant, cosine = _text_schedule(fresh), _text_schedule(RECIPE)
    assert [constant(s) for s in (0, 3, 4, 19)] == [0.25, 1.0, 1.0, 1.0]
    assert cosine(4) == 1.0 and cosine(19) < 0.2
    with pytest.raises(InputError, match="schedule must be one of"):
        TextRecipe(schedule="linear")
    # the first release's recipe keeps its fingerprint: it is the one its shipped results carry
    old = Path(__file__).resolve().parents[2] / "docs" / "results" / "sinks"
    sha = json.loads((old / "corpus.json").read_text())["sha256"]
    runs = pd.read_csv(old / "runs.csv")
    assert set(runs[runs.domain == "text"].recipe) == {recipe_fingerprint(TextRecipe(), sha)}
    assert recipe_fingerprint(fresh_text_recipe(), sha) != recipe_fingerprint(TextRecipe(), sha)


def test_the_packages_corpus_keeps_each_text_once_and_names_a_missing_package(tmp_path):
    root = tmp_path / "site"
    for rel, text in [("alpha/a.py", "a = 1\n"), ("alpha/copy.py", "a = 1\n"), ("alpha/tests/t.py", "t\n"),
                      ("beta/b.py", "b = 2\n"), *[(f"beta/m{i}.py", f"m = {i}\n") for i in range(30)]]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    corpus = packages_corpus(10_000, ("alpha", "beta"), root, cache=tmp_path / "cache")
    paths = [f["path"] for f in corpus.record["files"]]
    assert len(paths) == 32 and "alpha/tests/t.py" not in paths  # one of a.py / copy.py: the same bytes
    assert len({f["sha256"] for f in corpus.record["files"]}) == len(paths)
    assert all(p.split("/")[0] in ("alpha", "beta") for p in paths)
    assert set(corpus.record["packages"]) == {"alpha", "beta"}
    again = packages_corpus(10_000, ("alpha", "beta"), root, cache=tmp_path / "cache")
    assert again.sha256 == corpus.sha256
    with pytest.raises(CorpusError, match="gamma are not installed"):
        packages_corpus(10_000, ("alpha", "gamma"), root, cache=tmp_path / "cache")


@pytest.mark.cuda
def test_a_text_run_on_cuda_matches_the_cpu_run_and_resumes_on_the_cpu(tmp_path):
    """The same initial weights and data on either device; a CUDA checkpoint resumes on the CPU."""
    fp = "d" * 16
    _, on_cpu = run_arm(TextTask("k_slot_v0", 1, RECIPE, CORPUS), tmp_path / "cpu", fp)
    model, _ = run_arm(TextTask("k_slot_v0", 1, RECIPE, CORPUS, "cuda"), tmp_path / "gpu", fp, stop_after=10)
    assert next(model.parameters()).device.type == "cuda"
    _, resumed = run_arm(TextTask("k_slot_v0", 1, RECIPE, CORPUS), tmp_path / "gpu", fp)  # steps 10..20 on the CPU
    cpu_rows, mixed_rows = pd.DataFrame(on_cpu["runs"]), pd.DataFrame(resumed["runs"])
    assert list(cpu_rows.step) == list(mixed_rows.step) == [0, 10, 20]
    assert list(mixed_rows.device) == ["cuda", "cuda", "cpu"] and set(cpu_rows.device) == {"cpu"}
    first = ["val_loss", "mean_mass_first", "mean_mass_slot", "implicit_norm", "slot_norm"]
    pd.testing.assert_frame_equal(cpu_rows.loc[[0], first], mixed_rows.loc[[0], first], rtol=1e-5)  # the same start
    # float rounding only: another data order moves it by ~0.02 here, a resume without the moments by ~0.03
    assert (cpu_rows.val_loss - mixed_rows.val_loss).abs().max() < 2e-3


def test_a_checkpoint_is_read_onto_the_cpu_whatever_device_wrote_it(tmp_path, monkeypatch):
    """A run trained on a GPU resumes on a machine without one: ``read_checkpoint`` maps every tensor to the
    CPU (a CUDA tensor cannot be made here, so the call is checked); each measurement names its device."""
    task = TextTask("kv_slot", 1, RECIPE, CORPUS)
    _, state = run_arm(task, tmp_path, "e" * 16, stop_after=10)
    assert {r["device"] for r in state["runs"]} == {"cpu"}
    seen, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: seen.append(kw) or load(*a, **kw))
    run_arm(task, tmp_path, "e" * 16, stop_after=1)
    assert seen and all(kw.get("map_location") == "cpu" and kw.get("weights_only") for kw in seen)


def _train_sinks_benchmark(monkeypatch, *argv):
    """experiments/train_sinks.py's module and its parsed ``argv``."""
    path = Path(__file__).resolve().parents[2] / "experiments" / "train_sinks.py"
    spec = importlib.util.spec_from_file_location("train_sinks_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["train_sinks.py", *argv])
    return module, module.arguments()


def test_the_benchmark_shape_flags_make_another_recipe_and_their_defaults_the_shipped_one(monkeypatch):
    """At their defaults the shape, batch and device flags give the recipe (and fingerprint) of the
    shipped text rerun (docs/results/sinks_text); a wider model is another recipe, never mixed with it."""
    results = Path(__file__).resolve().parents[2] / "docs" / "results" / "sinks_text"
    shipped = json.loads((results / "corpus.json").read_text())["sha256"]
    bench, args = _train_sinks_benchmark(monkeypatch, "--recipe", "fresh", "--text-steps", "1000", "--text-every", "125")
    default = bench.text_recipe(args)
    assert default == fresh_text_recipe(steps=1000, every=125)
    assert set(pd.read_csv(results / "runs.csv").recipe) == {recipe_fingerprint(default, shipped)}
    bench, args = _train_sinks_benchmark(monkeypatch, "--recipe", "fresh", "--text-steps", "1000", "--d-model", "256",
                                         "--n-heads", "8", "--context", "256", "--text-batch", "64")
    wide = bench.text_recipe(args)
    assert (wide.shape.d_model, wide.shape.n_heads, wide.shape.context, wide.batch) == (256, 8, 256, 64)
    assert (wide.shape.n_layers, wide.shape.d_ff) == (LMShape().n_layers, LMShape().d_ff)
    assert recipe_fingerprint(wide, shipped) != recipe_fingerprint(default, shipped)
    with pytest.raises(SystemExit, match="is not a device torch knows \\(try 'cpu', 'cuda' or 'cuda:0'\\)"):
        bench.check_device("gpu0")
    with pytest.raises(SystemExit, match="tested on cpu and cuda only"):
        bench.check_device("mps")
    with pytest.raises(SystemExit, match="not a multiple of --n-heads 6"):
        bench.text_recipe(_train_sinks_benchmark(monkeypatch, "--d-model", "256", "--n-heads", "6")[1])
    # the shipped first-release weights (data/sinks) are replaced only by the first release's recipe
    assert bench.ship_folder(args, TextRecipe()) == Path(bench.SHIPPED)
    with pytest.raises(SystemExit, match="pass --no-ship, or --ship FOLDER"):
        bench.ship_folder(args, wide)
    args.ship = "elsewhere"
    assert bench.ship_folder(args, wide) == Path("elsewhere")
    args.no_ship = True
    assert bench.ship_folder(args, TextRecipe()) is None
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device 'cuda' asks for CUDA, but no CUDA device is available here: use 'cpu'"):
            bench.check_device("cuda")
        with pytest.raises(InputError, match="no CUDA device is available here"):  # the library refuses it too
            TextTask("none", 0, RECIPE, CORPUS, "cuda")
    with pytest.raises(InputError, match="'gpu0' is not a device torch knows"):
        TextTask("none", 0, RECIPE, CORPUS, "gpu0")


def test_a_corpus_folder_loads_elsewhere_checked_and_the_benchmark_trains_on_it(tmp_path, monkeypatch):
    """``load_corpus``: the bytes gathered on one machine, on another (checked against the record);
    ``train_sinks.py --corpus-from`` takes its budget from that record."""
    root = tmp_path / "site"
    for i in range(40):
        (root / "alpha" / f"m{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (root / "alpha" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 20)
    corpus = packages_corpus(20_000, ("alpha",), root, cache=tmp_path / "cache")
    (folder,) = (tmp_path / "cache" / "sinks-corpus").iterdir()
    moved = tmp_path / "elsewhere"
    shutil.copytree(folder, moved)
    loaded = load_corpus(moved)
    assert torch.equal(loaded.train, corpus.train) and torch.equal(loaded.val, corpus.val)
    assert loaded.sha256 == corpus.sha256 and loaded.record == corpus.record

    bench, args = _train_sinks_benchmark(monkeypatch, "--recipe", "fresh", "--text-steps", "3", "--text-batch", "2",
                                         "--context", "32", "--corpus-from", str(moved))
    recipe = bench.text_recipe(args)
    assert recipe.corpus_budget == 20_000 and bench.corpus_of(args, recipe).sha256 == corpus.sha256
    bench, args = _train_sinks_benchmark(monkeypatch, "--recipe", "fresh", "--corpus-budget", "30000",
                                         "--corpus-from", str(moved))
    with pytest.raises(SystemExit, match="gathered with a budget of 20000: drop --corpus-budget"):
        bench.text_recipe(args)
    bench, args = _train_sinks_benchmark(monkeypatch, "--recipe", "first", "--corpus-from", str(moved))
    with pytest.raises(SystemExit, match="holds a packages corpus, but --recipe first trains on the stdlib corpus"):
        bench.text_recipe(args)
    record = json.loads((moved / "corpus.json").read_text())
    (moved / "corpus.json").write_text(json.dumps({k: v for k, v in record.items() if k != "budget"}))
    bench, args = _train_sinks_benchmark(monkeypatch, "--recipe", "fresh", "--corpus-from", str(moved))
    with pytest.raises(SystemExit, match="records no budget"):
        bench.text_recipe(args)

    (moved / "val.bin").write_bytes(b"x" + (moved / "val.bin").read_bytes())
    with pytest.raises(CorpusError, match="does not match its corpus.json"):
        load_corpus(moved)
    (moved / "corpus.json").write_text("[1, 2]")
    with pytest.raises(CorpusError, match="is not a corpus record"):
        load_corpus(moved)
    (moved / "train.bin").unlink()
    with pytest.raises(CorpusError, match="lacks train.bin"):
        load_corpus(moved)
