"""The sink experiment's arms differ only in what they name: shared weights start equal, data
order is shared, and the slot is exact where it can be (issue 27, "Must show")."""

import pytest
import torch

from interp.errors import InputError, MissingWeightsError
from experiments.training.sink_arms import (
    SINK_ID, TEXT_ARMS, VISION_ARMS, LMShape, attention_modules, build_lm_arm, build_vit_arm, load_sink_lm,
    save_lm_arm, set_slot_gate,
)
from experiments.training.corpus import Corpus
from experiments.training.sinks import TextRecipe, TextTask, VisionRecipe, VisionTask, lm_loss, train_offsets


SMALL = LMShape(n_layers=2, d_model=32, n_heads=4, d_ff=64, context=16)
EXTRA = ("slot_key", "slot_value", "register_tokens")


@pytest.mark.parametrize("builder, arms", [(lambda a, s: build_lm_arm(a, s, SMALL), TEXT_ARMS),
                                           (build_vit_arm, VISION_ARMS)])
def test_every_arm_starts_from_the_same_shared_weights(builder, arms):
    reference = builder("none", 3).state_dict()
    for arm in arms:
        weights = builder(arm, 3).state_dict()
        assert set(reference) <= set(weights), arm
        assert all(torch.equal(weights[k], v) for k, v in reference.items()), arm
        for k in set(weights) - set(reference):  # what the arm adds: zero biases, slots, registers
            assert k.endswith(EXTRA) or (k.endswith(".bias") and float(weights[k].abs().max()) == 0), (arm, k)
    other = builder("none", 4).state_dict()
    assert not all(torch.equal(other[k], v) for k, v in reference.items())  # seeds differ


def test_every_text_arm_sees_the_same_data_in_the_same_order():
    corpus = Corpus(torch.arange(5000) % 256, torch.arange(800) % 256, {"train_sha256": "a", "val_sha256": "b"})
    recipe = TextRecipe(shape=SMALL, steps=5, batch=3)
    batches = {arm: [TextTask(arm, 7, recipe, corpus).batch(s) for s in range(5)] for arm in TEXT_ARMS}
    for arm in TEXT_ARMS:
        assert all(torch.equal(a, b) for a, b in zip(batches[arm], batches["none"]))
    assert torch.equal(train_offsets(5000, recipe, 7), train_offsets(5000, recipe, 7))
    assert not torch.equal(train_offsets(5000, recipe, 7), train_offsets(5000, recipe, 8))


def test_every_vision_arm_sees_the_same_images_in_the_same_order(monkeypatch):
    fake = torch.randn(6000, 3, 28, 28), torch.randint(0, 10, (6000,))
    monkeypatch.setattr(VisionTask, "_data", {"train": fake, "test": fake})
    recipe = VisionRecipe(steps=4, batch=8)
    batches = {arm: [VisionTask(arm, 5, recipe).batch(s) for s in range(4)] for arm in VISION_ARMS}
    for arm in VISION_ARMS:
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches[arm], batches["none"]))
    assert not torch.equal(VisionTask("none", 6, recipe).batch(0)[1], batches["none"][0][1])


def test_qkv_arm_has_q_k_v_bias_and_an_o_bias_held_at_zero():
    model = build_lm_arm("qkv", 0, SMALL)
    for attn in attention_modules(model):
        assert all(getattr(attn, p).bias.requires_grad for p in ("q_proj", "k_proj", "v_proj"))
        assert not attn.o_proj.bias.requires_grad and float(attn.o_proj.bias.abs().max()) == 0


@pytest.mark.parametrize("arm", ["kv_slot", "k_slot_v0"])
def test_a_slot_with_its_key_at_minus_infinity_is_the_plain_model(arm):
    torch.manual_seed(0)
    x = torch.randint(0, 256, (3, 16))
    plain = build_lm_arm("none", 5, SMALL).double().eval()
    slot = build_lm_arm(arm, 5, SMALL).double().eval()
    for attn in attention_modules(slot):  # a slot that would matter: a large key and value
        attn.slot_key.data.normal_(0, 3.0)
        attn.slot_value.data.normal_(0, 3.0) if arm == "kv_slot" else None
    with torch.no_grad():
        assert float((slot(input_ids=x).logits - plain(input_ids=x).logits).abs().max()) > 1e-3
        set_slot_gate(slot, float("-inf"))
        diff = float((slot(input_ids=x).logits - plain(input_ids=x).logits).abs().max())
    assert diff <= 1e-6  # HF's eager path softmaxes in float32 even in float64; the slot path in float64
    plain.config._attn_implementation = slot.config._attn_implementation  # both through slot_attention
    with torch.no_grad():
        assert float((slot(input_ids=x).logits - plain(input_ids=x).logits).abs().max()) <= 1e-12


def test_slot_rows_sum_to_one_with_the_slot_in_column_zero():
    model = build_lm_arm("kv_slot", 0, SMALL).double().eval()
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 256, (2, 16)), output_attentions=True)
    for a in out.attentions:
        assert a.shape == (2, 4, 16, 17)
        assert float((a.sum(-1) - 1).abs().max()) < 1e-12
        assert float(a[..., 0].min()) > 0  # the slot is visible to every query
        assert float(a[:, :, 0, 2:].abs().max()) == 0  # causal: query 0 sees the slot and itself only


def test_value_slot_fixed_at_zero_is_not_a_parameter():
    model = build_lm_arm("k_slot_v0", 0, SMALL)
    names = {n for n, _ in model.named_parameters()}
    assert any(n.endswith("slot_key") for n in names) and not any(n.endswith("slot_value") for n in names)
    assert all(float(a.slot_value.abs().max()) == 0 for a in attention_modules(model))


def test_registers_sit_after_cls_and_the_classifier_reads_cls():
    model = build_vit_arm("registers", 0).eval()
    with torch.no_grad():
        out = model(pixel_values=torch.randn(2, 3, 28, 28), output_hidden_states=True)
    assert out.hidden_states[0].shape[1] == 1 + 4 + 49
    reg = model.vit.embeddings.register_tokens
    assert torch.equal(out.hidden_states[0][0, 1:5], reg[0])  # no position embedding on registers


def test_every_arm_scores_the_same_predictions():
    batch = torch.randint(0, 256, (2, 16))
    for arm in TEXT_ARMS:
        model = build_lm_arm(arm, 0, SMALL)
        losses = []
        model.register_forward_hook(lambda m, i, o: losses.append(o.logits.shape[1]))
        lm_loss(model, batch, arm)
        assert losses == [16 + (arm == "sink_token")]
    vocab = build_lm_arm("sink_token", 0, SMALL).config.vocab_size
    assert max(bytes(range(256))) < SINK_ID < vocab  # no byte maps to the sink id, and it has an embedding row


def test_saved_arms_load_back_in_float16_and_errors_name_the_fix(tmp_path):
    model = build_lm_arm("kv_slot", 0, SMALL).eval()
    save_lm_arm(model, "kv_slot", SMALL, tmp_path, dict(val_loss=1.0))
    loaded = load_sink_lm("kv_slot", tmp_path)
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert float((loaded(input_ids=x).logits - model(input_ids=x).logits).abs().max()) < 1e-2
    with pytest.raises(MissingWeightsError, match="python -m experiments.train_sinks"):
        load_sink_lm("none", tmp_path)
    (tmp_path / "kv_slot.safetensors").rename(tmp_path / "none.safetensors")
    with pytest.raises(InputError, match="holds arm 'kv_slot'"):
        load_sink_lm("none", tmp_path)
    with pytest.raises(InputError, match="text arms are"):
        build_lm_arm("registers", 0)
