"""interp.analysis.scores: ``bias_invariances``' numbers equal full forwards recomputed by hand (no prefix replay,
no capture loop), over every batch it reads, in one pass of ``stream_batches``; ``score_decomposition``'s table
equals a brute force written row by row in numpy from the HF modules' own q and k (no hook, no interp helper)."""

import collections

import numpy as np
import pytest
import torch
from scipy.special import logsumexp

import interp
import interp.analysis.scores as scores
import interp.record.capture as capture
from interp.analysis.scores import TERMS
from interp.models import tiny_hf_model, tiny_inputs
from interp.models.loading import clone_model
from interp.record.patching import bias_patch_hooks


def _by_hand(model, batches, layer):
    """(max |pattern(b_k removed) - pattern| over attended pairs, max |output(b_v folded) - output|), float64,
    each from a plain forward of the whole model, one item at a time (as the check runs them: a float64 forward of
    one item holds a quarter of a batch of four's activations; batched, the same numbers differ in the last bit)."""
    m = clone_model(model, dtype=torch.float64)
    heads = range(m.interp.n_kv_heads)
    name = f"blocks.{layer}.attn.hook_pattern"
    k_diff = v_diff = 0.0
    items = [(ids[i:i + 1], mask[i:i + 1]) for ids, mask in batches for i in range(ids.shape[0])]
    with torch.no_grad():
        for ids, mask in items:
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


def test_the_invariance_progress_bar_counts_the_items_it_runs(capsys):
    model = interp.load_model(tiny_hf_model("vit", n_layers=1, n_heads=2), device="cpu")
    data = [tiny_inputs("vit", batch=3, seed=s) for s in range(2)]
    inv = interp.bias_invariances(model, data, max_batches=2, progress=True)
    assert set(inv.n_batches) == {2}
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert any(line.startswith("bias invariances: ") and " 6/" not in line and "6item " in line for line in bar), bar


# ----- score_decomposition against a brute force, row by row --------------------------------------------------


def _hf_q_k(hf, ids, mask, layer):
    """(q [b, p, H d], k [b, p, KV d], b_q, b_k) of ``layer``: the outputs of the HF model's own q and k
    projections (BERT's query / key, Llama's and Qwen2's q_proj / k_proj), caught by plain torch forward hooks
    in one HF forward; a missing bias is zeros."""
    if hasattr(hf, "bert"):
        attn = hf.bert.encoder.layer[layer].attention.self
        wq, wk = attn.query, attn.key
    else:
        wq, wk = hf.model.layers[layer].self_attn.q_proj, hf.model.layers[layer].self_attn.k_proj
    out = {}
    handles = [lin.register_forward_hook(lambda mod, args, y, key=key: out.setdefault(key, y))
               for key, lin in (("q", wq), ("k", wk))]
    try:
        hf(input_ids=ids, attention_mask=mask)
    finally:
        for handle in handles:
            handle.remove()
    bias = lambda lin: lin.bias if lin.bias is not None else torch.zeros(lin.out_features, dtype=out["q"].dtype)  # noqa: E731
    return out["q"], out["k"], bias(wq), bias(wk)


def _rotated(hf, x, n_pos):
    """HF's rotary embedding written out: x cos + rotate_half(x) sin, cos/sin from the model's rotary module at
    positions 0..n-1; x [b, p, h, d]."""
    cos, sin = hf.model.rotary_emb(x[:, :, 0], torch.arange(n_pos)[None])
    half = x.shape[-1] // 2
    return x * cos[:, :, None] + torch.cat((-x[..., half:], x[..., :half]), -1) * sin[:, :, None]


def _brute_force_sums(model, hf, ids, mask, layer, sums):
    """Add, row by row in numpy, every valid query row's Var(t), Cov(t, s), Var(s) over its allowed keys (padding,
    causal, the layer's sliding window), and KL(softmax s || softmax(s - key_prior)), per head, to ``sums``."""
    info = model.interp
    n_heads, n_kv, (b, p) = info.n_heads, info.n_kv_heads, ids.shape
    with torch.no_grad():
        q, k, bq, bk = _hf_q_k(hf, ids, mask, layer)
        d = q.shape[-1] // n_heads
        parts = [(q - bq).view(b, p, n_heads, d), bq.view(n_heads, d).expand(b, p, -1, -1),
                 (k - bk).view(b, p, n_kv, d), bk.view(n_kv, d).expand(b, p, -1, -1)]
        if info.rotary:
            parts = [_rotated(hf, x, p) for x in parts]
    group = np.arange(n_heads) // (n_heads // n_kv)
    cq, bq, ck, bk = (x.detach().numpy() for x in parts[:2] + [parts[2][:, :, group], parts[3][:, :, group]])
    window = hf.config.sliding_window if getattr(hf.config, "layer_types", None) and \
        hf.config.layer_types[layer] == "sliding_attention" else None
    m = mask.bool().numpy()
    for item in range(b):
        for i in range(p):
            keys = [j for j in range(p) if m[item, i] and m[item, j] and (not info.causal or j <= i)
                    and (window is None or j > i - window)]
            if not keys:
                continue
            dot = lambda x, y: np.einsum("hd,jhd->hj", x[item, i], y[item, keys]) / np.sqrt(d)  # noqa: E731
            terms = {"content": dot(cq, ck), "query_const": dot(cq, bk), "key_prior": dot(bq, ck), "const": dot(bq, bk)}
            s = sum(terms.values())
            centred_s = s - s.mean(1, keepdims=True)
            for name, t in terms.items():
                sums[(layer, name, "var")] += t.var(1)
                sums[(layer, name, "cov")] += ((t - t.mean(1, keepdims=True)) * centred_s).mean(1)
            sums[(layer, "total", "var")] += s.var(1)
            logp = s - logsumexp(s, 1, keepdims=True)
            shifted = s - terms["key_prior"]
            sums[(layer, "kl", "")] += (np.exp(logp) * (logp - shifted + logsumexp(shifted, 1, keepdims=True))).sum(1)
            sums[("rows", layer)] += 1


def _assert_equals_brute_force(model, batches, layers, table):
    """Every number column of ``table`` (variance, share, total_variance, kl_without_key_prior) equals the brute
    force over ``batches`` (``_brute_force_sums``) to 1e-9 relative (1e-12 absolute: terms that are 0)."""
    hf = model.hf_model
    sums = collections.defaultdict(float)
    for ids, mask in batches:
        for layer in layers:
            _brute_force_sums(model, hf, ids, mask, layer, sums)
    for layer in layers:
        rows = table[table.layer == layer]
        n = sums[("rows", layer)]
        for name in TERMS:
            got = rows[rows.term == name].sort_values("head")
            close = dict(rtol=1e-9, atol=1e-12, err_msg=f"layer {layer} {name}")
            np.testing.assert_allclose(got.variance, sums[(layer, name, "var")] / n, **close)
            np.testing.assert_allclose(got.share, sums[(layer, name, "cov")] / sums[(layer, "total", "var")], **close)
            np.testing.assert_allclose(got.total_variance, sums[(layer, "total", "var")] / n, **close)
            np.testing.assert_allclose(got.kl_without_key_prior, sums[(layer, "kl", "")] / n, **close)


def _padded(ids, lengths):
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return ids, mask


@pytest.mark.parametrize("row_block", [3, 64])
@pytest.mark.parametrize("family", ["qwen2", "bert"])
def test_score_decomposition_equals_a_row_by_row_brute_force(family, row_block, monkeypatch):
    """Tiny float64 models with large biases: Qwen2 (rotary, 4 query heads on 2 kv heads, a 4-key sliding window
    on layers 1-2) and BERT (bidirectional, learned positions); right padding, two batches of different sizes;
    blocks of 3 query rows (several blocks per layer, each over its own key range) and of 64 (one block). HF's
    windowed Qwen2 layer gives NaN states at padded query positions (no key in their window), so layer 2's q and k
    are NaN there: the table stays finite and equal to the brute force (aa859e5's was NaN on every head)."""
    monkeypatch.setattr(scores, "ROW_BLOCK", row_block)
    config = dict(use_sliding_window=True, sliding_window=4, max_window_layers=1) if family == "qwen2" else None
    model = interp.load_model(tiny_hf_model(family, n_layers=3, bias_scale=2.0, config=config).double(), device="cpu")
    if family == "qwen2":
        assert model.interp.windows == (None, 4, 4) and model.interp.n_kv_heads == 2 and model.interp.rotary
    ids = tiny_inputs(family, batch=3, pos=12)
    batches = [_padded(ids, [12, 7, 10]), _padded(ids[:2, :9], [9, 5])]
    table = interp.score_decomposition(model, [{"input_ids": i, "attention_mask": m} for i, m in batches],
                                       n_boot=0, progress=False)
    _assert_equals_brute_force(model, batches, range(3), table)


@pytest.mark.slow
@pytest.mark.parametrize("name,layers", [("minilm-l6", None), ("smollm2-135m", [0, 1, 29])])
def test_score_decomposition_of_zoo_models_equals_the_brute_force(name, layers):
    """The shipped MiniLM-L6 (BERT: q and k biases, bidirectional) and SmolLM2-135M (Llama: rotary, 9 query heads on
    3 kv heads, no biases; three of its layers), in float64, on right-padded token ids."""
    model = clone_model(interp.load_model(name, device="cpu"), dtype=torch.float64)
    ids = torch.randint(1000, 2000, (3, 14), generator=torch.Generator().manual_seed(0))
    batches = [_padded(ids, [14, 9, 11])]
    table = interp.score_decomposition(model, [{"input_ids": i, "attention_mask": m} for i, m in batches],
                                       layers=layers, n_boot=0, progress=False)
    _assert_equals_brute_force(model, batches, layers or range(model.interp.n_layers), table)


# ----- bias_invariances leaves the model as it found it -------------------------------------------------------


def _model_state(model):
    """Per module of the bridge's and the HF model's trees: its parameter and buffer objects with their dtypes and
    values, every other tensor it holds as an attribute (the same object), its hooks, its training flag and
    whether it has a ``forward`` of its own."""
    state = {}
    for m in {id(m): m for tree in (model, model.hf_model) for m in tree.modules()}.values():
        for table in ("_parameters", "_buffers"):
            for name, t in getattr(m, table).items():
                state[id(m), table, name] = None if t is None else (id(t), t.dtype, t.detach().clone())
        for name, value in vars(m).items():
            if isinstance(value, torch.Tensor) or name == "_pattern":
                state[id(m), "attribute", name] = id(value)
        state[id(m), "hooks"] = (len(m._forward_hooks), len(m._forward_pre_hooks))
        state[id(m), "training"] = m.training
        state[id(m), "own forward"] = "forward" in vars(m)
    return state


def _changed(before, after):
    out = [key for key in before.keys() ^ after.keys()]
    for key in before.keys() & after.keys():
        a, b = before[key], after[key]
        if isinstance(a, tuple) and len(a) == 3 and isinstance(a[2], torch.Tensor):
            if a[:2] != b[:2] or not torch.equal(a[2], b[2]):
                out.append(key)
        elif a != b:
            out.append(key)
    return out


@pytest.mark.parametrize("family", ["gpt2", "timm-vit", "open-clip-vit"])
def test_bias_invariances_leave_every_module_as_it_found_it_after_a_return_or_an_interrupt(family):
    """The float64 check swaps float64 copies in and out of the user's model (no copy of the model any more): on
    return, and after a KeyboardInterrupt raised inside a block at each of its forwards, every parameter and
    buffer is the same object with the same dtype and values, no hook or ``forward`` is left, every module's
    training flag is as it was (timm's bridged block list too), and no tensor attribute points at a tensor the
    check made (TransformerLens' fused-qkv attention keeps the last pattern it computed: a float64 one per layer
    would stay on the model)."""
    model = interp.load_model(tiny_hf_model(family), device="cpu")
    data = [tiny_inputs(family, seed=s) for s in range(2)]
    with torch.no_grad():
        model(data[0])  # the bridge wires its own capture hooks at the first forward: part of the model after
    before = _model_state(model)
    interp.bias_invariances(model, data, max_batches=2, progress=False)
    assert _changed(before, _model_state(model)) == []
    for n in (1, 3, 6):  # the intact forward, a check's patched forward, the next batch's
        calls = []

        def interrupt(module, args, n=n):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt

        handle = model.blocks[1].register_forward_pre_hook(interrupt)
        with pytest.raises(KeyboardInterrupt):
            interp.bias_invariances(model, data, max_batches=2, progress=False)
        handle.remove()
        assert _changed(before, _model_state(model)) == [], n
