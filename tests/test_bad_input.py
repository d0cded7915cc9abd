"""Bad input to every public function: one clear error naming the argument and what was expected."""

import pandas as pd
import pytest
import torch

import interp
from interp.errors import InputError, InterpError, OfflineError, UnknownSourceError
from interp.models import tiny_hf_model, tiny_inputs


@pytest.fixture(scope="module")
def vit():
    return interp.load_model(tiny_hf_model("vit"), device="cpu")


@pytest.fixture(scope="module")
def lm():
    return interp.load_model(tiny_hf_model("gpt2"), device="cpu")


CASES = [
    ("load_model int", lambda v, l: interp.load_model(42), UnknownSourceError, "source must be a zoo name"),
    ("load_model unknown", lambda v, l: interp.load_model("nope"), UnknownSourceError, "unknown model source 'nope'"),
    ("load_model hub offline", lambda v, l: interp.load_model("org/model"), OfflineError, "offline"),
    ("bias_spec raw HF", lambda v, l: interp.bias_spec(tiny_hf_model("gpt2")), InputError, "interp.load_model"),
    ("record empty", lambda v, l: interp.record_qkv(v, [], progress=False), InputError, "data is empty"),
    ("record float data", lambda v, l: interp.record_qkv(v, 3.5, progress=False), InputError, "data must be"),
    ("record token ids to ViT", lambda v, l: interp.record_qkv(v, [torch.zeros(2, 5, dtype=torch.long)], progress=False),
     InputError, "token ids"),
    ("record 1-channel", lambda v, l: interp.record_qkv(v, [torch.randn(2, 1, 32, 32)], progress=False),
     InputError, r"\[batch, 3, H, W\]"),
    ("record odd size", lambda v, l: interp.record_qkv(v, [torch.randn(2, 3, 30, 30)], progress=False),
     InputError, "not a multiple of the patch size 8"),
    ("record NaN pixels", lambda v, l: interp.record_qkv(v, [torch.full((1, 3, 32, 32), float("nan"))], progress=False),
     InputError, "NaN or inf"),
    ("record too long", lambda v, l: interp.record_qkv(l, [torch.zeros(1, 100, dtype=torch.long)], progress=False),
     InputError, "exceeds the model's context of 64"),
    ("record pixels to LM", lambda v, l: interp.record_qkv(l, [torch.randn(1, 3, 32, 32)], progress=False),
     InputError, "integer token ids"),
    ("images to LM", lambda v, l: interp.record_qkv(l, "photos", progress=False), InputError, "holds images"),
    ("unknown dataset", lambda v, l: interp.record_qkv(v, "imagenet", progress=False), InputError, "unknown dataset 'imagenet'"),
    ("bad kinds", lambda v, l: interp.record_qkv(v, [tiny_inputs("vit")], kinds=("x",), progress=False), InputError, "kinds"),
    ("bad layers", lambda v, l: interp.record_qkv(v, [tiny_inputs("vit")], layers=[9], progress=False), InputError, "layers must lie in 0..1"),
    ("bad part", lambda v, l: interp.record_qkv(v, [tiny_inputs("vit")], progress=False).mean(0, "q", "bias"),
     InputError, "part must be"),
    ("fold on q", lambda v, l: interp.ablate_bias(v, [tiny_inputs("vit")], kinds=("q",), method="fold", progress=False),
     InputError, "fold' applies to v only"),
    ("bad estimate", lambda v, l: interp.ablate_bias(v, [tiny_inputs("vit")], estimate="fast", progress=False),
     InputError, "estimate must be"),
    ("attribution of distance", lambda v, l: interp.ablate_bias(v, [tiny_inputs("vit")], estimate="attribution", progress=False),
     InputError, "gradient at the intact model is zero"),
    ("CE without labels", lambda v, l: interp.ablate_bias(v, [tiny_inputs("vit")], metric="cross_entropy", progress=False),
     InputError, "needs labels"),
    ("cluster without features", lambda v, l: interp.cluster_heads(pd.DataFrame({"x": [1, 2, 3]})), InputError, "no feature columns"),
    ("cluster k=1", lambda v, l: interp.cluster_heads(interp.frequency_profile(v, [tiny_inputs("vit")], progress=False), k=1),
     InputError, "k must lie in"),
    ("cluster method", lambda v, l: interp.cluster_heads(interp.frequency_profile(v, [tiny_inputs("vit")], progress=False), method="dbscan"),
     InputError, "method must be"),
    ("load missing stats", lambda v, l: interp.QKVStats.load("/nonexistent/s.safetensors"), InterpError, "no statistics file"),
]


@pytest.mark.parametrize("name,call,error,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_error(vit, lm, name, call, error, message):
    with pytest.raises(error, match=message):
        call(vit, lm)
