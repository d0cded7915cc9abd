"""interp.record.heads: per-head weights as TransformerLens names them, checked against the HF modules."""

import numpy as np
import pytest
import torch

import interp
from interp.errors import InputError
from interp.record.heads import attention_weights, kv_group, v_fold_vector
from interp.models import tiny_hf_model


@pytest.fixture(scope="module")
def qwen():
    hf = tiny_hf_model("qwen2", n_heads=4, n_kv_heads=2, d_head=8).double()
    return hf, interp.load_model(hf, device="cpu")


def test_per_head_projections_equal_the_hf_projection(qwen):
    hf, model = qwen
    attn = hf.model.layers[1].self_attn
    x = torch.randn(5, hf.config.hidden_size, dtype=torch.float64)
    w = attention_weights(model, 1)
    for kind, proj, heads in (("Q", attn.q_proj, 4), ("K", attn.k_proj, 2), ("V", attn.v_proj, 2)):
        per_head = torch.einsum("nm,hmd->nhd", x, getattr(w, f"W_{kind}")) + getattr(w, f"b_{kind}")
        assert torch.allclose(per_head, proj(x).view(5, heads, 8), atol=1e-12, rtol=0)
    out = torch.einsum("nhd,hdm->nm", torch.randn(5, 4, 8, dtype=torch.float64), w.W_O)
    assert out.shape == (5, hf.config.hidden_size)


def test_lower_case_names_of_release_0_1_read_the_same_tensors(qwen):
    w = attention_weights(qwen[1], 0)
    for kind in "qkvo":
        assert getattr(w, f"W_{kind}") is getattr(w, f"W_{kind.upper()}") is w.weight(kind)
        assert getattr(w, f"b_{kind}") is getattr(w, f"b_{kind.upper()}") is w.bias(kind)
    with pytest.raises(AttributeError):
        w.W_x


def test_kv_group_maps_query_heads_to_their_kv_head():
    assert kv_group(4, 2) == [0, 0, 1, 1]
    assert kv_group(6, 1) == [0] * 6
    with pytest.raises(InputError):
        kv_group(3, 2)


def test_folding_b_v_into_b_o_leaves_the_block_output_unchanged():
    """Rows of the pattern sum to 1, so b_v adds exactly sum_h b_v[h] W_O[h]: move it into b_O."""
    hf = tiny_hf_model("gpt2").double()
    model = interp.load_model(hf, device="cpu")
    ids = torch.randint(0, hf.config.vocab_size, (2, 7))
    with torch.no_grad():
        before = hf(ids).logits
        fold = v_fold_vector(model, 1, dtype=torch.float64)
        attn, d = hf.transformer.h[1].attn, hf.config.n_embd
        attn.c_attn.bias[2 * d:] = 0.0  # GPT-2's fused qkv: the last third is b_v
        attn.c_proj.bias += fold
        after = hf(ids).logits
    assert (before - after).abs().max().item() <= 1e-10


@pytest.mark.parametrize("layer", [np.int64(1), np.int32(1), np.uint8(1), np.array(1), torch.tensor(1)],
                         ids=["np.int64", "np.int32", "np.uint8", "0-d array", "0-d tensor"])
def test_a_numpy_or_torch_integer_names_a_layer(qwen, layer):
    # issue 38: np.int64(1) (what iterating a numpy array or a DataFrame column gives) was "out of range"
    _, model = qwen
    want, got = attention_weights(model, 1), attention_weights(model, layer)
    assert all(torch.equal(getattr(want, n), getattr(got, n)) for n in ("W_Q", "b_Q", "W_K", "b_K", "W_O", "b_O"))
    assert torch.equal(v_fold_vector(model, layer, heads=np.array([0, 2])), v_fold_vector(model, 1, heads=[0, 2]))


@pytest.mark.parametrize("layer,words", [
    (np.float64(1.0), "layer must be an integer; got 1.0 as float64 \\(float64\\)"),
    (True, "layer must be an integer; got True \\(bool\\)"), ("1", "layer must be an integer; got '1' \\(str\\)"), (np.int64(2), "layer 2 out of range"), (-1, "layer -1 out of range")])
def test_a_layer_that_is_not_an_index_in_range_is_refused(qwen, layer, words):
    with pytest.raises(InputError, match=words):
        attention_weights(qwen[1], layer)


def test_fold_vector_heads_are_checked(qwen):
    with pytest.raises(InputError, match=r"heads must lie in 0..3"):
        v_fold_vector(qwen[1], 1, heads=[7])
