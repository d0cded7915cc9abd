"""interp.record.stats and interp.record.stats_format: QKVStats equals a brute-force recomputation, merges exactly,
and survives a save/load round trip bit for bit; damaged files are refused."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import interp
from interp.errors import InputError, InterpError
from interp.record.hooks import hook_name
from interp.models import tiny_hf_model
from interp.record.stats import QKVStats


@pytest.fixture(scope="module")
def recorded():
    model = interp.load_model(tiny_hf_model("gpt2").double(), device="cpu")
    ids = torch.randint(0, 100, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    return model, ids, mask, interp.record_qkv(model, [(ids[:2], mask[:2]), (ids[2:], mask[2:])], progress=False)


def test_moments_equal_the_activations_recomputed_from_a_cache(recorded):
    model, ids, mask, stats = recorded
    _, cache = model.run_with_cache(ids, attention_mask=mask)
    keep = mask.bool()
    for layer in stats.layers:
        q = cache[hook_name(layer, "q")][keep].double()  # [n, head, d_head]
        assert stats.count(layer) == int(keep.sum())
        assert (stats.mean(layer, "q") - q.mean(0)).abs().max() <= 1e-10
        centred = q - q.mean(0)
        cov = torch.einsum("nhd,nhe->hde", centred, centred) / len(q)
        assert (stats.cov(layer, "q") - cov).abs().max() <= 1e-10
        frame = stats.to_frame().query("layer == @layer and kind == 'q'")
        assert frame.rms_full.to_numpy() == pytest.approx(q.pow(2).sum(-1).mean(0).sqrt().numpy(), rel=1e-9)


def test_two_halves_merged_equal_one_recording(recorded):
    model, ids, mask, whole = recorded
    a = interp.record_qkv(model, [(ids[:2], mask[:2])], progress=False)
    b = interp.record_qkv(model, [(ids[2:], mask[2:])], progress=False)
    a.merge(b)
    for key, mom in whole.moments.items():
        assert (a.moments[key].mean - mom.mean).abs().max() <= 1e-12
        assert (a.moments[key].m2 - mom.m2).abs().max() <= 1e-10


def test_save_then_load_gives_the_same_tensors(recorded, tmp_path):
    stats = recorded[3]
    loaded = QKVStats.load(stats.save(tmp_path / "s.safetensors"))
    assert loaded._signature() == stats._signature() and loaded.data_fingerprint == stats.data_fingerprint
    for key, mom in stats.moments.items():
        assert torch.equal(loaded.moments[key].mean, mom.mean) and torch.equal(loaded.moments[key].m2, mom.m2)
        assert torch.equal(loaded.biases[key], stats.biases[key])


def test_a_file_with_a_changed_count_is_refused(recorded, tmp_path):
    path = recorded[3].save(tmp_path / "s.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
    tensors = load_file(str(path))
    tensors["L0.q.count"] = tensors["L0.q.count"] + 1  # no longer the layer's other counts
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(InterpError, match="counts of L0"):
        QKVStats.load(path)


def test_merging_the_same_data_twice_is_refused_and_counts_stay(recorded, tmp_path):
    # issue 38: merging a shard with (a copy of) itself doubled every count
    model, ids, mask, whole = recorded
    half = [(ids[:2], mask[:2])]
    a, again = (interp.record_qkv(model, half, progress=False) for _ in range(2))
    b = interp.record_qkv(model, [(ids[2:], mask[2:])], progress=False)
    n = a.count(0)
    for other in (again, a, QKVStats.load(again.save(tmp_path / "a.safetensors"))):
        with pytest.raises(InputError, match="same data twice.*counts would double"):
            a.merge(other)
        assert a.count(0) == n  # refused before any moment changed
    a.merge(b)
    assert a.count(0) == whole.count(0)
    with pytest.raises(InputError, match=f"data fingerprint {again.data_fingerprint} is in both"):
        a.merge(again)  # a shard already merged in, merged again
    with pytest.raises(InputError, match="same data twice"):
        interp.record_qkv(model, [(ids[2:], mask[2:])], progress=False).merge(a)
