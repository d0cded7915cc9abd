"""load_model: the hooked forward is HF's forward, and the biases are HF's own."""

import time

import pytest
import torch
import transformers as tf
from einops import rearrange

import interp
from interp.errors import InputError, OfflineError, UnknownSourceError, UnsupportedModelError
from interp.models import TINY_FAMILIES, tiny_hf_model, tiny_inputs

VISION = {f.name for f in interp.list_families(modality="vision")}


def hf_reference(hf, x):
    with torch.no_grad():
        out = hf(pixel_values=x) if x.is_floating_point() else hf(x)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def hf_qkv(family, attn, x, n_heads, n_kv):
    """Ground truth straight from the HF attention module: q, k, v [b, p, h, d] and biases."""
    if family == "gpt2":
        qkv = attn.c_attn(x)
        q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
        b = attn.c_attn.bias.split(qkv.shape[-1] // 3)
        biases = dict(zip("qkv", b))
    elif family == "neox":
        qkv = rearrange(attn.query_key_value(x), "b p (h three d) -> three b p (h d)", three=3, h=n_heads)
        q, k, v = qkv
        bias = rearrange(attn.query_key_value.bias, "(h three d) -> three (h d)", three=3, h=n_heads)
        biases = dict(zip("qkv", bias))
    elif family == "bert":
        s = attn.self
        q, k, v = s.query(x), s.key(x), s.value(x)
        biases = dict(q=s.query.bias, k=s.key.bias, v=s.value.bias)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        biases = {kind: getattr(attn, f"{kind}_proj").bias for kind in "qkv"}
    heads = dict(q=n_heads, k=n_kv, v=n_kv)
    acts = {kind: rearrange(t, "b p (h d) -> b p h d", h=heads[kind]) for kind, t in zip("qkv", (q, k, v))}
    return acts, biases


def hf_attention_modules(hf, family):
    base = getattr(hf, {"gpt2": "transformer", "neox": "gpt_neox", "opt": "model", "qwen2": "model",
                        "llama": "model", "bert": "bert"}.get(family, ""), hf) if family not in VISION else hf
    if family == "gpt2":
        return [blk.attn for blk in base.h]
    if family == "neox":
        return [blk.attention for blk in base.layers]
    if family == "opt":
        return [blk.self_attn for blk in base.decoder.layers]
    if family in ("qwen2", "llama"):
        return [blk.self_attn for blk in base.layers]
    if family == "bert":
        return [blk.attention for blk in base.encoder.layer]
    if family == "dinov2":
        return [blk.attention for blk in base.encoder.layer]
    return [blk.attention for blk in base.layers]


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def loaded(request):
    family = request.param
    hf = tiny_hf_model(family)
    x = tiny_inputs(family)
    ref = hf_reference(hf, x)
    model = interp.load_model(hf, device="cpu")
    return family, hf, model, x, ref


def test_hooked_forward_equals_hf(loaded):
    family, hf, model, x, ref = loaded
    with torch.no_grad():
        out = model(x)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-4


def test_hooks_and_biases_equal_hf_projections(loaded):
    family, hf, model, x, ref = loaded
    info = model.interp
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    attns = hf_attention_modules(hf, family)
    assert len(attns) == info.n_layers
    for layer, attn in enumerate(attns):
        xin = cache[f"blocks.{layer}.attn.q.hook_in"]
        with torch.no_grad():
            acts, biases = hf_qkv(family, attn, xin, info.n_heads, info.n_kv_heads)
        weights = interp.attention_weights(model, layer)
        for kind in "qkv":
            hooked = cache[f"blocks.{layer}.attn.hook_{kind}"]
            n = info.n_heads if kind == "q" else info.n_kv_heads
            assert hooked.shape == (x.shape[0], xin.shape[1], n, info.d_head)
            assert (hooked - acts[kind]).abs().max().item() <= 1e-5
            if biases[kind] is not None:
                # the loaded bias is the HF parameter, bit for bit
                assert torch.equal(weights.bias(kind).flatten(), biases[kind].detach())
            else:
                assert not weights.present[kind]


EXPECTED_PRESENT = {f.name: f.default_biases for f in interp.list_families()}


def test_bias_spec_presence_comes_from_architecture(loaded):
    family, hf, model, x, ref = loaded
    spec = interp.bias_spec(model)
    info = model.interp
    assert len(spec) == info.n_layers * 4
    assert list(spec.columns) == ["layer", "kind", "present", "n_heads", "d_head", "norm", "rotary"]
    for kind in "qkvo":
        rows = spec[spec.kind == kind]
        assert rows.present.all() == (kind in EXPECTED_PRESENT[family]), (family, kind)
        expected_heads = info.n_kv_heads if kind in "kv" else info.n_heads
        assert (rows.n_heads == expected_heads).all()
        if kind in EXPECTED_PRESENT[family]:
            assert (rows.norm > 0).all()
    assert spec.rotary.all() == (interp.models.get_family(family).positions == "rotary")


def test_zero_bias_is_still_present():
    """A bias that exists but is zero is 'present' (zero bias is not no bias)."""
    hf = tiny_hf_model("vit")
    with torch.no_grad():
        for blk in hf.layers:
            blk.attention.k_proj.bias.zero_()
    spec = interp.bias_spec(interp.load_model(hf, device="cpu"))
    k = spec[spec.kind == "k"]
    assert k.present.all() and (k.norm == 0).all()


def test_gqa_heads_counted_as_kv_heads():
    hf = tiny_hf_model("qwen2", n_heads=6, n_kv_heads=2)
    spec = interp.bias_spec(interp.load_model(hf, device="cpu"))
    assert set(spec[spec.kind == "k"].n_heads) == {2}
    assert set(spec[spec.kind == "q"].n_heads) == {6}


def test_run_with_hooks_patches_the_forward():
    hf = tiny_hf_model("vit")
    model = interp.load_model(hf, device="cpu")
    x = tiny_inputs("vit")
    with torch.no_grad():
        base = model(x)
        patched = model.run_with_hooks(
            x, fwd_hooks=[("blocks.0.attn.hook_v", lambda t, hook: torch.zeros_like(t))]
        )
        again = model(pixel_values=x)
    assert (patched - base).abs().max() > 1e-3  # the hook reached HF's computation
    assert torch.equal(again, base)  # and was removed afterwards


def test_bert_encoder_without_head_is_wrapped():
    hf = tiny_hf_model("bert").bert
    model = interp.load_model(hf, device="cpu")
    ids = tiny_inputs("bert")
    with torch.no_grad():
        _, cache = model.run_with_cache(ids)
        ref = hf(ids).last_hidden_state
    last = cache[f"blocks.{model.interp.n_layers - 1}.hook_out"]
    assert (last - ref).abs().max() <= 1e-5
    assert model.interp.random_head


def test_local_folder_round_trip(tmp_path):
    hf = tiny_hf_model("gpt2")
    hf.save_pretrained(tmp_path)
    model = interp.load_model(str(tmp_path), device="cpu")
    ids = tiny_inputs("gpt2")
    assert (model(ids) - hf_reference(hf, ids)).abs().max() <= 1e-4


def test_unknown_source():
    with pytest.raises(UnknownSourceError, match="unknown model source 'no-such-model'"):
        interp.load_model("no-such-model")
    with pytest.raises(UnknownSourceError, match="source must be"):
        interp.load_model(42)


def test_unsupported_architecture():
    hf = tf.GPTJForCausalLM(tf.GPTJConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=50, rotary_dim=4))
    with pytest.raises(UnsupportedModelError, match="unsupported architecture GPTJForCausalLM"):
        interp.load_model(hf)


def test_hub_id_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(OfflineError, match="offline.*minilm-l6"):
        interp.load_model("openai-community/gpt2")
    assert time.monotonic() - start < 3.0


def test_vit_given_token_ids():
    model = interp.load_model(tiny_hf_model("vit"), device="cpu")
    with pytest.raises(InputError, match="vision model.*token ids"):
        model(torch.randint(0, 10, (2, 7)))
    with pytest.raises(InputError, match=r"\[batch, 3, H, W\]"):
        model(torch.randn(2, 1, 32, 32))


def test_lm_given_pixels():
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    with pytest.raises(InputError, match="integer token ids"):
        model(torch.randn(2, 3, 32, 32))
    with pytest.raises(InputError, match="exceeds the model's context of 64"):
        model(torch.zeros(1, 65, dtype=torch.long))
