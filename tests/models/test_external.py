"""timm:NAME / open_clip:NAME with a weights file, and the folders timm's and open_clip's save_for_hf write:
the loaded model must be the saved one (biases bit for bit, outputs equal to the library's own forward), and
what cannot be read is one clear error."""

import argparse
import json
import shutil

import pytest
import torch

import interp
from interp.errors import InputError, MissingWeightsError, UnknownSourceError
from interp.models.external import library_source, read_state_dict
from interp.models.zoo import ZOO

timm = pytest.importorskip("timm")
NAME = "vit_tiny_patch16_224"
ARGS = dict(img_size=32, patch_size=8, depth=2)  # vit_tiny's width and heads, two layers, 32 px


@pytest.fixture(scope="module")
def planted():
    """A tiny random timm ViT whose q/k/v and output biases are planted (random init leaves them zero), saved
    as .safetensors and .pth state dicts."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = timm.create_model(NAME, pretrained=False, num_classes=5, **ARGS).eval()
    with torch.no_grad():
        for block in ref.blocks:
            block.attn.qkv.bias.normal_()
            block.attn.proj.bias.normal_()
    return ref, save_file, torch.randn(3, 3, 32, 32)


def _qkv_norms(ref):
    """Per layer and kind, ||b|| from the fused qkv bias of timm's own module (rows q | k | v)."""
    out = {}
    for layer, block in enumerate(ref.blocks):
        for kind, part in zip("qkv", block.attn.qkv.bias.detach().chunk(3)):
            out[(layer, kind)] = float(part.double().norm())
    return out


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_timm_name_with_weights_is_the_saved_model(planted, suffix, tmp_path):
    ref, save_file, x = planted
    file = tmp_path / f"w{suffix}"
    save_file(ref.state_dict(), file) if suffix == ".safetensors" else torch.save(ref.state_dict(), file)
    model = interp.load_model(f"timm:{NAME}", weights=file, model_args=ARGS, device="cpu")
    assert model.interp.family == "timm-vit" and model.interp.name == f"timm:{NAME}"
    spec = interp.bias_spec(model).set_index(["layer", "kind"])
    for key, norm in _qkv_norms(ref).items():
        assert abs(spec.loc[key, "norm"] - norm) <= 1e-5 * norm, key
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max() <= 1e-5  # num_classes (5) read from the file's head


@pytest.mark.parametrize("safe", [True, False])
def test_a_folder_timms_save_for_hf_wrote_loads(planted, safe, tmp_path):
    from timm.models import save_for_hf

    ref, _, x = planted
    save_for_hf(ref, tmp_path / "vit", safe_serialization=safe)  # model.safetensors, or pytorch_model.bin
    model = interp.load_model(tmp_path / "vit", device="cpu")
    assert model.interp.family == "timm-vit"
    with torch.no_grad():
        assert (model(x) - ref(x)).abs().max() <= 1e-5
    assert interp.bias_spec(model).query("kind == 'q'").norm.min() > 1  # the planted biases, not timm's zeros


def test_random_init_says_the_biases_are_zero():
    with pytest.warns(UserWarning, match="no weights given.*every q/k/v bias at exactly zero"):
        model = interp.load_model(f"timm:{NAME}", model_args=ARGS, device="cpu")
    assert (interp.bias_spec(model).query("kind in ('q', 'k', 'v')").norm == 0).all()


def test_weights_of_other_sizes_name_the_tensors_and_the_fix(planted, tmp_path):
    ref, save_file, _ = planted
    save_file(ref.state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(MissingWeightsError, match=r"pos_embed is \[1, 17, 192\] in the file, \[1, 197, 192\].*"
                                                  r"model_args"):
        interp.load_model(f"timm:{NAME}", weights=tmp_path / "w.safetensors", device="cpu")


def test_a_checkpoint_that_needs_unpickling_is_refused(planted, tmp_path):
    ref = planted[0]
    torch.save({"state_dict": ref.state_dict(), "args": argparse.Namespace(lr=0.1)}, tmp_path / "ckpt.pth")
    with pytest.raises(MissingWeightsError, match="does not unpickle"):
        read_state_dict(tmp_path / "ckpt.pth")
    torch.save({"state_dict": {f"module.{k}": v for k, v in ref.state_dict().items()}}, tmp_path / "wrapped.pth")
    assert read_state_dict(tmp_path / "wrapped.pth").keys() == ref.state_dict().keys()  # unwrapped, prefix gone


@pytest.mark.parametrize("source, kwargs, error, match", [
    (f"timm:{NAME[:-1]}", {}, UnknownSourceError, f"did you mean {NAME}"),
    ("timm:", {}, UnknownSourceError, "names no model"),
    ("digits-vit", {"weights": "w.pth"}, InputError, "go with a timm:NAME"),
    (f"timm:{NAME}", {"weights": "missing.safetensors"}, MissingWeightsError, "does not exist"),
])
def test_bad_sources_are_one_clear_error(source, kwargs, error, match):
    with pytest.raises(error, match=match):
        interp.load_model(source, device="cpu", **kwargs)


def test_library_source_reads_the_prefix():
    assert library_source("timm:vit_small_patch16_224") == ("timm", "vit_small_patch16_224")
    assert library_source("open_clip:ViT-B-32") == ("open_clip", "ViT-B-32")
    assert library_source("digits-vit") is None


def test_a_folder_whose_type_cannot_be_read_says_what_it_needs(tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(ZOO["digits-vit"].folder(), hf)
    config = json.loads((hf / "config.json").read_text())
    del config["model_type"]
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnknownSourceError, match='add "model_type": "vit" \\(the type of its architecture '
                                                 'ViTForImageClassification\\)'):
        interp.load_model(hf, device="cpu")
    (hf / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(UnknownSourceError, match="names neither a model_type .* nor an architecture .*timm"):
        interp.load_model(hf, device="cpu")


def test_open_clip_name_with_weights_is_the_saved_tower(tmp_path):
    open_clip = pytest.importorskip("open_clip")
    tiny = dict(embed_dim=16, vision_cfg=dict(image_size=32, layers=2, width=32, head_width=16, patch_size=8),
                text_cfg=dict(context_length=8, vocab_size=64, width=16, heads=2, layers=1))
    (tmp_path / "interp-test-tiny.json").write_text(json.dumps(tiny))
    open_clip.add_model_config(tmp_path / "interp-test-tiny.json")
    torch.manual_seed(0)
    clip = open_clip.create_model("interp-test-tiny", pretrained=None).eval()
    with torch.no_grad():
        for block in clip.visual.transformer.resblocks:
            block.attn.in_proj_bias.normal_()
    torch.save(clip.state_dict(), tmp_path / "clip.pth")  # the whole CLIP model's keys, visual.*
    model = interp.load_model("open_clip:interp-test-tiny", weights=tmp_path / "clip.pth", device="cpu")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(x) - clip.visual(x)).abs().max() <= 1e-5
    q_norm = float(clip.visual.transformer.resblocks[0].attn.in_proj_bias.detach()[:32].double().norm())
    assert abs(interp.bias_spec(model).query("layer == 0 and kind == 'q'").norm.iloc[0] - q_norm) <= 1e-5 * q_norm
