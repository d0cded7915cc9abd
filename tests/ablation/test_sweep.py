"""ablate_bias: exact identities, resumable sweeps, and attribution against exact."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

import interp
import interp.ablation.metrics
from interp.ablation import ablate_bias
from interp.record.patching import bias_patch_hooks
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs
from interp.models.loading import clone_model


def lm_batches(family):
    return [tiny_inputs(family, batch=2, pos=8, seed=s) for s in range(2)]


@pytest.mark.parametrize("family", ["gpt2", "bert", "vit", "qwen2"])
def test_zero_k_bias_changes_nothing_except_under_rotary(family):
    # large biases so the rotary effect of b_k is well above rounding on a random model
    model = interp.load_model(tiny_hf_model(family, bias_scale=3.0), device="cpu")
    metric = "next_token_ce" if family in ("gpt2", "qwen2") else ("embedding_cosine" if family == "bert" else "feature_cosine")
    df = ablate_bias(model, lm_batches(family), kinds=("k",), scope="layer", metric=metric, progress=False, estimate="exact",
                     n_control=0)
    if family == "qwen2":
        assert df.delta.abs().max() > 1e-4, df  # b_k is not inert under rotary (>= 10x the tolerance)
    else:
        assert df.delta.abs().max() <= 1e-5, df


@pytest.mark.parametrize("family", ["gpt2", "qwen2", "vit"])
def test_v_fold_is_exact(family):
    model = interp.load_model(tiny_hf_model(family), device="cpu")
    metric = "feature_cosine" if family == "vit" else "next_token_ce"
    df = ablate_bias(model, lm_batches(family), kinds=("v",), scope="head", method="fold", metric=metric, progress=False, estimate="exact")
    assert df.delta.abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["gpt2", "qwen2", "dinov2"])
def test_ablating_every_bias_equals_zeroed_weights(family):
    model = interp.load_model(tiny_hf_model(family), device="cpu")
    info = model.interp
    targets = [(l, h, k) for l in range(info.n_layers) for k in "qkv"
               for h in range(info.n_heads if k == "q" else info.n_kv_heads)]
    x = tiny_inputs(family)
    with torch.no_grad():
        patched = model.run_with_hooks(x, fwd_hooks=bias_patch_hooks(model, targets, "zero"))
        zeroed = clone_model(model)
        for l in range(info.n_layers):
            for k in "qkv":
                lin = getattr(zeroed.blocks[l].attn, k).original_component
                if getattr(lin, "bias", None) is not None:
                    lin.bias.zero_()
        if family == "gpt2":  # GPT-2's fused c_attn is what HF runs; TL splits copies of it
            for blk in zeroed.hf_model.transformer.h:
                blk.attn.c_attn.original_component.bias.zero_()
        reference = zeroed(x)
    assert (patched - reference).abs().max() <= 1e-5
    assert (patched - model(x)).abs().max() > 1e-3  # the ablation did something


def test_mean_method_replaces_b_with_the_content_mean():
    model = interp.load_model(tiny_hf_model("vit").double(), device="cpu")
    x = tiny_inputs("vit").double()
    stats = interp.record_qkv(model, [x], progress=False)
    hooks = bias_patch_hooks(model, [(1, 2, "q")], "mean", stats)
    captured = {}
    grab = ("blocks.1.attn.hook_q", lambda t, hook: captured.setdefault("q", t.clone()))
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        model.run_with_hooks(x, fwd_hooks=hooks + [grab])
    b = interp.attention_weights(model, 1).b_Q
    expected = cache["blocks.1.attn.hook_q"].clone()
    expected[:, :, 2] += -b[2] + stats.mean(1, "q", "content")[2]
    assert (captured["q"] - expected).abs().max() <= 1e-12


def test_sweep_killed_midway_resumes_to_the_same_table(tmp_path):
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    data = lm_batches("gpt2")
    straight = ablate_bias(model, data, kinds=("q", "v"), progress=False, estimate="exact", n_control=2)
    out = tmp_path / "sweep"
    ablate_bias(model, data, kinds=("q", "v"), out=out, progress=False, estimate="exact", n_control=2)
    log = out / "ablation.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:6]) + "\n" + lines[6][:17])  # fingerprint + 5 done, one torn write
    calls = []
    orig = interp.ablation.metrics.run_forward
    interp.ablation.metrics.run_forward = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
    try:
        resumed = ablate_bias(model, data, kinds=("q", "v"), out=out, stack=1, progress=False, estimate="exact",
                              n_control=2)
    finally:
        interp.ablation.metrics.run_forward = orig
    n_variants = len(straight)
    # per batch: the baseline, the round's intact rerun (its block outputs and log-probabilities, streamed), and
    # only the unfinished variants, each with its 2 control draws
    assert len(calls) == len(data) * (1 + 1 + (n_variants - 5) * (1 + 2))
    torch.testing.assert_close(torch.tensor(resumed.control_lo.values), torch.tensor(straight.control_lo.values))
    assert resumed[["layer", "head", "kind"]].equals(straight[["layer", "head", "kind"]])
    torch.testing.assert_close(torch.tensor(resumed.delta.values), torch.tensor(straight.delta.values))
    assert all(json.loads(l) for l in log.read_text().splitlines())
    assert "_fingerprint" in json.loads(log.read_text().splitlines()[0])
    assert (out / "ablation.parquet").exists()


def test_attribution_tracks_exact_on_the_trained_vit():
    model = interp.load_model("digits-vit", device="cpu")
    exact = ablate_bias(model, "digits", kinds=("q", "v"), max_batches=8, progress=False, estimate="exact",
                        n_control=0)  # the control is not what this compares
    approx = ablate_bias(model, "digits", kinds=("q", "v"), estimate="attribution", max_batches=8, progress=False)
    assert (exact.metric == "cross_entropy").all()
    for kind in "qv":
        rho = spearmanr(exact[exact.kind == kind].delta, approx[approx.kind == kind].delta).correlation
        assert rho >= 0.8, (kind, rho)


def test_attribution_refuses_distance_metrics():
    model = interp.load_model(tiny_hf_model("vit"), device="cpu")
    with pytest.raises(InputError, match="gradient at the intact model is zero"):
        ablate_bias(model, [tiny_inputs("vit")], metric="feature_cosine", estimate="attribution", progress=False)


def test_bad_options():
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    data = lm_batches("gpt2")
    with pytest.raises(InputError, match="fold' applies to v only"):
        ablate_bias(model, data, kinds=("q",), method="fold", progress=False, estimate="exact")
    with pytest.raises(InputError, match="scope must be"):
        ablate_bias(model, data, scope="everything", progress=False, estimate="exact")
    with pytest.raises(InputError, match="unknown metric"):
        ablate_bias(model, data, metric="accuracy-ish", progress=False, estimate="exact")
    with pytest.raises(InputError, match="out of range"):
        ablate_bias(model, data, scope=[(7, 0, "q")], progress=False, estimate="exact")


@pytest.mark.parametrize("family", ["gpt2", "vit"])
def test_stacked_variants_equal_one_forward_each(family):
    model = interp.load_model(tiny_hf_model(family), device="cpu")
    data = lm_batches(family)
    metric = "feature_cosine" if family == "vit" else "next_token_ce"
    one = ablate_bias(model, data, kinds=("q", "v"), metric=metric, stack=1, progress=False, estimate="exact",
                      n_control=2)
    many = ablate_bias(model, data, kinds=("q", "v"), metric=metric, stack=5, progress=False, estimate="exact",
                      n_control=2)
    assert (one.delta - many.delta).abs().max() <= 1e-6
    assert (one.control_lo - many.control_lo).abs().max() <= 1e-6  # control draws stack like variants
    fold1 = ablate_bias(model, data, kinds=("v",), method="fold", metric=metric, stack=1, progress=False, estimate="exact")
    fold3 = ablate_bias(model, data, kinds=("v",), method="fold", metric=metric, stack=3, progress=False, estimate="exact")
    assert (fold1.delta - fold3.delta).abs().max() <= 1e-6


def test_identities_answer_without_forwards_and_agree_with_forced_forwards(monkeypatch):
    """b_k under learned positions is answered by the identity (no forward); --force-exact agrees."""
    import interp.ablation.metrics as metrics

    model = interp.load_model(interp.tiny_hf_model("vit", bias_scale=2.0), device="cpu")
    x = interp.tiny_inputs("vit")
    calls = []
    real = metrics.run_forward
    monkeypatch.setattr(metrics, "run_forward", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    fast = interp.ablate_bias(model, [x], kinds=("q", "k", "v"), stack=1, progress=False, estimate="exact",
                              n_control=2)
    k = fast[fast.kind == "k"]
    assert (k.identity == "b_k cancels in the softmax under learned positions").all()
    assert (k.delta == 0).all() and (k.kl == 0).all()
    assert (fast[fast.kind != "k"].identity == "").all()
    # the intact run, the round's intact rerun (streamed prefix), per q and v head one forward and 2 control draws;
    # none for k, whose controls are 0 too
    assert len(calls) == 1 + 1 + 2 * 4 * 2 * (1 + 2)
    assert (k.control_lo == 0).all() and (k.control_hi == 0).all() and (k.n_control == 2).all()
    forced = interp.ablate_bias(model, [x], kinds=("k",), stack=1, force_exact=True, progress=False, estimate="exact")
    assert (forced.identity == "").all() and forced.delta.abs().max() <= 1e-5  # float32 rounding only


def test_no_identity_is_claimed_under_rotary_and_absent_biases_are_said():
    qwen = interp.load_model(interp.tiny_hf_model("qwen2", bias_scale=2.0), device="cpu")
    table = interp.ablate_bias(qwen, [interp.tiny_inputs("qwen2")], kinds=("k",), progress=False, estimate="exact",
                               n_control=0)
    assert (table.identity == "").all() and (table.delta.abs() > 0).any()
    beit = interp.load_model(interp.tiny_hf_model("beit"), device="cpu")
    table = interp.ablate_bias(beit, [interp.tiny_inputs("beit")], kinds=("k",), progress=False, estimate="exact")
    assert (table.identity == "absent bias: nothing to remove").all() and (table.delta == 0).all()
    mean = interp.ablate_bias(beit, [interp.tiny_inputs("beit")], kinds=("k",), method="mean", progress=False, estimate="exact")
    # no k bias to replace by E[XW] either (it used to be replaced, and said inert only because b_k cancels)
    assert (mean.identity == "absent bias: nothing to remove").all() and (mean.delta == 0).all()


@pytest.mark.parametrize("family", ["qwen2", "neox"])
def test_atp_star_recomputes_the_pattern_and_beats_plain_attribution_where_the_softmax_bends(family):
    """Large biases (N(0, 2^2)): AtP* (exact pattern, linear after z) against the exact deltas."""

    model = interp.load_model(interp.tiny_hf_model(family, bias_scale=2.0), device="cpu")
    data = [interp.tiny_inputs(family, batch=4, pos=12, seed=s) for s in range(2)]
    kw = dict(kinds=("q", "k"), force_exact=True, progress=False)
    exact = interp.ablate_bias(model, data, estimate="exact", n_control=0, **kw)  # deltas only: no matched control
    plain = interp.ablate_bias(model, data, estimate="attribution", **kw)
    atp = interp.ablate_bias(model, data, estimate="atp", **kw)
    assert (atp.estimate == "atp").all()
    for kind in "qk":
        e, p, a = (t[t.kind == kind].delta.to_numpy() for t in (exact, plain, atp))
        assert np.abs(a - e).max() <= 0.1 * np.abs(p - e).max(), kind  # an order of magnitude closer
        assert spearmanr(e, a)[0] >= 0.9, kind


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("estimate", ["attribution", "atp"])
def test_linear_rows_are_minus_the_bias_dot_the_hf_models_gradient_of_the_metric_wrt_it(monkeypatch, estimate,
                                                                                          checkpoint):
    """Zeroing b moves a by -b at every position, so the first-order delta is -b . dNLL/db: the HF model's own
    bias gradient, independent of the hooks (every row under attribution, the v rows under AtP*), checkpointed or
    not. Qwen2: grouped keys and values, rotary."""
    import interp.ablation.sweep as sweep

    model = interp.load_model(tiny_hf_model("qwen2", n_layers=2, bias_scale=2.0), device="cpu").to(torch.float64)
    ids = tiny_inputs("qwen2", batch=2, pos=8, seed=0)
    if checkpoint:
        tiled = sweep._tiled_metric
        monkeypatch.setattr(sweep, "_tiled_metric", lambda run: {**tiled(run), "checkpoint": True, "items_per_part": 1})
    table = interp.ablate_bias(model, [ids], kinds=("q", "k", "v"), estimate=estimate, progress=False)
    hf = model.hf_model
    projections = {(i, kind): getattr(layer.self_attn, f"{kind}_proj")
                   for i, layer in enumerate(hf.model.layers) for kind in "qkv"}
    nll = torch.nn.functional.cross_entropy(hf(ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert abs(float(nll) - table.baseline.iloc[0]) < 1e-12
    grads = torch.autograd.grad(nll, [p.bias for p in projections.values()])
    d_head = hf.config.hidden_size // hf.config.num_attention_heads
    linear = "qkv" if estimate == "attribution" else "v"
    for ((layer, kind), projection), grad in zip(projections.items(), grads):
        if kind in linear:
            expected = -(projection.bias.detach().view(-1, d_head) * grad.view(-1, d_head)).sum(-1).numpy()
            got = table[(table.layer == layer) & (table.kind == kind)].sort_values("head").delta.to_numpy()
            assert len(got) == len(expected) and np.abs(expected).max() > 1e-6
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("method", ["zero", "layer_mean", "fold"])
def test_atp_star_v_rows_equal_plain_attribution_from_the_same_backward(method):
    model = interp.load_model(interp.tiny_hf_model("qwen2", bias_scale=2.0), device="cpu")
    data = [interp.tiny_inputs("qwen2", batch=2, pos=8, seed=s) for s in range(2)]
    kw = dict(kinds=("v",) if method == "fold" else ("q", "v"), method=method, progress=False)
    atp = interp.ablate_bias(model, data, estimate="atp", **kw)
    plain = interp.ablate_bias(model, data, estimate="attribution", **kw)
    v = atp.kind == "v"
    np.testing.assert_allclose(atp[v].delta, plain[v].delta, rtol=1e-6, atol=1e-12)
    assert method == "fold" or atp[v].delta.abs().max() > 0


def test_atp_star_refuses_scores_that_are_not_bilinear():
    model = interp.load_model(interp.tiny_hf_model("timm-vit-qknorm"), device="cpu")
    with pytest.raises(InputError, match="estimate='atp' recomputes attention scores.*qk-norm"):
        interp.ablate_bias(model, [interp.tiny_inputs("timm-vit-qknorm")], kinds=("q",), estimate="atp",
                           metric=lambda out, batch: out.sum(), progress=False)


@pytest.mark.parametrize("family", ["beit", "bloom", "falcon-rw"])
def test_the_identity_claim_holds_under_relative_and_alibi_positions(family):
    """'mean' moves b_k by a nonzero E[XW] - b_k: relative position bias and ALiBi are content-free, so the
    forced forwards must agree with the identity's 0. BEiT has no k bias: nothing is moved (said so), and the
    forced forwards, which add 0, agree."""
    model = interp.load_model(interp.tiny_hf_model(family, bias_scale=2.0).double(), device="cpu")
    x = interp.tiny_inputs(family)
    x = x.double() if x.is_floating_point() else x
    kw = dict(kinds=("k",), method="mean", metric=lambda out, batch: out.double().pow(2).mean(), estimate="exact",
              progress=False)
    claimed = interp.ablate_bias(model, [x], **kw)
    forced = interp.ablate_bias(model, [x], force_exact=True, **kw)
    reason = "absent bias" if family == "beit" else "b_k cancels"
    assert claimed.identity.str.startswith(reason).all() and (claimed.delta == 0).all()
    assert forced.delta.abs().max() <= 1e-6 * forced.baseline.abs().max()  # float32 softmax rounding at most


def test_layer_mean_replaces_each_head_bias_by_the_layer_average():
    """The patched q of head h is x W_q[h] + mean over heads of b_q: checked against the hook by hand."""
    model = interp.load_model(interp.tiny_hf_model("vit", bias_scale=2.0), device="cpu")
    x = interp.tiny_inputs("vit")
    b_q = interp.attention_weights(model, 0).b_Q
    store = {}
    hooks = bias_patch_hooks(model, [(0, h, "q") for h in range(4)], "layer_mean")
    grab = ("blocks.0.attn.hook_q", lambda t, hook: store.__setitem__("q", t.detach()))
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        model.run_with_hooks(x, fwd_hooks=hooks + [grab])
    expected = cache["blocks.0.attn.hook_q"] - b_q + b_q.mean(0)
    torch.testing.assert_close(store["q"], expected)
    table = interp.ablate_bias(model, [x], kinds=("q", "k"), method="layer_mean",
                               metric=lambda out, batch: out.pow(2).mean(), progress=False, estimate="exact")
    assert (table[table.kind == "k"].identity != "").all() and (table[table.kind == "q"].delta != 0).any()


def test_interp_ablate_under_torchrun_equals_one_process(tmp_path, run_cli, capsys, torchrun_forked):
    """Each rank runs its share of the variants into its own log; rank 0's merged table is one process's. The ranks
    run under torchrun's elastic agent, forked from this process (``torchrun_forked``)."""
    import pandas as pd

    # 4 exact heads per kind (3 top, 1 drawn), each with 2 control draws: both ranks get exact rows and control
    # draws to shard (the defaults, 5 drawn and 19 draws, ran 320 patched forwards twice for the same property)
    args = ["-m", "interp.cli", "ablate", "--model", "digits-vit", "--data", "digits", "--max-batches", "1",
            "--estimate", "auto", "--top-k", "3", "--sample-k", "1", "--n-control", "2"]
    assert run_cli(args[2:] + ["--out", tmp_path / "one"]) == 0, capsys.readouterr().err[-2000:]  # one thread
    ranks = torchrun_forked(args[2:] + ["--out", tmp_path / "two"])  # one thread a rank: the same float32 sums
    assert sorted(ranks) == [0, 1] and all(code == 0 for code, _, _ in ranks.values()), ranks
    one = pd.read_parquet(tmp_path / "one" / "ablation.parquet")
    two = pd.read_parquet(tmp_path / "two" / "ablation.parquet")
    shares = [pd.read_parquet(tmp_path / "two" / f"rank{r}" / "ablation.parquet") for r in range(2)]
    exact = [s[s.estimate == "exact"] for s in shares]
    assert len(exact[0]) and len(exact[1]) and len(exact[0]) + len(exact[1]) == (one.estimate == "exact").sum()
    pd.testing.assert_frame_equal(two, one, check_exact=False, rtol=1e-7, atol=1e-12)  # float32 model
    # rank 0's manifest lists every file of the command, the other rank's too, each with its hash
    import json

    from interp.io import sha256_file

    files = json.loads((tmp_path / "two" / "manifest.json").read_text())["files"]
    on_disk = {str(p.relative_to(tmp_path / "two")) for p in (tmp_path / "two").rglob("*")
               if p.is_file() and p.name != "manifest.json"}
    assert set(files) == on_disk and {"rank1/ablation.jsonl", "rank1/ablation.parquet"} <= on_disk
    assert all(sha256_file(tmp_path / "two" / name) == digest for name, digest in files.items())


def test_delta_standard_error_equals_the_spread_of_per_item_deltas():
    """delta_se is the standard error over items (clusters of tokens), recomputed here from one
    sweep per sequence: d_i = delta_i n_i, se = sqrt(N/(N-1) sum (d_i - delta n_i)^2) / sum n_i."""
    model = interp.load_model(interp.tiny_hf_model("gpt2"), device="cpu")
    data = lm_batches("gpt2")
    kw = dict(kinds=("q",), estimate="exact", n_control=0, progress=False)  # deltas only: no matched control
    both = ablate_bias(model, data, **kw)
    items = [x[None] for b in data for x in (b.inputs if hasattr(b, "inputs") else b)]
    singles = [ablate_bias(model, [x], **kw) for x in items]
    n = np.array([x.shape[1] - 1 for x in items], dtype=float)  # predicted tokens per item
    d = np.stack([s.delta.to_numpy() for s in singles]) * n[:, None]
    delta = d.sum(0) / n.sum()
    se = np.sqrt(len(n) / (len(n) - 1) * ((d - delta * n[:, None]) ** 2).sum(0)) / n.sum()
    np.testing.assert_allclose(both.delta, delta, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(both.delta_se, se, rtol=1e-4, atol=1e-9)
    assert singles[0].delta_se.isna().all()  # one item: no spread to report


def test_a_model_in_training_mode_with_dropout_is_refused():
    hf = interp.tiny_hf_model("gpt2", seed=0)
    hf.config.attn_pdrop = 0.1
    for module in hf.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    model = interp.load_model(hf, device="cpu")
    model.train()
    batch = interp.tiny_inputs("gpt2", batch=2, pos=8, seed=0)
    for call in (lambda: interp.ablate_bias(model, [batch], kinds=("q",), progress=False, estimate="exact"),
                 lambda: interp.record_qkv(model, [batch], progress=False),
                 lambda: interp.frequency_profile(model, [batch], progress=False)):
        with pytest.raises(interp.InterpError, match=r"model\.eval\(\)"):
            call()
    model.eval()
    a = interp.ablate_bias(model, [batch], kinds=("q",), progress=False, estimate="exact", n_control=0)
    b = interp.ablate_bias(model, [batch], kinds=("q",), progress=False, estimate="exact", n_control=0)
    assert a.delta.tolist() == b.delta.tolist()


def test_training_mode_without_dropout_gives_the_eval_numbers():
    hf = interp.tiny_hf_model("gpt2", seed=0)
    hf.config.attn_pdrop = 0.0
    for module in hf.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model = interp.load_model(hf, device="cpu")
    batch = interp.tiny_inputs("gpt2", batch=2, pos=8, seed=0)
    evaluated = interp.ablate_bias(model, [batch], kinds=("q",), progress=False, estimate="exact", n_control=0)
    model.train()
    trained = interp.ablate_bias(model, [batch], kinds=("q",), progress=False, estimate="exact", n_control=0)
    assert trained.delta.tolist() == evaluated.delta.tolist()


def test_bfloat16_deltas_below_rounding_are_flagged():
    model = interp.load_model(interp.tiny_hf_model("gpt2", seed=0, bias_scale=1e-4), device="cpu", dtype=torch.bfloat16)
    batch = interp.tiny_inputs("gpt2", batch=2, pos=8, seed=0)
    df = interp.ablate_bias(model, [batch], kinds=("q", "v"), progress=False, estimate="exact", n_control=0)
    eps = torch.finfo(torch.bfloat16).eps
    assert (df.below_rounding == (df.delta.abs() < eps * df.baseline.abs())).all()
    assert df.below_rounding.any()  # biases of 1e-4 change the loss by far less than bfloat16 resolves
    full = interp.ablate_bias(interp.load_model(interp.tiny_hf_model("gpt2", seed=0, bias_scale=1e-4), device="cpu"),
                              [batch], kinds=("q", "v"), progress=False, estimate="exact", n_control=0)
    assert not full.below_rounding.any()  # float32: no flag


def test_atp_star_reads_gpt2_inverse_layer_scaling():
    """AtP* recomputes each pattern with the layer's own score factor: 1/(sqrt(d) (l + 1)) under
    scale_attn_by_inverse_layer_idx (it divided by sqrt(d) only: layer-1 estimates off ~2x)."""
    hf = interp.tiny_hf_model("gpt2", n_layers=3, bias_scale=8.0, seed=1)
    hf.config.scale_attn_by_inverse_layer_idx = True
    for block in hf.transformer.h:
        block.attn.scale_attn_by_inverse_layer_idx = True
    model = interp.load_model(hf.double(), device="cpu")
    data = [interp.tiny_inputs("gpt2", batch=4, pos=12, seed=s) for s in range(2)]
    exact = interp.ablate_bias(model, data, kinds=("q",), estimate="exact", n_control=0, progress=False)
    atp = interp.ablate_bias(model, data, kinds=("q",), estimate="atp", progress=False)
    ratio = (atp.delta / exact.delta).groupby(atp.layer).median()  # 2.0 at layer 1, 3.0 at layer 2 before
    np.testing.assert_allclose(ratio, 1.0, atol=0.05)


def test_merge_shards_refuses_another_analyzers_table():
    import pandas as pd

    profile = pd.DataFrame(dict(layer=[0, 0], head=[0, 1], position=["first", "first"], mass=[0.5, 0.2]))
    with pytest.raises(InputError, match=r"merge_shards takes tables of interp\.ablate_bias\(model.*frame 0 lacks kind"):
        interp.merge_shards([profile, profile])


def _counting_forwards(monkeypatch):
    """The sweep's forwards, counted; recording means (a forward per batch of its own) fails the test."""
    import interp.ablation.metrics as metrics
    import interp.ablation.sweep as sweep

    calls = []
    real = metrics.run_forward
    monkeypatch.setattr(metrics, "run_forward", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    monkeypatch.setattr(sweep, "record_qkv", lambda *a, **k: pytest.fail("means recorded for absent biases"))
    return calls


def _said_absent_without_forwards(table, n_control):
    assert (table.identity == "absent bias: nothing to remove").all(), table.identity
    assert (table.delta == 0).all() and (table.ablated == table.baseline).all() and (table.kl == 0).all()
    assert (table.displacement_norm == 0).all()  # the columns of any identity row: controls of 0, p = 1
    assert (table.control_lo == 0).all() and (table.control_hi == 0).all() and (table.n_control == n_control).all()
    assert (table.control_p == 1).all() and not table.bias_dependent.astype(bool).any()


@pytest.mark.parametrize("method", ["mean", "layer_mean", "random", "zero"])
def test_every_method_reports_an_absent_bias_as_such_without_a_forward(monkeypatch, method):
    """SmolLM2's architecture (tiny llama): no q, k, v bias. "mean" used to shift it by E[XW] and report an
    effect on a head that has no bias; now every method is answered by the identity: delta 0, no patched forward,
    no means recorded."""
    llama = interp.load_model(interp.tiny_hf_model("llama"), device="cpu")
    data = lm_batches("llama")
    calls = _counting_forwards(monkeypatch)
    table = ablate_bias(llama, data, kinds=("q", "k", "v"), method=method, progress=False, estimate="exact",
                        n_control=3)
    assert len(table) == 2 * (4 + 2 + 2) and len(calls) == len(data)  # every variant; the intact run only
    _said_absent_without_forwards(table, 3)


@pytest.mark.slow
def test_smollm2_mean_ablation_is_zero_without_forwards(monkeypatch):
    smol = interp.load_model("smollm2-135m")
    data = interp.builtin_batches(smol, "python-docs", batch_size=2, n=4, seq_len=16)
    calls = _counting_forwards(monkeypatch)
    table = ablate_bias(smol, data, kinds=("q", "k", "v"), method="mean", layers=[0, 14, 29], heads=[0, 2],
                        progress=False, estimate="exact", n_control=2)
    assert len(table) == 3 * 3 * 2 and len(calls) == len(data)
    _said_absent_without_forwards(table, 2)


def test_a_zero_displacement_needs_no_forward_and_a_real_one_runs(monkeypatch):
    """A present bias of zeros (bias_scale 0) is moved by 0 under "zero": its rows are said without a forward.
    Under "mean" the same heads move by E[XW] (not 0) and run, with their control draws."""
    gpt2 = interp.load_model(interp.tiny_hf_model("gpt2", bias_scale=0.0), device="cpu")
    assert interp.bias_spec(gpt2).present.all() and (interp.bias_spec(gpt2).query("kind != 'o'").norm == 0).all()
    data = lm_batches("gpt2")
    import interp.ablation.metrics as metrics

    calls = []
    real = metrics.run_forward
    monkeypatch.setattr(metrics, "run_forward", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    zero = ablate_bias(gpt2, data, kinds=("q", "v"), method="zero", progress=False, estimate="exact", n_control=2)
    assert (zero.identity.str.startswith("zero displacement")).all() and (zero.delta == 0).all()
    assert (zero.displacement_norm == 0).all() and (zero.control_p == 1).all() and len(calls) == len(data)
    mean = ablate_bias(gpt2, data, kinds=("q", "v"), method="mean", progress=False, estimate="exact", n_control=2)
    assert (mean.identity == "").all() and (mean.displacement_norm > 0).all() and (mean.delta != 0).all()


def test_a_non_finite_intact_metric_names_its_cause():
    """The intact metric's NaN is refused with its likely cause: no counted position (every item a single real
    token), or the model's own output at the items named (a float64 Qwen2 whose sliding window is shorter than the
    padding: HF's eager attention leaves NaN at fully masked padded queries and the next layer spreads it)."""
    ids = tiny_inputs("qwen2", batch=3, pos=10, seed=0)
    plain = interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu")
    one_token = torch.zeros_like(ids)
    one_token[:, 0] = 1
    keywords = dict(kinds=("q",), estimate="exact", n_control=1, progress=False)
    with pytest.raises(InputError, match="no unit is counted.*at least two real tokens"):
        interp.ablate_bias(plain, [interp.Batch(ids, one_token)], **keywords)
    windowed = interp.load_model(tiny_hf_model("qwen2", n_layers=3, config={
        "sliding_window": 3, "use_sliding_window": True, "max_window_layers": 0}), device="cpu").to(torch.float64)
    padded = torch.ones_like(ids)
    padded[0, 7:] = 0
    padded[2, 4:] = 0
    with pytest.raises(InputError, match=r"model's own output is not finite at items 0, 2 .*sliding window"):
        interp.ablate_bias(windowed, [interp.Batch(ids, padded)], **keywords)
    unpadded = interp.ablate_bias(windowed, [interp.Batch(ids)], **keywords)  # the same model without padding
    assert np.isfinite(unpadded["baseline"]).all()


def test_waiting_stacks_are_copied_into_one_buffer_that_each_pass_frees(monkeypatch):
    """The exact stage's stacked forwards wait for one pass over the vocabulary (``_Waiting``): their final hidden
    states are copied into one buffer, so no forward's own output is kept among the next forward's temporaries;
    the pass gives each stack ``patched_stacks``' numbers on the original states bit for bit, and the next states
    fill the same buffer again. A stack larger than the first is kept as it is; the buffer holds no more stacks
    than the round runs."""
    import gc
    import weakref
    from types import SimpleNamespace

    import interp.ablation.logits as logits
    import interp.ablation.sweep as sweep
    from interp.data import Batch
    from interp.record.hooks import block_hook

    model = interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu")
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    batch = Batch(tiny_inputs("qwen2", batch=2, pos=10, seed=0), mask)
    kept = {}
    with torch.no_grad():
        out, _ = interp.ablation.metrics.run_forward(
            model, batch, [(block_hook(1, "hook_out"), lambda t, hook: kept.update(h=t))], False)
    unembedding = logits.linear_unembedding(model, kept["h"], out)
    intact = logits.intact_logits(model, kept["h"], batch, unembedding)
    per_stack = kept["h"].numel() * 4
    # the pass runs once three one-variant stacks wait (the limit lies between two and three stacks' bytes)
    monkeypatch.setattr(sweep, "WAITING_SHARE", 2.5 * per_stack / (len(intact.rows) * intact.vocab * 4))
    waiting = sweep._Waiting(SimpleNamespace(model=model, unembedding=unembedding), intact, n_stacks=5)
    g = torch.Generator().manual_seed(0)
    states = [kept["h"] + 0.1 * torch.randn(kept["h"].shape, generator=g) for _ in range(4)]
    originals = [s.clone() for s in states]
    job = SimpleNamespace(draw=-1)
    assert waiting.add([job], states[0]) == [] and waiting.add([job], states[1]) == []
    buffer = waiting.buffer.untyped_storage().data_ptr()
    assert all(o.untyped_storage().data_ptr() == buffer for _, o in waiting.stacks)  # copies, not the outputs
    gone = weakref.ref(states[0])
    states[0] = None
    gc.collect()
    assert gone() is None  # the forward's own output is not held
    done = waiting.add([job], states[2])  # the third reaches the limit: the pass runs
    want = logits.patched_stacks(model, unembedding, [(o, 1) for o in originals[:3]], intact)
    assert len(done) == 3 and waiting.used == 0
    for (_, got), expected in zip(done, want):
        assert torch.equal(got[0][0], expected[0][0]) and torch.equal(got[0][1], expected[0][1])
    assert waiting.add([job], states[3]) == []
    assert waiting.stacks[0][1].untyped_storage().data_ptr() == buffer  # the same buffer, refilled
    larger = torch.cat([states[3]] * 3)  # a stack of three variants: past the buffer's room
    assert waiting._keep(larger) is larger
    assert waiting.buffer.numel() == 3 * kept["h"].numel()  # the limit's room and one more stack
    short = sweep._Waiting(SimpleNamespace(model=model, unembedding=unembedding), intact, n_stacks=1)
    short.add([job], originals[0])
    assert short.buffer.numel() == kept["h"].numel()  # a round of one stacked forward: room for one
