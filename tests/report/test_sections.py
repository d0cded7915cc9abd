"""interp.report.sections: the pipeline's data (``DataBatches``) is read lazily and never held whole; every pass
gives the same batches, capped at ``max_batches`` (the sample every step reads); ``Context.first`` takes it, or
its first batches."""

import pytest
import torch

import interp
from interp.data import CheckedBatch, DataSource
from interp.models import tiny_hf_model
from interp.models.tiny import VOCAB
from interp.report.pipeline import make_context
from interp.report.sections import Context, DataBatches


@pytest.fixture(scope="module")
def lm():
    return interp.load_model(tiny_hf_model("gpt2", n_layers=1, n_heads=2), device="cpu")


def _ids(seed):
    return torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(seed))


def counted(n, pulled):
    """A one-shot generator of ``n`` batches that notes each batch read."""
    for seed in range(n):
        pulled.append(seed)
        yield _ids(seed)


def test_a_generator_is_read_only_as_far_as_the_passes_go_and_read_once(lm):
    pulled = []
    ctx = Context(lm, "generated", DataBatches(lm, counted(10, pulled), max_batches=6))
    assert pulled == []  # nothing read when the context is made
    ctx.step = "s"
    first = ctx.first(2)  # a step that reads fewer than the sample (the invariances) reads its first batches
    assert ctx.analysed["s"]["batches"] == 2 and pulled == [0, 1]  # counted as chosen: 2 batches read
    assert [b.inputs.tolist() for b in first] == [_ids(0).tolist(), _ids(1).tolist()]
    assert pulled == [0, 1]  # a second pass over the same batches reads nothing new
    assert [b.inputs.tolist() for b in ctx.batches] == [_ids(s).tolist() for s in range(6)]
    assert pulled == list(range(6))  # capped at max_batches: the 7th batch is never read
    assert len(ctx.batches) == 6 and all(isinstance(b, CheckedBatch) for b in ctx.batches)


def test_make_context_streams_a_source_afresh_on_each_pass_reading_no_further_than_asked(lm, monkeypatch):
    corpus = torch.randint(0, VOCAB, (9, 5), generator=torch.Generator().manual_seed(3)).numpy()  # 9 sequences
    read, real_iter = [], DataSource.__iter__

    def counting(self):
        for batch in real_iter(self):
            read.append(batch)
            yield batch

    monkeypatch.setattr(DataSource, "__iter__", counting)
    ctx = make_context(lm, corpus, data_options=dict(batch_size=2), max_batches=3)
    assert read == [] and isinstance(ctx.batches, DataBatches) and isinstance(ctx.batches.source, DataSource)
    ctx.step = "one"
    assert len(list(ctx.first(1))) == 1 and len(read) == 2  # one batch to count, one to read: never the rest
    once, again = [b.inputs.tolist() for b in ctx.batches], [b.inputs.tolist() for b in ctx.batches]
    assert once == again and len(once) == 3 and len(read) == 2 + 3 + 3
    assert ctx.batches._kept == []  # nothing held between passes
    monkeypatch.setattr(DataSource, "__iter__", real_iter)
    assert once == [corpus[i:i + 2].tolist() for i in (0, 2, 4)]


def test_first_caps_a_list_and_a_lazy_source_alike(lm):
    listed = [_ids(s) for s in range(4)]
    lazy = Context(lm, "ids", DataBatches(lm, listed), quick=True)
    plain = Context(lm, "ids", list(interp.iter_batches(lm, listed)), quick=True)
    for ctx in (lazy, plain):
        ctx.step = "x"
        assert [b.inputs.tolist() for b in ctx.first(1)] == [_ids(0).tolist()]
        assert ctx.analysed["x"] == dict(items=2, batches=1)
        ctx.step = "y"  # the sample: every batch read
        assert [b.inputs.tolist() for b in ctx.first()] == [_ids(s).tolist() for s in range(4)]
        assert ctx.analysed["y"] == dict(items=8, batches=4)
    assert lazy.data_label() == plain.data_label() == "ids, 40 tokens (8 sequences)"


def test_quick_reads_one_batch_whatever_max_batches_asks(lm):
    """Quick mode's sample is the first batch (of at most 8 items): every step reads exactly it."""
    corpus = torch.randint(0, VOCAB, (20, 5), generator=torch.Generator().manual_seed(4)).numpy()
    quick = make_context(lm, corpus, quick=True, data_options=dict(batch_size=3), max_batches=5)
    assert [b.inputs.tolist() for b in quick.batches] == [corpus[:3].tolist()]
    full = make_context(lm, corpus, data_options=dict(batch_size=3), max_batches=5)
    assert [b.inputs.tolist() for b in full.batches] == [corpus[i:i + 3].tolist() for i in range(0, 15, 3)]
