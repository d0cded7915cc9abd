"""The exact sweep's next-token metrics from final hidden states, a chunk of positions at a time
(``interp.ablation.logits``), equal the full-logits formulas (``metrics.metric_items``, ``kl_from_intact``)."""

import pytest
import torch

import interp
import interp.ablation.logits as logits
from interp.ablation import metrics
from interp.data import Batch
from interp.record.hooks import block_hook
from interp.models import tiny_hf_model, tiny_inputs
from interp.models.loading import clone_model


def _hidden_and_out(model, batch):
    kept = {}
    with torch.no_grad():
        out, _ = metrics.run_forward(model, batch, [(block_hook(model.interp.n_layers - 1, "hook_out"),
                                                     lambda t, hook: kept.update(h=t))], False)
    return kept["h"], out


def _padded_float64(family):
    """A tiny float64 model of ``family``, a batch of 3 with right padding in two items, its final hidden states,
    logits and linear unembedding."""
    model = clone_model(interp.load_model(tiny_hf_model(family, n_layers=2), device="cpu"), torch.float64)
    ids = tiny_inputs(family, batch=3, pos=10, seed=0)
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 4:] = 0
    batch = Batch(ids, mask)
    hidden, out = _hidden_and_out(model, batch)
    return model, batch, mask, hidden, out, logits.linear_unembedding(model, hidden, out)


@pytest.mark.parametrize("chunk_bytes", [4 * 7 * 512, logits.CHUNK_BYTES])  # 7 positions a chunk, or one chunk
def test_chunked_nll_and_kl_equal_the_full_logits_formulas(monkeypatch, chunk_bytes):
    monkeypatch.setattr(logits, "CHUNK_BYTES", chunk_bytes)
    model = clone_model(interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu"), torch.float64)
    ids = tiny_inputs("qwen2", batch=3, pos=10, seed=0)
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0  # right padding
    mask[2, 4:] = 0
    batch = Batch(ids, mask)
    hidden, out = _hidden_and_out(model, batch)
    assert logits.head_matches(model, hidden, out)
    intact = logits.intact_logits(model, hidden, batch)
    assert intact.logits.shape[0] == int(mask.sum())  # only the real positions
    other = Batch(tiny_inputs("qwen2", batch=3, pos=10, seed=1), mask)  # another run's hidden states: a "patch"
    h2, out2 = _hidden_and_out(model, other)
    sums, kl = logits.patched_items(model, h2, intact, kl=True)
    want_sums, want_counts = metrics.metric_items("next_token_ce", out2, None, {}, batch)
    torch.testing.assert_close(sums, want_sums, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(intact.counts, want_counts.to(intact.counts.dtype))
    torch.testing.assert_close(kl, metrics.kl_from_intact(model, out, out2, batch), rtol=1e-12, atol=1e-12)
    assert kl > 0


def test_a_head_that_does_more_than_norm_and_unembedding_keeps_the_full_logits():
    """Gemma 2 soft-caps its logits after the unembedding: the split head does not reproduce them, so the sweep
    keeps the full output (and its numbers)."""
    model = clone_model(interp.load_model(tiny_hf_model("gemma2", n_layers=2), device="cpu"), torch.float64)
    model.hf_model.config.final_logit_softcapping = 0.5  # strong enough to show at tiny logits
    batch = Batch(tiny_inputs("gemma2", batch=2, pos=8, seed=0))
    hidden, out = _hidden_and_out(model, batch)
    assert not logits.head_matches(model, hidden, out)
    assert logits.linear_unembedding(model, hidden, out) is None  # nor does the tiled unembedding claim them


def test_every_logit_of_a_row_lowered_past_float64_exp_range_falls_back_to_the_log_softmax_path():
    """exp(z - lse_p) underflows to 0 at every entry of a row (each patched logit over 745 below the intact
    logsumexp): S = 0 is finite, but log S is -inf, so the stack's NLL and KL were -inf or NaN; they now come
    from ``patched_items``, as past the top of exp's range. The intact run is taken with the final norm's gain
    1e4-fold (logits in the thousands), the patch is the model as it is."""
    model = interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu")
    batch = Batch(tiny_inputs("qwen2", batch=2, pos=6, seed=0))
    hidden, out = _hidden_and_out(model, batch)
    unembedding = logits.linear_unembedding(model, hidden, out)
    norm = next(p for name, p in model.ln_final.named_parameters() if name.endswith("weight"))
    with torch.no_grad():
        norm.mul_(1e4)
        intact = logits.intact_logits(model, hidden, batch)
        norm.div_(1e4)
        z = logits.head(model, hidden.reshape(-1, hidden.shape[-1]))[intact.rows] - intact.lse[:, None]
    assert float(z.max(-1).values.max()) < -746  # the premise: S underflows
    (sums, kl), = logits.patched_stack(model, unembedding, hidden, intact, 1)
    want_sums, want_kl = logits.patched_items(model, hidden, intact, kl=True)
    assert torch.isfinite(sums).all() and torch.isfinite(kl) and float(kl) > 1  # p near one-hot, q spread
    torch.testing.assert_close(sums, want_sums)
    torch.testing.assert_close(kl, want_kl)


@pytest.mark.parametrize("tile_vocab", [7, logits.TILE_VOCAB])  # 7 vocabulary entries a tile, or one tile
@pytest.mark.parametrize("family", ["qwen2", "gpt2"])  # tied embedding; GPT-2's Conv1D-free lm_head too
def test_tiled_stack_equals_the_full_logits_formulas_per_variant(monkeypatch, tile_vocab, family):
    """Three variants stacked on the batch axis: each one's NLL sums and KL, from the vocabulary tiles and the
    online log-sum-exp, equal the full-logits formulas on that variant's own output (float64, 1e-12)."""
    monkeypatch.setattr(logits, "TILE_VOCAB", tile_vocab)
    model, batch, mask, hidden, out, unembedding = _padded_float64(family)
    assert unembedding is not None
    intact = logits.intact_logits(model, hidden, batch, unembedding)  # normed rows kept, logits recomputed
    assert intact.logits is None and intact.normed.shape == (len(intact.rows), hidden.shape[-1])
    torch.testing.assert_close(intact.z(), out.reshape(-1, out.shape[-1])[intact.rows].double(),
                               rtol=1e-12, atol=1e-12)
    held = logits.intact_logits(model, hidden, batch)  # the logits held: the same distribution's sums
    for name in ("lse", "total_p", "p_dot_log_p"):
        torch.testing.assert_close(getattr(intact, name), getattr(held, name), rtol=1e-12, atol=1e-12)
    patched = [_hidden_and_out(model, Batch(tiny_inputs(family, batch=3, pos=10, seed=s), mask)) for s in (1, 2, 3)]
    patched[1] = (hidden, out)  # a variant that changes nothing: KL 0
    stacked = torch.cat([h for h, _ in patched])
    got = logits.patched_stack(model, unembedding, stacked, intact, 3)
    for (sums, kl), (h, o) in zip(got, patched):
        want_sums, _ = metrics.metric_items("next_token_ce", o, None, {}, batch)
        torch.testing.assert_close(sums, want_sums, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kl.double(), metrics.kl_from_intact(model, out, o, batch).double(),
                                   rtol=1e-10, atol=1e-12)
    assert abs(float(got[1][1])) < 1e-12 and float(got[0][1]) > 0


@pytest.mark.slow
def test_tiled_metric_is_nearer_float64_than_the_float32_log_softmax_on_smollm2():
    """On the shipped SmolLM2 (float32, vocabulary 49,152), for hidden states perturbed at four scales, the tiled
    NLL and KL equal a float64 evaluation of the same float32 logits far more closely than the float32
    log-softmax path (``patched_items``), which is why the frozen SmolLM2 sweep was refrozen: its KL was off by
    ~1.6e-5 nats (negative at small patches), its NLL sums by ~3e-4."""
    from interp.data import builtin_batches
    model = interp.load_model("smollm2-135m")
    batch = builtin_batches(model, name="python-docs", batch_size=2, n=2, seq_len=20)[0]
    hidden, out = _hidden_and_out(model, batch)
    unembedding = logits.linear_unembedding(model, hidden, out)
    assert unembedding is not None
    intact = logits.intact_logits(model, hidden, batch)
    flat = lambda h: h.reshape(-1, h.shape[-1])[intact.rows]  # noqa: E731
    with torch.no_grad():
        log_p64 = logits.head(model, flat(hidden)).double().log_softmax(-1)
    g = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1e-2, 1e-1, 1.0):
        patched = hidden + scale * torch.randn(hidden.shape, generator=g)
        with torch.no_grad():
            log_q64 = logits.head(model, flat(patched)).double().log_softmax(-1)
            (sums, kl), = logits.patched_stack(model, unembedding, patched, intact, 1)
            old_sums, old_kl = logits.patched_items(model, patched, intact, kl=True)
        kl64 = float((log_p64.exp() * (log_p64 - log_q64)).sum(-1).mean())
        nll64 = torch.zeros(intact.n_items, dtype=torch.float64).index_add_(
            0, intact.item, -log_q64.gather(-1, intact.target[:, None])[:, 0] * intact.counted.double())
        assert abs(float(kl) - kl64) <= 1e-7 + 1e-3 * kl64, (scale, float(kl), kl64)
        assert float((sums - nll64).abs().max()) <= 1e-4, scale  # ~20 tokens an item
        assert abs(float(kl) - kl64) < abs(float(old_kl) - kl64)
        assert float((sums - nll64).abs().max()) < float((old_sums - nll64).abs().max())


def test_a_logit_raised_past_float64_exp_range_falls_back_to_the_log_softmax_path():
    """exp(z - lse_p) overflows float64 past 709: the stack's numbers then come from ``patched_items`` (finite,
    equal to the full-logits formulas), never inf or NaN."""
    model = interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu")
    batch = Batch(tiny_inputs("qwen2", batch=2, pos=6, seed=0))
    hidden, out = _hidden_and_out(model, batch)
    unembedding = logits.linear_unembedding(model, hidden, out)
    intact = logits.intact_logits(model, hidden, batch)
    norm = next(p for name, p in model.ln_final.named_parameters() if name.endswith("weight"))
    with torch.no_grad():
        norm.mul_(1e5)  # the "patch": every logit scaled 1e5-fold after the intact run was taken
        wild = hidden
        z = logits.head(model, wild.reshape(-1, wild.shape[-1]))[intact.rows] - intact.lse[:, None]
    assert float(z.max()) > 710  # the premise: some logit rises past exp's float64 range above lse_p
    (sums, kl), = logits.patched_stack(model, unembedding, wild, intact, 1)
    want_sums, want_kl = logits.patched_items(model, wild, intact, kl=True)
    assert torch.isfinite(sums).all() and torch.isfinite(kl)
    torch.testing.assert_close(sums, want_sums)
    torch.testing.assert_close(kl, want_kl)


@pytest.mark.parametrize("tile_vocab", [7, logits.TILE_VOCAB])  # 7 vocabulary entries a tile, or one tile
@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_tiled_nll_and_its_gradient_equal_the_full_head(monkeypatch, tile_vocab, family):
    """The one-pass estimates' metric from vocabulary tiles (``tiled_item_sums``): its per-item NLL sums and
    counts equal ``metric_items`` on the forward's own logits, and its gradient with respect to the final hidden
    states equals autograd's through the full head (norm, unembedding, log-softmax), float64, 1e-12; padded
    rows get no gradient."""
    monkeypatch.setattr(logits, "TILE_VOCAB", tile_vocab)
    model, batch, mask, hidden, out, unembedding = _padded_float64(family)
    weight = torch.randn(3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # a weighted sum
    h1 = hidden.detach().clone().requires_grad_(True)
    sums, counts = logits.tiled_item_sums(model, unembedding, h1, batch)
    (grad,) = torch.autograd.grad((sums * weight).sum(), h1)
    h2 = hidden.detach().clone().requires_grad_(True)
    want_sums, want_counts = metrics.metric_items("next_token_ce", logits.head(model, h2), None, {}, batch)
    (want_grad,) = torch.autograd.grad((want_sums * weight).sum(), h2)
    torch.testing.assert_close(sums, want_sums, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(counts, want_counts.double())
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    assert float(grad.abs().sum()) > 0 and float(grad[0, 7:].abs().max()) == 0


def test_several_stacks_through_the_vocabulary_at_once_equal_each_stack_alone():
    """``patched_stacks`` recomputes each tile's intact logits once for every waiting stack: each stack's numbers
    are bit for bit those of ``patched_stack`` on that stack alone (float32, the sweep's dtype)."""
    model = interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu")
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 6:] = 0
    batch = Batch(tiny_inputs("qwen2", batch=3, pos=10, seed=0), mask)
    hidden, out = _hidden_and_out(model, batch)
    unembedding = logits.linear_unembedding(model, hidden, out)
    intact = logits.intact_logits(model, hidden, batch, unembedding)
    g = torch.Generator().manual_seed(0)
    stacks = [(torch.cat([hidden + 0.1 * torch.randn(hidden.shape, generator=g) for _ in range(n)]), n)
              for n in (2, 1, 3)]
    together = logits.patched_stacks(model, unembedding, stacks, intact)
    for (stacked, n), got in zip(stacks, together):
        alone = logits.patched_stack(model, unembedding, stacked, intact, n)
        assert len(got) == len(alone) == n
        for (sums, kl), (want_sums, want_kl) in zip(got, alone):
            assert torch.equal(sums, want_sums) and torch.equal(kl, want_kl)
