"""interp.record.capture: every streaming pass runs its batches through the one capture loop, which checks each
batch on the host before its forward and hashes it into the data fingerprint."""

import pytest
import torch

import interp
import interp.record.capture as capture
from interp.data import Batch, CheckedBatch
from interp.errors import InputError
from interp.models import tiny_hf_model


@pytest.fixture(scope="module")
def models():
    lm = interp.load_model(tiny_hf_model("gpt2", n_layers=2, n_heads=4), device="cpu")
    vit = interp.load_model(tiny_hf_model("vit", n_layers=2), device="cpu")
    return lm, vit


def _ids(seed=0):
    return torch.randint(0, 90, (2, 6), generator=torch.Generator().manual_seed(seed))


PASSES = {
    "record_qkv": lambda m, d: interp.record_qkv(m, d, progress=False),
    "origin_shift intervals": lambda m, d: interp.origin_shift(m, interp.record_qkv(m, d, progress=False), data=d,
                                                              n_boot=10),
    "score_decomposition": lambda m, d: interp.score_decomposition(m, d, n_boot=10, progress=False),
    "frequency_profile": lambda m, d: interp.frequency_profile(m, d, progress=False),
    "frequency_shift_under_ablation": lambda m, d: interp.frequency_shift_under_ablation(m, d, progress=False),
    "sink_profile": lambda m, d: interp.sink_profile(m, d, progress=False),
    "implicit_value_bias": lambda m, d: interp.implicit_value_bias(m, d, progress=False),
    "high_norm_tokens": lambda m, d: interp.high_norm_tokens(m, d, progress=False),
}


@pytest.mark.parametrize("name", PASSES)
def test_every_forward_of_a_streaming_pass_goes_through_the_one_loop_on_a_checked_batch(models, monkeypatch, name):
    """Each forward the pass runs is one of ``stream_batches``' (``run_until_kept`` inside it), on a
    ``CheckedBatch`` that holds for the model (only ``check_batch`` makes one, after ``Batch.check``, which ran
    before the first forward): a pass with a loop of its own (record, the intervals, the scores and the
    frequency passes had one each) runs forwards the loop never saw."""
    lm, _ = models
    events = []
    real_check, real_run, real_forward = Batch.check, capture.run_until_kept, type(lm).run_with_hooks

    def check(self, info):
        events.append("check")
        return real_check(self, info)

    def run(*args, **kwargs):
        events.append("loop")
        return real_run(*args, **kwargs)

    def forward(self, batch, *args, **kwargs):
        held = isinstance(batch, CheckedBatch) and batch.holds_for(self.interp, next(self.parameters()).dtype)
        events.append("forward" if held else f"forward of {type(batch).__name__}")
        return real_forward(self, batch, *args, **kwargs)

    monkeypatch.setattr(Batch, "check", check)
    monkeypatch.setattr(capture, "run_until_kept", run)
    monkeypatch.setattr(type(lm), "run_with_hooks", forward)
    PASSES[name](lm, [_ids(0), _ids(1)])
    forwards = [i for i, e in enumerate(events) if e.startswith("forward")]
    assert forwards, "the pass ran no forward"
    assert "check" in events[:forwards[0]], events  # the first batch checked before the first forward
    for i in forwards:
        assert events[i] == "forward" and events[i - 1] == "loop", f"a forward outside the loop: {events}"


@pytest.mark.parametrize("name", ["frequency_profile", "frequency_shift_under_ablation", "record_qkv"])
@pytest.mark.parametrize("bad", ["nan pixels", "mask of 2"])
def test_what_only_the_host_check_sees_is_refused_by_every_pass(models, name, bad):
    """NaN pixels and a mask that is not 0/1 are caught by ``Batch.check`` alone (the bridge's own forward
    check looks at shapes and dtypes only)."""
    lm, vit = models
    if bad == "nan pixels":
        x = torch.randn(2, 3, 32, 32)
        x[1, 0, 3, 3] = float("nan")
        model, data, words = vit, [x], "NaN or inf"
    else:
        ids = _ids()
        model, data, words = lm, [{"input_ids": ids, "attention_mask": torch.full_like(ids, 2)}], "only 0"
    with pytest.raises(InputError, match=words):
        PASSES[name](model, data)


def test_the_loop_hashes_what_it_runs_and_restores_the_mode(models):
    lm, _ = models
    lm.train()
    try:  # dropout active in training mode: refused (random numbers), never silently switched to eval
        with pytest.raises(InputError, match=r"model\.eval\(\)"):
            capture.stream_batches(lm, [_ids(0)], None, [], desc="test", progress=False)
        dropouts = [m for m in lm.hf_model.modules() if isinstance(m, torch.nn.Dropout) and m.p]
        rates = {m: m.p for m in dropouts}
        for m in dropouts:
            m.p = 0.0
        config, pdrop = lm.hf_model.config, getattr(lm.hf_model.config, "attn_pdrop", None)
        if pdrop is not None:
            config.attn_pdrop = 0.0
        seen = []
        n, fp = capture.stream_batches(lm, [_ids(0), _ids(1)], None, ["blocks.0.attn.hook_pattern"],
                                       lambda b, store: seen.append(store["blocks.0.attn.hook_pattern"].shape),
                                       desc="test", progress=False)
        assert lm.training  # no dropout: eval inside, the caller's mode after
    finally:
        for m, p in rates.items():
            m.p = p
        if pdrop is not None:
            config.attn_pdrop = pdrop
        lm.eval()
    assert n == 2 and seen == [torch.Size([2, 4, 6, 6])] * 2
    assert fp == interp.record.fingerprint.data_fingerprint([Batch(_ids(0)), Batch(_ids(1))])
    assert capture.stream_batches(lm, [_ids(0)], None, [], desc="test", progress=False)[0] == 1


def test_pixels_that_overflow_the_models_dtype_are_refused_before_the_forward(models):
    """Finite float64 pixels beyond float32's range became inf in the cast: frequency_profile returned a table."""
    _, vit = models
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64) * 1e300
    for call in (lambda: interp.frequency_profile(vit, [x], progress=False),
                 lambda: interp.record_qkv(vit, [x], progress=False)):
        with pytest.raises(InputError, match="beyond what the model's torch.float32 holds"):
            call()
    assert interp.frequency_profile(vit, [x / 1e300], progress=False).equals(
        interp.frequency_profile(vit, [(x / 1e300).float()], progress=False))


def test_token_ids_of_any_integer_dtype_are_the_same_ids(models):
    """uint8 / int16 ids reached the embedding as they were (a raw RuntimeError); now read as int64."""
    lm, _ = models
    ids = _ids()
    want = interp.record_qkv(lm, [ids], progress=False).to_frame()
    for dtype in (torch.uint8, torch.int16, torch.int32):
        assert interp.record_qkv(lm, [ids.to(dtype)], progress=False).to_frame().equals(want)


# ----- computing_in: a float64 forward of a float32 model without a float64 copy --------------------------------

from interp.models.families import list_families  # noqa: E402
from interp.models.loading import clone_model  # noqa: E402


def _first(out):
    return out if isinstance(out, torch.Tensor) else out[0]


@pytest.mark.parametrize("name", [f.name for f in list_families()])
def test_computing_in_float64_equals_a_float64_copy_and_leaves_the_model_untouched(name):
    model = interp.load_model(tiny_hf_model(name), device="cpu")
    x = Batch(interp.tiny_inputs(name))  # a Batch: pixels cast to the dtype the model computes in
    before = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
    reference = clone_model(model, dtype=torch.float64)
    seen = []
    probe = ("blocks.0.attn.hook_q", lambda t, hook: seen.append(t.dtype))
    with torch.no_grad():
        want_out, want = reference.run_with_cache(x)
        with capture.computing_in(model, torch.float64):
            got_out, got = model.run_with_cache(x)
            model.run_with_hooks(x, fwd_hooks=[probe])
            assert all(p.dtype == torch.float32 for p in model.blocks[0].parameters())  # cast only while it runs
    assert seen == [torch.float64]
    assert torch.equal(_first(got_out), _first(want_out))  # bit for bit: the same float64 arithmetic
    for hook in ("blocks.0.attn.hook_pattern", f"blocks.{model.interp.n_layers - 1}.attn.hook_z"):
        if hook in want:
            assert torch.equal(got[hook], want[hook]), hook
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    for n, (p, values) in before.items():  # the same objects, the same float32 values
        assert after[n] is p and p.dtype == values.dtype and torch.equal(p, values), n


def test_computing_in_restores_a_block_whose_forward_was_stopped_inside_it():
    model = interp.load_model(tiny_hf_model("gpt2", n_layers=2, n_heads=4), device="cpu")
    x = _ids()
    with torch.no_grad(), capture.computing_in(model, torch.float64):
        kept = capture.run_until_kept(model, x, ["blocks.0.attn.hook_pattern"])  # stops inside block 0
        assert kept["blocks.0.attn.hook_pattern"].dtype == torch.float64
        assert next(model.blocks[0].parameters()).dtype == torch.float64  # still cast: its forward never returned
        full = _first(model(x))  # the next block to start puts block 0's own tensors back
        assert next(model.blocks[0].parameters()).dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad():
        assert torch.equal(full, _first(clone_model(model, dtype=torch.float64)(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_off_heap_gives_back_the_same_tensor(dtype):
    """What a pass keeps as Python numbers comes back bit for bit: float32 and float64 values, shape and dtype."""
    g = torch.Generator().manual_seed(0)
    for t in (torch.randn(3, 4, 5, generator=g, dtype=torch.float64).mul(1e30).to(dtype), torch.tensor(1 / 3).to(dtype),
              torch.randn(0, 2, generator=g).to(dtype)):
        kept = capture.off_heap(t)
        assert isinstance(kept, capture.HostCopy)  # on the host: no tensor kept
        back, = capture.tensors([kept])
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
