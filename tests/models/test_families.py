"""The family registry: one entry per family, duplicates refused, everything else reads it."""

from pathlib import Path

import pytest
import torch

import interp
from interp.errors import RegistryError
from interp.models.families import (
    Family,
    families_markdown,
    family_for_model_type,
    get_family,
    list_families,
    readme_with_families,
    register_family,
)

MODELS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "models.md"
FAMILIES = [f.name for f in list_families()]


def test_the_registry_is_broad():
    """The issue's floor: 30 families or variants, 10 of them vision."""
    assert len(list_families()) >= 30
    assert len(list_families(modality="vision")) >= 10


def test_a_variant_is_chosen_by_its_config():
    import transformers as tf

    assert family_for_model_type("falcon", tf.FalconConfig(alibi=True)).name == "falcon-rw"
    assert family_for_model_type("falcon", tf.FalconConfig(alibi=False)).name == "falcon"
    assert family_for_model_type("falcon").name == "falcon"  # no config: the base family
    base = get_family("gpt2")
    with pytest.raises(RegistryError, match="needs a registered base"):
        register_family(Family(**{**base.__dict__, "name": "gpt2-x", "variant_of": "gpt2"}))  # no `matches`


def test_registering_a_duplicate_fails_and_changes_nothing():
    gpt2 = get_family("gpt2")
    before = len(list_families())
    with pytest.raises(RegistryError, match="'gpt2' is already registered"):
        register_family(gpt2)
    clash = Family(**{**gpt2.__dict__, "name": "gpt2-again"})
    with pytest.raises(RegistryError, match=r"model_type \['gpt2'\].*already covered by 'gpt2'"):
        register_family(clash)
    assert len(list_families()) == before and family_for_model_type("gpt2") is gpt2


def test_filters():
    assert {"vit", "deit", "dinov2", "beit", "clip-vision", "siglip-vision", "timm-vit", "open-clip-vit"} <= {
        f.name for f in list_families(modality="vision")}
    assert {f.source for f in list_families()} == {"transformers", "timm", "open_clip"}
    rotary = {f.name for f in list_families(positions="rotary")}
    assert {"neox", "qwen2", "llama", "mistral", "qwen3"} <= rotary and "gpt2" not in rotary
    qk_norm = {f.name for f in list_families(qk_norm=True)}
    assert {"qwen3", "olmo2", "timm-vit-qknorm"} <= qk_norm
    assert {f.name for f in list_families(k_bias_inert=False)} == rotary | qk_norm
    assert {f.name for f in list_families(positions="alibi")} == {"bloom", "falcon-rw"}
    assert {f.name for f in list_families(modality="text", attention="bidirectional")} == {"bert", "roberta"}
    with pytest.raises(RegistryError, match="cannot filter families by"):
        list_families(colour="blue")
    with pytest.raises(RegistryError, match="unknown model family 'gpt5'"):
        get_family("gpt5")


def test_docs_family_table_is_generated_from_the_registry():
    text = MODELS_PAGE.read_text()
    assert readme_with_families(text) == text, (
        "docs/models.md's family table drifted from the registry: run `interp families --readme docs/models.md`"
    )
    for family in list_families():
        assert family.label in families_markdown()


@pytest.mark.parametrize("name", FAMILIES)
def test_loaded_model_carries_its_family_facts(name):
    family = get_family(name)
    model = interp.load_model(interp.tiny_hf_model(name), device="cpu")
    info = model.interp
    assert info.spec is family
    assert (info.modality, info.attention, info.positions) == (family.modality, family.attention, family.positions)
    assert info.rotary == family.rotary
    if family.modality == "vision":
        registers = getattr(model.hf_model.config, family.prefix_tokens_field, 0) if family.prefix_tokens_field else 0
        assert info.n_prefix_tokens == family.prefix_tokens + registers
        with torch.no_grad():
            _, cache = model.run_with_cache(interp.tiny_inputs(name))
        grid = (info.image_size // info.patch_size) ** 2
        assert cache["blocks.0.attn.hook_q"].shape[1] == grid + info.n_prefix_tokens


@pytest.mark.parametrize("name", FAMILIES)
def test_k_bias_identity_follows_the_position_scheme(name):
    family = get_family(name)
    model = interp.load_model(interp.tiny_hf_model(name, bias_scale=3.0).double(), device="cpu")
    x = interp.tiny_inputs(name)
    x = x.double() if x.is_floating_point() else x
    inv = interp.bias_invariances(model, [x], float64=False, progress=False)
    k = inv[inv.check == "k_bias_pattern"]
    if "k" not in family.default_biases:
        assert (k.bias_norm == 0).all()
    elif family.k_bias_inert:  # rounding only: of a float32 softmax where HF upcasts
        assert k.max_abs_diff.max() <= (1e-5 if family.softmax_float32 else 1e-9), k
    else:
        assert k.max_abs_diff.max() > 1e-4, k


def test_raw_hf_model_gets_a_clear_error_naming_load_model():
    hf = interp.tiny_hf_model("vit")
    for call in (interp.bias_spec, lambda m: interp.record_qkv(m, [interp.tiny_inputs("vit")], progress=False),
                 lambda m: interp.score_decomposition(m, [interp.tiny_inputs("vit")], progress=False),
                 lambda m: interp.frequency_profile(m, [interp.tiny_inputs("vit")], progress=False),
                 lambda m: interp.ablate_bias(m, [interp.tiny_inputs("vit")], progress=False, estimate="exact"),
                 lambda m: interp.bias_invariances(m, [interp.tiny_inputs("vit")], progress=False)):
        with pytest.raises(interp.errors.InputError, match=r"interp\.load_model"):
            call(hf)


def test_zero_biases_warn_on_load_but_not_on_clone():
    import warnings

    hf = interp.tiny_hf_model("vit", bias_scale=0.0)
    for module in hf.modules():
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)
    with pytest.warns(UserWarning, match="present but exactly zero"):
        interp.load_model(hf, device="cpu")
    model = interp.load_model(interp.tiny_hf_model("vit"), device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        interp.clone_model(model)
