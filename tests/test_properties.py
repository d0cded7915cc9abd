"""Property tests over random small configurations of every supported family (hypothesis)."""

import torch
from transformers import PreTrainedModel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import interp
from interp.record.patching import bias_patch_hooks
from interp.analysis.scores import _key_mask, score_terms
from interp.data import Batch
from interp.models import TINY_FAMILIES, tiny_hf_model
from interp.models.loading import clone_model
from interp.record.recording import record_qkv

VISION = {f.name for f in interp.list_families(modality="vision")}
CAUSAL = {f.name for f in interp.list_families(attention="causal")}
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@st.composite
def configs(draw, families=TINY_FAMILIES):
    family = draw(st.sampled_from(families))
    n_heads = draw(st.sampled_from([2, 4, 6]))
    n_kv = draw(st.sampled_from([h for h in (1, 2, n_heads) if n_heads % h == 0]))
    d_head = draw(st.sampled_from([4, 8]))
    n_layers = draw(st.integers(1, 3))
    batch = draw(st.integers(1, 3))
    pos = draw(st.integers(2, 12))
    seed = draw(st.integers(0, 10_000))
    pad = draw(st.lists(st.integers(0, max(0, pos - 1)), min_size=batch, max_size=batch))
    return dict(family=family, n_heads=n_heads, n_kv=n_kv, d_head=d_head, n_layers=n_layers,
                batch=batch, pos=pos, seed=seed, pad=pad)


def build(cfg, dtype=torch.float32):
    hf = tiny_hf_model(cfg["family"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"], d_head=cfg["d_head"],
                       n_kv_heads=cfg["n_kv"], seed=cfg["seed"]).to(dtype)
    g = torch.Generator().manual_seed(cfg["seed"])
    if cfg["family"] in VISION:
        x = torch.randn(cfg["batch"], 3, 32, 32, generator=g, dtype=dtype)
        return hf, Batch(x)
    ids = torch.randint(0, 97, (cfg["batch"], cfg["pos"]), generator=g)
    mask = torch.ones_like(ids)
    for row, p in enumerate(cfg["pad"]):
        if p and cfg["family"] not in CAUSAL:
            mask[row, cfg["pos"] - p:] = 0  # right padding (encoders)
    mask[:, 0] = 1
    return hf, Batch(ids, mask)


def run(model, batch, **kw):
    kwargs = {} if batch.attention_mask is None else {"attention_mask": batch.attention_mask}
    return model.run_with_hooks(batch.inputs, **kwargs, **kw) if "fwd_hooks" in kw else model(batch.inputs, **kwargs)


@SETTINGS
@given(configs())
def test_load_model_equals_hf(cfg):
    hf, batch = build(cfg)
    with torch.no_grad():
        if cfg["family"] in VISION:
            o = hf(pixel_values=batch.inputs) if isinstance(hf, PreTrainedModel) else hf(batch.inputs)
        else:
            o = hf(batch.inputs, attention_mask=batch.attention_mask)
        ref = o if isinstance(o, torch.Tensor) else o.logits if hasattr(o, "logits") else o.last_hidden_state
        out = run(interp.load_model(hf, device="cpu"), batch)
    assert (out - ref).abs().max() <= 1e-4


@SETTINGS
@given(configs())
def test_statistics_equal_brute_force(cfg):
    hf, batch = build(cfg, torch.float64)
    model = interp.load_model(hf, device="cpu")
    stats = record_qkv(model, [batch], progress=False)
    kw = {} if batch.attention_mask is None else {"attention_mask": batch.attention_mask}
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.inputs, **kw)
    for layer in range(cfg["n_layers"]):
        for kind in "qkv":
            a = cache[f"blocks.{layer}.attn.hook_{kind}"]
            a = a[batch.attention_mask.bool()] if batch.attention_mask is not None else a.flatten(0, 1)
            mean = a.mean(0)
            torch.testing.assert_close(stats.mean(layer, kind), mean, rtol=1e-6, atol=1e-10)
            cov = torch.einsum("nhd,nhe->hde", a - mean, a - mean) / a.shape[0]
            torch.testing.assert_close(stats.cov(layer, kind), cov, rtol=1e-6, atol=1e-10)


@SETTINGS
@given(configs([f.name for f in interp.list_families(score_status="exact")]))
def test_four_terms_reproduce_the_pattern(cfg):
    hf, batch = build(cfg, torch.float64)
    model = interp.load_model(hf, device="cpu")
    kw = {} if batch.attention_mask is None else {"attention_mask": batch.attention_mask}
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.inputs, **kw)
    for layer in range(cfg["n_layers"]):
        s = sum(score_terms(model, cache, layer).values())
        allowed = _key_mask(model, batch, s.shape[-1], s.device)
        p = s.masked_fill(~allowed, float("-inf")).softmax(-1)
        ref = cache[f"blocks.{layer}.attn.hook_pattern"]
        rows = allowed.any(-1, keepdim=True).expand_as(p)
        assert (p - ref)[rows].abs().max() <= 1e-5


@SETTINGS
@given(configs())
def test_k_invariance_v_fold_and_ablate_all(cfg):
    hf, batch = build(cfg, torch.float64)
    model = interp.load_model(hf, device="cpu")
    inv = interp.bias_invariances(model, [batch], float64=False, progress=False)
    k = inv[inv.check == "k_bias_pattern"].max_abs_diff.max()
    if interp.models.get_family(cfg["family"]).k_bias_inert:
        assert k <= 1e-6
    assert inv[inv.check == "v_bias_fold"].max_abs_diff.max() <= 1e-6
    info = model.interp
    targets = [(l, h, kind) for l in range(info.n_layers) for kind in "qkv"
               for h in range(info.n_heads if kind == "q" else info.n_kv_heads)]
    with torch.no_grad():
        patched = run(model, batch, fwd_hooks=bias_patch_hooks(model, targets, "zero"))
        zeroed = clone_model(model)
        for mod in zeroed.hf_model.modules():
            for name in ("q_proj", "k_proj", "v_proj", "query", "key", "value", "c_attn", "query_key_value"):
                lin = getattr(mod, name, None)
                lin = getattr(lin, "original_component", lin)
                if getattr(lin, "bias", None) is not None:
                    lin.bias.zero_()
        for l in range(info.n_layers):  # the bridge's own split q/k/v copies (GPT-2, NeoX)
            for kind in "qkv":
                lin = getattr(zeroed.blocks[l].attn, kind).original_component
                if getattr(lin, "bias", None) is not None:
                    lin.bias.zero_()
        assert (patched - run(zeroed, batch)).abs().max() <= 1e-6
