"""On a GPU, recording and exact sweeps do not synchronise the host once per batch.

PyTorch's sync debug mode warns at every synchronising CUDA call; the number of such calls
must not grow with the number of batches (setup, such as hashing the weights for the
fingerprint, and one read-out per group of stacked variants may sync). Skipped without CUDA.
"""

import warnings

import pytest
import torch

import interp
from interp.ablation import ablate_bias
from interp.models import tiny_hf_model, tiny_inputs


def count_syncs(fn) -> int:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.cuda
@pytest.mark.parametrize("family", ["vit", "gpt2"])
def test_record_qkv_syncs_do_not_grow_with_batches(family):
    model = interp.load_model(tiny_hf_model(family), device="cuda")
    few = [tiny_inputs(family, seed=s) for s in range(1)]
    many = [tiny_inputs(family, seed=s) for s in range(4)]
    n_few = count_syncs(lambda: interp.record_qkv(model, few, progress=False))
    n_many = count_syncs(lambda: interp.record_qkv(model, many, progress=False))
    assert n_many == n_few, (n_few, n_many)


@pytest.mark.cuda
def test_exact_sweep_syncs_do_not_grow_with_batches():
    model = interp.load_model(tiny_hf_model("gpt2"), device="cuda")
    kw = dict(kinds=("q", "v"), metric="next_token_ce", estimate="exact", progress=False)
    n_few = count_syncs(lambda: ablate_bias(model, [tiny_inputs("gpt2", seed=0)], **kw))
    n_many = count_syncs(lambda: ablate_bias(model, [tiny_inputs("gpt2", seed=s) for s in range(3)], **kw))
    assert n_many == n_few, (n_few, n_many)
