"""The exact sweep's next-token metrics from final hidden states, a chunk of positions at a time
(``interp.ablation.logits``), equal the full-logits formulas (``metrics.metric_items``, ``kl_from_intact``)."""

import pytest
import torch

import interp
import interp.ablation.logits as logits
from interp.ablation import metrics
from interp.data import Batch
from interp.hooks import block_hook
from interp.models import tiny_hf_model, tiny_inputs
from interp.models.loading import clone_model


def _hidden_and_out(model, batch):
    kept = {}
    with torch.no_grad():
        out, _ = metrics.run_forward(model, batch, [(block_hook(model.interp.n_layers - 1, "hook_out"),
                                                     lambda t, hook: kept.update(h=t))], False)
    return kept["h"], out


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
    assert intact.log_p.shape[0] == int(mask.sum())  # only the real positions
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
