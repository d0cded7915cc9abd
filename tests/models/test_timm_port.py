"""The same trained weights as an HF ViT and as a timm ViT (fused qkv): the library must see
one model. An independent check of the fused-qkv split against HF's separate projections."""

import pytest
import torch

import interp
from interp.models.digits import digits_vit_as_timm


@pytest.fixture(scope="module", params=["digits-vit", "digits-vit-nobias"])
def pair(request):
    hf = interp.load_model(request.param, device="cpu")
    timm_model = interp.load_model(digits_vit_as_timm(request.param), device="cpu")
    batch = interp.builtin_batches(hf, "digits", batch_size=64, n=128)
    return request.param, hf, timm_model, batch


def test_same_logits_and_hooks(pair):
    name, hf, timm_model, batches = pair
    assert timm_model.interp.family == ("timm-vit" if name == "digits-vit" else "timm-vit-nobias")
    with torch.no_grad():
        a, cache_a = hf.run_with_cache(batches[0].inputs)
        b, cache_b = timm_model.run_with_cache(batches[0].inputs)
    assert (a - b).abs().max() <= 1e-5
    for layer in range(hf.interp.n_layers):
        for hook in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_pattern"):
            key = f"blocks.{layer}.attn.{hook}"
            assert (cache_a[key] - cache_b[key]).abs().max() <= 1e-5, key


def test_same_bias_inventory_and_origin_shift(pair):
    name, hf, timm_model, batches = pair
    spec_a, spec_b = interp.bias_spec(hf), interp.bias_spec(timm_model)
    assert spec_a[["layer", "kind", "present", "n_heads"]].equals(spec_b[["layer", "kind", "present", "n_heads"]])
    assert (spec_a.norm - spec_b.norm).abs().max() <= 1e-6
    origin_a = interp.origin_shift(hf, interp.record_qkv(hf, batches, progress=False))
    origin_b = interp.origin_shift(timm_model, interp.record_qkv(timm_model, batches, progress=False))
    numeric = origin_a.select_dtypes("number").columns
    assert origin_a[numeric].isna().equals(origin_b[numeric].isna())  # the same cells filled
    assert (origin_a[numeric] - origin_b[numeric]).abs().max().max() <= 1e-6
