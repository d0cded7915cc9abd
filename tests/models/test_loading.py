"""load_model: the hooked forward is HF's forward, and the biases are HF's own."""

import time

import pytest
import torch
import torch.nn.functional as F
import transformers as tf
from einops import rearrange

import interp
from interp.errors import InputError, OfflineError, UnknownSourceError, UnsupportedModelError
from interp.models import TINY_FAMILIES, tiny_hf_model, tiny_inputs

VISION = {f.name for f in interp.list_families(modality="vision")}


def hf_reference(hf, x):
    """The unwrapped model's own output: logits, last hidden state, or a timm / open_clip tensor."""
    with torch.no_grad():
        out = hf(pixel_values=x) if x.is_floating_point() and isinstance(hf, tf.PreTrainedModel) else hf(x)
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def fused_projection(attn, x):
    """(x W_qkv + b_qkv, b_qkv or None) of a fused projection, computed as its owner computes it."""
    if hasattr(attn, "in_proj_weight"):  # nn.MultiheadAttention (open_clip)
        return F.linear(x, attn.in_proj_weight, attn.in_proj_bias), attn.in_proj_bias
    if hasattr(attn, "qkv") and getattr(attn, "q_bias", None) is not None:  # timm EVA / BEiT
        full = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))  # k_bias: a zero buffer, not a parameter
        return F.linear(x, attn.qkv.weight, full), full
    fused = next(getattr(attn, n) for n in ("c_attn", "query_key_value", "qkv_proj", "qkv") if hasattr(attn, n))
    return fused(x), fused.bias


def absent_biases(attn):
    """Kinds whose bias is a buffer or missing in a fused module (EVA / BEiT's k)."""
    k_bias = getattr(attn, "k_bias", None)
    return {"k"} if k_bias is not None and not isinstance(k_bias, torch.nn.Parameter) else set()


# HF attention classes whose fused projection interleaves q, k, v per head: "(h three d)"
INTERLEAVED = {"GPTNeoXAttention", "BloomAttention", "FalconAttention"}


def hf_qkv(attn, x, n_heads, n_kv):
    """Ground truth from the HF attention module's own weights: q, k, v [b, p, h, d] and biases."""
    inner = getattr(attn, "self", attn)  # BERT and RoBERTa keep q, k, v one level down
    names = next((n for n in (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"))
                  if getattr(inner, n[0], None) is not None), None)
    heads = dict(q=n_heads, k=n_kv, v=n_kv)
    if names is not None:
        lins = dict(zip("qkv", (getattr(inner, n) for n in names)))
        outs = {kind: lin(x) for kind, lin in lins.items()}
        biases = {kind: lin.bias for kind, lin in lins.items()}
    else:
        y, b = fused_projection(attn, x)
        if type(attn).__name__ in INTERLEAVED and n_kv == n_heads:
            parts = rearrange(y, "b p (h three d) -> three b p (h d)", three=3, h=n_heads)
            bias_parts = None if b is None else rearrange(b, "(h three d) -> three (h d)", three=3, h=n_heads)
        else:  # [q | k | v], k and v with n_kv heads
            d = y.shape[-1] // (n_heads + 2 * n_kv)
            sizes = [n_heads * d, n_kv * d, n_kv * d]
            parts = y.split(sizes, dim=-1)
            bias_parts = None if b is None else b.split(sizes)
        outs = dict(zip("qkv", parts))
        biases = dict(zip("qkv", (None, None, None) if bias_parts is None else bias_parts))
        biases.update({kind: None for kind in absent_biases(attn)})
    acts = {kind: rearrange(t, "b p (h d) -> b p h d", h=heads[kind]) for kind, t in outs.items()}
    return acts, biases


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
    hf_modules = set(hf.modules())
    for layer in range(info.n_layers):
        attn = model.blocks[layer].attn.original_component  # HF's own attention module, unwrapped
        assert attn in hf_modules
        xin = cache[f"blocks.{layer}.attn.q.hook_in"]
        with torch.no_grad():
            acts, biases = hf_qkv(attn, xin, info.n_heads, info.n_kv_heads)
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


def test_unsupported_architecture_names_the_nearest_families():
    hf = tf.ElectraForMaskedLM(tf.ElectraConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                intermediate_size=32, embedding_size=16, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match=r"unsupported architecture ElectraForMaskedLM.*Nearest supported: .*"
                                                    r"BertForMaskedLM"):
        interp.load_model(hf)


def test_a_bridged_but_undescribed_family_loads_with_one_warning_naming_what_was_inferred():
    """GPT-Neo: TransformerLens bridges it, the registry does not describe it."""
    import warnings

    hf = tf.GPTNeoForCausalLM(tf.GPTNeoConfig(
        hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], vocab_size=97,
        max_position_embeddings=64, attn_implementation="eager")).eval()
    ids = tiny_inputs("gpt2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load_model(hf, device="cpu")
    said = [str(w.message) for w in caught if "not in interp's family registry" in str(w.message)]
    assert len(said) == 1 and "positions=learned (from the embedding `transformer.wpe`)" in said[0]
    info = model.interp
    assert info.family == "inferred:gpt_neo" and not info.spec.k_bias_inert and info.positions == "learned"
    assert any("family inferred" in n for n in info.notes)
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() <= 1e-5
    spec = interp.bias_spec(model)
    assert not spec[spec.kind.isin(["q", "k", "v"])].present.any() and spec[spec.kind == "o"].present.all()
    with pytest.raises(UnsupportedModelError, match="does not describe this architecture"):
        interp.score_decomposition(model, [ids], progress=False)
    stats = interp.record_qkv(model, [ids], progress=False)  # what needs no identity still runs
    assert stats.count(0) == ids.numel()


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


def test_sinusoidal_positions_are_inferred_as_absolute():
    """XGLM (bridged by TransformerLens, not in the registry) adds sinusoidal positions to its input."""
    import warnings

    hf = tf.XGLMForCausalLM(tf.XGLMConfig(d_model=32, num_layers=1, attention_heads=4, ffn_dim=64,
                                          max_position_embeddings=64, vocab_size=97))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interp.load_model(hf, device="cpu")
    assert model.interp.positions == "learned"
    assert any("absolute position module `model.embed_positions`" in str(w.message) for w in caught)
