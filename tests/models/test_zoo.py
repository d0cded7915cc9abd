"""Real zoo models offline, each checked against its source format (slow; CI runs them)."""

import math

import numpy as np
import pytest
import torch

import interp
from interp.data import photos, python_docs
from interp.errors import MissingWeightsError
from interp.models.zoo import ZOO

pytestmark = pytest.mark.slow


def needs(name):
    if not ZOO[name].available():
        pytest.fail(f"{name} is not cached: the test setup (`make models`) should have fetched it")


def embed(model, texts):
    enc = model.tokenizer(texts, return_tensors="pt", padding=True)
    last = f"blocks.{model.interp.n_layers - 1}.hook_out"
    with torch.no_grad():
        _, cache = model.run_with_cache(enc["input_ids"], attention_mask=enc["attention_mask"], names_filter=[last])
    m = enc["attention_mask"][..., None].float()
    e = (cache[last] * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(e, dim=-1)


def test_minilm_paraphrase_closer_than_unrelated():
    needs("minilm-l6")
    model = interp.load_model("minilm-l6", device="cpu")
    e = embed(model, ["A man is playing a guitar.", "Someone plays an acoustic guitar.",
                      "The stock market fell sharply on Tuesday."])
    para, unrelated = float(e[0] @ e[1]), float(e[0] @ e[2])
    assert para > unrelated + 0.3, (para, unrelated)


def test_smollm2_knows_paris_and_has_a_sane_perplexity():
    needs("smollm2-135m")
    model = interp.load_model("smollm2-135m", device="cpu")
    tok = model.tokenizer
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        for _ in range(6):
            nxt = model(ids)[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    assert "Paris" in tok.decode(ids[0])
    seqs, mask = python_docs(tok, seq_len=64, n_seqs=8)
    with torch.no_grad():
        logits = model(seqs, attention_mask=mask)
    lp = logits[:, :-1].log_softmax(-1).gather(-1, seqs[:, 1:, None])[..., 0]
    keep = mask[:, 1:].bool()
    ppl = math.exp(float(-lp[keep].mean()))
    print(f"SmolLM2-135M perplexity on Python docs: {ppl:.2f}")
    assert 1.5 < ppl < 60


def test_dinov2_matches_onnxruntime_on_photographs():
    needs("dinov2-s14")
    import onnx
    import onnxruntime as ort

    src = ZOO["dinov2-s14"].folder() / "source.onnx"
    graph = onnx.load(str(src))
    final = [n for n in graph.graph.node if "backbone.layernorm.bias" in n.input][0].output[0]
    graph.graph.output.append(onnx.helper.make_tensor_value_info(final, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    x = photos(224, n=4)
    ref = sess.run([final], {"input_image": x.numpy()})[0]
    model = interp.load_model("dinov2-s14", device="cpu")
    with torch.no_grad():
        out = model(x).numpy()
    diff = float(np.abs(out - ref).max())
    print(f"DINOv2 vs onnxruntime: max abs diff {diff:.2e}")
    assert diff <= 1e-3


def test_missing_cache_says_to_rerun_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    with pytest.raises(MissingWeightsError, match="make models"):
        interp.load_model("minilm-l6")


def _copied_minilm_cache(tmp_path, monkeypatch):
    """A copy of the cached minilm-l6 folder under a fresh $INTERP_CACHE, to damage."""
    import shutil

    needs("minilm-l6")
    src = ZOO["minilm-l6"].folder()
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    dst = ZOO["minilm-l6"].folder()
    shutil.copytree(src, dst)
    return dst


def test_corrupt_cache_says_to_rerun_setup(tmp_path, monkeypatch):
    weights = _copied_minilm_cache(tmp_path, monkeypatch) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    with pytest.raises(MissingWeightsError, match="corrupt.*make models"):
        interp.load_model("minilm-l6")


def test_stale_cache_version_is_not_used(tmp_path, monkeypatch):
    import json

    dst = _copied_minilm_cache(tmp_path, monkeypatch)
    (dst / "interp_cache.json").write_text(json.dumps({"cache_version": 0}))
    with pytest.raises(MissingWeightsError, match="make models"):
        interp.load_model("minilm-l6")


def test_list_models_reports_availability():
    df = interp.list_models()
    assert {"minilm-l6", "smollm2-135m", "dinov2-s14"} <= set(df.name)
    assert set(df.columns) >= {"name", "family", "bias", "source", "available"}
