"""The whole chain on a tiny model of every registered family: record -> origin shift -> score
decomposition (or its stated refusal) -> frequency profile -> ablation, each checked for what
the family's registry entry promises."""

import pytest

import interp
from interp.errors import UnsupportedModelError
from interp.models import TINY_FAMILIES, tiny_hf_model, tiny_inputs


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_the_whole_chain_runs_and_keeps_the_registry_promises(name):
    family = interp.models.get_family(name)
    model = interp.load_model(tiny_hf_model(name), device="cpu")
    info = model.interp
    x = tiny_inputs(name, batch=2)
    n_pos = (info.image_size // info.patch_size) ** 2 + info.n_prefix_tokens if family.modality == "vision" \
        else x.shape[1]

    stats = interp.record_qkv(model, [x], progress=False)
    assert stats.count(0) == 2 * n_pos

    origin = interp.origin_shift(model, stats)
    assert len(origin) == info.n_layers * (info.n_heads + 2 * info.n_kv_heads)
    absent = set("qkv") - set(family.default_biases)
    assert (origin[origin.kind.isin(absent)].bias_share == 0).all()
    assert (origin[origin.kind.isin(set("qkv") - absent)].bias_share > 0).all()

    if family.score_refusal:
        with pytest.raises(UnsupportedModelError, match="does not apply"):
            interp.score_decomposition(model, [x], progress=False)
    else:
        dec = interp.score_decomposition(model, [x], progress=False)
        sums = dec.groupby(["layer", "head"]).share.sum()
        assert ((sums - 1).abs() <= 1e-9).all()
        assert (dec.terms_complete == (not family.extra_score_term)).all()

    profile = interp.frequency_profile(model, [x], progress=False)
    assert len(profile) == info.n_layers * info.n_heads
    assert profile.mean_attention_distance.notna().all() and (profile.sink_mass.between(0, 1)).all()

    # 2 control draws a head run the matched control on every family (19, the default, cost 17 more forwards a head)
    table = interp.ablate_bias(model, [x], progress=False, estimate="exact", n_control=2)
    assert (table[table.kind.isin(absent)].delta == 0).all()  # an absent bias has nothing to remove
    present = table[table.kind.isin(set("qv") - absent)]
    assert present.empty or (present.delta.abs() > 0).any()
    if family.k_bias_inert and "k" not in absent:
        k_rows = table[table.kind == "k"]  # answered by the identity (no forward): delta 0 by construction
        assert (k_rows.identity.fillna("") != "").all() and (k_rows.delta == 0).all()
        forced = interp.ablate_bias(model, [x], kinds=("k",), scope="layer", progress=False, estimate="exact",
                                    force_exact=True, n_control=0)  # a real forward per layer: the identity holds
        assert (forced.identity.fillna("") == "").all() and forced.delta.abs().max() <= 1e-4  # float32 rounding
