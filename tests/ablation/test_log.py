"""A results folder never mixes runs: each stale-resume case is refused, overwrite starts afresh. Sweeps run without
the matched control (n_control=0: no 19 draws per head) except where the control's own options are the case."""

import json

import pandas as pd
import pytest
import torch

import interp
import interp.record.fingerprint
from interp.ablation import ablate_bias
from interp.errors import InputError, StaleResultsError
from interp.models import tiny_hf_model, tiny_inputs


def data(n=2):
    return [tiny_inputs("gpt2", batch=2, pos=8, seed=s) for s in range(n)]


@pytest.fixture(scope="module")
def models():
    return (interp.load_model(tiny_hf_model("gpt2", seed=0), device="cpu"),
            interp.load_model(tiny_hf_model("gpt2", seed=1), device="cpu"))


def test_another_model_into_the_same_folder_is_refused(models, tmp_path):
    a, b = models
    ablate_bias(a, data(), kinds=("q",), out=tmp_path, progress=False, estimate="exact", n_control=0)
    with pytest.raises(StaleResultsError, match="another run.*model:"):
        ablate_bias(b, data(), kinds=("q",), out=tmp_path, progress=False, estimate="exact", n_control=0)


def test_more_batches_after_fewer_is_refused(models, tmp_path):
    a, _ = models
    ablate_bias(a, data(3), kinds=("q",), out=tmp_path, max_batches=1, progress=False, estimate="exact", n_control=0)
    with pytest.raises(StaleResultsError, match="max_batches: 1 there, 3 now"):
        ablate_bias(a, data(3), kinds=("q",), out=tmp_path, max_batches=3, progress=False, estimate="exact", n_control=0)


def test_other_data_is_refused(models, tmp_path):
    a, _ = models
    ablate_bias(a, data(), kinds=("v",), out=tmp_path, progress=False, estimate="exact", n_control=0)
    other = [tiny_inputs("gpt2", batch=2, pos=8, seed=s + 10) for s in range(2)]
    with pytest.raises(StaleResultsError, match="data:"):
        ablate_bias(a, other, kinds=("v",), out=tmp_path, progress=False, estimate="exact", n_control=0)


def test_two_lambda_metrics_do_not_collide(models, tmp_path):
    a, _ = models
    ablate_bias(a, data(), kinds=("q",), metric=lambda out, batch: out.float().mean(), out=tmp_path, progress=False, estimate="exact", n_control=0)
    with pytest.raises(StaleResultsError, match="metric:"):
        ablate_bias(a, data(), kinds=("q",), metric=lambda out, batch: out.float().std(), out=tmp_path,
                    progress=False, estimate="exact", n_control=0)


def test_overwrite_starts_afresh_and_equals_a_clean_run(models, tmp_path):
    a, b = models
    ablate_bias(a, data(), kinds=("q",), out=tmp_path, progress=False, estimate="exact", n_control=0)
    fresh = ablate_bias(b, data(), kinds=("q",), out=tmp_path, overwrite=True, progress=False, estimate="exact", n_control=0)
    clean = ablate_bias(b, data(), kinds=("q",), progress=False, estimate="exact", n_control=0)
    assert fresh.delta.tolist() == pytest.approx(clean.delta.tolist(), abs=1e-12)
    header = json.loads((tmp_path / "ablation.jsonl").read_text().splitlines()[0])["_fingerprint"]
    assert header["model"] == fresh.model_fingerprint.iloc[0] == interp.record.fingerprint.model_fingerprint(b)


def test_a_log_without_fingerprint_is_refused(models, tmp_path):
    a, _ = models
    (tmp_path / "ablation.jsonl").write_text(json.dumps({"_key": "x", "delta": 0.5}) + "\n")
    with pytest.raises(StaleResultsError, match="without a fingerprint"):
        ablate_bias(a, data(), kinds=("q",), out=tmp_path, progress=False, estimate="exact", n_control=0)


def test_statistics_of_another_model_are_refused(models):
    a, b = models
    stats_b = interp.record_qkv(b, data(), progress=False)
    with pytest.raises(interp.errors.InputError, match="recorded on another model"):
        interp.origin_shift(a, stats_b)
    with pytest.raises(interp.errors.InputError, match="recorded on another model"):
        ablate_bias(a, data(), kinds=("q",), method="mean", stats=stats_b, progress=False, estimate="exact", n_control=0)
    stats_a = interp.record_qkv(a, data(), progress=False)
    with pytest.raises(interp.errors.InputError, match="different models"):
        stats_a.merge(stats_b)


def test_a_damaged_line_in_the_middle_is_named(models, tmp_path):
    a, _ = models
    ablate_bias(a, data(), kinds=("q",), out=tmp_path, progress=False, estimate="exact", n_control=0)
    log = tmp_path / "ablation.jsonl"
    lines = log.read_text().splitlines()
    lines[2] = "\udcff garbage"
    log.write_text("\n".join(lines) + "\n", errors="surrogateescape")
    with pytest.raises(StaleResultsError, match="line 3: unreadable"):
        ablate_bias(a, data(), kinds=("q",), out=tmp_path, progress=False, estimate="exact", n_control=0)


def test_ids_and_mask_as_one_pair_are_one_batch(models):
    a, _ = models
    ids = tiny_inputs("gpt2", batch=2, pos=8)
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    pair = interp.record_qkv(a, (ids, mask), progress=False)
    explicit = interp.record_qkv(a, [{"input_ids": ids, "attention_mask": mask}], progress=False)
    assert pair.count(0) == explicit.count(0) == 2 * 8 - 3
    assert torch.equal(pair.mean(0, "q"), explicit.mean(0, "q"))


def _metric_for_token(token):
    def metric(out, batch):  # a closure: its code is the same for every token
        return out[..., token].float().mean()
    return metric


def _logit_of(out, batch, token):
    return out[..., token].float().mean()


def test_closure_metrics_capturing_different_values_do_not_collide(models, tmp_path):
    a, _ = models
    ablate_bias(a, data(), kinds=("q",), metric=_metric_for_token(5), out=tmp_path, progress=False, estimate="exact", n_control=0)
    with pytest.raises(StaleResultsError, match="metric:"):
        ablate_bias(a, data(), kinds=("q",), metric=_metric_for_token(7), out=tmp_path, progress=False, estimate="exact", n_control=0)
    resumed = ablate_bias(a, data(), kinds=("q",), metric=_metric_for_token(5), out=tmp_path, progress=False, estimate="exact", n_control=0)
    assert len(resumed) == 8  # the same closure value resumes


def test_partial_metrics_with_different_arguments_do_not_collide(models, tmp_path):
    import functools
    a, _ = models
    ablate_bias(a, data(), kinds=("q",), metric=functools.partial(_logit_of, token=5), out=tmp_path, progress=False, estimate="exact", n_control=0)
    with pytest.raises(StaleResultsError, match="metric:"):
        ablate_bias(a, data(), kinds=("q",), metric=functools.partial(_logit_of, token=7), out=tmp_path,
                    progress=False, estimate="exact", n_control=0)


def test_a_metric_capturing_an_unhashable_object_never_resumes(models, tmp_path):
    a, _ = models
    holder = type("Holder", (), {})()
    holder.token = 5
    metric = lambda out, batch: out[..., holder.token].float().mean()  # noqa: E731
    ablate_bias(a, data(), kinds=("q",), metric=metric, out=tmp_path, progress=False, estimate="exact", n_control=0)
    with pytest.raises(StaleResultsError, match="cannot hash"):
        ablate_bias(a, data(), kinds=("q",), metric=metric, out=tmp_path, progress=False, estimate="exact", n_control=0)


def test_weights_changed_in_place_are_noticed(tmp_path):
    model = interp.load_model(tiny_hf_model("gpt2", seed=0), device="cpu")
    before = ablate_bias(model, data(), kinds=("q",), out=tmp_path, progress=False, estimate="exact", n_control=0)
    stats = interp.record_qkv(model, data(), progress=False)
    with torch.no_grad():  # a fine-tuning step in a notebook: the weights change in place
        model.hf_model.transformer.h[0].attn.c_attn.weight.mul_(1.5)
    with pytest.raises(StaleResultsError, match="model:"):
        ablate_bias(model, data(), kinds=("q",), out=tmp_path, progress=False, estimate="exact", n_control=0)
    with pytest.raises(interp.InterpError, match="record them on this model"):
        interp.origin_shift(model, stats)
    after = ablate_bias(model, data(), kinds=("q",), progress=False, estimate="exact", n_control=0)
    assert after.model_fingerprint.iloc[0] != before.model_fingerprint.iloc[0]
    assert after.baseline.iloc[0] != before.baseline.iloc[0]


def test_an_optimizer_step_and_load_state_dict_are_noticed():
    model = interp.load_model(tiny_hf_model("gpt2", seed=0), device="cpu")
    first = interp.record.fingerprint.model_fingerprint(model)
    assert interp.record.fingerprint.model_fingerprint(model) == first  # cached while nothing moved
    saved = {k: v.clone() for k, v in model.hf_model.state_dict().items()}
    opt = torch.optim.SGD(model.hf_model.parameters(), lr=0.1)
    model.hf_model.transformer.h[0].attn.c_attn.bias.grad = torch.ones_like(model.hf_model.transformer.h[0].attn.c_attn.bias)
    opt.step()
    assert interp.record.fingerprint.model_fingerprint(model) != first
    model.hf_model.load_state_dict(saved)
    assert interp.record.fingerprint.model_fingerprint(model) == first  # the same bytes again: the same fingerprint


SHIFT = 3


def _shifted_logits(out, batch):  # SHIFT is read only inside the generator expression (a nested code object)
    return sum(out[..., t + SHIFT].float().mean() for t in range(2))


def test_a_global_read_only_inside_a_comprehension_is_part_of_the_metric(models, tmp_path, monkeypatch):
    """Found in issue 23's second pass: the global constants were read from the function's own code only, so
    changing SHIFT resumed the old rows."""
    a, _ = models
    ablate_bias(a, data(), kinds=("q",), metric=_shifted_logits, out=tmp_path, progress=False, estimate="exact", n_control=0)
    monkeypatch.setitem(globals(), "SHIFT", 10)
    with pytest.raises(StaleResultsError, match="metric:"):
        ablate_bias(a, data(), kinds=("q",), metric=_shifted_logits, out=tmp_path, progress=False, estimate="exact", n_control=0)


def test_mean_ablation_with_statistics_of_other_data_is_refused(models, tmp_path):
    """Found in issue 23's second pass: the statistics passed to method="mean" were not in the fingerprint,
    so statistics of other data resumed the rows patched with the first run's means."""
    a, _ = models
    first, other = (interp.record_qkv(a, d, progress=False) for d in (data(1), data(2)[1:]))
    ablate_bias(a, data(), kinds=("v",), method="mean", stats=first, out=tmp_path, progress=False, estimate="exact", n_control=0)
    with pytest.raises(StaleResultsError, match="stats:"):
        ablate_bias(a, data(), kinds=("v",), method="mean", stats=other, out=tmp_path, progress=False,
                    estimate="exact", n_control=0)
    resumed = ablate_bias(a, data(), kinds=("v",), method="mean", stats=first, out=tmp_path, progress=False,
                          estimate="exact", n_control=0)
    assert len(resumed) == 8


def test_a_hook_left_on_the_model_is_part_of_the_run(tmp_path):
    """Found in issue 23's second pass: a permanent hook added between two runs resumed the hook-free rows."""
    model = interp.load_model(tiny_hf_model("gpt2", seed=0), device="cpu")
    ablate_bias(model, data(), kinds=("v",), out=tmp_path, progress=False, estimate="exact", n_control=0)
    ablate_bias(model, data(), kinds=("v",), out=tmp_path, progress=False, estimate="exact", n_control=0)  # TL's own hooks: resumes
    model.blocks[0].attn.hook_pattern.add_hook(lambda t, hook: torch.full_like(t, 1.0 / t.shape[-1]),
                                               is_permanent=True)
    with pytest.raises(StaleResultsError, match="hooks: None there"):
        ablate_bias(model, data(), kinds=("v",), out=tmp_path, progress=False, estimate="exact", n_control=0)


def test_atp_distance_with_other_projections_is_refused(tmp_path):
    """Found in issue 23's second pass: n_projections was not in the fingerprint, so a rerun with 16 random
    projections resumed the rows estimated with 2."""
    bert = interp.load_model(tiny_hf_model("bert", seed=1), device="cpu")
    run = dict(kinds=("q",), estimate="atp_distance", out=tmp_path, progress=False)
    ablate_bias(bert, [tiny_inputs("bert")], n_projections=2, **run)
    with pytest.raises(StaleResultsError, match="n_projections: 2 there, 16 now"):
        ablate_bias(bert, [tiny_inputs("bert")], n_projections=16, **run)


# Every option of ablate_bias is one field of SweepOptions, and each says how it reaches the results (issue 31):
# "fingerprint" options are refused on resume, "key" options run their own rows, "none" options resume the same rows.
SELECTION = {"model", "data", "kinds", "scope", "metric", "stats", "out", "layers", "heads"}
CHANGED = {  # a fingerprint-bound option -> (keywords of the first run, the changed value, what the refusal names);
    # options that are not the control's run without it (n_control=0: no 19 draws per head for a refusal)
    "max_batches": (dict(n_control=0), 1, "max_batches: None there, 1 now"),
    "n_boot": (dict(n_control=0), 10, "n_boot: 1000 there, 10 now"),
    "seed": (dict(n_control=0), 3, "seed: 0 there, 3 now"),
    "n_control": (dict(), 4, "n_control: 19 there, 4 now"),
    "control_stop": (dict(), 0, "control_stop: 5 there, 0 now"),
    "control_p": (dict(n_control=39), "sequential", "control_p: 'normal' there, 'sequential' now"),
    "shard": (dict(n_control=0), (1, 2), "shard: None there, '1/2' now"),
    "n_projections": (dict(metric=lambda out, batch: out.sum(), n_control=0), None, None),  # bound only for a distance metric
}


def test_every_option_of_ablate_bias_is_one_checked_field_that_says_how_it_binds():
    import dataclasses
    import inspect

    from interp.ablation.sweep import SweepOptions

    params = inspect.signature(ablate_bias).parameters
    fields = {f.name: f.default for f in dataclasses.fields(SweepOptions)}
    # one way to pass options: keywords, each a field of SweepOptions with the field's default (method and estimate
    # also by position); no options object, no **keywords
    assert set(params) == SELECTION | set(fields)
    assert {n: params[n].default for n in fields} == fields
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert set(fields) == set(SweepOptions.BINDS)
    assert set(SweepOptions.BINDS.values()) == {"fingerprint", "key", "none"}
    assert {n for n, how in SweepOptions.BINDS.items() if how == "fingerprint"} == set(CHANGED)
    options = SweepOptions(stack=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.stack = 3
    # the fingerprint holds exactly the "fingerprint" fields (n_projections with a distance metric, shard when sharded)
    assert set(SweepOptions(shard=(0, 2)).fingerprint(distance=True)) == set(CHANGED)


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_a_changed_fingerprint_option_is_refused_on_resume(models, name, tmp_path):
    a, _ = models
    first, value, words = CHANGED[name]
    kw = dict(kinds=("q",), layers=[0], out=tmp_path, progress=False, estimate="exact", **first)
    ablate_bias(a, data(), **kw)
    if words is None:  # n_projections: no distance estimate runs under exact, so another value is refused there
        lines = (tmp_path / "ablation.jsonl").read_text()
        with pytest.raises(InputError, match="n_projections=3 does not apply with estimate=exact"):
            ablate_bias(a, data(), n_projections=3, **kw)
        assert (tmp_path / "ablation.jsonl").read_text() == lines
        return  # with a distance metric it is refused: test_atp_distance_with_other_projections_is_refused
    with pytest.raises(StaleResultsError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ablate_bias(a, data(), **{name: value}, **kw)


def test_options_that_bind_no_row_resume_the_same_rows(models, tmp_path):
    a, _ = models
    kw = dict(kinds=("q", "v"), layers=[1], out=tmp_path, estimate="auto", top_k=1, sample_k=1, progress=False)
    first = ablate_bias(a, data(), **kw)
    lines = (tmp_path / "ablation.jsonl").read_text()
    kw.update(stack=1, reuse_prefix=False, force_exact=True, progress=True, top_k=2, sample_k=0)
    again = ablate_bias(a, data(), **kw)
    assert (tmp_path / "ablation.jsonl").read_text().startswith(lines)  # nothing recomputed (top_k=2: one more)
    assert set(again.options) == set(first.options)
    shared = first.merge(again, on=["layer", "head", "kind", "estimate"], suffixes=("", "_again"))
    assert len(shared) >= 4 and (shared.delta == shared.delta_again).all()


def test_an_option_one_estimate_ignores_is_still_bound_by_the_rows_of_the_other(models, tmp_path):
    """`interp ablate --estimate both --n-control 0`: the attribution rows do not depend on n_control, so their run
    leaves it out of the fingerprint, and the log keeps the exact rows' value: a later exact run with another
    n_control is refused, even after an attribution run opened the log in between."""
    a, _ = models
    kw = dict(kinds=("q",), layers=[0], out=tmp_path, progress=False)
    ablate_bias(a, data(), estimate="attribution", **kw)
    exact = ablate_bias(a, data(), estimate="exact", n_control=0, **kw)
    ablate_bias(a, data(), estimate="attribution", **kw)
    assert json.loads((tmp_path / "ablation.jsonl").read_text().split("\n")[0])["_fingerprint"]["n_control"] == 0
    again = ablate_bias(a, data(), estimate="exact", n_control=0, **kw)  # resumed: the same rows
    pd.testing.assert_frame_equal(again, exact)
    with pytest.raises(StaleResultsError, match="n_control: 0 there, 2 now"):
        ablate_bias(a, data(), estimate="exact", n_control=2, **kw)
