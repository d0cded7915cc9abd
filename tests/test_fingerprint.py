"""interp.fingerprint: a fingerprint changes exactly when what it names changes."""

import functools

import torch

import interp
from interp.data import Batch
from interp.fingerprint import callable_identity, data_fingerprint, model_fingerprint
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
