"""interp.data.iterate: one decision of what a ``data`` argument is, shared by the API, the pipeline
and the CLI (the same argument and options give the same batches through each door)."""

import argparse

import pytest
import torch

import interp
from interp.data import Batch, DataSource, open_data
from interp.errors import InputError
from interp.models import tiny_hf_model


@pytest.fixture(scope="module")
def lm():
    from transformers import AutoTokenizer

    from interp.models.zoo import ZOO

    folder = ZOO["smollm2-135m"].folder()
    if not folder.exists():
        pytest.skip("the zoo is not fetched (make models)")
    return interp.load_model(tiny_hf_model("llama", config={"vocab_size": 49152}), device="cpu",
                             tokenizer=AutoTokenizer.from_pretrained(folder))


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
    from interp.pipeline import make_context

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
