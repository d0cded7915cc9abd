"""interp.data.iterate: one decision of what a ``data`` argument is, shared by the API, the pipeline
and the CLI (the same argument and options give the same batches through each door)."""

import argparse

import pytest
import torch

import interp
from interp.data import Batch, DataSource, open_data
from interp.errors import InputError
from interp.models import tiny_hf_model


def _tiny_with_tokenizer(family, zoo_name, vocab_size):
    """A tiny ``family`` model with the tokenizer of the zoo model ``zoo_name``."""
    from transformers import AutoTokenizer

    from interp.models.zoo import ZOO

    folder = ZOO[zoo_name].folder()
    if not folder.exists():
        pytest.skip("the zoo is not fetched (make models)")
    return interp.load_model(tiny_hf_model(family, config={"vocab_size": vocab_size}), device="cpu",
                             tokenizer=AutoTokenizer.from_pretrained(folder))


@pytest.fixture(scope="module")
def lm():
    return _tiny_with_tokenizer("llama", "smollm2-135m", 49152)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "my corpus.txt"
    path.write_text("\n".join(f"Sentence number {i} is about attention biases." for i in range(9)))
    return path


def _ids(batches):
    return [b.inputs.tolist() for b in batches]


def test_each_kind_of_argument(lm, corpus):
    assert isinstance(open_data(lm, corpus), DataSource)
    assert isinstance(open_data(lm, str(corpus)), DataSource)  # a path with a space is a path, not a sentence
    assert open_data(lm, "attention has biases") == [["attention has biases"]]
    built_in = open_data(lm, "python-docs", {"batch_size": 3}, n=7)
    assert [len(b.inputs) for b in built_in] == [3, 3, 1]
    ids = torch.ones(2, 4, dtype=torch.long)
    assert open_data(lm, ids) == [ids]
    with pytest.raises(InputError, match="no such file"):
        open_data(lm, "missing/corpus.txt")
    with pytest.raises(InputError, match="data options .*batch_size"):
        open_data(lm, ids, {"batch_size": 2})  # refused, not ignored


def test_api_pipeline_and_cli_read_the_same_batches(lm, corpus):
    from interp.cli import _data_source
    from interp.report.pipeline import make_context

    options = {"batch_size": 2, "max_items": 5, "seq_len": 16}
    direct = list(open_data(lm, corpus, options))
    ctx = make_context(lm, str(corpus), data_options=options)
    args = argparse.Namespace(data=str(corpus), text_column=None, image_column=None, max_tokens=None,
                              normalize="model", strict=False, **options)
    from_cli = list(_data_source(lm, args))
    assert _ids(direct) == _ids(ctx.batches) == _ids(from_cli)
    assert sum(len(b.inputs) for b in direct) == 5


def test_iter_batches_caps_and_refuses_empty(lm):
    assert len(list(interp.iter_batches(lm, "python-docs", max_batches=2))) == 2
    with pytest.raises(InputError, match="empty"):
        list(interp.iter_batches(lm, []))
    one = Batch(torch.ones(1, 3, dtype=torch.long))
    assert [b.inputs.tolist() for b in interp.iter_batches(lm, one)] == [[[1, 1, 1]]]


@pytest.fixture(scope="module")
def bert():
    """A tiny BERT with MiniLM's tokenizer: an empty text becomes [CLS] [SEP], a row of two real tokens."""
    return _tiny_with_tokenizer("bert", "minilm-l6", 30522)


TEXTS = ["", "the cat sat on the mat", "  ", "dogs bark"]


def _text_doors(tmp_path):
    """The same texts through every entry point that reads texts."""
    import datasets
    import pandas as pd

    table = pd.DataFrame({"text": TEXTS})
    table.to_json(tmp_path / "t.jsonl", orient="records", lines=True)
    table.to_csv(tmp_path / "t.csv", index=False)
    table.to_parquet(tmp_path / "t.parquet")
    return {"list": TEXTS, "tuple": tuple(TEXTS), "Series": table.text, "generator": (t for t in TEXTS),
            "list of batches": [TEXTS[:2], TEXTS[2:]], "jsonl": tmp_path / "t.jsonl", "csv": tmp_path / "t.csv",
            "parquet": tmp_path / "t.parquet", "Dataset": datasets.Dataset.from_pandas(table)}


def test_empty_texts_are_dropped_alike_through_every_door(bert, tmp_path):
    # issue 38: [""] + texts as a list put an [CLS] [SEP] row (mass 1.0 on the first token) into the means,
    # while the same texts as JSONL or a Dataset dropped it: every door must give the reference's numbers
    reference = interp.sink_profile(bert, [t for t in TEXTS if t.strip()], progress=False)
    for door, data in _text_doors(tmp_path).items():
        with pytest.warns(UserWarning, match=r"^2 empty text\(s\) .*were dropped") as caught:
            got = interp.sink_profile(bert, data, progress=False)
        assert sum("empty text" in str(w.message) for w in caught) == 1, door
        assert (got.n_rows == reference.n_rows).all(), door
        assert got["mass"].to_numpy() == pytest.approx(reference["mass"].to_numpy(), abs=1e-6), door


@pytest.mark.parametrize("data,words", [
    (["a b", 3], r"item 1 of the list of texts is int 3, not a str"),
    ((None, "a b"), r"item 0 of the list of texts is NoneType None"),
    (["", " \n"], r"every text given \(2\) is empty"),
    ((t for t in ["", " "]), r"data is empty.*every text was empty"),
])
def test_texts_that_are_not_text_are_one_input_error(bert, data, words):
    with pytest.raises(InputError, match=words):
        interp.sink_profile(bert, data, progress=False)
