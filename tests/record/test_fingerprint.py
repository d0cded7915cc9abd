"""interp.record.fingerprint: a fingerprint changes exactly when what it names changes."""

import functools

import pytest
import torch

import interp
from interp.data import Batch
from interp.record.fingerprint import callable_identity, data_fingerprint, model_fingerprint
from interp.models import tiny_hf_model


def test_model_fingerprint_follows_the_weights_not_the_object():
    a = interp.load_model(tiny_hf_model("gpt2", seed=3), device="cpu")
    b = interp.load_model(tiny_hf_model("gpt2", seed=3), device="cpu")
    c = interp.load_model(tiny_hf_model("gpt2", seed=4), device="cpu")
    assert model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(c)
    before = model_fingerprint(a)
    param = next(a.hf_model.parameters())
    saved = param[0, 0].item()
    with torch.no_grad():
        param[0, 0] += 1.0  # an in-place step, as a notebook's fine-tuning does
    assert model_fingerprint(a) != before
    with torch.no_grad():
        param[0, 0] = saved
    assert model_fingerprint(a) == before  # the bytes are back, so is the fingerprint


def test_data_fingerprint_names_the_exact_batches():
    ids = torch.arange(12).view(2, 6)
    one = [Batch(ids, torch.ones_like(ids))]
    assert data_fingerprint(one) == data_fingerprint([Batch(ids.clone(), torch.ones_like(ids))])
    mask = torch.ones_like(ids)
    mask[1, 5] = 0
    assert data_fingerprint([Batch(ids, mask)]) != data_fingerprint(one)  # padding is part of the data
    assert data_fingerprint([Batch(ids + 1, torch.ones_like(ids))]) != data_fingerprint(one)


def _token_logit(out, batch, token):
    return out[..., token].mean()


def test_callable_identity_hashes_captured_values():
    def make(token):
        return lambda out, batch: out[..., token].mean()

    assert callable_identity(make(5)) == callable_identity(make(5)) != callable_identity(make(7))
    five, seven = functools.partial(_token_logit, token=5), functools.partial(_token_logit, token=7)
    assert callable_identity(five) != callable_identity(seven)
    # a partial binding a large tensor: its repr abbreviates the middle, its identity must not
    first, second = torch.zeros(10_000), torch.zeros(10_000)
    second[5_000] = 1.0
    assert repr(first) == repr(second)
    assert callable_identity(functools.partial(_token_logit, token=first)) != \
        callable_identity(functools.partial(_token_logit, token=second))
    unhashable = functools.partial(_token_logit, token=object())
    assert "unfingerprintable" in callable_identity(unhashable)
    assert callable_identity(unhashable) != callable_identity(unhashable)  # never resumes


def test_callable_identity_reads_code_nested_in_the_function():
    """A comprehension or generator is a nested code object: its repr holds a memory address (the same
    source defined twice got two identities, so a new session never resumed) and the globals it reads
    were left out (changing one resumed old rows)."""
    source = "def metric(out, batch):\n    return sum(out[..., t + SHIFT].mean() for t in range(2))\n"
    first, second, other = {"SHIFT": 3}, {"SHIFT": 3}, {"SHIFT": 4}
    for namespace in (first, second, other):
        exec(source, namespace)
    assert callable_identity(first["metric"]) == callable_identity(second["metric"])
    assert callable_identity(first["metric"]) != callable_identity(other["metric"])


def test_model_fingerprint_streams_chunks_and_keeps_its_value(monkeypatch):
    """Hashed in chunks, the fingerprint is the blake2b of config and every parameter's whole bytes at
    once (its value before chunking, recomputed here by brute force); one flipped element in the middle
    of a parameter, chunks away from its start, gives a new fingerprint."""
    import hashlib
    import json

    import interp.record.fingerprint as fp

    monkeypatch.setattr(fp, "CHUNK_BYTES", 1000)  # not a multiple of 4: chunks split float32 elements
    model = interp.load_model(tiny_hf_model("gpt2", seed=5), device="cpu")
    h = hashlib.blake2b(digest_size=8)
    config = model.hf_model.config.to_dict()
    config.pop("_name_or_path", None)
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for p in model.hf_model.parameters():
        h.update(f"{tuple(p.shape)}:{p.dtype};".encode() + p.detach().numpy().tobytes())
    before = model_fingerprint(model)
    assert before == h.hexdigest()
    big = max(model.hf_model.parameters(), key=lambda p: p.numel())
    assert big.numel() * big.element_size() > 4 * fp.CHUNK_BYTES
    with torch.no_grad():
        big.view(-1)[big.numel() // 2] += 2.0 ** -10
    assert model_fingerprint(model) != before


def test_model_fingerprint_never_copies_a_whole_parameter_to_python(monkeypatch):
    """The old hash made a bytes copy of each parameter (a 600 MB one for a 420M Qwen2's embedding);
    chunked, the Python heap grows by far less than the largest parameter."""
    import tracemalloc

    import interp.record.fingerprint as fp

    monkeypatch.setattr(fp, "CHUNK_BYTES", 1 << 16)
    model = interp.load_model(tiny_hf_model("gpt2", seed=6), device="cpu")
    with torch.no_grad():
        model.hf_model.transformer.wte.weight.data = torch.randn(4096, 256)  # 4 MiB, a new storage
    tracemalloc.start()
    try:
        model_fingerprint(model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20)  # the old code's peak was the 4 MiB parameter's bytes


@pytest.mark.cuda
def test_model_fingerprint_on_cuda_equals_the_cpu_one(monkeypatch):
    """Chunks copied from the device one at a time hash to the CPU model's fingerprint."""
    import interp.record.fingerprint as fp

    monkeypatch.setattr(fp, "CHUNK_BYTES", 4096)
    on_cpu = interp.load_model(tiny_hf_model("gpt2", seed=7), device="cpu")
    on_gpu = interp.load_model(tiny_hf_model("gpt2", seed=7), device="cuda")
    assert model_fingerprint(on_gpu) == model_fingerprint(on_cpu)
