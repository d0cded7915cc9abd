"""Batching invariance, as a property: every public analyzer gives the same numbers whether the
same sequences arrive in one padded batch, in random padded groups, or one at a time.

Bootstrap intervals (``*_lo`` / ``*_hi``: ablation deltas, shift ratios, shares) are compared too: they
resample items in a canonical order, so they do not depend on the batching either.

The weighting is the one ``docs/mathematics.md`` states: each real token (query row) counts once
in token means, each sequence or image once in item means; padding never counts. Models run in
float64 so that equal means equal to rounding (1e-9).
"""

import random

import pandas as pd
import pytest
import torch

import interp
from interp.data import Batch

LENGTHS = (11, 3, 7, 12, 5, 9)  # different real lengths, so that every padded batch has padding
FAMILIES = ("gpt2", "bert", "qwen2")


def _model(family):
    torch.manual_seed(0)
    hf = interp.tiny_hf_model(family, n_layers=2, n_heads=4, d_head=8, n_kv_heads=2 if family == "qwen2" else 4,
                              seed=3).double()
    return interp.load_model(hf)


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return _model(request.param)


def _sequences(n_vocab=97, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, n_vocab, (n,), generator=g) for n in LENGTHS]


def _padded(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)], mask[row, : len(s)] = s, 1
    return Batch(ids, mask)


def splits(seqs, seed=1):
    """(name, batches): one padded batch; random padded groups in a shuffled order; one at a time."""
    rng = random.Random(seed)
    order = list(range(len(seqs)))
    rng.shuffle(order)
    cuts = sorted(rng.sample(range(1, len(seqs)), 2))
    groups = [order[a:b] for a, b in zip([0] + cuts, cuts + [len(seqs)])]
    return {
        "one_batch": [_padded(seqs)],
        "random_groups": [_padded([seqs[i] for i in g]) for g in groups],
        "one_at_a_time": [Batch(s[None], torch.ones(1, len(s), dtype=torch.long)) for s in seqs],
    }


def _numbers(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    numeric = [c for c in df.columns if c not in keys and pd.api.types.is_float_dtype(df[c])]
    return df.sort_values(keys).reset_index(drop=True)[keys + numeric]


# delta_z divides a metric difference by the control draws' SD, so it carries the metric's rounding times 1 / SD
# (here ~1e3), and so do the normal-tail p and its adjustment, smooth functions of it (slope < 0.4): compared to
# 1e-3 absolute and relative (a thousandth of a control SD; of a p), every other column at the analyses' tolerance
Z_COLUMNS, Z_ATOL = ["delta_z", "control_p", "control_p_adjusted"], 1e-3


def _assert_same(frames: dict, keys: list[str], atol=1e-9, rtol=1e-7):
    ref_name, ref = next(iter(frames.items()))
    ref = _numbers(ref, keys)
    for name, df in frames.items():
        df = _numbers(df, keys)
        z = [c for c in Z_COLUMNS if c in ref.columns]
        pd.testing.assert_frame_equal(df.drop(columns=z), ref.drop(columns=z), check_exact=False, atol=atol,
                                      rtol=rtol, obj=f"{name} vs {ref_name}")
        pd.testing.assert_frame_equal(df[z], ref[z], check_exact=False, atol=max(atol, Z_ATOL), rtol=max(rtol, Z_ATOL),
                                      obj=f"{name} vs {ref_name}")


def _analyses(model, batches):
    stats = interp.record_qkv(model, batches, progress=False)
    return {
        "record": stats.to_frame(),
        "origin": interp.origin_shift(model, stats, data=batches),  # with bootstrap intervals over items
        "scores": interp.score_decomposition(model, batches, progress=False),
        "frequency": interp.frequency_profile(model, batches, progress=False),
        # 2 control draws, the fewest with a spread: the control's deltas, delta_z and its p are compared across
        # batchings like the delta (19, the default, only repeat the same check at 7x the forwards)
        "ablation_exact": interp.ablate_bias(model, batches, kinds=("q", "v"), estimate="exact", n_control=2,
                                             progress=False),
    }


KEYS = {"record": None, "origin": ["layer", "head", "kind"], "scores": ["layer", "head", "term"],
        "frequency": ["layer", "head"], "ablation_exact": ["kind", "layer", "head", "estimate"]}


def _assert_analyses_same(results: dict, atol: float = 1e-9, rtol: float = 1e-7) -> None:
    """Each analysis's frames equal across the ways the data came (the first way is the reference)."""
    for analysis, keys in KEYS.items():
        frames = {way: r[analysis] for way, r in results.items()}
        first = next(iter(frames.values()))
        if keys is None:
            keys = [c for c in first.columns if not pd.api.types.is_float_dtype(first[c])]
        _assert_same(frames, keys, atol=atol, rtol=rtol)


def _hf_float64_batching_error(hf) -> float:
    """How far HF's own float64 forward moves the last hidden state between one padded batch and one
    sequence at a time (Qwen2's rotary takes cos/sin in float32, whose vectorised tail differs by the
    sequence length: 2.4e-7 here; 0 for GPT-2 and BERT)."""
    seqs = _sequences()
    batch = _padded(seqs)
    with torch.no_grad():
        full = hf(batch.inputs, attention_mask=batch.attention_mask, output_hidden_states=True).hidden_states[-1]
        return max((hf(s[None], output_hidden_states=True).hidden_states[-1][0] - full[i, :len(s)]).abs().max().item()
                   for i, s in enumerate(seqs))


def test_every_analyzer_is_invariant_to_batching(lm):
    hf = interp.tiny_hf_model(lm.interp.family, n_layers=2, n_heads=4, d_head=8,
                              n_kv_heads=2 if lm.interp.family == "qwen2" else 4, seed=3).double()
    floor = _hf_float64_batching_error(hf)  # the reference's own rounding: ours may not exceed its scale
    assert floor < 1e-6
    atol, rtol = (1e-9, 1e-7) if floor == 0 else (100 * floor, 1e-4)
    _assert_analyses_same({name: _analyses(lm, batches) for name, batches in splits(_sequences()).items()},
                          atol=atol, rtol=rtol)


def test_one_pass_estimates_are_invariant_to_batching():
    model = _model("gpt2")  # a task metric (next-token cross-entropy): AtP* and attribution
    for estimate in ("atp", "attribution"):
        frames = {name: interp.ablate_bias(model, b, kinds=("q",), estimate=estimate, progress=False)
                  for name, b in splits(_sequences()).items()}
        _assert_same(frames, ["kind", "layer", "head", "estimate"])


def test_vision_analyzers_are_invariant_to_batching():
    model = interp.load_model(interp.tiny_hf_model("vit", n_layers=2, n_heads=4, d_head=8, seed=2).double())
    g = torch.Generator().manual_seed(0)
    images = torch.randn(5, 3, 32, 32, generator=g, dtype=torch.float64)
    ways = {"one_batch": [images], "groups": [images[:2], images[2:]], "one_at_a_time": list(images.split(1))}
    results = {name: _analyses(model, batches) for name, batches in ways.items()}
    for analysis, keys in KEYS.items():
        if keys is not None:
            _assert_same({split: r[analysis] for split, r in results.items()}, keys)


def test_frequency_profile_takes_batches_of_different_lengths_and_ignores_padding():
    """A text spectrum over sequences of different lengths is taken per sequence over its real tokens:
    padding added to a batch changes nothing (it used to enter the FFT, or fail on mixed lengths)."""
    model = _model("gpt2")
    seqs = _sequences()[:2]
    alone = interp.frequency_profile(model, [Batch(seqs[0][None])], progress=False)
    padded = _padded([seqs[0], seqs[0][:4]])  # no row of full length... except the first: pad more
    wide = Batch(torch.cat([padded.inputs, torch.zeros(2, 5, dtype=torch.long)], 1),
                 torch.cat([padded.attention_mask, torch.zeros(2, 5, dtype=torch.long)], 1))
    two = interp.frequency_profile(model, [wide], progress=False)
    short = interp.frequency_profile(model, [Batch(seqs[0][None, :4])], progress=False)
    # both sequences count once: the spectra of length 11 and 4 averaged, as two separate batches give
    separate = interp.frequency_profile(model, [Batch(seqs[0][None]), Batch(seqs[0][None, :4])], progress=False)
    _assert_same({"padded": two, "separate": separate}, ["layer", "head"])
    assert not alone.hf_ratio.equals(short.hf_ratio)  # the lengths do differ: the check above is not vacuous


def _left_padded(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, width - len(s):], mask[row, width - len(s):] = s, 1
    return Batch(ids, mask)


def test_left_padding_gives_the_numbers_of_right_padding():
    """Found in issue 23's second pass: next-token cross-entropy counted the prediction of each left-padded
    row's first real token from the padding before it (the ablation baseline moved by 5e-3)."""
    model = _model("gpt2")
    seqs = _sequences()
    _assert_analyses_same({name: _analyses(model, b) for name, b in (("right", [_padded(seqs)]),
                                                                      ("left", [_left_padded(seqs)]))})


def test_left_padding_in_float64_is_refused_where_hf_softmaxes_in_float32():
    """Qwen2, LLaMA, ... in float64: HF's eager softmax runs in float32, the mask's float64 minimum turns -inf
    there and left-padding rows become NaN, which reach the real tokens; every analyzer refuses it (the
    NaN used to give NaN spectra, other invariance checks and an InternalError in massive_activations)."""
    model = _model("qwen2")
    left = [_left_padded(_sequences())]
    for run in (lambda: interp.massive_activations(model, left, progress=False),
                lambda: interp.frequency_profile(model, left, progress=False),
                lambda: interp.bias_invariances(interp.load_model(interp.tiny_hf_model("qwen2")), left)):
        with pytest.raises(interp.InterpError, match="float64 with left padding.*pad on the right"):
            run()
    interp.frequency_profile(model, [_padded(_sequences())], progress=False)  # right padding runs
