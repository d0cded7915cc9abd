"""interp.analysis.scores, ``bias_invariances``: its numbers equal full forwards recomputed by hand (no prefix
replay, no capture loop), over every batch it reads, in one pass of ``stream_batches``."""

import torch

import interp
import interp.capture as capture
from interp.models import tiny_hf_model, tiny_inputs
from interp.models.loading import clone_model
from interp.patching import bias_patch_hooks


def _by_hand(model, batches, layer):
    """(max |pattern(b_k removed) - pattern| over attended pairs, max |output(b_v folded) - output|), float64,
    each from a plain forward of the whole model."""
    m = clone_model(model, dtype=torch.float64)
    heads = range(m.interp.n_kv_heads)
    name = f"blocks.{layer}.attn.hook_pattern"
    k_diff = v_diff = 0.0
    with torch.no_grad():
        for ids, mask in batches:
            out, cache = m.run_with_cache(ids, attention_mask=mask)
            kept = {}
            m.run_with_hooks(ids, attention_mask=mask, fwd_hooks=bias_patch_hooks(m, [(layer, h, "k") for h in heads], "zero")
                             + [(name, lambda t, hook: kept.update(p=t.clone()))])
            folded = m.run_with_hooks(ids, attention_mask=mask,
                                      fwd_hooks=bias_patch_hooks(m, [(layer, h, "v") for h in heads], "fold"))
            n = ids.shape[1]
            allowed = mask.bool()[:, None, None, :] & mask.bool()[:, None, :, None] & torch.ones(n, n).tril().bool()
            k_diff = max(k_diff, float((kept["p"] - cache[name]).abs().masked_fill(~allowed, 0).max()))
            v_diff = max(v_diff, float((folded - out).abs().max()))
    return k_diff, v_diff


def test_bias_invariances_equal_full_forwards_by_hand_over_every_batch():
    model = interp.load_model(tiny_hf_model("gpt2", n_layers=2, n_heads=2), device="cpu")
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    batches = [(tiny_inputs("gpt2", seed=s), mask) for s in range(3)]
    data = [{"input_ids": ids, "attention_mask": m} for ids, m in batches]
    inv = interp.bias_invariances(model, data, max_batches=None, progress=False)
    assert set(inv.n_batches) == {3}
    for layer in range(2):
        k_diff, v_diff = _by_hand(model, batches, layer)
        rows = inv[inv.layer == layer].set_index("check").max_abs_diff
        assert rows["k_bias_pattern"] == k_diff and rows["v_bias_fold"] == v_diff, (layer, rows, k_diff, v_diff)


def test_bias_invariances_read_each_batch_once_through_the_one_loop(monkeypatch):
    model = interp.load_model(tiny_hf_model("vit", n_layers=2, n_heads=2), device="cpu")
    passes, real = [], capture.stream_batches

    def counted(*args, **kwargs):
        passes.append(kwargs["desc"])
        return real(*args, **kwargs)

    monkeypatch.setattr("interp.analysis.scores.stream_batches", counted)
    data = [tiny_inputs("vit", seed=s) for s in range(2)]
    inv = interp.bias_invariances(model, data, max_batches=2, progress=False)
    assert passes == ["bias invariances"] and set(inv.n_batches) == {2}
    assert set(inv.softmax_dtype) == {"float32"}  # HF's ViT softmaxes in float32 even in a float64 model
    assert (inv[inv.check == "k_bias_pattern"].max_abs_diff < 1e-6).all()  # learned positions: b_k is inert
    assert (inv[inv.check == "v_bias_fold"].max_abs_diff < 1e-6).all()  # the float32 softmax again
