"""Bad input to every public function and command: one clear error naming the problem.

Each case: what is passed, the error class expected, words the message must contain. No
case may end in a raw traceback (an exception outside ``InterpError``) or a silent result.
"""

import json

import pandas as pd
import pytest
import timm
import torch
import transformers as tf
from safetensors.torch import load_file, save_file

import interp
import interp.data
from interp import interactive
from interp.cli import main as cli_main
from interp.errors import (
    InputError,
    InterpError,
    MissingWeightsError,
    OfflineError,
    RegistryError,
    StaleResultsError,
    UnknownSourceError,
    UnsupportedModelError,
)
from interp.io import OutputError
from interp.models import tiny_hf_model, tiny_inputs
from interp.record.patching import bias_patch_hooks
from interp.record.stats import QKVStats


class Ctx:
    """Models, data and files the cases use, built once."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.vit = interp.load_model(tiny_hf_model("vit"), device="cpu")
        self.lm = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
        self.lm2 = interp.load_model(tiny_hf_model("gpt2", seed=3), device="cpu")
        self.bert = interp.load_model(tiny_hf_model("bert"), device="cpu")
        self.clf = interp.load_model("digits-vit", device="cpu")
        self.x = tiny_inputs("vit")
        self.ids = tiny_inputs("gpt2")
        self.stats = interp.record_qkv(self.vit, [self.x], progress=False)
        self.lm_stats = interp.record_qkv(self.lm, [self.ids], progress=False)
        self.profile = interp.frequency_profile(self.vit, [self.x], progress=False)
        self.stats_file = self.stats.save(tmp / "stats.safetensors")

    def ids_with_mask(self, mask):
        return [{"input_ids": self.ids, "attention_mask": mask}]

    def damaged_stats(self, name, change):
        tensors = load_file(str(self.stats_file))
        from safetensors import safe_open

        with safe_open(str(self.stats_file), framework="pt") as fh:
            meta = fh.metadata()
        change(tensors, meta)
        path = self.tmp / name
        save_file(tensors, str(path), metadata=meta)
        return path

    def folder(self, name, config=None):
        path = self.tmp / name
        path.mkdir(exist_ok=True)
        if config is not None:
            (path / "config.json").write_text(json.dumps(config))
        return path

    def a_file(self):
        path = self.tmp / "a-file.txt"
        path.write_text("not a folder")
        return path


def no_fingerprint(t, meta):
    m = json.loads(meta["interp"])
    m.pop("model_fingerprint")
    meta["interp"] = json.dumps(m)


def wrong_shape(t, meta):
    t["L0.q.mean"] = torch.zeros(3, 3, dtype=torch.float64)


def missing_tensor(t, meta):
    del t["L1.v.m2"]


def future_format(t, meta):
    m = json.loads(meta["interp"])
    m["format"] = 99
    meta["interp"] = json.dumps(m)


ELECTRA = tf.ElectraConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                           embedding_size=16, vocab_size=50)
Z = torch.zeros
CASES = [
    # ---- load_model ----------------------------------------------------------------------------
    ("load int", lambda c: interp.load_model(42), UnknownSourceError, "source must be a zoo name"),
    ("load None", lambda c: interp.load_model(None), UnknownSourceError, "source must be"),
    ("load list", lambda c: interp.load_model(["gpt2"]), UnknownSourceError, "source must be"),
    ("load unknown name", lambda c: interp.load_model("nope"), UnknownSourceError, "unknown model source 'nope'"),
    ("load hub id offline", lambda c: interp.load_model("org/model"), OfflineError, "offline"),
    ("load missing folder", lambda c: interp.load_model("./no/such/dir"), UnknownSourceError, "not a local folder"),
    ("load folder without config", lambda c: interp.load_model(str(c.folder("empty"))), UnknownSourceError,
     "no config.json"),
    ("load config without architecture", lambda c: interp.load_model(str(c.folder("noarch", {"model_type": "vit"}))),
     UnsupportedModelError, "names no architecture"),
    ("load unsupported model_type", lambda c: interp.load_model(str(c.folder("electra", {
        "model_type": "electra", "architectures": ["ElectraForMaskedLM"]}))), UnsupportedModelError,
     "unsupported architecture ElectraForMaskedLM.*Nearest supported"),
    ("load unknown HF class", lambda c: interp.load_model(str(c.folder("weird", {
        "model_type": "vit", "architectures": ["NoSuchModel"]}))), UnsupportedModelError, "no model class"),
    ("load in-memory Electra", lambda c: interp.load_model(tf.ElectraForMaskedLM(ELECTRA)), UnsupportedModelError,
     "unsupported architecture ElectraForMaskedLM"),
    ("load plain nn.Linear", lambda c: interp.load_model(torch.nn.Linear(2, 2)), UnknownSourceError,
     "transformers, timm or open_clip model, got Linear"),
    ("load a timm CNN", lambda c: interp.load_model(timm.models.resnet.resnet18(num_classes=3)), UnsupportedModelError,
     "unsupported architecture timm:ResNet"),
    ("load already-wrapped HF model", lambda c: interp.load_model(c.vit.hf_model), InputError, "already wrapped"),
    ("load device typo", lambda c: interp.load_model("digits-vit", device="gpu0"), InputError, "not a device"),
    ("load cuda without GPU", lambda c: interp.load_model("digits-vit", device="cuda:7"), InputError, "CUDA"),
    ("load dtype as string", lambda c: interp.load_model("digits-vit", dtype="float64"), InputError,
     "dtype must be a torch.dtype"),
    ("load zoo not cached", lambda c: _with_empty_cache(c), MissingWeightsError, "make models"),
    ("clone raw HF model", lambda c: interp.clone_model(tiny_hf_model("vit")), InputError, "interp.load_model"),
    # ---- the registry ---------------------------------------------------------------------------
    ("unknown family", lambda c: interp.models.get_family("gpt5"), RegistryError, "unknown model family 'gpt5'"),
    ("tiny of unknown family", lambda c: tiny_hf_model("gpt5"), RegistryError, "unknown model family"),
    ("filter by unknown field", lambda c: interp.list_families(colour="blue"), RegistryError, "cannot filter"),
    ("register a duplicate", lambda c: interp.models.register_family(interp.models.get_family("vit")),
     RegistryError, "already registered"),
    # ---- bias_spec, attention_weights -------------------------------------------------------------
    ("bias_spec raw HF", lambda c: interp.bias_spec(tiny_hf_model("gpt2")), InputError, "interp.load_model"),
    ("bias_spec string", lambda c: interp.bias_spec("gpt2"), InputError, "interp.load_model"),
    ("attention_weights layer too high", lambda c: interp.attention_weights(c.vit, 5), InputError,
     "layer 5 out of range"),
    ("attention_weights negative layer", lambda c: interp.attention_weights(c.vit, -1), InputError, "out of range"),
    ("attention_weights raw HF", lambda c: interp.attention_weights(tiny_hf_model("vit"), 0), InputError,
     "interp.load_model"),
    ("AttentionWeights unknown kind", lambda c: interp.attention_weights(c.vit, 0).bias("x"), InputError,
     "kind must be one of"),
    ("v_fold_vector raw", lambda c: interp.record.heads.v_fold_vector(tiny_hf_model("vit"), 0), InputError,
     "interp.load_model"),
    # ---- data -------------------------------------------------------------------------------------
    ("record empty list", lambda c: interp.record_qkv(c.vit, [], progress=False), InputError, "data is empty"),
    ("record empty generator", lambda c: interp.record_qkv(c.vit, iter([]), progress=False), InputError,
     "data is empty"),
    ("record float as data", lambda c: interp.record_qkv(c.vit, 3.5, progress=False), InputError, "data must be"),
    ("record None as data", lambda c: interp.record_qkv(c.vit, None, progress=False), InputError, "data must be"),
    ("record object in list", lambda c: interp.record_qkv(c.vit, [object()], progress=False), InputError,
     "cannot make a batch"),
    ("record dict without ids", lambda c: interp.record_qkv(c.lm, [{"x": c.ids}], progress=False), InputError,
     "needs 'input_ids' or 'pixel_values'"),
    ("record text without tokenizer", lambda c: interp.record_qkv(c.lm, ["some text"], progress=False), InputError,
     "no tokenizer"),
    ("record token ids to ViT", lambda c: interp.record_qkv(c.vit, [Z(2, 5, dtype=torch.long)], progress=False),
     InputError, "token ids"),
    ("record 1-channel image", lambda c: interp.record_qkv(c.vit, [torch.randn(2, 1, 32, 32)], progress=False),
     InputError, r"\[batch, 3, H, W\]"),
    ("record 3-D image", lambda c: interp.record_qkv(c.vit, [torch.randn(3, 32, 32)], progress=False), InputError,
     r"\[batch, 3, H, W\]"),
    ("record empty image batch", lambda c: interp.record_qkv(c.vit, [torch.randn(0, 3, 32, 32)], progress=False),
     InputError, r"\[batch, 3, H, W\]"),
    ("record odd image size", lambda c: interp.record_qkv(c.vit, [torch.randn(2, 3, 30, 30)], progress=False),
     InputError, "not a multiple of the patch size 8"),
    ("record NaN pixels", lambda c: interp.record_qkv(c.vit, [torch.full((1, 3, 32, 32), float("nan"))],
                                                      progress=False), InputError, "NaN or inf"),
    ("record inf pixels", lambda c: interp.record_qkv(c.vit, [torch.full((1, 3, 32, 32), float("inf"))],
                                                      progress=False), InputError, "NaN or inf"),
    ("record too long ids", lambda c: interp.record_qkv(c.lm, [Z(1, 100, dtype=torch.long)], progress=False),
     InputError, "exceeds the model's context of 64"),
    ("record pixels to LM", lambda c: interp.record_qkv(c.lm, [torch.randn(1, 3, 32, 32)], progress=False),
     InputError, "integer token ids"),
    ("record float ids", lambda c: interp.record_qkv(c.lm, [torch.rand(2, 5)], progress=False), InputError,
     "integer token ids"),
    ("record bool ids", lambda c: interp.record_qkv(c.lm, [torch.ones(2, 5, dtype=torch.bool)], progress=False),
     InputError, "integer token ids"),
    ("record 3-D ids", lambda c: interp.record_qkv(c.lm, [Z(2, 3, 4, dtype=torch.long)], progress=False),
     InputError, r"\[batch, pos\]"),
    ("record 1-D ids", lambda c: interp.record_qkv(c.lm, [Z(5, dtype=torch.long)], progress=False), InputError,
     r"\[batch, pos\]"),
    ("record empty ids", lambda c: interp.record_qkv(c.lm, [Z(2, 0, dtype=torch.long)], progress=False),
     InputError, "non-empty"),
    ("record negative ids", lambda c: interp.record_qkv(c.lm, [-torch.ones(2, 5, dtype=torch.long)],
                                                        progress=False), InputError, "vocabulary"),
    ("record ids beyond vocab", lambda c: interp.record_qkv(c.lm, [torch.full((2, 5), 97)], progress=False),
     InputError, r"0\.\.96"),
    ("record all-zero mask", lambda c: interp.record_qkv(c.lm, c.ids_with_mask(torch.zeros_like(c.ids)),
                                                         progress=False), InputError, "no real tokens"),
    ("record mask of wrong shape", lambda c: interp.record_qkv(c.lm, c.ids_with_mask(Z(2, 3, dtype=torch.long)),
                                                               progress=False), InputError, "does not match"),
    ("record mask with 2s", lambda c: interp.record_qkv(c.lm, c.ids_with_mask(torch.full_like(c.ids, 2)),
                                                        progress=False), InputError, "only 0"),
    ("record images to LM", lambda c: interp.record_qkv(c.lm, "photos", progress=False), InputError, "holds images"),
    ("record digits to LM", lambda c: interp.record_qkv(c.lm, "digits", progress=False), InputError, "holds images"),
    ("record text to ViT", lambda c: interp.record_qkv(c.vit, "python-docs", progress=False), InputError,
     "holds text"),
    ("record unknown dataset", lambda c: interp.record_qkv(c.vit, "imagenet", progress=False), InputError,
     "unknown dataset or path 'imagenet'"),
    ("builtin_batches raw HF", lambda c: interp.builtin_batches(tiny_hf_model("vit"), "photos"), InputError,
     "interp.load_model"),
    ("builtin_batches unknown", lambda c: interp.builtin_batches(c.vit, "cifar"), InputError, "unknown dataset"),
    ("python-docs without tokenizer", lambda c: interp.builtin_batches(c.lm, "python-docs"), InputError,
     "needs a tokenizer"),
    # ---- record_qkv options --------------------------------------------------------------------------
    ("record raw HF", lambda c: interp.record_qkv(tiny_hf_model("gpt2"), [c.ids], progress=False), InputError,
     "interp.load_model"),
    ("record unknown kind", lambda c: interp.record_qkv(c.vit, [c.x], kinds=("x",), progress=False), InputError,
     "kinds"),
    ("record kind o", lambda c: interp.record_qkv(c.vit, [c.x], kinds=("o",), progress=False), InputError,
     "subset of q, k, v"),
    ("record no kinds", lambda c: interp.record_qkv(c.vit, [c.x], kinds=(), progress=False), InputError,
     "non-empty"),
    ("record repeated kinds", lambda c: interp.record_qkv(c.vit, [c.x], kinds=("q", "q"), progress=False),
     InputError, "must not repeat"),
    ("record layer too high", lambda c: interp.record_qkv(c.vit, [c.x], layers=[9], progress=False), InputError,
     "layers must lie in 0..1"),
    ("record negative layer", lambda c: interp.record_qkv(c.vit, [c.x], layers=[-1], progress=False), InputError,
     "layers must lie"),
    ("record max_batches 0", lambda c: interp.record_qkv(c.vit, [c.x], max_batches=0, progress=False),
     InputError, "max_batches must be a positive"),
    ("record max_batches negative", lambda c: interp.record_qkv(c.vit, [c.x], max_batches=-2, progress=False),
     InputError, "max_batches"),
    ("record max_batches float", lambda c: interp.record_qkv(c.vit, [c.x], max_batches=1.5, progress=False),
     InputError, "max_batches"),
    ("record capture over the cap", lambda c: interp.record_qkv(c.vit, [c.x], capture=True, capture_limit_mb=1e-4,
                                                                progress=False), InterpError, "capture_limit_mb"),
    # ---- QKVStats ---------------------------------------------------------------------------------
    ("stats bad part", lambda c: c.stats.mean(0, "q", "bias"), InputError, "part must be"),
    ("stats cov bad part", lambda c: c.stats.cov(0, "q", "x"), InputError, "part must be"),
    ("stats layer not recorded", lambda c: c.stats.mean(9, "q"), InputError, "no statistics for layer 9"),
    ("stats kind not recorded", lambda c: c.stats.mean(0, "o"), InputError, "kind 'o'"),
    ("stats input_mean unknown layer", lambda c: c.stats.input_mean(9), InputError, "no statistics for layer 9"),
    ("stats count unknown layer", lambda c: c.stats.count(7), InputError, "no statistics for layer 7"),
    ("merge non-stats", lambda c: c.stats.merge({"a": 1}), InputError, "can only merge QKVStats"),
    ("merge another model", lambda c: c.stats.merge(c.lm_stats), InputError, "different models"),
    ("all_reduce without process group", lambda c: c.stats.all_reduce(), InterpError, "torch.distributed"),
    ("load missing stats file", lambda c: QKVStats.load("/nonexistent/s.safetensors"), InterpError,
     "no statistics file"),
    ("load garbage stats file", lambda c: (c.tmp / "g.st").write_bytes(b"\x00junk") and QKVStats.load(c.tmp / "g.st"),
     InterpError, "not a readable interp statistics file"),
    ("load stats with a wrong shape", lambda c: QKVStats.load(c.damaged_stats("shape.st", wrong_shape)),
     InterpError, "has shape"),
    ("load stats missing a tensor", lambda c: QKVStats.load(c.damaged_stats("missing.st", missing_tensor)),
     InterpError, "lacks tensor"),
    ("load stats of a future format", lambda c: QKVStats.load(c.damaged_stats("future.st", future_format)),
     InterpError, "format 99"),
    # ---- origin_shift ---------------------------------------------------------------------------------
    ("origin raw HF", lambda c: interp.origin_shift(tiny_hf_model("vit"), c.stats), InputError, "interp.load_model"),
    ("origin LM stats for a ViT", lambda c: interp.origin_shift(c.vit, c.lm_stats), InputError,
     "recorded on another model"),
    ("origin same-shape other model", lambda c: interp.origin_shift(c.lm2, c.lm_stats), InputError,
     "recorded on another model"),
    ("origin stats as DataFrame", lambda c: interp.origin_shift(c.vit, c.stats.to_frame()), InputError,
     "expected QKVStats"),
    ("origin stats without fingerprint", lambda c: interp.origin_shift(
        c.vit, QKVStats.load(c.damaged_stats("nofp.st", no_fingerprint))), InputError, "no model fingerprint"),
    # ---- score decomposition and invariances ------------------------------------------------------------
    ("scores raw HF", lambda c: interp.score_decomposition(tiny_hf_model("vit"), [c.x], progress=False), InputError,
     "interp.load_model"),
    ("scores empty", lambda c: interp.score_decomposition(c.vit, [], progress=False), InputError, "empty"),
    ("scores all-zero mask", lambda c: interp.score_decomposition(c.lm, c.ids_with_mask(torch.zeros_like(c.ids)),
                                                                  progress=False), InputError, "no query rows"),
    ("scores max_batches 0", lambda c: interp.score_decomposition(c.vit, [c.x], max_batches=0, progress=False),
     InputError, "max_batches"),
    ("invariances raw HF", lambda c: interp.bias_invariances(tiny_hf_model("vit"), [c.x], progress=False),
     InputError, "interp.load_model"),
    ("invariances max_batches 0", lambda c: interp.bias_invariances(c.vit, [c.x], max_batches=0, progress=False),
     InputError, "max_batches"),
    ("invariances empty", lambda c: interp.bias_invariances(c.vit, [], progress=False), InputError, "empty"),
    # ---- frequency and clustering -------------------------------------------------------------------------
    ("profile raw HF", lambda c: interp.frequency_profile(tiny_hf_model("vit"), [c.x], progress=False), InputError,
     "interp.load_model"),
    ("profile empty", lambda c: interp.frequency_profile(c.vit, [], progress=False), InputError, "empty"),
    ("profile layer too high", lambda c: interp.frequency_profile(c.vit, [c.x], layers=[7], progress=False),
     InputError, "layers must lie"),
    ("profile all-zero mask", lambda c: interp.frequency_profile(c.lm, c.ids_with_mask(torch.zeros_like(c.ids)),
                                                                 progress=False), InputError, "no real tokens"),
    ("shift unknown kind", lambda c: interp.frequency_shift_under_ablation(c.vit, [c.x], kinds=("x",),
                                                                          progress=False), InputError, "kinds"),
    ("shift unknown method", lambda c: interp.frequency_shift_under_ablation(c.vit, [c.x], method="bogus",
                                                                            progress=False), InputError, "method"),
    ("shift fold on q", lambda c: interp.frequency_shift_under_ablation(c.vit, [c.x], method="fold", progress=False),
     InputError, "v only"),
    ("cluster without features", lambda c: interp.cluster_heads(pd.DataFrame({"x": [1, 2, 3]})), InputError,
     "no feature columns"),
    ("cluster not a frame", lambda c: interp.cluster_heads([1, 2, 3]), InputError, "DataFrame"),
    ("cluster k=1", lambda c: interp.cluster_heads(c.profile, k=1), InputError, "k must lie in"),
    ("cluster k too large", lambda c: interp.cluster_heads(c.profile, k=99), InputError, "k must lie in"),
    ("cluster k float", lambda c: interp.cluster_heads(c.profile, k=2.5), InputError, r"k must be an integer or None; got 2.5 \(float\)"),
    ("cluster method", lambda c: interp.cluster_heads(c.profile, method="dbscan"), InputError, "method must be"),
    ("cluster two heads", lambda c: interp.cluster_heads(c.profile.head(2)), InputError, "at least 3 heads"),
    # ---- ablate_bias --------------------------------------------------------------------------------------
    ("ablate raw HF", lambda c: interp.ablate_bias(tiny_hf_model("vit"), [c.x], progress=False, estimate="exact"), InputError,
     "interp.load_model"),
    ("ablate fold on q", lambda c: interp.ablate_bias(c.vit, [c.x], kinds=("q",), method="fold", progress=False, estimate="exact"),
     InputError, "fold' applies to v only"),
    ("ablate unknown method", lambda c: interp.ablate_bias(c.vit, [c.x], method="bogus", progress=False, estimate="exact"),
     InputError, "method must be one of"),
    ("ablate unknown method, attribution", lambda c: interp.ablate_bias(c.lm, [c.ids], method="bogus",
                                                                        estimate="attribution", progress=False),
     InputError, "method must be one of"),
    ("ablate unknown estimate", lambda c: interp.ablate_bias(c.vit, [c.x], estimate="fast", progress=False),
     InputError, "estimate must be"),
    ("ablate attribution of a distance", lambda c: interp.ablate_bias(c.vit, [c.x], estimate="attribution",
                                                                      progress=False), InputError,
     "gradient at the intact model is zero"),
    ("ablate attribution of embedding cosine", lambda c: interp.ablate_bias(c.bert, [tiny_inputs("bert")],
                                                                            estimate="attribution", progress=False),
     InputError, "gradient at the intact model is zero"),
    ("ablate atp_distance of a task metric", lambda c: interp.ablate_bias(c.lm, [c.ids], estimate="atp_distance",
                                                                          progress=False), InputError,
     "is for the distance metrics"),
    ("ablate auto with negative top_k", lambda c: interp.ablate_bias(c.lm, [c.ids], estimate="auto", top_k=-1,
                                                                     progress=False), InputError, "top_k must be"),
    ("ablate atp_distance without projections", lambda c: interp.ablate_bias(c.vit, [c.x], estimate="atp_distance",
                                                                             n_projections=0, progress=False),
     InputError, "n_projections must be >= 1"),
    ("ablate shard outside the world", lambda c: interp.ablate_bias(c.lm, [c.ids], shard=(2, 2), progress=False, estimate="exact"),
     InputError, "0 <= rank < world"),
    ("ablate shard not a pair", lambda c: interp.ablate_bias(c.lm, [c.ids], shard=3, progress=False, estimate="exact"),
     InputError, r"shard must be a tuple of 2 \(an integer, an integer\); got 3 \(int\)"),
    ("mnist unknown split", lambda c: interp.data.mnist(28, "validation"), InputError, "split"),
    ("ablate CE without a classifier", lambda c: interp.ablate_bias(c.vit, [c.x], metric="cross_entropy",
                                                                    progress=False, estimate="exact"), InputError,
     "needs an image classifier"),
    ("ablate CE without labels", lambda c: interp.ablate_bias(c.clf, [torch.randn(2, 3, 8, 8)],
                                                              metric="cross_entropy", progress=False, estimate="exact"), InputError,
     "needs labels"),
    ("ablate next-token CE on a ViT", lambda c: interp.ablate_bias(c.vit, [c.x], metric="next_token_ce",
                                                                   progress=False, estimate="exact"), InputError,
     "needs a causal language model"),
    ("ablate next-token CE on BERT", lambda c: interp.ablate_bias(c.bert, [tiny_inputs("bert")],
                                                                  metric="next_token_ce", progress=False, estimate="exact"), InputError,
     "needs a causal language model"),
    ("ablate feature cosine on an LM", lambda c: interp.ablate_bias(c.lm, [c.ids], metric="feature_cosine",
                                                                    progress=False, estimate="exact"), InputError, "position 0"),
    ("ablate unknown metric", lambda c: interp.ablate_bias(c.vit, [c.x], metric="accuracy-ish", progress=False, estimate="exact"),
     InputError, "unknown metric"),
    ("ablate unknown scope", lambda c: interp.ablate_bias(c.vit, [c.x], scope="everything", progress=False, estimate="exact"),
     InputError, "scope must be"),
    ("ablate empty target list", lambda c: interp.ablate_bias(c.vit, [c.x], scope=[], progress=False, estimate="exact"), InputError,
     "empty list of targets"),
    ("ablate target out of range", lambda c: interp.ablate_bias(c.vit, [c.x], scope=[(7, 0, "q")], progress=False, estimate="exact"),
     InputError, "out of range"),
    ("ablate target head out of range", lambda c: interp.ablate_bias(c.vit, [c.x], scope=[(0, 9, "q")],
                                                                     progress=False, estimate="exact"), InputError, "out of range"),
    ("ablate target of kind o", lambda c: interp.ablate_bias(c.vit, [c.x], scope=[(0, 0, "o")], progress=False, estimate="exact"),
     InputError, "out of range"),
    ("ablate malformed target", lambda c: interp.ablate_bias(c.vit, [c.x], scope=[("a",)], progress=False, estimate="exact"),
     InputError, "scope must be"),
    ("ablate repeated kinds", lambda c: interp.ablate_bias(c.vit, [c.x], kinds=("q", "q"), progress=False, estimate="exact"),
     InputError, "must not repeat"),
    ("ablate no kinds", lambda c: interp.ablate_bias(c.vit, [c.x], kinds=(), progress=False, estimate="exact"), InputError,
     "non-empty"),
    ("ablate kinds as one string", lambda c: interp.ablate_bias(c.vit, [c.x], kinds="qk", progress=False, estimate="exact"),
     InputError, "kinds"),
    ("ablate mean with another model's stats", lambda c: interp.ablate_bias(c.vit, [c.x], method="mean",
                                                                            stats=c.lm_stats, progress=False, estimate="exact"),
     InputError, "recorded on another model"),
    ("ablate max_batches 0", lambda c: interp.ablate_bias(c.vit, [c.x], max_batches=0, progress=False, estimate="exact"), InputError,
     "max_batches"),
    ("ablate empty data", lambda c: interp.ablate_bias(c.vit, [], progress=False, estimate="exact"), InputError, "empty"),
    ("ablate out is a file", lambda c: interp.ablate_bias(c.vit, [c.x], kinds=("v",), out=c.a_file(),
                                                          progress=False, estimate="exact"), OutputError, "cannot write"),
    ("ablate into another run's folder", lambda c: _two_runs_one_folder(c), StaleResultsError, "another run"),
    # ---- patching hooks ------------------------------------------------------------------------------------
    ("hooks mean without stats", lambda c: bias_patch_hooks(c.vit, [(0, 0, "q")], "mean"), InputError,
     "needs stats"),
    ("hooks unknown method", lambda c: bias_patch_hooks(c.vit, [(0, 0, "q")], "x"), InputError, "method must be"),
    ("hooks fold on k", lambda c: bias_patch_hooks(c.vit, [(0, 0, "k")], "fold"), InputError, "v only"),
    ("hooks stats of another model", lambda c: bias_patch_hooks(c.vit, [(0, 0, "q")], "mean", c.lm_stats),
     InputError, "recorded on another model"),
]


def _with_empty_cache(c):
    import os

    old = os.environ.get("INTERP_CACHE")
    os.environ["INTERP_CACHE"] = str(c.tmp / "empty-cache")
    try:
        return interp.load_model("minilm-l6")
    finally:
        if old is None:
            del os.environ["INTERP_CACHE"]
        else:
            os.environ["INTERP_CACHE"] = old


def _two_runs_one_folder(c):
    out = c.tmp / "shared-out"
    interp.ablate_bias(c.lm, [c.ids], kinds=("q",), out=out, progress=False, estimate="exact", n_control=0)
    return interp.ablate_bias(c.lm2, [c.ids], kinds=("q",), out=out, progress=False, estimate="exact", n_control=0)


CASES += [  # issue 38: inputs that failed deep inside (InternalError) or passed silently
    ("sink_profile positions as an index", lambda c: interp.sink_profile(c.lm, [c.ids], positions=0, progress=False),
     InputError, r"names position classes \(strings\), not token indices; got 0 \(int\).*is 'first'"),
    ("sink_profile positions as indices", lambda c: interp.sink_profile(c.lm, [c.ids], positions=[0, 1],
                                                                         progress=False), InputError, "not token indices"),
    ("implicit_value_bias positions as an index", lambda c: interp.implicit_value_bias(
        c.lm, [c.ids], positions=0, progress=False), InputError, "not token indices"),
    ("ablate sink_v positions as an index", lambda c: interp.ablate_bias(
        c.lm, [c.ids], kinds=("sink_v",), positions=0, progress=False), InputError, "not token indices"),
    ("record texts with a number", lambda c: interp.record_qkv(c.lm, ["a b", 3], progress=False), InputError,
     "item 1 of the list of texts is int 3, not a str"),
    ("merge statistics with themselves", lambda c: c.stats.merge(c.stats), InputError, "same data twice"),
    ("attention_weights float layer", lambda c: interp.attention_weights(c.vit, 1.0), InputError,
     r"layer must be an integer; got 1.0 \(float\)"),
    ("interactive heatmap of an empty table", lambda c: interactive.sink_mass(c.profile.iloc[:0]), InputError,
     "sink_mass draws .*sink_profile.*lacks"),
    ("interactive heatmap of another table", lambda c: interactive.sink_mass(c.profile), InputError,
     r"sink_mass draws the table of interp.sink_profile\(model, data\); this table lacks"),
    ("interactive ablation of another table", lambda c: interactive.ablation_delta(c.profile), InputError,
     "ablation_delta draws the table of interp.ablate_bias"),
]

CLI_CASES = [
    ("cli inventory unknown model", ["inventory", "--model", "no-such-model"], "unknown model source 'no-such-model'"),
    ("cli record unknown dataset", ["record", "--model", "digits-vit", "--data", "imagenet"], "unknown dataset"),
    ("cli record text for a ViT", ["record", "--model", "digits-vit", "--data", "python-docs"], "holds text"),
    ("cli record max-batches 0", ["record", "--model", "digits-vit", "--data", "digits", "--max-batches", "0"],
     "max_batches must be a positive"),
    ("cli record device typo", ["record", "--model", "digits-vit", "--data", "digits", "--device", "gpu"],
     "not a device"),
    ("cli ablate kinds comma", ["ablate", "--model", "digits-vit", "--data", "digits", "--kinds", ","], "non-empty"),
    ("cli ablate kinds unknown", ["ablate", "--model", "digits-vit", "--data", "digits", "--kinds", "q,x"], "kinds"),
    ("cli ablate unknown metric", ["ablate", "--model", "digits-vit", "--data", "digits", "--metric", "accuracy"],
     "unknown metric"),
    ("cli ablate both with a distance metric", ["ablate", "--model", "digits-vit", "--data", "digits",
                                                "--metric", "feature_cosine", "--estimate", "both"],
     "gradient at the intact model is zero"),
    ("cli ablate next-token CE on a ViT", ["ablate", "--model", "digits-vit", "--data", "digits", "--metric",
                                           "next_token_ce"], "needs a causal language model"),
    ("cli ablate auto negative top-k", ["ablate", "--model", "digits-vit", "--data", "digits", "--estimate", "auto",
                                        "--top-k", "-1"], "top_k must be"),
    ("cli demo unknown model", ["demo", "--model", "no-such-model"], "unknown model source"),
    ("cli fetch unknown zoo name", ["fetch", "--only", "nope"], "unknown fetchable name 'nope'"),
    ("cli inventory unwritable out", ["inventory", "--model", "digits-vit", "--out", "/proc/interp-out"],
     "cannot write to output folder"),
]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return Ctx(tmp_path_factory.mktemp("bad-input"))


@pytest.mark.parametrize("name,call,error,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_error(ctx, name, call, error, message):
    with pytest.raises(error, match=message):
        call(ctx)


@pytest.mark.parametrize("name,argv,message", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_command_line_gets_one_clear_line(ctx, capsys, tmp_path, name, argv, message):
    if "--out" not in argv and argv[0] in ("record", "ablate", "inventory", "demo"):
        argv = argv + ["--out", str(tmp_path / "out")]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(f"interp {argv[0]}: error")  # one line, last


def test_the_table_is_large_enough():
    assert len(CASES) + len(CLI_CASES) >= 120
