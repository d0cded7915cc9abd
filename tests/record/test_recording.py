"""record_qkv: streaming statistics equal brute force; merging and all_reduce are exact."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import interp
from interp.errors import ActivationError, InputError, InterpError
from interp.models import tiny_hf_model, tiny_inputs
from interp.record.recording import record_qkv
from interp.record.stats import QKVStats


def padded_batches(family, n_batches=3, seed=0):
    out = []
    for i in range(n_batches):
        ids = tiny_inputs(family, batch=3, pos=9, seed=seed + i)
        mask = torch.ones_like(ids)
        mask[0, 5 + i :] = 0  # right padding of varying length
        mask[2, 2:] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def brute_force(model, batches, layer, kind):
    acts, xs = [], []
    for b in batches:
        with torch.no_grad():
            _, cache = model.run_with_cache(b["input_ids"], attention_mask=b["attention_mask"])
        keep = b["attention_mask"].bool()
        acts.append(cache[f"blocks.{layer}.attn.hook_{kind}"][keep])
        xs.append(cache[f"blocks.{layer}.attn.q.hook_in"][keep])
    a, x = torch.cat(acts).double(), torch.cat(xs).double()
    return a, x


@pytest.fixture(scope="module", params=["gpt2", "qwen2"])
def recorded(request):
    hf = tiny_hf_model(request.param).double()
    model = interp.load_model(hf, device="cpu")
    batches = padded_batches(request.param)
    return model, batches, record_qkv(model, batches, progress=False)


def test_statistics_equal_brute_force(recorded):
    model, batches, stats = recorded
    info = model.interp
    for layer in range(info.n_layers):
        for kind in "qkv":
            a, x = brute_force(model, batches, layer, kind)
            n_heads = info.n_heads if kind == "q" else info.n_kv_heads
            assert a.shape[1] == n_heads
            b = interp.attention_weights(model, layer, dtype=torch.float64).bias(kind)
            content = a - b
            assert stats.count(layer) == a.shape[0] == sum(int(bt["attention_mask"].sum()) for bt in batches)
            mean = a.mean(0)
            cov = torch.einsum("nhd,nhe->hde", a - mean, a - mean) / a.shape[0]
            torch.testing.assert_close(stats.mean(layer, kind), mean, rtol=1e-6, atol=1e-12)
            torch.testing.assert_close(stats.mean(layer, kind, "content"), content.mean(0), rtol=1e-6, atol=1e-12)
            torch.testing.assert_close(stats.cov(layer, kind), cov, rtol=1e-6, atol=1e-12)
            cc = content - content.mean(0)
            torch.testing.assert_close(
                stats.cov(layer, kind, "content"), torch.einsum("nhd,nhe->hde", cc, cc) / a.shape[0],
                rtol=1e-6, atol=1e-12,
            )
            torch.testing.assert_close(stats.mean_sq_norm(layer, kind), a.pow(2).sum(-1).mean(0), rtol=1e-6, atol=1e-12)
            torch.testing.assert_close(
                stats.mean_sq_norm(layer, kind, "content"), content.pow(2).sum(-1).mean(0), rtol=1e-6, atol=1e-12
            )
        torch.testing.assert_close(stats.input_mean(layer), x.mean(0), rtol=1e-6, atol=1e-12)


def test_merge_of_three_shards_equals_whole(recorded):
    model, batches, whole = recorded
    shards = [record_qkv(model, [b], progress=False) for b in batches]
    merged = shards[0].merge(shards[1]).merge(shards[2])
    for layer in whole.layers:
        assert merged.count(layer) == whole.count(layer)
        for kind in "qkv":
            torch.testing.assert_close(merged.mean(layer, kind), whole.mean(layer, kind), rtol=1e-10, atol=1e-13)
            torch.testing.assert_close(merged.cov(layer, kind), whole.cov(layer, kind), rtol=1e-10, atol=1e-13)


def test_save_load_round_trip(recorded, tmp_path):
    model, batches, stats = recorded
    path = stats.save(tmp_path / "stats.safetensors")
    again = QKVStats.load(path)
    assert not list(tmp_path.glob(".*tmp"))  # no temporary left behind
    for layer in stats.layers:
        for kind in "qkv":
            assert torch.equal(again.mean(layer, kind), stats.mean(layer, kind))
            assert torch.equal(again.cov(layer, kind), stats.cov(layer, kind))
    frame = stats.to_frame()
    assert len(frame) == sum(stats.heads[k] for k in "qkv") * model.interp.n_layers
    assert {"layer", "head", "kind", "count", "bias_norm", "rms_content"} <= set(frame.columns)


def test_corrupt_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "stats.safetensors"
    bad.write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(InterpError, match="not a readable interp statistics file"):
        QKVStats.load(bad)


def _worker(rank, world, port, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = interp.load_model(tiny_hf_model("gpt2").double(), device="cpu")
    batches = padded_batches("gpt2", n_batches=4)
    stats = record_qkv(model, batches[rank::world], progress=False).all_reduce()
    if rank == 0:
        stats.save(path)
    dist.barrier()
    dist.destroy_process_group()


def test_two_process_gloo_all_reduce_equals_single_process(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "dist.safetensors"
    # forked ranks start from this process's imports (spawned ones imported torch, transformers and interp again:
    # ~15 s of CPU each); gloo, the process group and the model are made in each rank after the fork
    mp.start_processes(_worker, args=(2, port, str(path)), nprocs=2, join=True, start_method="fork")
    dist_stats = QKVStats.load(path)
    model = interp.load_model(tiny_hf_model("gpt2").double(), device="cpu")
    single = record_qkv(model, padded_batches("gpt2", n_batches=4), progress=False)
    for layer in single.layers:
        assert dist_stats.count(layer) == single.count(layer)
        for kind in "qkv":
            torch.testing.assert_close(dist_stats.mean(layer, kind), single.mean(layer, kind), rtol=1e-10, atol=1e-13)
            torch.testing.assert_close(dist_stats.cov(layer, kind), single.cov(layer, kind), rtol=1e-10, atol=1e-13)


def test_empty_data():
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    with pytest.raises(InputError, match="empty"):
        record_qkv(model, [], progress=False)


def test_model_without_hooks():
    with pytest.raises(InputError, match="interp.load_model"):
        record_qkv(tiny_hf_model("gpt2"), [tiny_inputs("gpt2")], progress=False)


def test_nan_activation_named_by_layer_and_head():
    hf = tiny_hf_model("vit")
    with torch.no_grad():
        hf.layers[1].attention.k_proj.weight[2 * 8 + 3, 0] = float("nan")  # head 2 of layer 1
    model = interp.load_model(hf, device="cpu")
    with pytest.raises(ActivationError, match=r"k activations at layer 1, head\(s\) \[2\]"):
        record_qkv(model, [tiny_inputs("vit")], progress=False)


def test_nan_input_rejected():
    model = interp.load_model(tiny_hf_model("vit"), device="cpu")
    x = tiny_inputs("vit")
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        record_qkv(model, [x], progress=False)


def test_merging_different_models_refused():
    a = record_qkv(interp.load_model(tiny_hf_model("gpt2"), device="cpu"), [tiny_inputs("gpt2")], progress=False)
    b = record_qkv(interp.load_model(tiny_hf_model("gpt2", n_heads=2), device="cpu"), [tiny_inputs("gpt2")], progress=False)
    with pytest.raises(InputError, match="different models"):
        a.merge(b)


def test_capture_mode_and_its_memory_cap():
    model = interp.load_model(tiny_hf_model("gpt2").double(), device="cpu")
    batches = padded_batches("gpt2", n_batches=2)
    stats = record_qkv(model, batches, capture=True, progress=False)
    a, _ = brute_force(model, batches, 1, "v")
    torch.testing.assert_close(stats.captured[(1, "v")][0], a)
    with pytest.raises(InterpError, match="capture_limit_mb"):
        record_qkv(model, batches, capture=True, capture_limit_mb=0.001, progress=False)


@pytest.mark.cuda
def test_cuda_equals_cpu():
    hf = tiny_hf_model("vit")
    x = [tiny_inputs("vit", seed=i) for i in range(3)]
    cpu = record_qkv(interp.load_model(hf, device="cpu"), x, progress=False)
    gpu = record_qkv(interp.load_model(tiny_hf_model("vit"), device="cuda"), x, progress=False)
    for layer in cpu.layers:
        for kind in "qkv":
            torch.testing.assert_close(gpu.mean(layer, kind).cpu(), cpu.mean(layer, kind), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(gpu.cov(layer, kind).cpu(), cpu.cov(layer, kind), rtol=1e-5, atol=1e-6)


def test_interp_record_under_torchrun_equals_one_process(tmp_path, run_cli):
    import shutil
    import subprocess
    import sys

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    base = ["record", "--model", "digits-vit", "--data", "digits", "--max-batches", "6"]
    assert run_cli(base + ["--out", tmp_path / "one"]) == 0  # one process: this one
    r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "interp.cli", "record", "--model", "digits-vit",
                        "--data", "digits", "--max-batches", "6", "--out", str(tmp_path / "two")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    one = QKVStats.load(tmp_path / "one" / "qkv_stats.safetensors")
    two = QKVStats.load(tmp_path / "two" / "qkv_stats.safetensors")
    assert one.count(0) == two.count(0) == 6 * 8 * 17
    for layer in one.layers:
        for kind in "qkv":
            torch.testing.assert_close(two.mean(layer, kind), one.mean(layer, kind), rtol=1e-10, atol=1e-13)
            torch.testing.assert_close(two.cov(layer, kind), one.cov(layer, kind), rtol=1e-10, atol=1e-13)


def test_interp_record_on_an_image_folder_under_torchrun_equals_one_process(tmp_path, run_cli, capsys, torchrun_forked):
    """Each rank reads its own batches of the folder (nothing listed twice); the merge equals one process. The
    ranks run under torchrun's elastic agent, forked from this process (``torchrun_forked``)."""
    import numpy as np
    from PIL import Image

    folder = tmp_path / "images"
    for i in range(21):
        sub = folder / ("a" if i % 2 else "b")
        sub.mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, (12 + i, 10 + 2 * i, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(sub / f"{i:02d}.png")
    (folder / "b" / "broken.png").write_bytes(b"\x89PNG truncated")
    args = ["-m", "interp.cli", "record", "--model", "digits-vit", "--data", str(folder), "--batch-size", "4"]
    assert run_cli(args[2:] + ["--out", tmp_path / "one"]) == 0  # one process: this one
    r1 = capsys.readouterr()
    ranks = torchrun_forked(args[2:] + ["--out", tmp_path / "two"])
    assert sorted(ranks) == [0, 1] and all(code == 0 for code, _, _ in ranks.values()), ranks
    assert "skipped 1 unreadable item(s)" in r1.out and "skipped 1 unreadable item(s)" in ranks[0][1]
    one = QKVStats.load(tmp_path / "one" / "qkv_stats.safetensors")
    two = QKVStats.load(tmp_path / "two" / "qkv_stats.safetensors")
    assert one.count(0) == two.count(0) == 21 * 17
    for layer in one.layers:
        for kind in "qkv":
            torch.testing.assert_close(two.mean(layer, kind), one.mean(layer, kind), rtol=1e-10, atol=1e-13)
            torch.testing.assert_close(two.cov(layer, kind), one.cov(layer, kind), rtol=1e-10, atol=1e-13)
    import json

    meta = json.loads((tmp_path / "two" / "manifest.json").read_text())["meta"]
    assert meta["skipped_items"] == 1 and len(meta["peak_rss_mb_per_rank"]) == 2
