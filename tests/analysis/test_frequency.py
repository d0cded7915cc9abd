"""Frequency profiles: known gratings, attention distance vs HF, planted local/global heads."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf
from sklearn.metrics import adjusted_rand_score
from torch.utils._python_dispatch import TorchDispatchMode

import interp
from interp.analysis.frequency import bin_spectrum, cluster_heads, frequency_profile, head_spectrum, radial_bins
from interp.models import tiny_hf_model


@pytest.mark.parametrize("cycles", [1, 3, 5, 7])
def test_grating_lands_in_its_radial_bin(cycles):
    n = 16
    rows, cols = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    grating = torch.cos(2 * math.pi * cycles * cols / n).double()  # cycles/patch = cycles / 16
    z = grating.reshape(1, n * n, 1, 1) + 1.0  # a DC term too
    bins, hf = bin_spectrum(head_spectrum(z, (n, n)), n_bins=8)
    expected = math.ceil((cycles / n) / 0.5 * 8) - 1
    assert int(torch.nanmean(bins, 0).nan_to_num(-1e9).argmax()) == expected
    assert (hf[0] > 0.3) == (cycles / n > 0.25)


def test_radial_bins_cover_up_to_nyquist():
    idx, r = radial_bins((16, 16), 8)
    assert (idx[r == 0] == -1).all() and set(idx[(r > 0) & (r <= 0.5)].unique().tolist()) == set(range(8))


def test_mean_attention_distance_equals_hf_output_attentions():
    hf = tiny_hf_model("vit")
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        attns = hf(pixel_values=x, output_attentions=True).attentions
    model = interp.load_model(hf, device="cpu")
    prof = frequency_profile(model, [x], progress=False).set_index(["layer", "head"])
    # independent: loops, numpy, patch centres in pixels
    grid, patch = 4, 8
    centres = np.array([((i // grid + 0.5) * patch, (i % grid + 0.5) * patch) for i in range(grid * grid)])
    dist = np.sqrt(((centres[:, None] - centres[None]) ** 2).sum(-1))
    for layer, a in enumerate(attns):
        a = a.numpy().astype(np.float64)[:, :, 1:, 1:]
        for h in range(a.shape[1]):
            expected = np.mean([(a[b, h] * dist).sum(-1).mean() for b in range(a.shape[0])])
            assert prof.loc[(layer, h)].mean_attention_distance == pytest.approx(expected, rel=1e-5)


class _LargestFloat64(TorchDispatchMode):
    """The number of elements of the largest float64 tensor any torch operation returns inside it."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.largest = max(self.largest, t.numel())
        return out


def test_vit_terms_are_the_whole_batch_sums_bit_for_bit_from_one_items_float64_pattern_at_a_time():
    """The per-layer sums of a ViT batch (pixel distance, sink mass, entropy) equal the whole-batch float64
    formulas exactly, while no float64 tensor larger than one item's pattern is formed (a whole batch's, and its
    products, grew glibc's heap at its defaults)."""
    import interp.analysis.frequency as frequency

    model = interp.load_model(tiny_hf_model("vit"), device="cpu")
    info, b = model.interp, 3
    n = 1 + 8 * 8  # the class token and an 8 x 8 grid of 8-pixel patches: a 64 x 64 image
    pattern = torch.rand(b, info.n_heads, n, n, generator=torch.Generator().manual_seed(0))
    pattern[:, :, :, 3] = 0.0  # zeros: -p log p is 0 there
    z = torch.randn(b, n, info.n_heads, info.d_head, generator=torch.Generator().manual_seed(1))

    with _LargestFloat64() as seen:
        got = frequency._vision_terms(info, z, pattern, (64, 64))
    assert 0 < seen.largest <= pattern[0].numel()
    whole = pattern.double()  # the formulas over the whole batch, by hand
    grid = torch.stack(torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij"), -1).flatten(0, 1)
    distances = torch.cdist((grid.double() + 0.5) * 8, (grid.double() + 0.5) * 8)
    assert torch.equal(got["dist"], (whole[:, :, 1:, 1:] * distances).sum((-1, -2)).sum(0))
    assert torch.equal(got["sink"], whole[:, :, 1:, :1].sum((-1, -2)).sum(0))
    assert torch.equal(got["ent"], -(whole * whole.clamp(min=1e-300).log()).sum((-1, -2)).sum(0))
    assert got["n_query"] == b * (n - 1) and got["n_rows"] == b * n


def test_text_terms_are_the_whole_batch_sums_from_one_sequences_float64_pattern_at_a_time():
    """A language model's per-layer sums (token distance, first real token's mass, entropy; real queries only,
    left padding) equal the whole-batch float64 formulas, summed in another order (1e-12), while no float64 tensor
    larger than one sequence's pattern is formed."""
    import interp.analysis.frequency as frequency

    b, heads, n, d_head = 3, 4, 40, 8
    pattern = torch.rand(b, heads, n, n, generator=torch.Generator().manual_seed(0)).tril()
    pattern[:, :, :, 5] = 0.0
    z = torch.randn(b, n, heads, d_head, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, :7] = 0  # left padding

    with _LargestFloat64() as seen:
        got = frequency._text_terms(z, pattern, mask)
    assert 0 < seen.largest <= pattern[0].numel()
    whole, real = pattern.double(), mask[:, None, :].double()  # the formulas over the whole batch, by hand
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    first = torch.tensor([0, 7, 0])
    expected = dict(dist=((whole * distance).sum(-1) * real).sum((0, 2)),
                    sink=(whole[torch.arange(b), :, :, first] * real).sum((0, 2)),
                    ent=(-(whole * whole.clamp(min=1e-300).log()).sum(-1) * real).sum((0, 2)))
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-12, atol=0, msg=key)
    assert got["n_query"] == got["n_rows"] == b * n - 7


def planted_vit(local_heads=(0, 1), beta=6.0, n_heads=4):
    """A ViT whose attention is set by position alone: some heads local, the rest uniform."""
    d_head, grid, patch = 8, 16, 4
    d = n_heads * d_head
    cfg = tf.ViTConfig(hidden_size=d, num_hidden_layers=2, num_attention_heads=n_heads, intermediate_size=d,
                       image_size=grid * patch, patch_size=patch, qkv_bias=True, attn_implementation="eager")
    hf = tf.ViTModel(cfg, add_pooling_layer=False).eval()
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    r, c = rows.flatten().double(), cols.flatten().double()
    code = []
    for theta in (math.pi / 16, math.pi / 8):
        code += [torch.cos(theta * r), torch.sin(theta * r), torch.cos(theta * c), torch.sin(theta * c)]
    code = torch.stack(code, -1)  # [256, 8]
    pos = torch.zeros(1, grid * grid + 1, d)
    for h in range(n_heads):
        pos[0, 1:, h * d_head:(h + 1) * d_head] = code.float()
    with torch.no_grad():
        for p in hf.parameters():
            p.zero_()
        hf.embeddings.position_embeddings.copy_(pos)
        for blk in hf.layers:
            for ln in (blk.layernorm_before, blk.layernorm_after):
                ln.weight.fill_(1.0)
            for h in range(n_heads):
                sl = slice(h * d_head, (h + 1) * d_head)
                blk.attention.v_proj.weight[sl, sl] = torch.eye(d_head)
                if h in local_heads:
                    blk.attention.q_proj.weight[sl, sl] = beta * torch.eye(d_head)
                    blk.attention.k_proj.weight[sl, sl] = beta * torch.eye(d_head)
        hf.layernorm.weight.fill_(1.0)
    return hf


def test_planted_local_and_uniform_heads_are_separated():
    model = interp.load_model(planted_vit(), device="cpu")
    x = torch.randn(2, 3, 64, 64)
    prof = frequency_profile(model, [x], progress=False)
    clustered = cluster_heads(prof)
    truth = [int(h in (0, 1)) for h in clustered["head"]]
    assert adjusted_rand_score(truth, clustered.cluster) >= 0.9
    local, uniform = prof[prof["head"].isin([0, 1])], prof[~prof["head"].isin([0, 1])]
    assert local.hf_ratio.min() > uniform.hf_ratio.max()
    assert local.mean_attention_distance.max() < uniform.mean_attention_distance.min()
    # cluster 0 is the most low-pass family: the uniform heads
    assert set(clustered[clustered.cluster == 0]["head"]) == {2, 3}
    agg = cluster_heads(prof, k=2, method="agglomerative")
    assert adjusted_rand_score(truth, agg.cluster) >= 0.9


def test_six_local_and_six_global_heads_are_two_families_beyond_the_null():
    model = interp.load_model(planted_vit(local_heads=(0, 1, 2), n_heads=6), device="cpu")
    prof = frequency_profile(model, [torch.randn(2, 3, 64, 64)], progress=False)
    clustered = cluster_heads(prof)
    assert clustered.structure.all() and (clustered.k == 2).all() and (clustered.p_value <= 0.05).all()
    truth = [int(h in (0, 1, 2)) for h in clustered["head"]]
    assert adjusted_rand_score(truth, clustered.cluster) == 1.0


@pytest.mark.parametrize("family", ["gpt2", "vit"])
def test_random_init_heads_are_one_family(family):
    """A tiny random-init model's heads differ consistently (the Gaussian null may reject) but by nothing
    visible (hf_ratio 0.0009 vs 0.000001, distances within 0.2%): standardised, that gave k=2 at silhouette
    0.77; the separation makes it one family (real shapes: tests/analysis/test_frequency_families.py)."""
    hf = tiny_hf_model(family, n_layers=4, n_heads=6, d_head=8, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 32, 32, generator=g) if family == "vit" else torch.randint(0, 97, (4, 32), generator=g)
    prof = frequency_profile(interp.load_model(hf, device="cpu"), [x], progress=False)
    clustered = cluster_heads(prof)
    assert not clustered.structure.any() and (clustered.k == 1).all() and (clustered.cluster == 0).all()
    assert (clustered.separation < 1).all() and clustered.silhouette.isna().all()
    forced = cluster_heads(prof, k=2)  # asked for: given, with the same p-value
    forced19 = cluster_heads(prof, k=2, n_null=19)
    assert (forced.k == 2).all() and forced.p_value.iloc[0] == clustered.p_value.iloc[0]
    # numpy numbers are numbers: the same table (k=np.int64(3) was "must lie in 2..23; got 3")
    pd.testing.assert_frame_equal(cluster_heads(prof, k=np.int64(2), alpha=np.float64(0.05), n_null=np.int32(19),
                                                seed=np.int64(0)), forced19)


def test_lm_profile_in_tokens():
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    ids = torch.randint(0, 97, (2, 16))
    prof = frequency_profile(model, [ids], progress=False)
    assert (prof.distance_unit == "tokens").all()
    assert ((prof.sink_mass >= 0) & (prof.sink_mass <= 1)).all()
    # causal attention: mean distance at most the mean of i over queries
    assert (prof.mean_attention_distance <= 7.5 + 1e-9).all()


def test_frequency_shift_under_q_ablation_runs_and_is_zero_for_k():
    from interp.analysis.frequency import frequency_shift_under_ablation

    model = interp.load_model(tiny_hf_model("vit"), device="cpu")
    x = torch.randn(2, 3, 32, 32)
    k = frequency_shift_under_ablation(model, [x], kinds=("k",), progress=False)
    assert k.delta_mean_attention_distance.abs().max() < 1e-4  # b_k is inert without rotary
    q = frequency_shift_under_ablation(model, [x], kinds=("q",), progress=False)
    assert q.delta_mean_attention_distance.abs().max() > 1e-4


def test_a_profile_with_nan_features_is_refused():
    import pandas as pd
    profile = pd.DataFrame(dict(layer=[0, 0, 1, 1], head=[0, 1, 0, 1], hf_ratio=[0.1, float("nan"), 0.2, 0.3],
                                mean_attention_distance=[1.0, 2, 3, 4], entropy=[1.0, 1, 1, 1], sink_mass=[0.1] * 4))
    with pytest.raises(interp.InterpError, match="NaN or infinite values in \\['hf_ratio'\\]"):
        cluster_heads(profile)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_spectral_bin_with_nan_or_inf_is_refused_not_dropped(bad):
    """The earlier release read NaN as 0 and dropped a bin that was NaN for every head without a word."""
    rng = np.random.default_rng(0)
    profile = pd.DataFrame(dict(layer=np.repeat([0, 1, 2], 4), head=np.tile(range(4), 3),
                                hf_ratio=rng.random(12), mean_attention_distance=rng.random(12) * 10,
                                entropy=rng.random(12), sink_mass=rng.random(12)))
    for i in range(3):
        profile[f"bin_{i}"] = rng.standard_normal(12)
    assert (cluster_heads(profile, n_null=19).n_features == 7).all()
    profile["bin_1"] = bad  # every head: the old code dropped it as a constant column
    with pytest.raises(interp.InterpError, match="\\['bin_1'\\]"):
        cluster_heads(profile, n_null=19)
    profile["bin_1"] = rng.standard_normal(12)
    profile.loc[3, "bin_2"] = bad  # one head: the old code read NaN as 0
    with pytest.raises(interp.InterpError, match="\\['bin_2'\\]"):
        cluster_heads(profile, n_null=19)
