"""Per-head statistics of Q/K/V activations: ``QKVStats`` and the float64 ``Moments`` it keeps.

Each batch is reduced to (count, mean, centred co-moment) per head and folded in with the
parallel-moments update (Chan et al.)::

    n = n_a + n_b,   delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    M2   = M2_a + M2_b + delta delta^T * n_a n_b / n        (cov = M2 / n)

so shards recorded anywhere merge exactly. The content part XW = activation - b has the
same covariance and its mean shifted by -b. ``interp.record.record_qkv`` fills them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch
import torch.distributed as dist
from jaxtyping import Float
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from interp.errors import ActivationError, InputError, InterpError, public
from interp.fingerprint import combine, model_fingerprint
from interp.io import atomic_path
from interp.models.bridge import InterpBridge
from interp.types import PARTS, QKV, Part

STATS_FORMAT = 2
READABLE_FORMATS = (1, 2)  # format 1 also stored a placeholder input co-moment, ignored


@dataclass
class Moments:
    """Running count, mean and (unless ``means_only``) centred co-moment of [head, d] vectors, float64."""

    count: Float[Tensor, ""]
    mean: Float[Tensor, "head_index d"]
    m2: Optional[Float[Tensor, "head_index d d"]]  # None when means_only
    means_only: bool = False

    @classmethod
    def zeros(cls, n_heads: int, d: int, device: Any, means_only: bool = False) -> "Moments":
        f64 = torch.float64
        m2 = None if means_only else torch.zeros(n_heads, d, d, dtype=f64, device=device)
        return cls(torch.zeros((), dtype=f64, device=device), torch.zeros(n_heads, d, dtype=f64, device=device),
                   m2, means_only)

    def add(self, count: Tensor, mean: Tensor, m2: Optional[Tensor]) -> None:
        """Fold in a batch's (count, mean, co-moment) with the parallel-moments update."""
        total = self.count + count
        safe = total.clamp(min=1.0)
        delta = mean - self.mean
        if not self.means_only:
            if m2 is None:
                raise InterpError("these moments keep a co-moment: add() needs one")
            self.m2 = self.m2 + m2 + torch.einsum("hd,he->hde", delta, delta) * (self.count * count / safe)
        self.mean = self.mean + delta * (count / safe)
        self.count = total

    def merge(self, other: "Moments") -> None:
        device = self.mean.device
        self.add(other.count.to(device), other.mean.to(device), None if other.m2 is None else other.m2.to(device))


def batch_moments(
    x: Tensor, weight: Optional[Tensor], with_m2: bool = True
) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """(count, mean [h, d], centred co-moment [h, d, d]) of x [n, h, d] with 0/1 weights [n]."""
    work = x.to(torch.float64) if x.dtype == torch.float64 else x.float()
    m2 = None
    if weight is None:
        count = torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device)
        mean = work.mean(0)
        if with_m2:
            centred = work - mean
            m2 = torch.einsum("nhd,nhe->hde", centred, centred)
    else:
        w = weight.to(work.dtype)
        count = w.sum().to(torch.float64)
        mean = torch.einsum("n,nhd->hd", w, work) / count.clamp(min=1.0).to(work.dtype)
        if with_m2:
            centred = work - mean
            m2 = torch.einsum("nhd,nhe->hde", centred * w[:, None, None], centred)
    return count, mean.to(torch.float64), None if m2 is None else m2.to(torch.float64)


@dataclass
class QKVStats:
    """Per-layer x head x kind statistics of Q/K/V activations (see ``record_qkv``)."""

    model_name: str
    n_layers: int
    layers: list[int]
    kinds: list[str]
    heads: dict[str, int]  # kind -> n heads (kv heads for k, v under GQA)
    d_head: int
    d_model: int
    biases: dict[tuple[int, str], Tensor]  # b [head, d_head], float64; zeros when absent
    moments: dict[tuple[int, str], Moments]
    input_moments: dict[int, Moments]  # attention input x (after the layer norm): count and mean
    nonfinite: dict[tuple[int, str], Tensor] = field(default_factory=dict)  # [head] flags
    captured: Optional[dict[tuple[int, str], list[Tensor]]] = None
    model_fingerprint: Optional[str] = None  # interp.fingerprint.model_fingerprint of the recorded model
    data_fingerprint: Optional[str] = None  # the batches recorded (interp.fingerprint.DataHasher)

    def __repr__(self) -> str:
        count = self.count(self.layers[0]) if self.layers else 0
        return (f"QKVStats(model={self.model_name!r}, layers={len(self.layers)}/{self.n_layers}, "
                f"kinds={self.kinds}, heads={self.heads}, d_head={self.d_head}, positions counted={count})")

    # ----- accessors -----------------------------------------------------------------
    def _key(self, layer: int, kind: str) -> tuple[int, str]:
        key = (layer, kind)
        if key not in self.moments:
            raise InputError(
                f"no statistics for layer {layer!r}, kind {kind!r}: recorded layers "
                f"{self.layers}, kinds {self.kinds}"
            )
        return key

    def count(self, layer: int) -> int:
        """Tokens (or patches) counted at ``layer``, padding excluded."""
        return int(self.moments[self._key(layer, self.kinds[0])].count.item())

    def mean(self, layer: int, kind: str, part: Part = "full") -> Float[Tensor, "head_index d_head"]:
        """E[XW + b] (``part="full"``) or E[XW] = E[X]W (``part="content"``)."""
        key = self._key(layer, kind)
        m = self.moments[key].mean
        if part == "full":
            return m.clone()
        if part == "content":
            return m - self.biases[key].to(m.device)
        raise InputError(f"part must be one of {', '.join(PARTS)}, got {part!r}")

    def cov(self, layer: int, kind: str, part: Part = "full") -> Float[Tensor, "head_index d_head d_head"]:
        """Population covariance (divides by n). Identical for full and content parts."""
        if part not in PARTS:
            raise InputError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
        mom = self.moments[self._key(layer, kind)]
        return mom.m2 / mom.count.clamp(min=1.0)

    def mean_sq_norm(self, layer: int, kind: str, part: Part = "full") -> Float[Tensor, " head_index"]:
        """E||a||^2 = tr(cov) + ||E a||^2 per head."""
        return torch.diagonal(self.cov(layer, kind), dim1=-2, dim2=-1).sum(-1) + self.mean(
            layer, kind, part
        ).pow(2).sum(-1)

    def input_mean(self, layer: int) -> Float[Tensor, " d_model"]:
        """E[x], the mean attention input (the residual after the layer norm)."""
        if layer not in self.input_moments:
            raise InputError(f"no statistics for layer {layer!r}; recorded layers {self.layers}")
        return self.input_moments[layer].mean[0].clone()

    # ----- combining -----------------------------------------------------------------
    def _signature(self) -> tuple:
        return (self.model_name, self.model_fingerprint, self.n_layers, tuple(self.layers), tuple(self.kinds),
                tuple(sorted(self.heads.items())), self.d_head, self.d_model)

    def require_model(self, model: InterpBridge) -> "QKVStats":
        """These statistics, if they were recorded on ``model`` (same weights); else one clear error."""
        info = model.interp
        if self.model_fingerprint is None:
            raise InputError(f"these statistics of {self.model_name!r} carry no model fingerprint (recorded by an "
                             "older interp): record them again with interp.record_qkv")
        mine = model_fingerprint(model)
        if self.model_fingerprint != mine:
            raise InputError(
                f"these statistics were recorded on another model ({self.model_name!r}, weights "
                f"{self.model_fingerprint}) than {info.name!r} (weights {mine}): record them on this model"
            )
        return self

    def merge(self, other: "QKVStats") -> "QKVStats":
        """Fold ``other`` into these statistics in place (exact) and return self."""
        if not isinstance(other, QKVStats):
            raise InputError(f"can only merge QKVStats, got {type(other).__name__}")
        if self._signature() != other._signature():
            raise InputError(
                "cannot merge statistics of different models or recordings: "
                f"{self._signature()} vs {other._signature()}"
            )
        for key, b in self.biases.items():
            if not torch.equal(b.cpu(), other.biases[key].cpu()):
                raise InputError(f"cannot merge: biases differ at layer {key[0]}, kind {key[1]}")
        for key, mom in self.moments.items():
            mom.merge(other.moments[key])
            self.nonfinite[key] = self.nonfinite[key] | other.nonfinite[key].to(self.nonfinite[key].device)
        for layer, mom in self.input_moments.items():
            mom.merge(other.input_moments[layer])
        self.data_fingerprint = combine(str(self.data_fingerprint), str(other.data_fingerprint))
        return self

    def all_reduce(self, group: Any = None) -> "QKVStats":
        """Merge the statistics of every rank of ``group`` (torch.distributed), in rank order.

        Each rank ends with the same merged result. Only tensors cross processes
        (``all_gather`` of counts, means, co-moments and flags; no pickling), so it works
        with gloo (CPU) and NCCL (CUDA) alike; every rank must have recorded the same model.
        """
        if not dist.is_available() or not dist.is_initialized():
            raise InterpError("all_reduce needs an initialised torch.distributed process group")
        world = dist.get_world_size(group)
        device = next(iter(self.moments.values())).mean.device
        ident = _text_tensor(json.dumps([list(map(str, self._signature())), self.kinds]), device)
        if any(not torch.equal(t, ident) for t in _gather(ident, world, group)):
            raise InputError("all_reduce: the ranks recorded different models, layers or kinds")
        data = _gather(_text_tensor(str(self.data_fingerprint), device), world, group)
        tensors = self._tensors()
        gathered = {name: _gather(t.to(device), world, group) for name, t in sorted(tensors.items())}
        merged = None
        for rank in range(world):
            state = {"meta": dict(self._meta(), data_fingerprint=bytes(data[rank].tolist()).decode().rstrip()),
                     "tensors": {name: parts[rank].cpu() for name, parts in gathered.items()}}
            part = QKVStats._from_state(state, device)
            merged = part if merged is None else merged.merge(part)
        self.moments, self.input_moments, self.nonfinite = merged.moments, merged.input_moments, merged.nonfinite
        self.data_fingerprint = merged.data_fingerprint
        return self

    # ----- tidy output ---------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """One row per layer x head x kind: count, bias norm, mean norms, RMS, covariance trace."""
        rows = []
        for (layer, kind) in sorted(self.moments, key=lambda k: (k[0], QKV.index(k[1]))):
            full, content = self.mean(layer, kind, "full"), self.mean(layer, kind, "content")
            tr = torch.diagonal(self.cov(layer, kind), dim1=-2, dim2=-1).sum(-1)
            msq_f, msq_c = self.mean_sq_norm(layer, kind, "full"), self.mean_sq_norm(layer, kind, "content")
            b = self.biases[(layer, kind)]
            n = self.count(layer)
            for h in range(full.shape[0]):
                rows.append(dict(
                    layer=layer, head=h, kind=kind, count=n,
                    bias_norm=float(b[h].norm()),
                    mean_norm_full=float(full[h].norm()), mean_norm_content=float(content[h].norm()),
                    rms_full=math.sqrt(max(float(msq_f[h]), 0.0)),
                    rms_content=math.sqrt(max(float(msq_c[h]), 0.0)),
                    cov_trace=float(tr[h]),
                ))
        return pd.DataFrame(rows)

    # ----- persistence ---------------------------------------------------------------
    def _meta(self) -> dict:
        return dict(format=STATS_FORMAT, model_name=self.model_name, model_fingerprint=self.model_fingerprint,
                    data_fingerprint=self.data_fingerprint,
                    n_layers=self.n_layers,
                    layers=self.layers, kinds=self.kinds, heads=self.heads,
                    d_head=self.d_head, d_model=self.d_model)

    def _tensors(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for (layer, kind), mom in self.moments.items():
            p = f"L{layer}.{kind}"
            out[f"{p}.count"] = mom.count.reshape(1)
            out[f"{p}.mean"], out[f"{p}.m2"] = mom.mean, mom.m2
            out[f"{p}.bias"] = self.biases[(layer, kind)]
            out[f"{p}.nonfinite"] = self.nonfinite[(layer, kind)].to(torch.uint8)
        for layer, mom in self.input_moments.items():
            out[f"L{layer}.x.count"] = mom.count.reshape(1)
            out[f"L{layer}.x.mean"] = mom.mean
        return {k: v.detach().cpu().contiguous() for k, v in out.items()}

    def _state(self) -> dict:
        return {"meta": self._meta(), "tensors": self._tensors()}

    @classmethod
    def _from_state(cls, state: dict, device: Any = "cpu") -> "QKVStats":
        meta, t = state["meta"], {k: v.to(device) for k, v in state["tensors"].items()}
        if meta.get("format") not in READABLE_FORMATS:
            raise InterpError(
                f"statistics file format {meta.get('format')} is not {STATS_FORMAT}: "
                "re-record with this version of interp"
            )
        _check_shapes(meta, t)
        moments, biases, nonfinite, inputs = {}, {}, {}, {}
        for layer in meta["layers"]:
            for kind in meta["kinds"]:
                p = f"L{layer}.{kind}"
                moments[(layer, kind)] = Moments(t[f"{p}.count"][0], t[f"{p}.mean"], t[f"{p}.m2"])
                biases[(layer, kind)] = t[f"{p}.bias"]
                nonfinite[(layer, kind)] = t[f"{p}.nonfinite"].bool()
            inputs[layer] = Moments(t[f"L{layer}.x.count"][0], t[f"L{layer}.x.mean"], None, means_only=True)
        return cls(
            model_name=meta["model_name"], n_layers=meta["n_layers"], layers=list(meta["layers"]),
            kinds=list(meta["kinds"]), heads={k: int(v) for k, v in meta["heads"].items()},
            d_head=meta["d_head"], d_model=meta["d_model"], biases=biases, moments=moments,
            input_moments=inputs, nonfinite=nonfinite, model_fingerprint=meta.get("model_fingerprint"),
            data_fingerprint=meta.get("data_fingerprint"),
        )

    def save(self, path: str | Path) -> Path:
        """Write one safetensors file (float64 tensors + JSON metadata), atomically."""
        path = Path(path)
        with atomic_path(path) as tmp:
            save_file(self._tensors(), str(tmp), metadata={"interp": json.dumps(self._meta())})
        return path

    @classmethod
    @public
    def load(cls, path: str | Path, device: Any = "cpu") -> "QKVStats":
        """Read statistics written by ``save`` (safetensors only: no pickle)."""
        if not isinstance(path, (str, os.PathLike)):
            raise InputError(f"QKVStats.load takes the path of a file stats.save wrote; got {type(path).__name__}")
        path = Path(path)
        if not path.is_file():
            raise InterpError(f"no statistics file at {path}" + (" (a folder)" if path.is_dir() else ""))
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = json.loads((fh.metadata() or {})["interp"])
            tensors = load_file(str(path))
        except Exception as exc:
            raise InterpError(f"{path} is not a readable interp statistics file ({exc})") from None
        _check_meta(meta, path)
        _check_shapes(meta, tensors)
        _check_values(tensors, path)
        return cls._from_state({"meta": meta, "tensors": tensors}, device)

    def check_finite(self) -> None:
        """Raise ``ActivationError`` naming the first layer/head whose activations had NaN/inf."""
        for (layer, kind), flags in sorted(self.nonfinite.items()):
            if bool(flags.any()):
                heads = torch.nonzero(flags).flatten().tolist()
                raise ActivationError(
                    f"non-finite (NaN or inf) {kind} activations at layer {layer}, head(s) {heads}"
                )


def _text_tensor(text: str, device: Any, length: int = 4096) -> Tensor:
    raw = text.encode()[:length].ljust(length)
    return torch.tensor(list(raw), dtype=torch.uint8, device=device)


def _gather(t: Tensor, world: int, group: Any) -> list[Tensor]:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def _check_shapes(meta: dict, t: dict[str, Tensor]) -> None:
    """Every tensor a statistics file must hold, with the shape its metadata implies."""
    d, dm = int(meta["d_head"]), int(meta["d_model"])
    expected: dict[str, tuple[int, ...]] = {}
    for layer in meta["layers"]:
        for kind in meta["kinds"]:
            h, p = int(meta["heads"][kind]), f"L{layer}.{kind}"
            expected.update({f"{p}.count": (1,), f"{p}.mean": (h, d), f"{p}.m2": (h, d, d), f"{p}.bias": (h, d),
                             f"{p}.nonfinite": (h,)})
        expected.update({f"L{layer}.x.count": (1,), f"L{layer}.x.mean": (1, dm)})
    for name, shape in expected.items():
        if name not in t:
            raise InterpError(f"statistics file lacks tensor {name!r}: it is damaged or not an interp file")
        if tuple(t[name].shape) != shape:
            raise InterpError(f"statistics file tensor {name!r} has shape {tuple(t[name].shape)}, expected {shape}: "
                              "the file is damaged")


META_FIELDS = {"format": int, "model_name": str, "n_layers": int, "layers": list, "kinds": list, "heads": dict,
               "d_head": int, "d_model": int}


def _check_meta(meta: Any, path: Path) -> None:
    """The metadata a statistics file must carry, with the types ``save`` gives them."""
    if not isinstance(meta, dict):
        raise InterpError(f"{path}: its interp metadata is not a JSON object: the file is damaged; record again")
    if meta.get("format") not in READABLE_FORMATS:
        raise InterpError(f"statistics file format {meta.get('format')} is not {STATS_FORMAT}: "
                          "re-record with this version of interp")
    bad = [k for k, t in META_FIELDS.items() if not isinstance(meta.get(k), t) or isinstance(meta.get(k), bool)]
    if bad:
        raise InterpError(f"{path}: metadata field(s) {', '.join(bad)} missing or of the wrong type: the file is "
                          "damaged or not written by QKVStats.save; record again")
    if (not all(isinstance(x, int) and 0 <= x < meta["n_layers"] for x in meta["layers"])
            or not set(meta["kinds"]) <= set(QKV) or not set(meta["kinds"]) <= set(meta["heads"])):
        raise InterpError(f"{path}: metadata layers {meta['layers']} / kinds {meta['kinds']} / heads {meta['heads']} "
                          "do not fit together: the file is damaged; record again")


def _check_values(t: dict[str, Tensor], path: Path) -> None:
    """Counts positive, finite and equal within a layer; means and co-moments finite."""
    for name, value in t.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise InterpError(f"{path}: tensor {name!r} holds NaN or inf: the file is damaged; record again")
    layers = {name.split(".")[0] for name in t if name.endswith(".count")}
    for layer in sorted(layers):
        counts = {name: float(v.reshape(-1)[0]) for name, v in t.items() if name.startswith(f"{layer}.")
                  and name.endswith(".count")}
        if any(c <= 0 or c != int(c) for c in counts.values()) or len(set(counts.values())) > 1:
            raise InterpError(f"{path}: counts of {layer} are {counts}: each must be the same positive whole "
                              "number of positions; the file is damaged; record again")


def require_stats(stats: object) -> QKVStats:
    if not isinstance(stats, QKVStats):
        raise InputError(f"expected QKVStats from interp.record_qkv or QKVStats.load, got {type(stats).__name__}")
    return stats
