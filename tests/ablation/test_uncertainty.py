"""Ablation uncertainty and controls: bootstrap intervals over items, the random-direction method, and
exact rows on a random sample of heads under estimate="auto"."""

import numpy as np
import pytest
import torch

import interp
from interp.ablation import ablate_bias
from interp.bootstrap import PERCENTILES, Resampler, item_keys, resample_indices
from interp.data import Batch
from interp.errors import StaleResultsError
from interp.record.heads import attention_weights
from interp.record.hooks import hook_name
from interp.models import tiny_hf_model
from interp.record.patching import random_bias


@pytest.fixture(scope="module")
def gpt2():
    return interp.load_model(tiny_hf_model("gpt2", seed=1).double(), device="cpu")


def _items(n, seed=0, pos=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 90, (pos,), generator=g) for _ in range(n)]


def _brute_interval(keys, n_boot, seed, statistic):
    """Percentile interval of ``statistic(indices of the arrived items)`` over the same resamples, redrawn."""
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    idx = np.random.default_rng(seed).integers(0, len(keys), size=(n_boot, len(keys)))
    assert (idx == resample_indices(len(keys), n_boot, seed)).all()
    return np.percentile([statistic(order[row]) for row in idx], PERCENTILES)


def test_resampler_ratio_interval_equals_brute_force_and_ignores_arrival_order():
    rng = np.random.default_rng(5)
    num, den = rng.normal(size=30), rng.integers(1, 9, size=30).astype(float)
    keys = [f"item{rng.integers(1e9)}" for _ in range(30)]
    lo, hi = Resampler(keys, 400, 7).ratio_interval(num, den)
    want = _brute_interval(keys, 400, 7, lambda take: num[take].sum() / den[take].sum())
    np.testing.assert_allclose([lo, hi], want, rtol=1e-12)
    perm = rng.permutation(30)
    again = Resampler([keys[i] for i in perm], 400, 7).ratio_interval(num[perm], den[perm])
    np.testing.assert_allclose(again, [lo, hi], rtol=1e-12)  # the same items in another order: the same interval
    assert lo < num.sum() / den.sum() < hi


def test_delta_interval_equals_brute_force_resampling_of_items(gpt2):
    """Each resample rerun from scratch: ablate_bias on the resampled items (in their own batches) gives
    that resample's delta; the percentiles of those equal delta_lo / delta_hi of one sweep."""
    items = _items(6)
    data = [torch.stack(items[:2]), torch.stack(items[2:])]  # batches of 2 and 4
    kw = dict(kinds=("q",), estimate="exact", n_control=0, progress=False, layers=[0])  # no matched control: deltas
    df = ablate_bias(gpt2, data, n_boot=10, seed=3, **kw)
    keys = [item_keys(Batch(x[None]))[0] for x in items]

    def delta(take):
        return ablate_bias(gpt2, [torch.stack([items[i] for i in take])], n_boot=0, **kw).delta.to_numpy()
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    idx = resample_indices(len(items), 10, 3)
    deltas = np.stack([delta(order[row]) for row in idx])
    lo, hi = np.percentile(deltas, PERCENTILES, axis=0)
    np.testing.assert_allclose(df.delta_lo, lo, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(df.delta_hi, hi, rtol=1e-8, atol=1e-12)
    assert ((df.delta_lo <= df.delta) & (df.delta <= df.delta_hi)).all()  # covers the point estimate
    assert (df.delta_hi > df.delta_lo).all()


def test_delta_interval_shrinks_with_more_items(gpt2):
    kw = dict(kinds=("q",), estimate="exact", n_control=0, progress=False, n_boot=300, seed=0, layers=[0])
    few = ablate_bias(gpt2, [torch.stack(_items(6, seed=1))], **kw)
    many = ablate_bias(gpt2, [torch.stack(_items(48, seed=1))], **kw)
    width = lambda df: (df.delta_hi - df.delta_lo).to_numpy()  # noqa: E731
    assert (width(many) < 0.7 * width(few)).all(), (width(few), width(many))  # ~ 1/sqrt(8) = 0.35 expected
    assert ((many.delta_lo <= many.delta) & (many.delta <= many.delta_hi)).all()


def test_intervals_are_deterministic_given_the_seed(gpt2):
    data = [torch.stack(_items(5))]
    kw = dict(kinds=("v",), estimate="exact", n_control=0, progress=False, layers=[1])
    a, b, c = (ablate_bias(gpt2, data, seed=s, n_boot=50, **kw) for s in (4, 4, 5))
    np.testing.assert_array_equal(a.delta_lo, b.delta_lo)
    assert not np.array_equal(a.delta_lo, c.delta_lo)
    assert ablate_bias(gpt2, data, n_boot=0, **kw).delta_lo.isna().all()  # n_boot=0: no interval


def test_random_bias_has_each_heads_norm_is_reproducible_and_points_anywhere():
    bias = torch.randn(6, 8, dtype=torch.float64) * torch.arange(1, 7, dtype=torch.float64)[:, None]
    r = random_bias(bias, 2, "q", seed=11)
    np.testing.assert_allclose(r.norm(dim=-1), bias.norm(dim=-1), rtol=1e-12)
    assert torch.equal(r, random_bias(bias, 2, "q", seed=11))
    assert not torch.equal(r, random_bias(bias, 2, "q", seed=12))
    assert not torch.equal(r, random_bias(bias, 3, "q", seed=11))
    # over many seeds the direction is uniform: mean cosine with the bias ~ 0 (sd 1/sqrt(8 * 400) = 0.018)
    cos = torch.stack([torch.nn.functional.cosine_similarity(random_bias(bias, 0, "k", s), bias, dim=-1)
                       for s in range(400)])
    assert cos.mean().abs() < 0.01 and (cos.mean(0).abs() < 0.1).all()
    assert cos.var(0).mean().item() == pytest.approx(1 / 8, rel=0.2)  # Var(cos) of a uniform direction: 1/d
    zero = random_bias(torch.zeros(2, 8), 0, "v")
    assert torch.equal(zero, torch.zeros(2, 8))  # an absent bias stays absent


def _hand_nll(model, ids, hooks):
    with torch.no_grad():
        logits = model.run_with_hooks(ids, fwd_hooks=hooks)
    logp = logits[:, :-1].double().log_softmax(-1)
    return float(-logp.gather(-1, ids[:, 1:, None]).mean())


def test_random_method_exact_rows_equal_a_hand_written_replacement_hook(gpt2):
    ids = torch.stack(_items(3, seed=2))
    df = ablate_bias(gpt2, [ids], kinds=("q", "v"), method="random", estimate="exact", seed=9, n_control=0,
                     progress=False)
    base = _hand_nll(gpt2, ids, [])
    for row in df.itertuples():
        layer = int(row.layer)
        b = attention_weights(gpt2, layer).bias(row.kind)
        r = random_bias(b, layer, row.kind, seed=9)

        def replace(t, hook, h=int(row.head), b=b, r=r):
            t = t.clone()
            t[:, :, h] = t[:, :, h] - b[h] + r[h]
            return t
        delta = _hand_nll(gpt2, ids, [(hook_name(layer, row.kind), replace)]) - base
        assert abs(row.delta - delta) <= 1e-6 * max(1.0, abs(delta)), (row, delta)
    assert (df.delta.abs() > 1e-12).all()  # the replacement does act (float64: far above rounding)


def test_random_seed_is_in_the_fingerprint(gpt2, tmp_path):
    data = [torch.stack(_items(2))]
    kw = dict(kinds=("q",), method="random", estimate="exact", n_control=0, progress=False, layers=[0], out=tmp_path)
    ablate_bias(gpt2, data, seed=1, **kw)
    with pytest.raises(StaleResultsError, match="seed"):
        ablate_bias(gpt2, data, seed=2, **kw)


def test_auto_runs_the_top_and_a_seeded_random_sample_exactly(gpt2):
    data = [torch.stack(_items(3))]
    kw = dict(kinds=("q", "v"), estimate="auto", top_k=1, sample_k=2, n_control=0, progress=False)
    df = ablate_bias(gpt2, data, seed=0, **kw)
    exact = df[df.estimate == "exact"]
    assert sorted(exact.exact_because) == ["sample"] * 4 + ["top"] * 2
    assert (df[df.estimate != "exact"].exact_because == "").all()
    per = exact.groupby(["kind", "exact_because"]).size()
    assert (per == [2, 1, 2, 1]).all()
    heads = lambda d, why: set(map(tuple, d[d.exact_because == why][["kind", "layer", "head"]].to_numpy()))  # noqa
    assert not heads(exact, "top") & heads(exact, "sample")
    again = ablate_bias(gpt2, data, seed=0, **kw)
    other = ablate_bias(gpt2, data, seed=1, **kw)
    assert heads(again, "sample") == heads(df, "sample") != heads(other, "sample")


def test_cli_ablate_takes_method_random_seed_n_boot_and_sample_k(tmp_path):
    from interp.cli import main as cli_main
    import pandas as pd
    argv = ["ablate", "--model", "digits-vit", "--data", "digits", "--max-batches", "1", "--kinds", "q",
            "--layers", "0", "--heads", "0,1", "--method", "random", "--seed", "3", "--n-boot", "40",
            "--estimate", "auto", "--top-k", "1", "--sample-k", "1", "--n-control", "0", "--out", str(tmp_path)]
    assert cli_main(argv) == 0
    df = pd.read_csv(tmp_path / "ablation.csv")
    exact = df[df.estimate == "exact"]
    assert sorted(exact.exact_because) == ["sample", "top"] and (df.method == "random").all()
    assert (exact.delta_lo <= exact.delta).all() and (exact.delta <= exact.delta_hi).all()
    header = (tmp_path / "ablation.jsonl").read_text().splitlines()[0]
    assert '"seed": 3' in header and '"n_boot": 40' in header


def test_cli_ablate_control_equals_the_api(tmp_path, capsys):
    """`interp ablate --n-control` writes the API's control columns and prints the band and the call."""
    from interp.cli import main as cli_main
    import pandas as pd
    argv = ["ablate", "--model", "digits-vit", "--data", "digits", "--max-batches", "1", "--kinds", "q,v",
            "--layers", "0", "--heads", "0,1", "--estimate", "exact", "--n-control", "3", "--n-boot", "20",
            "--out", str(tmp_path)]
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert "control_lo" in printed and "bias_dependent" in printed
    cli = pd.read_csv(tmp_path / "ablation.csv")
    model = interp.load_model("digits-vit")
    api = interp.ablate_bias(model, "digits", kinds=("q", "v"), layers=[0], heads=[0, 1], estimate="exact",
                             n_control=3, n_boot=20, max_batches=1, progress=False)
    assert (cli.n_control == 3).all()
    for column in ("delta", "control_lo", "control_hi", "control_p", "displacement_norm"):
        np.testing.assert_allclose(cli[column].to_numpy(), api[column].to_numpy(), rtol=1e-9, atol=1e-12)
    assert cli.bias_dependent.tolist() == api.bias_dependent.tolist() == [False] * len(api)  # 3 draws: p >= 0.25
