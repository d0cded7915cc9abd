"""Half precision: models in float16/bfloat16 record, analyse and ablate; statistics are
accumulated in float64 and agree with the float32 run within the tolerances below.

Tolerances (relative to the float32 result's scale): float16 keeps ~11 significant
bits (unit roundoff 4.9e-4), bfloat16 ~8 (3.9e-3); two transformer layers of rounding
compound to a few units of roundoff, so we allow 2e-2 (float16) and 6e-2 (bfloat16) on
means and second moments E[a a^T] (covariance plus mean outer product), and 0.05 / 0.1 absolute on shares, which live in [0, 1].
"""

import pytest
import torch

import interp
from interp.models import tiny_hf_model, tiny_inputs

TOL = {torch.float16: 2e-2, torch.bfloat16: 6e-2}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def rel_err(a, b):
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm().clamp(min=1e-12))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["vit", "gpt2"])
def test_half_precision_agrees_with_float32(family, dtype, device):
    x = [tiny_inputs(family, seed=s) for s in range(2)]
    ref_model = interp.load_model(tiny_hf_model(family), device=device)
    half_model = interp.load_model(tiny_hf_model(family), device=device, dtype=dtype)
    assert next(half_model.parameters()).dtype == dtype
    ref = interp.record_qkv(ref_model, x, progress=False)
    half = interp.record_qkv(half_model, x, progress=False)
    assert half.moments[(0, "q")].mean.dtype == torch.float64  # accumulated in float64
    for layer in ref.layers:
        for kind in "qkv":
            assert rel_err(half.mean(layer, kind), ref.mean(layer, kind)) <= TOL[dtype]
            # rounding scales with |a|, not with its spread: compare second moments E[a a^T]
            second = lambda st: st.cov(layer, kind) + torch.einsum("hd,he->hde", st.mean(layer, kind), st.mean(layer, kind))  # noqa: E731
            assert rel_err(second(half), second(ref)) <= TOL[dtype]
    o_ref, o_half = interp.origin_shift(ref_model, ref), interp.origin_shift(half_model, half)
    assert (o_ref.bias_share - o_half.bias_share).abs().max() <= 0.05
    d_ref = interp.score_decomposition(ref_model, x, progress=False)
    d_half = interp.score_decomposition(half_model, x, progress=False)
    assert (d_ref.share - d_half.share).abs().max() <= (0.05 if dtype == torch.float16 else 0.1)
    metric = "feature_cosine" if family == "vit" else "next_token_ce"
    a_ref = interp.ablate_bias(ref_model, x, kinds=("q", "v"), scope="layer", metric=metric, progress=False, estimate="exact",
                               n_control=0)
    a_half = interp.ablate_bias(half_model, x, kinds=("q", "v"), scope="layer", metric=metric, progress=False, estimate="exact",
                               n_control=0)
    scale = max(a_ref.delta.abs().max(), 1e-3)
    assert (a_ref.delta - a_half.delta).abs().max() <= 0.3 * scale + (0.02 if dtype == torch.bfloat16 else 0.005)
    # the float64 invariance check does not inherit the half-precision rounding
    inv = interp.bias_invariances(half_model, x[:1], progress=False)
    assert inv.max_abs_diff.max() <= 1e-5
