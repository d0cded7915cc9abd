"""Errors of our own at every construction boundary (a model built from model_args or a config, a table or text
file read) and tables checked before they are analysed: one InputError (or another error of ours) naming the
argument or file and the fix, never the library's raw error or an InternalError, never a silent answer."""

import json

import numpy as np
import pytest
import torch

import interp
from interp.errors import InputError, InterpError, InternalError, MissingWeightsError
from interp.models import tiny_hf_model, tiny_inputs

TEXT = ("Ceci est un paragraphe en français, avec des accents: é à è ù, assez long pour compter comme un texte "
        "entier. ") * 2 + "\n\n"


@pytest.fixture(scope="module")
def gpt2():
    return interp.load_model(tiny_hf_model("gpt2", n_layers=2), device="cpu")


@pytest.fixture(scope="module")
def lm():
    """A tiny llama with SmolLM2's tokenizer, so text files are read and tokenised."""
    from transformers import AutoTokenizer

    from interp.models.zoo import ZOO

    folder = ZOO["smollm2-135m"].folder()
    if not folder.exists():
        pytest.skip("the zoo is not fetched (make models)")
    return interp.load_model(tiny_hf_model("llama", config={"vocab_size": 49152}), device="cpu",
                             tokenizer=AutoTokenizer.from_pretrained(folder))


@pytest.mark.parametrize("args, words", [({"num_heads": 5}, "num_heads=5 failed .*AssertionError"),
                                         ({"img_size": -1}, "img_size=-1 failed"),
                                         ({"embed_dim": 0}, "embed_dim=0 failed")])
def test_timm_model_args_it_cannot_build_are_one_input_error(args, words):
    pytest.importorskip("timm")
    with pytest.raises(InputError, match=words) as exc:
        interp.load_model("timm:vit_tiny_patch16_224", model_args=args)
    assert not isinstance(exc.value, InternalError) and "pass values this architecture takes" in str(exc.value)


def test_an_hf_config_with_a_field_of_the_wrong_type_is_ours(tmp_path):
    tiny_hf_model("gpt2", n_layers=2).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layer": "2"}))
    with pytest.raises(InterpError, match=r"config.json.*n_layer.*an integer as a number, not text") as exc:
        interp.load_model(str(tmp_path))
    assert not isinstance(exc.value, InternalError)


@pytest.mark.parametrize("encoding, named", [("latin-1", "latin-1"), ("utf-16", "UTF-16"), ("cp1252", "latin-1")])
def test_compare_models_on_a_text_file_that_is_not_utf8_names_the_encoding(gpt2, lm, tmp_path, encoding, named):
    path = tmp_path / "corpus.txt"
    path.write_bytes((TEXT * 4).encode(encoding))
    with pytest.raises(InputError, match=rf"corpus.txt is not UTF-8 text.*looks like {named}.*re-encode it as UTF-8"):
        interp.compare_models({"a": gpt2, "b": interp.clone_model(gpt2)}, str(path))
    with pytest.raises(InputError, match=r"corpus.txt is not UTF-8 text"):  # the data module: the same reader
        list(interp.iter_batches(lm, str(path)))


@pytest.mark.parametrize("content", [b"PAR1 not really", b"PAR1" + bytes(100) + b"PAR1", b"\x00" * 64])
def test_a_fake_or_truncated_parquet_is_one_input_error(lm, tmp_path, content):
    import pandas as pd

    path = tmp_path / "texts.parquet"
    pd.DataFrame({"text": ["a sentence of text"] * 4}).to_parquet(path)
    whole = path.read_bytes()
    for damaged in (content, whole[: len(whole) // 2]):
        path.write_bytes(damaged)
        with pytest.raises(InputError, match=r"texts.parquet as a Parquet table failed.*write it again"):
            list(interp.iter_batches(lm, str(path)))


@pytest.mark.parametrize("row", ["hello there, world,1", "one,two,three,four", "only"])
def test_a_csv_row_of_another_width_than_its_header_is_refused(lm, tmp_path, row):
    path = tmp_path / "t.csv"
    path.write_text(f"text,label\nfine text,0\n{row}\n")
    with pytest.raises(InputError, match=r"t.csv line 3 has \d fields where its header has 2"):
        list(interp.iter_batches(lm, str(path)))


def test_a_quoted_comma_is_read_as_text(lm, tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('text,label\n"hello there, world",1\n')
    (batch,) = interp.iter_batches(lm, str(path))
    assert batch.inputs.shape[0] == 1


def test_load_model_refuses_options_it_would_ignore_on_a_loaded_model(gpt2):
    for given in (dict(dtype=torch.float64), dict(device="cpu"), dict(weights="w.safetensors"),
                  dict(model_args={"a": 1})):
        with pytest.raises(InputError, match=f"{next(iter(given))} do\\(es\\) not apply"):
            interp.load_model(gpt2, **given)
    assert interp.load_model(gpt2) is gpt2


def test_compare_models_refuses_text_options_with_token_ids(gpt2):
    ids = [tiny_inputs("gpt2", batch=2, pos=8)]
    pair = {"a": gpt2, "b": interp.clone_model(gpt2)}
    with pytest.raises(InputError, match=r"n_items=3 do\(es\) not apply to token ids"):
        interp.compare_models(pair, ids, n_items=3)
    with pytest.raises(InputError, match=r"max_chars=50 do\(es\) not apply to token ids"):
        interp.compare_models(pair, ids, max_chars=50)
    with pytest.raises(InputError, match=r"max_chars=50 does not apply to a list of strings"):
        interp.compare_models(pair, ["a text " * 20] * 2, max_chars=50)


def test_integer_weights_for_a_float_model_are_refused(tmp_path):
    pytest.importorskip("timm")
    import timm
    from safetensors.torch import save_file

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, depth=1)
    state = {k: v.to(torch.int64) if k.endswith("qkv.bias") else v for k, v in model.state_dict().items()}
    save_file(state, tmp_path / "w.safetensors")
    with pytest.raises(MissingWeightsError, match=r"integer or boolean tensor.*qkv.bias \(torch.int64\)"):
        interp.load_model("timm:vit_tiny_patch16_224", weights=str(tmp_path / "w.safetensors"),
                          model_args={"img_size": 32, "depth": 1})


# ----- tables checked before they are analysed ---------------------------------------------------------------


@pytest.fixture(scope="module")
def profile():
    vit = interp.load_model(tiny_hf_model("vit", n_layers=2), device="cpu")
    return vit, interp.frequency_profile(vit, [tiny_inputs("vit", batch=2)], progress=False)


def test_cluster_heads_refuses_a_nan_in_one_heads_bin_and_an_infinity(profile):
    _, table = profile
    interp.cluster_heads(table, k=2)  # every spectral bin is defined at every length: nothing NaN to begin with
    full = next(c for c in table.filter(like="bin_") if table[c].notna().all())
    for column, value in ((full, np.nan), ("entropy", np.inf), ("hf_ratio", -np.inf), ("sink_mass", np.nan)):
        bad = table.copy()
        bad.loc[1, column] = value
        with pytest.raises(InputError, match=rf"NaN or infinite values in \['{column}'\]"):
            interp.cluster_heads(bad, k=2)


def test_cluster_heads_refuses_a_head_twice_and_halves_of_another_model(profile):
    vit, table = profile
    with pytest.raises(InputError, match="more than one row for layer 0, head 0"):
        interp.cluster_heads(table.iloc[[0, *range(len(table))]].reset_index(drop=True), k=2)
    other = interp.load_model(tiny_hf_model("vit", n_layers=3), device="cpu")
    theirs = interp.frequency_profile(other, [tiny_inputs("vit", batch=2)], progress=False)
    with pytest.raises(InputError, match="profile's own heads"):
        interp.cluster_heads(table, halves=[(theirs, theirs)])
    renamed = table.copy()
    renamed.attrs["model"] = "another"
    with pytest.raises(InputError, match="another model than the profile"):
        interp.cluster_heads(table, halves=[(renamed, renamed)])


def test_spread_interval_reads_its_layers_as_every_analyzer_does(profile):
    vit, _ = profile
    data = [tiny_inputs("vit", batch=4)]
    once = interp.spread_interval(vit, data, layers=[1], n_boot=5, progress=False)
    for same in ([1, 1], 1, np.int64(1), torch.tensor(1)):
        row = interp.spread_interval(vit, data, layers=same, n_boot=5, progress=False)
        assert row.n_heads.iloc[0] == once.n_heads.iloc[0] == vit.interp.n_heads
        assert row.spread.iloc[0] == once.spread.iloc[0]


def test_spread_difference_refuses_rows_of_different_data(profile):
    vit, _ = profile
    a = interp.spread_interval(vit, [tiny_inputs("vit", batch=4, seed=0)], n_boot=5, progress=False)
    b = interp.spread_interval(vit, [tiny_inputs("vit", batch=4, seed=1)], n_boot=5, progress=False)
    with pytest.raises(InputError, match="computed on different data"):
        interp.spread_difference(a, b)
    assert interp.spread_difference(a, a).difference.iloc[0] == 0


def test_a_one_head_model_has_no_spread(tmp_path):
    one = interp.load_model(tiny_hf_model("gpt2", n_layers=1, n_heads=1), device="cpu")
    with pytest.raises(InputError, match="needs at least 2"):
        interp.spread_interval(one, [tiny_inputs("gpt2", batch=4, pos=8)], n_boot=5, progress=False)


def test_a_tuple_of_two_image_batches_is_refused_not_read_as_one(profile):
    vit, _ = profile
    x, y = tiny_inputs("vit", batch=2, seed=0), tiny_inputs("vit", batch=2, seed=1)
    with pytest.raises(InputError, match="tuple of two image batches"):
        interp.record_qkv(vit, (x, y), progress=False)
    assert interp.record_qkv(vit, [x, y], progress=False).count(0) > 0
