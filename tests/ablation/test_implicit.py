"""Implicit-bias ablation (``kinds=("sink_v", "massive")`` in ``ablate_bias``).

Each patched metric equals a hand-written hook on the plain HF modules (float32, <= 1e-6); mean-ablating
a value that is the same in every sequence changes nothing (delta exactly 0); the rows do not depend on
how the same sequences are batched; resume and fingerprints work as for bias rows.
"""

import copy
import io
import json

import pandas as pd
import pytest
import torch

import interp
from interp.errors import InputError, StaleResultsError
from interp.models import tiny_hf_model

D = 8  # tiny models' d_head


def padded(seqs, left=False):
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, s in enumerate(seqs):
        cols = slice(width - len(s), width) if left else slice(0, len(s))
        ids[row, cols], mask[row, cols] = s, 1
    return {"input_ids": ids, "attention_mask": mask}


def sequences(lengths=(9, 5, 7, 3), seed=0, first=None):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 97, (n,), generator=g) for n in lengths]
    if first is not None:
        for s in seqs:
            s[0] = first
    return seqs


def next_token_ce(logits, batch):
    """The sweep's next_token_ce by hand: summed NLL of each real token predicted from a real token (left
    padding: not the first real token from the pad before it) over their count."""
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    nll = -logits[:, :-1].double().log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    keep = (mask[:, 1:] & mask[:, :-1]).double()
    return (nll * keep).sum(), keep.sum()


def hf_metric(hf, batches, module, edit):
    """next_token_ce over ``batches`` of the plain HF model with ``edit(output, batch)`` hooked on ``module``."""
    total, count = 0.0, 0.0
    for batch in batches:
        handle = module.register_forward_hook(lambda m, a, o, b=batch: edit(o.clone(), b)) if module else None
        try:
            with torch.no_grad():
                logits = hf(**batch).logits
        finally:
            if handle:
                handle.remove()
        s, c = next_token_ce(logits, batch)
        total, count = total + float(s), count + float(c)
    return total / count


def first_real(mask):
    return mask.int().argmax(1)


def test_zeroing_sink_values_equals_a_plain_torch_hook():
    """Llama (grouped-query: 4 query heads, 2 kv heads), left and right padding: zeroing kv head 1's values at
    each sequence's first real token equals the same edit on HF's v_proj output."""
    hf = tiny_hf_model("llama").eval()
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    seqs = sequences()
    batches = [padded(seqs[:2], left=True), padded(seqs[2:])]
    df = interp.ablate_bias(model, batches, kinds=("sink_v",), estimate="exact", metric="next_token_ce",
                            progress=False).set_index(["layer", "head"])
    worst = 0.0
    for layer in range(2):
        for head in range(2):
            def zero(out, batch, head=head):
                rows = torch.arange(out.shape[0])
                out[rows, first_real(batch["attention_mask"]), head * D:(head + 1) * D] = 0.0
                return out
            want = hf_metric(hf, batches, hf.model.layers[layer].self_attn.v_proj, zero)
            assert abs(df.loc[(layer, head), "baseline"] - hf_metric(hf, batches, None, None)) <= 1e-6
            worst = max(worst, abs(df.loc[(layer, head), "ablated"] - want))
    assert worst <= 1e-6, worst
    assert (df.delta.abs() > 1e-4).all(), df  # the edit matters: the comparison is not vacuous
    print(f"sink_v zero vs plain-torch hook: max abs diff {worst:.1e}")


def plant_first_token_sink(hf, layer, head, channel=3, strength=40.0):
    """BERT head ``head`` scores keys by the key prior only, on a channel the first token is large in."""
    block = hf.bert.encoder.layer[layer].attention.self
    rows = slice(head * D, (head + 1) * D)
    with torch.no_grad():
        block.query.weight[rows] = 0.0
        block.query.bias[rows] = 0.0
        block.query.bias[head * D] = strength
        block.key.weight[rows] = 0.0
        block.key.weight[head * D, channel] = 1.0
        hf.bert.embeddings.position_embeddings.weight[0, channel] += 30.0


def test_zeroing_a_planted_sink_head_equals_a_plain_torch_hook():
    """BERT with head 2 of layer 0 planted to sink on the first token (>= 90% of its attention): zeroing
    its sink values equals the plain hook on HF's value module, measured by mean-pooled embedding cosine."""
    hf = tiny_hf_model("bert").eval()
    plant_first_token_sink(hf, 0, 2)
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    batches = [padded(sequences(seed=1)[:2]), padded(sequences(seed=1)[2:])]
    assert interp.sink_profile(model, batches, positions="first", layers=[0], progress=False).query(
        "head == 2").mass.iloc[0] >= 0.9
    row = interp.ablate_bias(model, batches, kinds=("sink_v",), layers=[0], heads=[2], estimate="exact",
                             progress=False).iloc[0]

    def pooled(batch, edit=None):
        value = hf.bert.encoder.layer[0].attention.self.value
        handle = value.register_forward_hook(lambda m, a, o: edit(o.clone())) if edit else None
        try:
            with torch.no_grad():
                h = hf(**batch, output_hidden_states=True).hidden_states[-1].double()
        finally:
            if handle:
                handle.remove()
        m = batch["attention_mask"][..., None].double()
        return (h * m).sum(1) / m.sum(1)

    def zero(out):
        out[:, 0, 2 * D:3 * D] = 0.0  # right padding: the first real token is position 0
        return out

    cos = torch.cat([torch.cosine_similarity(pooled(b, zero), pooled(b), dim=-1) for b in batches])
    assert row.metric == "embedding_cosine" and abs(row.ablated - float(cos.mean())) <= 1e-6
    assert row.delta < -1e-5, row  # the planted sink carries something (100x float32 rounding of a cosine)


def test_mean_ablating_a_constant_sink_value_is_a_no_op():
    """Every sequence starts with token 1 (BOS): in a causal model layer 0's value at the first token is the
    same vector in every sequence, so its data mean is itself and the ablation changes nothing, exactly.
    Layer 1's first-token values are also equal (position 0 sees only itself): exact no-op there too, while
    zeroing them is not one."""
    model = interp.load_model(tiny_hf_model("llama").double(), device="cpu")  # float64: equal to rounding
    batches = [padded(sequences(first=1)[:3]), padded(sequences(first=1)[3:])]
    mean = interp.ablate_bias(model, batches, kinds=("sink_v",), method="mean", estimate="exact", progress=False)
    assert (mean.delta.abs() <= 1e-12).all() and (mean.kl.abs() <= 1e-12).all(), mean
    zero = interp.ablate_bias(model, batches, kinds=("sink_v",), method="zero", estimate="exact", progress=False)
    assert (zero.delta.abs() > 1e-5).all(), zero  # >= 10^7 x the no-op's bound


def test_mean_ablation_of_varying_sink_values_is_not_a_no_op():
    """Different first tokens: their values differ, so replacing them by their mean changes the loss; a ViT's
    class token at layer 0 is the same vector for every image (no-op again)."""
    model = interp.load_model(tiny_hf_model("llama").double(), device="cpu")
    seqs = sequences()
    df = interp.ablate_bias(model, [padded(seqs[:3]), padded(seqs[3:])], kinds=("sink_v",), method="mean",
                            estimate="exact", progress=False)
    assert (df.delta.abs() > 1e-5).all(), df
    vit = interp.load_model(tiny_hf_model("vit").double(), device="cpu")
    images = [torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(s)).double() for s in range(2)]
    df = interp.ablate_bias(vit, images, kinds=("sink_v",), method="mean", estimate="exact", layers=[0],
                            progress=False)
    assert (df.delta.abs() <= 1e-12).all(), df


def plant_massive(hf, ids, scale=500.0):
    """Token 1's embedding at channel 7 set to ``scale`` x the median |residual|: one massive activation."""
    clean = interp.load_model(copy.deepcopy(hf), device="cpu")
    median = interp.massive_activations(clean, [ids], layers=[0], progress=False).median_abs.iloc[0]
    with torch.no_grad():
        hf.model.embed_tokens.weight[1, 7] = scale * median
    return median


def test_massive_entries_zeroed_equal_a_plain_torch_hook_and_absent_ones_are_said():
    hf = tiny_hf_model("llama").eval()
    seqs = sequences(first=1, lengths=(10, 10, 8, 6))
    batches = [padded(seqs[:2]), padded(seqs[2:])]
    clean = interp.load_model(copy.deepcopy(hf), device="cpu")
    median = plant_massive(hf, padded(seqs)["input_ids"])
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    kw = dict(kinds=("massive",), estimate="exact", abs_threshold=100 * median, ratio_threshold=100.0, progress=False)
    df = interp.ablate_bias(model, batches, **kw).set_index("layer")
    assert (df.identity == "").all() and (df.scope == "layer").all() and df["head"].isna().all()

    def zero(out, batch):  # the block's output: its hidden states (a tuple's first element)
        h = out[0] if isinstance(out, tuple) else out
        h[:, 0, 7] = 0.0  # the one planted entry: token 1 at position 0, channel 7
        return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h
    for layer in (0, 1):
        want = hf_metric(hf, batches, hf.model.layers[layer], zero)
        assert abs(df.loc[layer, "ablated"] - want) <= 1e-6, (layer, df.loc[layer, "ablated"], want)
        assert abs(df.loc[layer, "delta"]) > 1e-3
    mean = interp.ablate_bias(model, batches, **{**kw, "method": "mean"})
    assert (mean.delta == 0).all(), mean  # position 0 of a causal model: the same value in every sequence
    none = interp.ablate_bias(clean, batches, **kw)
    assert (none.delta == 0).all() and none.identity.str.startswith("no massive activation at layer").all()


def test_rows_do_not_depend_on_the_batching():
    hf = tiny_hf_model("qwen2", n_kv_heads=2).double()
    model = interp.load_model(hf, device="cpu")
    seqs = sequences(lengths=(11, 3, 7, 12, 5, 9), first=1)
    splits = [[padded(seqs)], [padded([seqs[i] for i in (4, 1)]), padded([seqs[i] for i in (0, 5, 2, 3)])],
              [padded([s]) for s in seqs]]
    for method in ("zero", "mean"):
        frames = [interp.ablate_bias(model, b, kinds=("sink_v", "massive"), method=method, estimate="exact",
                                     ratio_threshold=3.0, abs_threshold=1e-3, progress=False) for b in splits]
        assert (frames[0].identity == "").all()  # low thresholds: every layer has entries to set
        for other in frames[1:]:
            assert list(other.kind) == list(frames[0].kind)
            assert (other.ablated - frames[0].ablated).abs().max() <= 1e-9, (method, other, frames[0])


def test_auto_runs_implicit_kinds_exactly_beside_bias_rows_and_resumes(tmp_path):
    hf = tiny_hf_model("gpt2")
    model = interp.load_model(copy.deepcopy(hf), device="cpu")
    batches = [padded(sequences()[:2]), padded(sequences()[2:])]
    kw = dict(kinds=("v", "sink_v"), n_control=0, progress=False, out=tmp_path)  # the v rows' control: not the point
    auto = interp.ablate_bias(model, batches, estimate="auto", **kw)
    implicit = auto[auto.kind == "sink_v"]
    assert (implicit.estimate == "exact").all() and (implicit.exact_because == "exact only").all()
    assert set(auto[auto.kind == "v"].estimate) == {"atp", "exact"}  # one table ranks both
    exact = interp.ablate_bias(model, batches, kinds=("sink_v",), estimate="exact", progress=False)
    assert list(implicit.delta) == list(exact.delta)
    lines = (tmp_path / "ablation.jsonl").read_text().splitlines()
    again = interp.ablate_bias(model, batches, estimate="auto", **kw)
    assert list(again.delta) == list(auto.delta)
    assert (tmp_path / "ablation.jsonl").read_text().splitlines() == lines  # every row resumed, none rerun
    other = interp.load_model(tiny_hf_model("gpt2", seed=5), device="cpu")
    with pytest.raises(StaleResultsError, match="another run"):
        interp.ablate_bias(other, batches, estimate="auto", **kw)


@pytest.mark.parametrize("kw,words", [
    (dict(kinds=("sink_v",), method="fold"), "take method 'zero' or 'mean'"),
    (dict(kinds=("massive",), method="layer_mean"), "take method 'zero' or 'mean'"),
    (dict(kinds=("sink_v",), positions="top_content"), "differs per head"),
    (dict(kinds=("sink_v",), positions="register_0"), "no position class"),
    (dict(kinds=("massive",), abs_threshold=-1.0), "abs_threshold must be a positive"),
    (dict(kinds=("v",), scope=[(0, 0, "massive")]), "head -1"),
    (dict(kinds=("sink_x",)), "subset of q, k, v, sink_v, massive"),
])
def test_bad_implicit_options_raise_one_clear_error(kw, words):
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    with pytest.raises(InputError, match=words):
        interp.ablate_bias(model, [padded(sequences())], progress=False, **kw)


def test_merge_shards_refuses_sink_v_ranks_run_at_other_positions():
    """Issue 31: no column recorded sink_v's positions, so ranks run at different sink positions merged into
    one table silently. Each row's ``options`` now holds them, and a merge of such frames is refused (also
    after a round trip through CSV); the ranks of one sweep merge to the one-process table."""
    from interp.ablation.sweep import merge_shards
    from interp.models import tiny_inputs

    deit = interp.load_model(tiny_hf_model("deit"), device="cpu")  # prefix classes: cls, distillation
    data = [tiny_inputs("deit")]
    kw = dict(kinds=("sink_v",), estimate="exact", progress=False, n_boot=10)
    cls = [interp.ablate_bias(deit, data, positions="cls", shard=(r, 2), **kw) for r in range(2)]
    dist = interp.ablate_bias(deit, data, positions="distillation", shard=(1, 2), **kw)
    assert [json.loads(o)["positions"] for o in cls[0].options] == [["cls"]] * len(cls[0])
    assert [json.loads(o)["positions"] for o in dist.options] == [["distillation"]] * len(dist)
    whole = interp.ablate_bias(deit, data, positions="cls", **kw)
    merged = merge_shards(cls)
    assert merged.drop(columns="options").equals(whole.drop(columns="options"))
    assert set(merged.options) == set(whole.options)  # one value: the rank is not among the options
    with pytest.raises(InputError, match=r'positions: \["cls"\] vs \["distillation"\]'):
        merge_shards([cls[0], dist])
    with pytest.raises(InputError, match="different options"):
        merge_shards([pd.read_csv(io.StringIO(f.to_csv(index=False))) for f in (cls[0], dist)])
