"""Every exception is ours: each public function and each command, driven with bad inputs of every
class (paths taken for text, tables and datasets of the wrong types, padded token arrays, damaged
statistics and model folders, meta / integer models, images of another size, positions past the
end, bad labels and metrics, full disks, wrong types and values), raises only an ``InterpError``
subclass whose message names the problem; none is a raw traceback, none a silent result.
``interp.errors.public`` turns whatever a check missed into ``InternalError`` (a bug to report);
these cases must be caught earlier, by a specific check. CLI help lists only accepted options.
"""

import errno
import importlib
import inspect
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

import interp
import interp.io
import interp.report.pipeline
import interp.record.stats
from interp.ablation.log import ResultLog
from interp.cli import build_parser
from interp.cli import main as cli_main
from interp.errors import InputError, InternalError, InterpError
from interp.models import tiny_hf_model, tiny_inputs
from interp.models.zoo import ZOO
from interp.record.stats import QKVStats


class Ctx:
    """Models, data and files the cases share, built once."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.tokenizer = tf.AutoTokenizer.from_pretrained(ZOO["smollm2-135m"].folder())
        hf = tiny_hf_model("gpt2")
        hf.resize_token_embeddings(len(self.tokenizer))
        self.lm = interp.load_model(hf, device="cpu", tokenizer=self.tokenizer)
        self.vit = interp.load_model(tiny_hf_model("vit"), device="cpu")
        self.clf = interp.load_model("digits-vit", device="cpu")
        self.x, self.ids = tiny_inputs("vit"), torch.randint(3, 90, (2, 7))
        self.stats = interp.record_qkv(self.vit, [self.x], progress=False)
        self.stats_file = self.stats.save(tmp / "stats.safetensors")

    def profile(self):
        return interp.frequency_profile(self.vit, [self.x], progress=False)

    def sinks(self):
        return interp.sink_profile(self.lm, [self.ids], progress=False)

    def file(self, name, text):
        path = self.tmp / name
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
        return path

    def jsonl(self, name, rows):
        return self.file(name, "".join(json.dumps(r) + "\n" for r in rows))

    def parquet(self, name, values):
        path = self.tmp / name
        pd.DataFrame({"text": values}).to_parquet(path)
        return path

    def stats_with(self, name, change):
        tensors = load_file(str(self.stats_file))
        with safe_open(str(self.stats_file), framework="pt") as fh:
            meta = json.loads(fh.metadata()["interp"])
        change(tensors, meta)
        path = self.tmp / name
        save_file(tensors, str(path), metadata={"interp": json.dumps(meta)})
        return path

    def folder(self, name, config=None, truncate=None, weights=True):
        """A saved tiny GPT-2, its config.json replaced (a dict is merged in; a string written as it is)."""
        path = self.tmp / name
        if not path.exists():
            tiny_hf_model("gpt2").save_pretrained(path)
        if isinstance(config, dict):
            config = json.dumps({**json.loads((path / "config.json").read_text()), **config})
        if config is not None:
            (path / "config.json").write_text(config)
        weights_file = path / "model.safetensors"
        if truncate:
            weights_file.write_bytes(weights_file.read_bytes()[:truncate])
        if not weights:
            weights_file.rename(path / "pytorch_model.bin")
        return str(path)


def _datasets():
    return pytest.importorskip("datasets")


def _meta_model():
    with torch.device("meta"):
        return tf.GPT2LMHeadModel(tiny_hf_model("gpt2").config)


def _failing(target, name, exc):
    """Run ``call`` with ``target.name`` replaced by a function raising ``exc`` (a full disk)."""
    def run(call):
        original = getattr(target, name)

        def boom(*args, **kwargs):
            raise exc
        setattr(target, name, boom)
        try:
            return call()
        finally:
            setattr(target, name, original)
    return run


NO_SPACE = OSError(errno.ENOSPC, "No space left on device")
SAFETENSORS_FULL = SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
IMG8 = torch.randn(2, 3, 8, 8)


def ce(c, labels):
    return interp.ablate_bias(c.clf, [(IMG8, labels)], kinds=("v",), metric="cross_entropy", progress=False, estimate="exact")


def lm_sweep(c, data=None, **kw):
    return interp.ablate_bias(c.lm, [c.ids] if data is None else data, **{"kinds": ("v",), "progress": False, **kw})


def sweep_log_full(c):
    log = ResultLog(c.tmp / "sweep" / "ablation.jsonl", {"model": "m"}, overwrite=True)
    return _failing(interp.io.os, "fsync", NO_SPACE)(lambda: log.add({"_key": "a"}))


def zero_counts(t, meta):
    for name in t:
        if name.endswith(".count"):
            t[name] = torch.zeros(1, dtype=torch.float64)


def left_padded(c):
    """MiniLM's tokenizer pads with [PAD] = 0, no other special token: a pad id before real tokens is left padding."""
    tokenizer = tf.AutoTokenizer.from_pretrained(ZOO["minilm-l6"].folder())
    hf = tiny_hf_model("bert")
    hf.resize_token_embeddings(len(tokenizer))
    bert = interp.load_model(hf, device="cpu", tokenizer=tokenizer)
    assert bert.tokenizer.pad_token_id == 0 not in (bert.tokenizer.eos_token_id, bert.tokenizer.bos_token_id)
    return interp.record_qkv(bert, np.array([[0, 5, 6], [5, 6, 7]]), progress=False)


# (id, call, regex the message must match); each call must raise an InterpError (not InternalError)
CASES = [
    # ---- a string that looks like a path is never read as a sentence -------------------------------------
    ("path with a space to record", lambda c: interp.record_qkv(c.lm, "/data/my corpus.txt", progress=False),
     "no such file or folder.*looks like a path"),
    ("relative path with a space", lambda c: interp.record_qkv(c.lm, "data/my corpus.jsonl", progress=False),
     "no such file"),
    ("file name with a space", lambda c: interp.record_qkv(c.lm, "my corpus.parquet", progress=False), "no such file"),
    ("windows path", lambda c: interp.record_qkv(c.lm, "C:\\data\\my file.csv", progress=False), "no such file"),
    ("home folder path", lambda c: interp.record_qkv(c.lm, "~/my data/", progress=False), "no such file"),
    ("url", lambda c: interp.record_qkv(c.lm, "https://example.com/my data.jsonl", progress=False), "no such file"),
    ("path to ablate_bias", lambda c: lm_sweep(c, data="/data/my corpus.txt"), "no such file"),
    ("path to frequency_profile", lambda c: interp.frequency_profile(c.lm, "/data/a b.txt", progress=False),
     "no such file"),
    ("path to score_decomposition", lambda c: interp.score_decomposition(c.lm, "/data/a b.txt", progress=False),
     "no such file"),
    ("path to bias_invariances", lambda c: interp.bias_invariances(c.lm, "/data/a b.txt", progress=False),
     "no such file"),
    ("path to make_context", lambda c: interp.report.pipeline.make_context(c.lm, "/data/my corpus.txt"), "no such file"),
    ("path to resolve_data", lambda c: interp.resolve_data(c.lm, "/data/my corpus.txt"), "no such file"),
    ("path to iter_batches", lambda c: list(interp.iter_batches(c.lm, "/data/my corpus.txt")), "no such file"),
    ("empty string as data", lambda c: interp.record_qkv(c.lm, "", progress=False), "empty string"),
    ("blank string as data", lambda c: interp.record_qkv(c.vit, "  ", progress=False), "empty string"),
    ("built-in name to resolve_data", lambda c: interp.resolve_data(c.lm, "python-docs"), "built-in dataset"),
    ("a DataFrame as data", lambda c: interp.record_qkv(c.lm, pd.DataFrame({"text": ["a b"]}), progress=False),
     "pandas DataFrame.*tolist"),
    ("bytes as data", lambda c: interp.record_qkv(c.lm, b"a b", progress=False), "data is bytes"),
    ("sentence to a ViT", lambda c: interp.record_qkv(c.vit, "a photo of a cat", progress=False),
     "unknown dataset or path"),
    # ---- tables: a cell that is not text is named by column and row ------------------------------------
    ("jsonl integer text", lambda c: interp.record_qkv(c.lm, c.jsonl("i.jsonl", [{"text": "a b"}, {"text": 5}]),
                                                       progress=False), "line 2 of column 'text' is an int"),
    ("jsonl list text", lambda c: interp.record_qkv(c.lm, c.jsonl("l.jsonl", [{"text": ["a"]}]), progress=False),
     "line 1 of column 'text' is a list"),
    ("jsonl null text", lambda c: interp.record_qkv(c.lm, c.jsonl("n.jsonl", [{"text": "a b"}, {"text": None}]),
                                                    progress=False), "line 2 .* empty \\(null\\)"),
    ("jsonl object text", lambda c: interp.record_qkv(c.lm, c.jsonl("d.jsonl", [{"text": {"a": 1}}]),
                                                      progress=False), "is a dict"),
    ("jsonl line not an object", lambda c: interp.record_qkv(c.lm, c.jsonl("a.jsonl", [[1, 2]]), progress=False),
     "line 1 is a JSON list, not an object"),
    ("jsonl column of numbers named", lambda c: interp.resolve_data(
        c.lm, c.jsonl("o.jsonl", [{"text": "a b", "n": 1}]), text_column="n"), "line 1 of column 'n' is an int"),
    ("parquet integer column", lambda c: interp.record_qkv(c.lm, c.parquet("i.parquet", [1, 2]), progress=False),
     "row 1 of column 'text' is an int"),
    ("parquet list column", lambda c: interp.record_qkv(c.lm, c.parquet("l.parquet", [["a"], ["b"]]),
                                                        progress=False), "row 1 of column 'text' is a list"),
    ("parquet missing value", lambda c: interp.record_qkv(c.lm, c.parquet("n.parquet", ["a b", None]),
                                                          progress=False), "row 2 .* empty"),
    ("csv not UTF-8", lambda c: interp.record_qkv(c.lm, c.file("b.csv", b"text\n\xff\xfe x\n"), progress=False),
     "not UTF-8"),
    ("jsonl not UTF-8", lambda c: interp.record_qkv(c.lm, c.file("b.jsonl", b'{"text": "\xff"}\n'), progress=False),
     "not UTF-8"),
    ("an image path that is not an image", lambda c: interp.record_qkv(c.vit, c.file("broken.png", b"not an image"),
                                                                     progress=False),
     r"no item of the data could be read.*broken\.png"),
    ("image column of integers", lambda c: interp.record_qkv(c.vit, c.jsonl("img.jsonl", [{"image": 3}]),
                                                             progress=False), "column 'image' is an int"),
    ("text_column not a string", lambda c: interp.resolve_data(c.lm, c.tmp / "i.jsonl", text_column=3),
     "text_column must be a column name"),
    # ---- datasets ------------------------------------------------------------------------------------
    ("datasets integer column", lambda c: interp.record_qkv(c.lm, _datasets().Dataset.from_dict({"text": [1, 2]}),
                                                            progress=False), "column 'text' holds int64"),
    ("datasets list column", lambda c: interp.record_qkv(c.lm, _datasets().Dataset.from_dict({"text": [["a"]]}),
                                                         progress=False), "column 'text' holds"),
    ("datasets missing value", lambda c: interp.record_qkv(c.lm, _datasets().Dataset.from_dict(
        {"text": ["a b", None]}), progress=False), "row 2 of column 'text' is empty"),
    ("datasets image column of integers", lambda c: interp.record_qkv(c.vit, _datasets().Dataset.from_dict(
        {"image": [1]}), progress=False), "holds int64 values .* not images"),
    ("datasets no rows", lambda c: interp.record_qkv(c.lm, _datasets().Dataset.from_dict({"text": []}),
                                                     progress=False), "no rows"),
    ("datasets DatasetDict", lambda c: interp.record_qkv(c.lm, _datasets().DatasetDict(
        {"train": _datasets().Dataset.from_dict({"text": ["a b"]})}), progress=False), "pass one split"),
    ("IterableDataset without the column", lambda c: interp.record_qkv(c.lm, _datasets().Dataset.from_dict(
        {"body": ["a b"]}).to_iterable_dataset(), progress=False), "no column 'text'; its columns: body"),
    ("IterableDataset of integers", lambda c: interp.record_qkv(c.lm, _datasets().IterableDataset.from_generator(
        lambda: iter([{"text": 4}])), progress=False), "row 1 of column 'text' is an int"),
    # ---- numpy token arrays ------------------------------------------------------------------------------
    ("numpy ids left-padded", left_padded, "pad id .* before real tokens"),
    ("numpy float ids", lambda c: interp.record_qkv(c.lm, np.random.rand(2, 5), progress=False), "integer token"),
    ("numpy ids beyond the vocabulary", lambda c: interp.record_qkv(c.lm, np.full((1, 4), 10**6), progress=False),
     "vocabulary"),
    # ---- statistics files -------------------------------------------------------------------------------
    ("stats NaN count", lambda c: QKVStats.load(c.stats_with("nan.st", lambda t, m: t.__setitem__(
        "L0.q.count", torch.tensor([float("nan")], dtype=torch.float64)))), "NaN or inf"),
    ("stats zero counts", lambda c: QKVStats.load(c.stats_with("zero.st", zero_counts)), "positive whole number"),
    ("stats counts disagree", lambda c: QKVStats.load(c.stats_with("two.st", lambda t, m: t.__setitem__(
        "L1.v.count", t["L1.v.count"] + 1))), "counts of L1"),
    ("stats NaN mean", lambda c: QKVStats.load(c.stats_with("nanm.st", lambda t, m: t.__setitem__(
        "L0.k.mean", t["L0.k.mean"] * float("nan")))), "'L0.k.mean' holds NaN"),
    ("stats without layers", lambda c: QKVStats.load(c.stats_with("nol.st", lambda t, m: m.pop("layers"))),
     "field\\(s\\) layers missing"),
    ("stats without heads", lambda c: QKVStats.load(c.stats_with("noh.st", lambda t, m: m.pop("heads"))),
     "heads missing"),
    ("stats layers not a list", lambda c: QKVStats.load(c.stats_with("l3.st", lambda t, m: m.__setitem__(
        "layers", 3))), "layers missing or of the wrong type"),
    ("stats layer beyond the model", lambda c: QKVStats.load(c.stats_with("l9.st", lambda t, m: m.__setitem__(
        "layers", [0, 9]))), "do not fit together"),
    ("stats path None", lambda c: QKVStats.load(None), "path must be a path \\(str or Path\\); got None"),
    ("stats path a folder", lambda c: QKVStats.load(c.tmp), "no statistics file at .*a folder"),
    # ---- model folders, checked before anything is built --------------------------------------------------
    ("weights truncated to 200 bytes", lambda c: interp.load_model(c.folder("t200", truncate=200), device="cpu"),
     "truncated or not a safetensors file"),
    ("weights truncated, header intact", lambda c: interp.load_model(c.folder("t-100", truncate=-100),
                                                                      device="cpu"), "is truncated: its header"),
    ("config.json not JSON", lambda c: interp.load_model(c.folder("badjson", "{not json"), device="cpu"),
     "not valid JSON"),
    ("config.json a list", lambda c: interp.load_model(c.folder("list", "[1, 2]"), device="cpu"),
     "JSON list, not an object"),
    ("config.json without model_type", lambda c: interp.load_model(c.folder("nomt", json.dumps(
        {"architectures": ["GPT2LMHeadModel"]})), device="cpu"), "has no model_type"),
    ("architectures and model_type disagree", lambda c: interp.load_model(c.folder("mix", {
        "architectures": ["LlamaForCausalLM"]}), device="cpu"), "disagrees with itself.*'llama' class"),
    ("config without its size fields", lambda c: interp.load_model(c.folder("nosize", json.dumps(
        {"model_type": "llama", "architectures": ["LlamaForCausalLM"]})), device="cpu"),
     "config.json describes a .* parameters, but the weights hold"),
    ("weights of another size", lambda c: interp.load_model(c.folder("wide", {"n_embd": 64}), device="cpu"),
     "do not fit its config.json"),
    ("only pickled weights", lambda c: interp.load_model(c.folder("pickled", weights=False), device="cpu"),
     "no model.safetensors; it holds pytorch_model.bin"),
    ("config with zero heads", lambda c: interp.load_model(c.folder("zeroheads", {"n_head": 0}), device="cpu"),
     "n_head=0: a model needs at least one"),
    ("config with negative layers", lambda c: interp.load_model(c.folder("neglayers", {"n_layer": -1}), device="cpu"),
     "n_layer=-1"),
    ("load onto the meta device", lambda c: interp.load_model("digits-vit", device="meta"), "holds shapes, not values"),
    ("meta-device model", lambda c: interp.load_model(_meta_model(), device="cpu"), "meta device"),
    ("dtype int8", lambda c: interp.load_model(tiny_hf_model("gpt2"), device="cpu", dtype=torch.int8),
     "dtype must be one of"),
    ("dtype complex64", lambda c: interp.load_model(tiny_hf_model("gpt2"), device="cpu", dtype=torch.complex64),
     "dtype must be one of"),
    ("clone_model to int8", lambda c: interp.clone_model(c.vit, dtype=torch.int8), "dtype must be one of"),
    ("tokenizer as a hub id", lambda c: interp.load_model(tiny_hf_model("gpt2"), device="cpu", tokenizer="gpt2"),
     "not a local folder"),
    ("tokenizer as a folder without one", lambda c: interp.load_model(tiny_hf_model("gpt2"), device="cpu",
                                                                       tokenizer=str(c.tmp)), "no tokenizer could"),
    ("tokenizer as a number", lambda c: interp.load_model(tiny_hf_model("gpt2"), device="cpu", tokenizer=3),
     "tokenizer must be a transformers tokenizer"),
    ("bare GPT2Model", lambda c: interp.load_model(tf.GPT2Model(tiny_hf_model("gpt2").config), device="cpu"),
     "through GPT2LMHeadModel"),
    ("bare LlamaModel", lambda c: interp.load_model(tf.LlamaModel(tiny_hf_model("llama").config), device="cpu"),
     "through LlamaForCausalLM"),
    ("GPT-2 with a classification head", lambda c: interp.load_model(
        tf.GPT2ForSequenceClassification(tiny_hf_model("gpt2").config), device="cpu"), "through GPT2LMHeadModel"),
    # ---- images of another size than the model's --------------------------------------------------------
    ("ViT at twice its size", lambda c: interp.record_qkv(c.vit, [torch.randn(1, 3, 64, 64)], progress=False),
     "takes 32 x 32 images.*got 64 x 64"),
    ("ViT at half its size", lambda c: interp.frequency_profile(c.vit, [torch.randn(1, 3, 16, 16)],
                                                                progress=False), "takes 32 x 32"),
    ("ViT, non-square images", lambda c: interp.score_decomposition(c.vit, [torch.randn(1, 3, 32, 64)],
                                                                    progress=False), "got 32 x 64"),
    ("ViT, mixed sizes", lambda c: interp.frequency_profile(c.vit, [c.x, torch.randn(1, 3, 64, 64)],
                                                            progress=False), "takes 32 x 32"),
    ("DeiT at another size", lambda c: interp.record_qkv(interp.load_model(tiny_hf_model("deit"), device="cpu"),
                                                         [torch.randn(1, 3, 64, 64)], progress=False), "takes 32"),
    ("timm ViT at another size", lambda c: interp.ablate_bias(interp.load_model(tiny_hf_model("timm-vit"),
                                                                                device="cpu"),
                                                              [torch.randn(1, 3, 16, 16)], progress=False, estimate="exact"),
     "takes 32"),
    # ---- positions: RoBERTa's table starts after its padding index --------------------------------------------
    ("RoBERTa one past its positions", lambda c: interp.record_qkv(
        interp.load_model(tiny_hf_model("roberta"), device="cpu"), [torch.randint(3, 90, (1, 65))], progress=False),
     "exceeds the model's context of 64"),
    ("GPT-2 one past its positions", lambda c: interp.record_qkv(c.lm, [torch.randint(3, 90, (1, 65))],
                                                                 progress=False), "context of 64"),
    # ---- metrics --------------------------------------------------------------------------------------
    ("cross_entropy label out of range", lambda c: ce(c, torch.tensor([0, 99])), "labels run from 0 to 99"),
    ("cross_entropy negative label", lambda c: ce(c, torch.tensor([0, -3])), "labels run from -3"),
    ("cross_entropy labels of the wrong length", lambda c: ce(c, torch.tensor([0, 1, 2])), "shape \\(3,\\)"),
    ("cross_entropy float labels", lambda c: ce(c, torch.tensor([0.0, 1.0])), "int64 class ids"),
    ("cross_entropy 2-D labels", lambda c: ce(c, torch.tensor([[0], [1]])), "int64 class ids"),
    ("cross_entropy int32 labels", lambda c: ce(c, torch.tensor([0, 1], dtype=torch.int32)), "labels.long\\(\\)"),
    ("metric NaN on the intact model", lambda c: lm_sweep(c, metric=lambda out, batch: out.sum() * float("nan")),
     "is nan on the intact model"),
    ("metric returns a float", lambda c: lm_sweep(c, metric=lambda out, batch: 0.5), "must return a floating tensor"),
    ("metric returns a string", lambda c: lm_sweep(c, metric=lambda out, batch: "x"), "floating tensor"),
    ("metric returns a matrix", lambda c: lm_sweep(c, metric=lambda out, batch: out.mean(-1)), "floating tensor"),
    ("metric raises", lambda c: lm_sweep(c, metric=lambda out, batch: out.logits),
     "metric callable .* raised"),
    ("metric takes one argument", lambda c: lm_sweep(c, metric=lambda out: out.mean()),
     "called as metric\\(output, batch\\)"),
    # ---- a full disk is an OutputError naming the folder and the fix --------------------------------------
    ("disk full in safetensors", lambda c: _failing(importlib.import_module("interp.record.stats_format"), "save_file", SAFETENSORS_FULL)(
        lambda: c.stats.save(c.tmp / "full.st")), "disk holding .* is full"),
    ("disk full at rename", lambda c: _failing(interp.io.os, "replace", NO_SPACE)(
        lambda: interp.io.write_table(pd.DataFrame({"a": [1]}), c.tmp / "t")), "nothing was written.*full"),
    ("disk full at fsync", lambda c: _failing(interp.io.os, "fsync", NO_SPACE)(
        lambda: c.stats.save(c.tmp / "f.st")), "free space there"),
    ("disk full appending a sweep row", lambda c: sweep_log_full(c), "appending to .*ablation.jsonl failed.*full"),
    ("out folder is a file", lambda c: lm_sweep(c, out=c.stats_file), "cannot write to output folder"),
    # ---- wrong types and values ---------------------------------------------------------------------------
    ("layers as a string", lambda c: interp.record_qkv(c.vit, [c.x], layers="12", progress=False),
     "layers must be None"),
    ("layers holding None", lambda c: interp.frequency_profile(c.vit, [c.x], layers=[None], progress=False),
     "layers must be None"),
    ("layers as a float", lambda c: interp.record_qkv(c.vit, [c.x], layers=1.0, progress=False), "layers must"),
    ("heads out of range", lambda c: interp.origin_shift(c.vit, c.stats, heads=[9]), "heads must lie in 0..3"),
    ("heads out of range in scores", lambda c: interp.score_decomposition(c.vit, [c.x], heads=[4], progress=False),
     "heads must lie in 0..3"),
    ("layers out of range in sinks", lambda c: interp.sink_profile(c.vit, [c.x], layers=[5], progress=False),
     "layers must lie in 0..1"),
    ("origin of layers not recorded", lambda c: interp.origin_shift(
        c.vit, interp.record_qkv(c.vit, [c.x], layers=[0], progress=False), layers=[1]), "were not recorded"),
    ("kinds None", lambda c: interp.record_qkv(c.vit, [c.x], kinds=None, progress=False), "kinds must be"),
    ("kinds an integer", lambda c: lm_sweep(c, kinds=3), "kinds must be"),
    ("top_k a string", lambda c: lm_sweep(c, estimate="auto", top_k="x"), "top_k must be"),
    ("stack zero", lambda c: lm_sweep(c, stack=0), "stack must be"),
    ("n_boot negative", lambda c: lm_sweep(c, n_boot=-1), "n_boot must be an integer >= 0"),
    ("n_boot a float", lambda c: interp.score_decomposition(c.vit, [c.x], n_boot=10.0, progress=False), "n_boot must be"),
    ("seed a string", lambda c: lm_sweep(c, method="random", seed="1"), "seed must be an integer; got '1' \\(str\\)"),
    ("sample_k negative", lambda c: lm_sweep(c, estimate="auto", sample_k=-1), "sample_k must be"),
    ("origin intervals n_boot None", lambda c: interp.origin_shift(c.vit, c.stats, data=[c.x], n_boot=None),
     "n_boot must be"),
    ("origin intervals on other data", lambda c: interp.origin_shift(c.vit, c.stats, data=[c.x[:1]]),
     "not the data the statistics were recorded on"),
    ("n_projections a string", lambda c: interp.ablate_bias(c.vit, [c.x], estimate="atp_distance",
                                                            n_projections="x", progress=False), "n_projections"),
    ("attention_weights layer as a string", lambda c: interp.attention_weights(c.vit, "0"),
     "layer must be an integer; got '0' \\(str\\)"),
    ("attention_weights integer dtype", lambda c: interp.attention_weights(c.vit, 0, dtype=torch.int64),
     "dtype must be one of"),
    ("builtin_batches batch_size 0", lambda c: interp.builtin_batches(c.vit, "digits", batch_size=0),
     "batch_size must be an integer >= 1"),
    ("builtin_batches n negative", lambda c: interp.builtin_batches(c.vit, "digits", n=-1), "n must be"),
    ("resolve_data batch_size a string", lambda c: interp.resolve_data(c.vit, c.tmp, batch_size="8"),
     "batch_size must be an integer"),
    ("resolve_data seq_len a float", lambda c: interp.resolve_data(c.lm, c.tmp / "i.jsonl", seq_len=2.5),
     "seq_len must be an integer"),
    ("resolve_data rank a string", lambda c: interp.resolve_data(c.vit, c.tmp, rank="0"), "rank"),
    ("kv_group of a model", lambda c: interp.kv_group(c.vit, 2), "n_heads must be an integer; got model 'ViTModel'"),
    ("kv_group not a multiple", lambda c: interp.kv_group(6, 4), "multiple"),
    ("origin_shift another model's stats", lambda c: interp.origin_shift(c.lm, c.stats), "another model"),
    ("ablate mean with another model's stats", lambda c: lm_sweep(c, method="mean", stats=c.stats), "another model"),
    ("ablate sink_v folded", lambda c: lm_sweep(c, kinds=("sink_v",), method="fold"), "take method 'zero' or 'mean'"),
    ("ablate sink_v at top_content", lambda c: lm_sweep(c, kinds=("sink_v",), positions="top_content"),
     "differs per head"),
    ("ablate sink_v at a class the model lacks", lambda c: lm_sweep(c, kinds=("sink_v",), positions="register_0"),
     "no position class"),
    ("ablate massive threshold negative", lambda c: lm_sweep(c, kinds=("massive",), ratio_threshold=-5),
     "ratio_threshold must be a positive"),
    ("ablate massive target with a head", lambda c: lm_sweep(c, scope=[(0, 1, "massive")]), "head -1"),
    ("high_norm_tokens k zero", lambda c: interp.high_norm_tokens(c.vit, [c.x], k=0, progress=False),
     "k must be a positive"),
    ("cluster_heads of statistics", lambda c: interp.cluster_heads(c.stats), "DataFrame"),
    ("cluster_heads alpha a string", lambda c: interp.cluster_heads(c.profile(), alpha="0.05"),
     "alpha must be a number; got '0.05' \\(str\\)"),
    ("cluster_heads k a float", lambda c: interp.cluster_heads(c.profile(), k=3.0),
     "k must be an integer or None; got 3.0 \\(float\\)"),
    ("cluster_heads k a bool", lambda c: interp.cluster_heads(c.profile(), k=True),
     "k must be an integer or None; got True \\(bool\\)"),
    ("cluster_heads n_null a numpy float", lambda c: interp.cluster_heads(c.profile(), n_null=np.float64(5)),
     "n_null must be an integer"),
    ("cluster_heads seed negative", lambda c: interp.cluster_heads(c.profile(), seed=-1),
     "seed must be an integer >= 0"),
    ("sink_shares of a profile given twice", lambda c: interp.sink_shares(pd.concat([c.sinks(), c.sinks()])),
     "more than once"),
    ("ablate out an empty string (the current folder)", lambda c: lm_sweep(c, out=""), "out is an empty string"),
    ("merge_shards of nothing", lambda c: interp.merge_shards([]), "list of the ranks' ablate_bias DataFrames"),
    ("merge_shards of paths", lambda c: interp.merge_shards(["rank0/ablation.parquet"]), "pd.read_parquet"),
    ("merge_shards of two runs", lambda c: interp.merge_shards([lm_sweep(c, estimate="exact", shard=(0, 2)),
                                                                lm_sweep(c, [c.ids + 1], estimate="exact", shard=(1, 2))]),
     "different runs \\(data_fingerprint"),
    ("merge_shards of one rank twice", lambda c: interp.merge_shards([lm_sweep(c, estimate="exact", shard=(0, 2))] * 2),
     "one rank's table given twice"),
    ("merge_shards of one auto rank twice", lambda c: interp.merge_shards(
        [lm_sweep(c, kinds=("q", "v"), shard=(1, 2), top_k=2, sample_k=0)] * 2), "one rank's table given twice"),
    ("register_family of a name", lambda c: interp.register_family("gpt2"), "takes an interp.Family"),
    ("bias_invariances float64 a string", lambda c: interp.bias_invariances(c.lm, [c.ids], float64="no"),
     "float64 must be True or False"),
    ("unknown keyword", lambda c: interp.record_qkv(c.vit, [c.x], layer=0), "has no option 'layer' \\(did you mean 'layers'\\?\\)"),
    ("missing argument", lambda c: interp.origin_shift(c.vit), "missing a required argument: 'stats'"),
]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return Ctx(tmp_path_factory.mktemp("ours"))


def raised(call):
    """The InterpError ``call`` raises; a raw exception or no exception fails the test."""
    try:
        result = call()
    except InterpError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - this is what the test is about
        pytest.fail(f"raw {type(exc).__name__} (not an InterpError): {exc}")
    pytest.fail(f"no error: a silent result ({str(result)[:200]!r})")


@pytest.mark.parametrize("name,call,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_one_of_ours(ctx, name, call, words):
    exc = raised(lambda: call(ctx))
    assert not isinstance(exc, InternalError), f"no specific check caught it: {exc}"
    assert len(str(exc)) >= 30 and re.search(words, str(exc)), str(exc)


PUBLIC = sorted(n for n in interp.__all__ if inspect.isfunction(getattr(interp, n)))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_function_is_guarded(name):
    assert getattr(getattr(interp, name), "__interp_public__", False), f"interp.{name} is not wrapped by public"


DEFINED = sorted((n, m) for n, m in interp._PUBLIC.items() if inspect.isfunction(getattr(importlib.import_module(m), n)))


@pytest.mark.parametrize("name, module", DEFINED, ids=[n for n, _ in DEFINED])
def test_the_guard_sits_at_the_definition(name, module):
    """Every import path gets the guarded function: the package, the module that exports it, and the one
    that defines it (``interp.ablation.ablate_bias`` was unguarded)."""
    func = getattr(interp, name)
    assert getattr(func, "__interp_public__", False)
    assert getattr(importlib.import_module(module), name) is func
    assert getattr(importlib.import_module(func.__module__), name) is func


def test_bad_input_through_the_defining_modules_is_our_error(ctx, monkeypatch):
    import interp.ablation
    import interp.analysis.origin
    import interp.data.iterate

    for call in (lambda: interp.ablation.ablate_bias(ctx.vit, [ctx.x], no_such_option=1),
                 lambda: interp.ablation.sweep.merge_shards([], 3),
                 lambda: interp.data.iterate.open_data(ctx.vit, [ctx.x], bogus=1),
                 lambda: interp.analysis.sinks.sink_shares(profile=None, extra=2)):
        exc = raised(call)
        # the guard names the parameters; ablate_bias, which takes its options as keywords, names SweepOptions'
        assert isinstance(exc, InputError) and (
            "parameters are" in str(exc) or "has no option" in str(exc)), exc

    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(interp.analysis.origin, "require_stats", broken)
    exc = raised(lambda: interp.analysis.origin.origin_shift(ctx.vit, ctx.stats))
    assert isinstance(exc, InternalError) and isinstance(exc.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("name", PUBLIC)
def test_a_wrong_keyword_names_the_parameters(name):
    exc = raised(lambda: getattr(interp, name)(no_such_option=1))
    assert not isinstance(exc, InternalError), exc
    assert "no_such_option" in str(exc) or "missing a required argument" in str(exc), exc


MODEL_FIRST = [n for n in PUBLIC if next(iter(inspect.signature(getattr(interp, n)).parameters), "") == "model"]
FILLERS = {"data": [torch.zeros(1, 3, 32, 32)], "stats": None, "layer": 0, "targets": [(0, 0, "q")], "method": "zero",
           "batch": None, "name": "digits"}


@pytest.mark.parametrize("name", MODEL_FIRST)
@pytest.mark.parametrize("model", [None, "gpt2", torch.nn.Linear(2, 2)], ids=["None", "a string", "nn.Linear"])
def test_every_analyzer_refuses_what_is_not_a_model(name, model):
    func = getattr(interp, name)
    required = [p for p in list(inspect.signature(func).parameters.values())[1:]
                if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    exc = raised(lambda: func(model, *[FILLERS.get(p.name) for p in required]))
    assert not isinstance(exc, InternalError) and re.search("load_model|model", str(exc)), str(exc)


def test_what_no_check_caught_leaves_as_internal_error(ctx, monkeypatch):
    """The last line of defence: an unexpected exception becomes InternalError, saying what failed, on
    which input and that it is a bug, with the original as its cause."""
    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(interp.analysis.origin, "require_stats", broken)
    with pytest.raises(InternalError, match="origin_shift failed unexpectedly on .*model 'ViTModel'.*"
                                            "ZeroDivisionError.*bug in interp") as info:
        interp.origin_shift(ctx.vit, ctx.stats)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_resources_and_interrupts_pass_through(ctx, monkeypatch):
    for exc in (MemoryError(), KeyboardInterrupt(), torch.cuda.OutOfMemoryError("CUDA out of memory")):
        def broken(*args, **kwargs):
            raise exc
        monkeypatch.setattr(interp.analysis.origin, "require_stats", broken)
        with pytest.raises(type(exc)):
            interp.origin_shift(ctx.vit, ctx.stats)


# ---- what used to be taken as something else, now read as meant -------------------------------------------


def test_trailing_pad_ids_of_a_token_array_are_masked_out(ctx):
    pad = ctx.tokenizer.pad_token_id
    padded = interp.record_qkv(ctx.lm, np.array([[5, 6, 7, pad, pad], [5, 6, 7, 8, 9]]), progress=False)
    assert padded.count(0) == 3 + 5  # the two trailing pads are not tokens


def test_an_iterable_dataset_streams(ctx):
    ds = _datasets().Dataset.from_dict({"text": ["hello world", "more text here"]}).to_iterable_dataset()
    streamed = interp.record_qkv(ctx.lm, ds, progress=False)
    listed = interp.record_qkv(ctx.lm, _datasets().Dataset.from_dict({"text": ["hello world", "more text here"]}),
                               progress=False)
    assert streamed.count(0) == listed.count(0) > 0


def test_roberta_runs_at_its_last_position():
    roberta = interp.load_model(tiny_hf_model("roberta"), device="cpu")
    assert roberta.interp.max_positions == 64  # 66 embeddings, padding index 1: positions 2..65
    interp.record_qkv(roberta, [torch.randint(3, 90, (1, 64))], progress=False)


def test_a_tokenizer_folder_is_read(ctx):
    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu", tokenizer=str(ZOO["smollm2-135m"].folder()))
    assert model.tokenizer is not None and model.tokenizer("a b")["input_ids"]


def test_a_sentence_is_still_text(ctx):
    stats = interp.record_qkv(ctx.lm, "two words, no path", progress=False)
    assert stats.count(0) == len(ctx.lm.tokenizer("two words, no path")["input_ids"])


def test_dinov2_takes_any_multiple_of_its_patch():
    dino = interp.load_model(tiny_hf_model("dinov2"), device="cpu")
    stats = interp.record_qkv(dino, [torch.randn(1, 3, 64, 64)], progress=False)
    patch = dino.hf_model.config.patch_size  # 8; the config's image_size is 32
    assert stats.count(0) == (64 // patch) ** 2 + 1  # every patch of the 64 x 64 image and the CLS token


# ---- the command line ----------------------------------------------------------------------------------------

CLI_CASES = [
    ("demo negative top-k before loading", ["demo", "--model", "digits-vit", "--top-k", "-2"], "top_k must be"),
    ("record path with a space", ["record", "--model", "digits-vit", "--data", "/data/my images/"], "no such file"),
    ("record batch-size 0", ["record", "--model", "digits-vit", "--data", "digits", "--batch-size", "0"],
     "batch_size must be an integer >= 1"),
    ("record seq-len -1", ["record", "--model", "digits-vit", "--data", "digits", "--seq-len", "-1"], "seq_len must"),
    ("record max-tokens 0", ["record", "--model", "digits-vit", "--data", "digits", "--max-tokens", "0"],
     "max_tokens must"),
    ("ablate max-items 0", ["ablate", "--model", "digits-vit", "--data", "digits", "--max-items", "0"], "max_items"),
    ("ablate kind o", ["ablate", "--model", "digits-vit", "--data", "digits", "--kinds", "o"], "subset of q, k, v"),
    ("origin text-column on a built-in", ["origin", "--model", "digits-vit", "--data", "digits", "--text-column",
                                          "t"], "--text-column applies to your own files"),
    ("record text-column on a built-in", ["record", "--model", "digits-vit", "--data", "digits", "--text-column",
                                          "t"], "--text-column applies to your own files"),
    ("ablate normalize on a built-in", ["ablate", "--model", "digits-vit", "--data", "digits", "--normalize", "none"],
     "--normalize applies"),
    ("scores seq-len on an image set", ["scores", "--model", "digits-vit", "--data", "digits", "--seq-len", "5"],
     "--seq-len applies to your own files"),
    ("scores missing folder", ["scores", "--model", "digits-vit", "--data", "./my data/"], "no such file"),
    ("frequency bad model folder", ["frequency", "--model", "/no such/model dir"], "unknown model source"),
    ("origin heads out of range", ["origin", "--model", "digits-vit", "--heads", "0,9"], "heads must lie in 0..3"),
    ("sinks layers out of range", ["sinks", "--model", "digits-vit", "--layers", "7"], "layers must lie in 0..3"),
    ("origin stats not there", ["origin", "--model", "digits-vit", "--stats", "./no stats/"], "no statistics file"),
    ("inventory truncated weights", ["inventory", "--model", "TRUNCATED"], "truncated"),
    ("demo empty model (ran the default model)", ["demo", "--model", ""], "--model is an empty string"),
    ("origin empty stats", ["origin", "--model", "digits-vit", "--stats", " "], "--stats is an empty string"),
]


@pytest.mark.parametrize("name,argv,words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_command_line_is_one_clear_line(ctx, capsys, tmp_path, name, argv, words):
    argv = [ctx.folder("cli-trunc", truncate=300) if a == "TRUNCATED" else a for a in argv]
    assert cli_main(argv + ["--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert err and err[-1].startswith(f"interp {argv[0]}: error: ") and words in err[-1], captured.err
    assert "Traceback" not in captured.err and "loading" not in captured.out  # refused before any step


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_help_mentions_only_accepted_options(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "10000")  # no line breaks inside an option's name
    sub = _subcommands()[command]
    accepted = {s for a in sub._actions for s in a.option_strings}
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", sub.format_help()))  # --float64 too
    assert mentioned <= accepted, f"{command} --help mentions {sorted(mentioned - accepted)}, which it refuses"


@pytest.mark.parametrize("command", ["origin", "scores", "frequency"])
def test_analysis_commands_run_with_the_data_options_their_help_lists(ctx, tmp_path, command):
    from PIL import Image

    rows = []
    for i in range(3):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append({"picture": f"{i}.png"})
    table = tmp_path / "images.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [command, "--model", "digits-vit", "--data", str(table), "--image-column", "picture", "--batch-size", "2",
            "--max-items", "3", "--normalize", "imagenet", "--strict", "--quick", "--out", str(tmp_path / "out")]
    assert cli_main(argv) == 0


def test_guarantees_quote_the_number_of_cases():
    """docs/guarantees.md says how many bad inputs this file drives; it said 122 and 14 after cases were added."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "guarantees.md").read_text()
    quoted = re.search(r"\((\d+) API cases, (\d+) command lines\)", text)
    assert quoted and (int(quoted.group(1)), int(quoted.group(2))) == (len(CASES), len(CLI_CASES)), quoted

