"""The second-order estimate of distance metrics (atp_distance) and estimate='auto'."""

import pytest
import torch
from scipy.stats import spearmanr

import interp
from interp.ablation import ablate_bias
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs
from interp.models.loading import clone_model

CASES = [("vit", "feature_cosine"), ("dinov2", "feature_cosine"), ("bert", "embedding_cosine")]


def model_and_data(family):
    # biases large enough that each head's effect stands well above float64 rounding
    model = clone_model(interp.load_model(tiny_hf_model(family, n_layers=3, bias_scale=3.0), device="cpu"),
                        torch.float64)
    return model, [tiny_inputs(family, batch=4, seed=s) for s in range(2)]


@pytest.mark.parametrize("family,metric", CASES)
def test_atp_distance_ranks_heads_like_the_exact_sweep(family, metric):
    model, data = model_and_data(family)
    # the exact deltas alone are compared: no matched control (19 more forwards per head, a property of its own)
    exact = ablate_bias(model, data, kinds=("q", "v"), metric=metric, progress=False, estimate="exact", n_control=0)
    est = ablate_bias(model, data, kinds=("q", "v"), metric=metric, estimate="atp_distance",
                      n_projections=32, progress=False)
    assert (est.estimate == "atp_distance").all() and (est.delta <= 0).all()  # a cosine to the intact run only falls
    for kind in "qv":
        e, a = exact[exact.kind == kind].delta, est[est.kind == kind].delta
        assert spearmanr(e, a).statistic >= 0.85, (kind, e.values, a.values)
        assert 0.7 <= a.sum() / e.sum() <= 1.5  # the right size, not only the right order


def test_first_order_estimates_still_refuse_distance_metrics_and_atp_distance_refuses_task_metrics():
    model, data = model_and_data("vit")
    with pytest.raises(InputError, match="atp_distance"):
        ablate_bias(model, data, metric="feature_cosine", estimate="atp", progress=False)
    lm = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    with pytest.raises(InputError, match="distance metrics"):
        ablate_bias(lm, [tiny_inputs("gpt2")], metric="next_token_ce", estimate="atp_distance", progress=False)
    with pytest.raises(InputError, match="top_k"):
        ablate_bias(lm, [tiny_inputs("gpt2")], estimate="auto", top_k=-1, progress=False)


@pytest.mark.parametrize("family,metric,first", [("vit", "feature_cosine", "atp_distance"),
                                                 ("qwen2", "next_token_ce", "atp")])
def test_auto_estimates_every_head_then_runs_the_top_k_per_kind_exactly(family, metric, first):
    model, data = model_and_data(family)
    # which heads run exactly and their deltas are the property: no matched control (19 forwards a head)
    auto = ablate_bias(model, data, metric=metric, estimate="auto", top_k=2, sample_k=0, n_control=0, progress=False)
    estimated, exact = auto[auto.estimate == first], auto[auto.estimate == "exact"]
    assert set(auto.estimate) == {first, "exact"}
    n_variants = model.interp.n_layers * (model.interp.n_heads + 2 * model.interp.n_kv_heads)
    assert len(estimated) == n_variants
    runnable = estimated[estimated.identity == ""]
    for kind, rows in runnable.groupby("kind"):
        top = rows.assign(a=rows.delta.abs()).nlargest(2, "a")[["layer", "head"]].values.tolist()
        assert sorted(exact[exact.kind == kind][["layer", "head"]].values.tolist()) == sorted(top)
    assert set(exact.kind) == set(runnable.kind)  # b_k answered by identity under learned positions is not rerun
    direct = ablate_bias(model, data, metric=metric, progress=False, estimate="exact", n_control=0).set_index(
        ["layer", "head", "kind"]).delta
    got = exact.set_index(["layer", "head", "kind"]).delta
    assert (got - direct.loc[got.index]).abs().max() <= 1e-12


@pytest.mark.parametrize("items,checkpoint", [(1, False), (3, False), (1, True)])
@pytest.mark.parametrize("family,metric", [("dinov2", "feature_cosine"), ("bert", "embedding_cosine")])
def test_atp_distance_in_parts_of_items_equals_whole_batches(monkeypatch, family, metric, items, checkpoint):
    """Each projection is a sum over items and no item's activations reach another's, so its estimate in parts of
    ``items`` items (blocks recomputed in the backward or not) adds up to the whole batch's: the rows equal those
    of whole batches (float64, 1e-10 relative)."""
    import interp.ablation.sweep as sweep

    model, data = model_and_data(family)
    keywords = dict(kinds=("q", "k", "v"), metric=metric, estimate="atp_distance", n_projections=4, progress=False)
    monkeypatch.setattr(sweep, "estimate_items", lambda model, inputs, checkpoint=None: int(inputs.shape[0]))
    monkeypatch.setattr(sweep, "estimate_checkpoint", lambda model, inputs: False)
    whole = ablate_bias(model, data, **keywords)
    monkeypatch.setattr(sweep, "estimate_items", lambda model, inputs, checkpoint=None: items)
    monkeypatch.setattr(sweep, "estimate_checkpoint", lambda model, inputs: checkpoint)
    parts = ablate_bias(model, data, **keywords)
    assert (whole.delta.abs() > 0).any()
    torch.testing.assert_close(torch.tensor(parts.delta.values), torch.tensor(whole.delta.values),
                               rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("family,metric", [("dinov2", "feature_cosine"), ("bert", "embedding_cosine")])
def test_checkpointed_atp_takes_each_layers_dz_as_its_block_passes(monkeypatch, family, metric):
    """With the blocks recomputed in the backward, each layer's (A' - A) V is taken in the forward as soon as that
    layer's q, k, v, pattern and z have passed, whichever the bridge fires first (DINOv2: z before the pattern), so
    the cache never holds more than one layer's reads; after the backward nothing is left to take."""
    import interp.ablation.attribution as attribution
    import interp.ablation.sweep as sweep

    model, data = model_and_data(family)
    seen, real = [], attribution._pattern_dz

    def counted(model, cache, sites, shift):
        seen.append((torch.is_grad_enabled(), len(cache), sorted({layer for layer, _ in sites})))
        return real(model, cache, sites, shift)

    monkeypatch.setattr(attribution, "_pattern_dz", counted)
    monkeypatch.setattr(sweep, "estimate_items", lambda model, inputs, checkpoint=None: 1)
    monkeypatch.setattr(sweep, "estimate_checkpoint", lambda model, inputs: True)
    ablate_bias(model, data, kinds=("q", "k", "v"), metric=metric, estimate="atp_distance", n_projections=2,
                progress=False)
    taken = [(n, layers) for _, n, layers in seen if layers]
    assert taken and all(n == 4 and len(layers) == 1 for n, layers in taken)  # one layer's q, k, v and pattern
    items = 2 * 4  # model_and_data: two batches of four, one item a part
    assert sorted(layers[0] for _, layers in taken) == sorted(list(range(model.interp.n_layers)) * items)


def test_the_backward_returns_per_head_sums_not_the_activations_gradients(monkeypatch):
    """The estimate asks autograd for small float64 probes ([kind, head] per layer at z, [head] per linear site),
    whose gradients are the per-head sums: never for a [batch, pos, head, d_head] gradient, which per projection
    and per node were all held until the backward ended."""
    import interp.ablation.attribution as attribution

    model, data = model_and_data("dinov2")
    info, requested = model.interp, []
    real = attribution._metric_grads

    def spy(out, hidden, ref, batch, values, nodes):
        requested.extend((tuple(n.shape), n.dtype) for n in nodes)
        return real(out, hidden, ref, batch, values, nodes)

    monkeypatch.setattr(attribution, "_metric_grads", spy)
    table = ablate_bias(model, data, kinds=("q", "k", "v"), metric="feature_cosine", estimate="atp_distance",
                        n_projections=2, progress=False)
    assert (table.delta.abs() > 0).any()
    assert requested and {dtype for _, dtype in requested} == {torch.float64}
    # per forward: one [kinds, head] probe per layer at z (q, and k where it is not inert), one [head] per v site
    assert all(shape in {(1, info.n_heads), (2, info.n_heads), (info.n_heads,)} for shape, _ in requested)
    assert sum(len(shape) == 2 for shape, _ in requested) == sum(len(shape) == 1 for shape, _ in requested)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_projections_backward_a_few_at_a_time_give_the_deltas_of_all_at_once(monkeypatch, checkpoint):
    """The projections' gradients come from batched backwards of ``PROJECTIONS_PER_BACKWARD`` (the last one
    shorter), each recomputing the checkpointed blocks where they are: the same deltas as one backward of all."""
    import interp.ablation.attribution as attribution
    import interp.ablation.sweep as sweep

    model, data = model_and_data("dinov2")
    monkeypatch.setattr(sweep, "estimate_checkpoint", lambda model, inputs: checkpoint)
    backwards = []
    real = torch.autograd.grad

    def counted(*args, **kwargs):
        backwards.append(kwargs["grad_outputs"].shape[0] if kwargs.get("is_grads_batched") else 1)
        return real(*args, **kwargs)

    keywords = dict(kinds=("q", "k", "v"), metric="feature_cosine", estimate="atp_distance", n_projections=5,
                    progress=False)
    tables = {}
    for per_backward in (5, 2):
        monkeypatch.setattr(attribution, "PROJECTIONS_PER_BACKWARD", per_backward)
        backwards.clear()
        with monkeypatch.context() as patched:
            patched.setattr(torch.autograd, "grad", counted)
            tables[per_backward] = ablate_bias(model, data, **keywords)
        forwards = len(backwards) // (1 if per_backward == 5 else 3)
        assert backwards == ([5] if per_backward == 5 else [2, 2, 1]) * forwards and forwards >= len(data)
    assert (tables[5].delta.abs() > 0).any()
    torch.testing.assert_close(torch.tensor(tables[2].delta.values), torch.tensor(tables[5].delta.values),
                               rtol=1e-12, atol=0)
