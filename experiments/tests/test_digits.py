"""The shipped controlled pair: ViTs on digits, identical except for the QKV bias."""

import pandas as pd
import pytest
import torch

import interp
from interp.data import digits
from interp.models.zoo import SHIPPED_DIR


@pytest.fixture(scope="module")
def pair():
    return interp.load_model("digits-vit", device="cpu"), interp.load_model("digits-vit-nobias", device="cpu")


def test_pair_differs_only_in_qkv_bias(pair):
    a, b = pair
    ca, cb = a.hf_model.config.to_dict(), b.hf_model.config.to_dict()
    assert ca.pop("qkv_bias") is True and cb.pop("qkv_bias") is False
    ca.pop("_name_or_path", None), cb.pop("_name_or_path", None)
    assert ca == cb
    sa, sb = interp.bias_spec(a), interp.bias_spec(b)
    assert sa.present.all()
    assert not sb[sb.kind != "o"].present.any() and sb[sb.kind == "o"].present.all()


def test_shipped_weights_reproduce_the_recorded_accuracy(pair):
    results = pd.read_csv(SHIPPED_DIR / "digits_vit_results.csv")
    x, y = digits(8, split="test", seed=0)
    for model, bias in zip(pair, (True, False)):
        with torch.no_grad():
            acc = float((model(x).argmax(-1) == y).float().mean())
        recorded = results[(results.seed == 0) & (results.qkv_bias == bias)].test_accuracy.iloc[0]
        assert acc == pytest.approx(recorded, abs=1e-6)
        assert acc > 0.8  # a trained model, not a random one


def test_digits_dataset_feeds_the_pair(pair):
    stats = interp.record_qkv(pair[0], "digits", max_batches=2, progress=False)
    assert stats.count(0) == 2 * 8 * 17  # 2 batches x 8 images x (16 patches + CLS)
