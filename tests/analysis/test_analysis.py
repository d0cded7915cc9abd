"""Analyzers: the exact identities of docs/mathematics.md, on random models of several families."""

import numpy as np
import pytest
import torch

import interp
from interp.analysis.scores import _key_mask, score_terms
from interp.data import Batch
from interp.models import tiny_hf_model, tiny_inputs
from interp.models.loading import clone_model


@pytest.mark.parametrize("family", ["gpt2", "bert", "vit", "qwen2", "neox", "dinov2"])
def test_four_terms_add_up_to_the_scores(family):
    model = interp.load_model(tiny_hf_model(family).double(), device="cpu")
    x = tiny_inputs(family)
    x = x.double() if x.is_floating_point() else x
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    for layer in range(model.interp.n_layers):
        scores = sum(score_terms(model, cache, layer).values())
        allowed = _key_mask(model, Batch(x), scores.shape[-1], scores.device)
        pattern = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        # HF softmaxes in float32 for some families, hence 1e-6 rather than 1e-12
        assert (pattern - cache[f"blocks.{layer}.attn.hook_pattern"]).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["gpt2", "bert", "vit"])
def test_invariances_hold_without_rotary(family):
    model = interp.load_model(tiny_hf_model(family), device="cpu")
    inv = interp.bias_invariances(model, [tiny_inputs(family)], progress=False)
    assert set(inv.check) == {"k_bias_pattern", "v_bias_fold"}
    assert (inv.max_abs_diff <= 1e-5).all(), inv
    assert (inv.bias_norm > 0.1).all()  # the b_k and b_v removed were real, not zero


def test_k_bias_changes_the_pattern_under_rotary():
    model = interp.load_model(tiny_hf_model("qwen2"), device="cpu")
    inv = interp.bias_invariances(model, [tiny_inputs("qwen2")], progress=False)
    k = inv[inv.check == "k_bias_pattern"]
    assert (k.max_abs_diff > 1e-2).all(), k  # fails clearly: rotary rotates b_k with position
    assert (inv[inv.check == "v_bias_fold"].max_abs_diff <= 1e-5).all()


def test_query_const_and_const_do_not_vary_across_keys_without_rotary():
    model = interp.load_model(tiny_hf_model("vit"), device="cpu")
    dec = interp.score_decomposition(model, [tiny_inputs("vit")], progress=False)
    for term in ("query_const", "const"):
        assert (dec[dec.term == term].share <= 1e-10).all()
    per_head = dec.groupby(["layer", "head"]).share.sum()
    assert ((per_head - 1).abs() < 1e-9).all()


def test_zero_biases_give_bias_share_zero():
    hf = tiny_hf_model("gpt2")
    with torch.no_grad():
        for blk in hf.transformer.h:
            blk.attn.c_attn.bias.zero_()
    model = interp.load_model(hf, device="cpu")
    stats = interp.record_qkv(model, [tiny_inputs("gpt2")], progress=False)
    origin = interp.origin_shift(model, stats)
    assert (origin.bias_share == 0).all()
    assert (origin.data_origin_norm > 0).all()  # the data still moves the origin
    assert len(origin) == 2 * 4 * 3


def test_model_without_biases_reports_data_origin():
    model = interp.load_model(tiny_hf_model("llama"), device="cpu")
    stats = interp.record_qkv(model, [tiny_inputs("llama")], progress=False)
    origin = interp.origin_shift(model, stats)
    assert (~origin.present).all() and (origin.bias_share == 0).all()
    assert (origin.data_origin_norm > 0).all()


def test_origin_shift_equals_its_definition():
    model = interp.load_model(tiny_hf_model("vit").double(), device="cpu")
    x = tiny_inputs("vit").double()
    stats = interp.record_qkv(model, [x], progress=False)
    origin = interp.origin_shift(model, stats).set_index(["layer", "head", "kind"])
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    w = interp.attention_weights(model, 1)
    q = cache["blocks.1.attn.hook_q"].reshape(-1, 4, 8)
    content = q - w.b_Q
    row = origin.loc[(1, 2, "q")]
    assert row.bias_norm == pytest.approx(float(w.b_Q[2].norm()), rel=1e-9)
    assert row.content_rms == pytest.approx(float(content[:, 2].pow(2).sum(-1).mean().sqrt()), rel=1e-9)
    assert row.data_origin_norm == pytest.approx(float(content[:, 2].mean(0).norm()), rel=1e-9)
    u = w.W_K[2] @ w.b_Q[2]
    assert row.key_prior_norm == pytest.approx(float(u.norm()), rel=1e-9)


def test_planted_key_prior_head_has_the_largest_key_prior_share():
    """Set b_q of (layer 0, head 1) so that u = W_k b_q points along one key token's input."""
    hf = tiny_hf_model("vit", bias_scale=0.0)
    model = interp.load_model(hf, device="cpu")
    x = tiny_inputs("vit")
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        xin = cache["blocks.0.attn.q.hook_in"]  # [b, p, d]
        target = xin[:, 5].mean(0)  # the residual direction of token 5
        w = interp.attention_weights(model, 0)
        W_k = w.W_K[1]  # [d_model, d_head]
        # b_q minimising ||W_k b_q - 40 target||: the key prior points at token 5
        b_q = torch.linalg.lstsq(W_k, 40 * target[:, None]).solution[:, 0]
        bias = model.blocks[0].attn.q.original_component.bias  # the HF parameter itself
        bias.zero_()
        bias[8:16] = b_q
    dec = interp.score_decomposition(model, [x], progress=False)
    kp = dec[(dec.term == "key_prior") & (dec.layer == 0)].set_index("head").share
    assert kp.idxmax() == 1 and kp[1] > 0.5
    assert dec[(dec.layer == 0) & (dec["head"] == 1)].kl_without_key_prior.iloc[0] > 0.1


def test_clone_is_independent_and_exact():
    model = interp.load_model(tiny_hf_model("bert"), device="cpu")
    clone = clone_model(model, dtype=torch.float64)
    x = tiny_inputs("bert")
    assert (clone(x).float() - model(x)).abs().max() <= 1e-5
    assert next(clone.parameters()).dtype == torch.float64
    assert next(model.parameters()).dtype == torch.float32


def test_key_prior_cosines_with_cls_and_positions_are_filled_for_a_vit():
    """They were NaN for every model while parameter names carried the bridge's prefixes."""
    model = interp.load_model(tiny_hf_model("vit").double(), device="cpu")
    x = tiny_inputs("vit").double()
    origin = interp.origin_shift(model, interp.record_qkv(model, [x], progress=False))
    q = origin[origin.kind == "q"]
    assert q.cos_key_prior_cls.notna().all() and q.max_abs_cos_key_prior_pos.notna().all()
    w = interp.attention_weights(model, 0)
    u = w.W_K[0] @ w.b_Q[0]
    cls = model.hf_model.embeddings.cls_token.detach().reshape(-1).double()
    expected = float(u @ cls / (u.norm() * cls.norm()))
    assert q[(q.layer == 0) & (q["head"] == 0)].cos_key_prior_cls.iloc[0] == pytest.approx(expected, rel=1e-9)


def test_clone_of_a_promoted_encoder_with_pooler():
    """A bare BertModel (with pooler) is wrapped in BertForMaskedLM; its clone must match it."""
    hf = tf_bert_with_pooler()
    model = interp.load_model(hf, device="cpu")
    clone = clone_model(model, dtype=torch.float64)
    x = tiny_inputs("bert")
    last = f"blocks.{model.interp.n_layers - 1}.hook_out"
    with torch.no_grad():
        _, a = model.run_with_cache(x, names_filter=[last])
        _, b = clone.run_with_cache(x, names_filter=[last])
    assert clone.interp.random_head and (a[last].double() - b[last]).abs().max() <= 1e-5


def tf_bert_with_pooler():
    import transformers as tf

    cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        vocab_size=97, max_position_embeddings=64, attn_implementation="eager")
    return tf.BertModel(cfg, add_pooling_layer=True).eval()


@pytest.mark.parametrize("family", [f.name for f in interp.list_families(positions="learned")])
def test_key_prior_cosine_with_learned_positions_is_filled(family):
    hf = tiny_hf_model(family)
    with torch.no_grad():  # some families initialise CLS and positions to zero, whose cosine is undefined
        for name, param in hf.named_parameters():
            if any(part in name for part in ("cls_token", "class_embedding", "position", "wpe", "pos_embed")):
                param.normal_(generator=torch.Generator().manual_seed(0))
    model = interp.load_model(hf, device="cpu")
    origin = interp.origin_shift(model, interp.record_qkv(model, [tiny_inputs(family)], progress=False))
    q = origin[origin.kind == "q"]
    if "q" not in interp.models.get_family(family).default_biases:  # no b_q: no key prior to compare
        assert q.max_abs_cos_key_prior_pos.isna().all() and q.cos_key_prior_cls.isna().all()
        return
    assert q.max_abs_cos_key_prior_pos.between(0, 1).all(), family
    has_cls = any(n.endswith(("cls_token", "class_embedding")) for n, _ in hf.named_parameters())  # not SigLIP
    assert q.cos_key_prior_cls.notna().all() == has_cls


@pytest.mark.parametrize("family", ["gpt2", "qwen2", "vit"])
def test_score_shares_are_cov_over_var_sum_to_one_and_equal_brute_force(family):
    """share_t = mean_rows Cov_j(term_t, s) / mean_rows Var_j(s): exact, so it sums to 1."""
    from interp.analysis.scores import _key_mask, score_terms

    model = interp.load_model(tiny_hf_model(family, bias_scale=2.0).double(), device="cpu")
    x = tiny_inputs(family, batch=2)
    x = x.double() if x.is_floating_point() else x
    dec = interp.score_decomposition(model, [x], progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    allowed = _key_mask(model, Batch(x), cache["blocks.0.attn.hook_q"].shape[1], "cpu")
    for layer in range(model.interp.n_layers):
        terms = score_terms(model, cache, layer)
        s = sum(terms.values())
        for head in range(model.interp.n_heads):
            rows = [(b, i) for b in range(x.shape[0]) for i in range(s.shape[-1]) if allowed[b, 0, i].any()]
            keys = [allowed[b, 0, i].numpy() for b, i in rows]
            var_s = np.mean([np.var(s[b, head, i].numpy()[k]) for (b, i), k in zip(rows, keys)])
            for name, t in terms.items():
                cov = np.mean([np.cov(t[b, head, i].numpy()[k], s[b, head, i].numpy()[k], bias=True)[0, 1]
                               for (b, i), k in zip(rows, keys)])
                got = dec[(dec.layer == layer) & (dec["head"] == head) & (dec.term == name)].share.item()
                assert got == pytest.approx(cov / var_s, rel=1e-9, abs=1e-12)
    assert ((dec.groupby(["layer", "head"]).share.sum() - 1).abs() <= 1e-9).all()
