"""interp.checks: index and count checks accept what the docs say and refuse the rest, naming the fix; validation
is decided by type (``CheckedBatch``), and nothing lets a caller skip it."""

import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import interp
import interp.ablation
from interp import checks
from interp.ablation import metrics
from interp.record.capture import run_until_kept
from interp.checks import Batch, CheckedBatch, check_batch, check_count, check_heads, check_key, check_kinds, \
    check_layers
from interp.data import batch_to_device
from interp.errors import InputError, InternalError
from interp.models import tiny_hf_model
from interp.models.loading import load_model
from interp.models.tiny import VOCAB


@pytest.fixture(scope="module")
def info():
    return load_model(tiny_hf_model("gpt2", n_layers=3, n_heads=4), device="cpu").interp


@pytest.mark.parametrize("given, expected", [(None, [0, 1, 2]), (1, [1]), ([2, 0, 2], [0, 2]), (range(2), [0, 1])])
def test_layers_are_sorted_unique_indices(info, given, expected):
    assert check_layers(given, info) == expected


@pytest.mark.parametrize("bad", [3, -1, [], "0", 1.0, True, [0, None]])
def test_out_of_range_or_not_an_index_is_refused(info, bad):
    with pytest.raises(InputError, match="layers must"):
        check_layers(bad, info)
    with pytest.raises(InputError, match="heads must"):
        check_heads(bad if bad != 3 else 4, info)


def test_kinds_and_counts():
    assert check_kinds(["q", "v"]) == ["q", "v"] and check_kinds("k") == ["k"]
    with pytest.raises(InputError):
        check_kinds(["x"])
    assert check_count("batch_size", 3) == 3
    for bad in (0, -2, 1.5, "4", True):
        with pytest.raises(InputError, match="batch_size"):
            check_count("batch_size", bad)


# ----- selections: ints and int sequences only (issue 31) ---------------------------------------------------

MASK = [False, True, False, True]  # a mask for heads [1, 3] of a 4-head model; read as indices it was [0, 1]


@pytest.mark.parametrize("bad", [
    torch.tensor(MASK), np.array(MASK), MASK, torch.tensor(MASK, dtype=torch.uint8), torch.tensor(True),
    np.bool_(True), torch.tensor([1.0, 3.0]), np.array([1.0, 3.0]), np.float64(1.0), torch.tensor([[1, 3]]),
    (h for h in (1, 3)), {1: "a"}, [1, 2.0], [torch.tensor(1.0)], b"\x01",
], ids=lambda v: "a generator" if inspect.isgenerator(v) else repr(v))  # repr holds an address: xdist needs stable ids
def test_a_mask_or_a_float_is_not_a_selection(info, bad):
    with pytest.raises(InputError, match="heads must be None .* or a list of indices") as raised:
        check_heads(bad, info)
    if "True" in repr(bad) or "bool" in repr(bad) or "uint8" in repr(bad):
        assert "mask" in str(raised.value) or "True/False" in str(raised.value)


@pytest.mark.parametrize("given", [
    [1, 3], (3, 1), torch.tensor([1, 3]), torch.tensor([3, 1], dtype=torch.int32), np.array([1, 3]),
    np.array([1, 3], dtype=np.uint8), [np.int64(1), torch.tensor(3)], pd.Series([1, 3]), pd.Index([3, 1]),
], ids=repr)
def test_integer_sequences_of_any_library_are_the_same_selection(info, given):
    assert check_heads(given, info) == [1, 3]
    assert all(type(h) is int for h in check_heads(given, info))


def test_a_tensor_without_values_is_refused(info):
    with pytest.raises(InputError, match="holds no values"):
        check_heads(torch.tensor([1, 2], device="meta"), info)


@pytest.mark.parametrize("given", [3, np.int64(3), np.int32(3), torch.tensor(3), np.array(3)], ids=repr)
def test_one_integer_of_any_library_is_one_index(info, given):
    assert check_heads(given, info) == [3]


def _entry_points(model, ids):
    data = [ids]
    return {
        "record_qkv": lambda sel: interp.record_qkv(model, data, layers=sel, progress=False),
        "frequency_profile": lambda sel: interp.frequency_profile(model, data, heads=sel, progress=False),
        "sink_profile": lambda sel: interp.sink_profile(model, data, heads=sel, progress=False),
        "score_decomposition": lambda sel: interp.score_decomposition(model, data, heads=sel),
        "single_input": lambda sel: interp.single_input(model, ids[0], heads=sel),
        "ablate_bias": lambda sel: interp.ablation.ablate_bias(model, data, heads=sel, progress=False),
        "ablate_bias targets": lambda sel: interp.ablate_bias(model, data, scope=[(0, sel, "q")], progress=False),
    }


ENTRY_POINTS = list(_entry_points(None, None))


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_bool_mask_is_refused_by_every_entry_point(entry):
    """A torch bool mask for heads [1, 3] used to analyse heads [0, 1] (and layers [0, 1]) silently."""
    model = load_model(tiny_hf_model("gpt2", n_layers=2, n_heads=4), device="cpu")
    call = _entry_points(model, torch.randint(0, 90, (1, 6), generator=torch.Generator().manual_seed(0)))[entry]
    mask = torch.tensor(MASK if entry != "record_qkv" else [False, True])
    if entry == "ablate_bias targets":
        mask = torch.tensor(True)
    with pytest.raises(InputError, match="mask|True/False|scope must be") as raised:
        call(mask)
    assert not isinstance(raised.value, InternalError)


def test_a_frame_of_another_analyzer_is_named_with_what_it_lacks():
    # issue 38: merge_shards given a sink profile failed with a KeyError deep in pandas (an InternalError)
    from interp.ablation.sweep import COLUMNS
    from interp.checks import check_frames

    key = ["layer", "head", "kind", "scope", "method", "estimate", "n_targets"]
    ablation = pd.DataFrame(columns=COLUMNS)
    profile = pd.DataFrame(columns=["model", "layer", "head", "position", "mass", "sink"])
    check_frames([ablation, ablation], key, "merge_shards", "interp.ablate_bias")  # the right tables pass
    with pytest.raises(InputError, match=r"merge_shards takes tables of interp.ablate_bias; frame 1 lacks kind, "
                                         r"scope, method, estimate, n_targets \(it has model, layer, head, position"):
        check_frames([ablation, profile], key, "merge_shards", "interp.ablate_bias")
    with pytest.raises(InputError, match="frame 0 lacks layer.*no columns"):
        check_frames([pd.DataFrame()], key, "merge_shards", "interp.ablate_bias")


@pytest.mark.parametrize("given", ["first", ["first"], ("first",), np.array(["first"]), pd.Series(["first"]),
                                   [np.str_("first")]], ids=["str", "list", "tuple", "array", "Series", "np.str_"])
def test_positions_are_names_in_any_container(given):
    from interp.analysis.sink_parts import check_positions

    model = load_model(tiny_hf_model("gpt2"), device="cpu")
    assert check_positions(model, given) == ["first"]
    for index in (0, np.int64(0), [0], (0, "first")):  # issue 38: positions=0 was a TypeError (an InternalError)
        with pytest.raises(InputError, match="not token indices.*position 0, the first real token, is 'first'"):
            check_positions(model, index)


# ----- validation by type: the CheckedBatch --------------------------------------------------------------
# The bridge's forward checks every input except a ``CheckedBatch`` that holds for it; only ``check_batch``
# makes one, after the checks; no public caller can skip them, and the checked path computes exactly what the
# validated path computes.

@pytest.fixture(scope="module")
def lm():
    return interp.load_model(tiny_hf_model("gpt2", n_layers=1, n_heads=2), device="cpu")


@pytest.fixture(scope="module")
def vit():
    return interp.load_model(tiny_hf_model("vit", n_layers=1, n_heads=2), device="cpu")


def _ids(seed=0):
    return torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(seed))


def _mask():
    return torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


def test_no_context_variable_anywhere_in_the_package():
    """The switch that turned the forward's checks off (a ContextVar any caller could set) is gone: no module
    of the package makes a context variable, and the old switch's names are gone."""
    package = Path(interp.__file__).parent
    makers = [str(p.relative_to(package)) for p in sorted(package.rglob("*.py"))
              if "contextvars" in p.read_text() or "ContextVar" in p.read_text()]
    assert makers == []
    assert not hasattr(checks, "inputs_checked_on_host") and not hasattr(checks, "checked_on_host")


# every public way into a forward, each given token ids past the vocabulary
ENTRIES = {
    "model(ids)": lambda m, ids: m(ids),
    "model.run_with_hooks(ids)": lambda m, ids: m.run_with_hooks(ids, fwd_hooks=[]),
    "model.run_with_cache(ids)": lambda m, ids: m.run_with_cache(ids),
    "model(Batch)": lambda m, ids: m(Batch(ids)),
    "model.run_with_hooks(Batch)": lambda m, ids: m.run_with_hooks(Batch(ids), fwd_hooks=[]),
    "run_until_kept(Batch)": lambda m, ids: run_until_kept(m, Batch(ids), ["blocks.0.attn.hook_pattern"]),
    "run_until_kept(tensor)": lambda m, ids: run_until_kept(m, ids, ["blocks.0.attn.hook_pattern"]),
    "metrics.run_forward(Batch)": lambda m, ids: metrics.run_forward(m, Batch(ids), [], False),
    "record_qkv": lambda m, ids: interp.record_qkv(m, [ids], progress=False),
    "score_decomposition": lambda m, ids: interp.score_decomposition(m, [ids], n_boot=0, progress=False),
    "bias_invariances": lambda m, ids: interp.bias_invariances(m, [ids], progress=False),
    "frequency_profile": lambda m, ids: interp.frequency_profile(m, [ids], progress=False),
    "sink_profile": lambda m, ids: interp.sink_profile(m, [ids], progress=False),
    "ablate_bias": lambda m, ids: interp.ablate_bias(m, [ids], kinds=("q",), estimate="exact", progress=False),
    "single_input": lambda m, ids: interp.single_input(m, ids[1]),
}


@pytest.mark.parametrize("entry", ENTRIES)
def test_no_public_entry_skips_the_checks(lm, entry):
    """Token ids past the vocabulary get the one clear InputError through every entry (the ContextVar let any
    caller inside ``run_until_kept`` or ``run_forward`` send them to the embedding unchecked)."""
    bad = _ids()
    bad[1, 3] = VOCAB + 7
    with pytest.raises(InputError, match=rf"token ids must lie in 0\.\.{VOCAB - 1}"):
        ENTRIES[entry](lm, bad)


@pytest.mark.parametrize("bad, words", [
    (lambda: torch.randn(2, 3, 16, 32), "not a multiple of the patch size|takes 32 x 32 images"),
    (lambda: torch.randn(2, 1, 32, 32), r"pixel_values must be \[batch, 3, H, W\]"),
    (lambda: torch.full((2, 3, 32, 32), float("nan")), "NaN or inf"),
])
def test_bad_pixels_are_refused_on_the_checked_and_the_plain_path(vit, bad, words):
    with pytest.raises(InputError, match=words):
        check_batch(vit, Batch(bad()))
    with pytest.raises(InputError, match=words):
        run_until_kept(vit, Batch(bad()), ["blocks.0.attn.hook_pattern"])
    with pytest.raises(InputError, match=words):
        interp.record_qkv(vit, [bad()], progress=False)


def test_a_mask_that_is_not_zero_one_is_refused_in_a_batch_given_to_the_forward(lm):
    with pytest.raises(InputError, match="only 0"):
        lm(Batch(_ids(), torch.full((2, 6), 2)))
    with pytest.raises(InputError, match="carries its own inputs and attention mask"):
        lm(Batch(_ids(), _mask()), attention_mask=_mask())


def test_the_checked_path_computes_what_the_validated_path_computes(lm, vit):
    """A CheckedBatch runs the same HF forward as plain tensors: logits and kept activations equal bit for bit."""
    ids, mask = _ids(), _mask()
    checked = check_batch(lm, Batch(ids, mask))
    with torch.no_grad():
        plain = lm(ids, attention_mask=mask)
        via_type = lm.run_with_hooks(checked, fwd_hooks=[])
        _, cache = lm.run_with_cache(ids, attention_mask=mask)
    assert (via_type - plain).abs().max().item() == 0
    name = "blocks.0.attn.hook_pattern"
    with torch.no_grad():
        kept = run_until_kept(lm, checked, [name])[name]
    assert (kept - cache[name]).abs().max().item() == 0
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (vit(check_batch(vit, Batch(x))) - vit(x)).abs().max().item() == 0


def test_a_checked_batch_cannot_be_built_or_changed_from_unchecked_input(lm):
    bad = _ids()
    bad[0, 0] = VOCAB + 1
    for build in (lambda: CheckedBatch(bad), lambda: CheckedBatch(inputs=bad, attention_mask=None),
                  lambda: CheckedBatch._made(Batch(bad), check_key(lm.interp, torch.float32), object())):
        with pytest.raises(InputError, match="made by checking a batch"):
            build()
    with pytest.raises(InputError, match="token ids must lie"):
        check_batch(lm, Batch(bad))
    checked = check_batch(lm, Batch(_ids()))
    with pytest.raises(InputError, match="made by checking a batch"):
        dataclasses.replace(checked, inputs=bad)
    with pytest.raises(InputError, match="made by checking a batch"):
        checked.inputs = bad
    with pytest.raises(InputError, match="made by checking a batch"):
        del checked.attention_mask
    assert checked.holds_for(lm.interp, torch.float32)


def test_an_in_place_write_voids_a_checked_batch_and_the_forward_checks_it_again(lm):
    checked = check_batch(lm, Batch(_ids()))
    checked.inputs[1, 2] = VOCAB + 3  # the tensor's version counter moves
    assert not checked.holds_for(lm.interp, torch.float32)
    with pytest.raises(InputError, match="token ids must lie"):
        run_until_kept(lm, checked, ["blocks.0.attn.hook_pattern"])


def test_a_batch_checked_for_another_model_is_checked_again(lm):
    """Checked for a model with a larger vocabulary, ids beyond this model's are still refused here."""
    big = interp.load_model(tiny_hf_model("gpt2", n_layers=1, n_heads=2, config=dict(vocab_size=VOCAB + 50)),
                            device="cpu")
    ids = _ids()
    ids[0, 1] = VOCAB + 20
    checked = check_batch(big, Batch(ids))
    assert checked.holds_for(big.interp, torch.float32) and not checked.holds_for(lm.interp, torch.float32)
    with pytest.raises(InputError, match="token ids must lie"):
        lm.run_with_hooks(checked, fwd_hooks=[])
    assert not checked.holds_for(lm.interp, torch.float64)  # another dtype: checked again (pixels may overflow)


def test_moving_and_repeating_keep_a_batch_checked_with_its_values(lm):
    checked = check_batch(lm, Batch(_ids(), _mask(), torch.tensor([3, 4])))
    moved, repeated = batch_to_device(checked, torch.device("cpu")), checked.repeat(3)
    for made in (moved, repeated, checked.to("cpu"), checked.repeat(2)):
        assert isinstance(made, CheckedBatch) and made.holds_for(lm.interp, torch.float32)
    assert torch.equal(repeated.inputs, checked.inputs.repeat(3, 1))
    assert torch.equal(repeated.attention_mask, checked.attention_mask.repeat(3, 1))
    assert torch.equal(repeated.labels, checked.labels.repeat(3))
    assert torch.equal(moved.inputs, checked.inputs) and moved.labels.tolist() == [3, 4]
    assert check_batch(lm, checked) is checked  # already checked for this model: not checked twice
    plain = Batch(_ids()).repeat(2)
    assert type(plain) is Batch  # an unchecked batch stays unchecked


def test_iter_batches_yields_checked_batches_and_refuses_a_bad_one(lm):
    got = list(interp.iter_batches(lm, [_ids(0), _ids(1)]))
    assert all(isinstance(b, CheckedBatch) and b.holds_for(lm.interp, torch.float32) for b in got)
    assert [b.inputs.tolist() for b in got] == [_ids(0).tolist(), _ids(1).tolist()]
    bad = _ids(2)
    bad[0, 0] = -1
    batches = interp.iter_batches(lm, [_ids(0), bad])
    next(batches)  # lazily: the first batch is fine
    with pytest.raises(InputError, match="token ids must lie"):
        next(batches)
