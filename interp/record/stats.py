"""Per-head statistics of Q/K/V activations: ``QKVStats``, the data and its exact merge.

Each batch is reduced to (count, mean, centred co-moment) per head and folded in with the
parallel-moments update (Chan et al.)::

    n = n_a + n_b,   delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    M2   = M2_a + M2_b + delta delta^T * n_a n_b / n        (cov = M2 / n)

so shards recorded anywhere merge exactly. The content part XW = activation - b has the
same covariance and its mean shifted by -b. ``interp.record.recording.record_qkv`` fills them.
``interp.record.moments`` keeps the float64 moments, ``interp.record.stats_format`` the file format and
``interp.record.stats_dist`` the reduction across ``torch.distributed`` ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import ActivationError, InputError, public
from interp.record.fingerprint import combine, model_fingerprint
from interp.models.bridge import InterpBridge
from interp.record.moments import Moments, batch_moments
from interp.record.stats_dist import gather_states
from interp.record.stats_format import STATS_FORMAT, fields_from_state, read_state, state_of, write_state
from interp.types import PARTS, QKV, Part

__all__ = ["STATS_FORMAT", "Moments", "QKVStats", "batch_moments", "require_stats"]


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
    model_fingerprint: Optional[str] = None  # interp.record.fingerprint.model_fingerprint of the recorded model
    data_fingerprint: Optional[str] = None  # the batches recorded (interp.record.fingerprint.DataHasher)
    # the data fingerprints of the shards merged into these statistics (this session; a file holds only the
    # combined data_fingerprint): merging a shard already in them would count its data twice
    data_parts: frozenset = field(default=frozenset(), init=False, repr=False, compare=False)
    # (data, max_batches) record_qkv read, when in memory (record.readable_again); None if loaded or merged
    recorded_data: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)

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
        mine, theirs = _distinct_parts(self, other)
        for key, mom in self.moments.items():
            mom.merge(other.moments[key])
            self.nonfinite[key] = self.nonfinite[key] | other.nonfinite[key].to(self.nonfinite[key].device)
        for layer, mom in self.input_moments.items():
            mom.merge(other.input_moments[layer])
        self.data_fingerprint = combine(str(self.data_fingerprint), str(other.data_fingerprint))
        self.data_parts, self.recorded_data = mine | theirs, None  # merged data is no longer one object
        return self

    def all_reduce(self, group: Any = None) -> "QKVStats":
        """Merge the statistics of every rank of ``group`` (torch.distributed), in rank order; each
        rank ends with the same merged result (``interp.record.stats_dist``: tensors only, no pickling)."""
        merged = None
        for state in gather_states(self, self._signature(), group):
            part = QKVStats(**fields_from_state(state, next(iter(self.moments.values())).mean.device))
            merged = part if merged is None else merged.merge(part)
        self.moments, self.input_moments, self.nonfinite = merged.moments, merged.input_moments, merged.nonfinite
        self.data_fingerprint, self.data_parts, self.recorded_data = merged.data_fingerprint, merged.data_parts, None
        return self

    # ----- tidy output ---------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """One row per layer x head x kind: count, bias norm, mean norms, RMS, covariance trace."""
        return _stats_frame(self)

    # ----- persistence ---------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write one safetensors file (float64 tensors + JSON metadata), atomically (``interp.record.stats_format``)."""
        return write_state(state_of(self), path)

    @classmethod
    @public
    def load(cls, path: str | Path, device: Any = "cpu") -> "QKVStats":
        """Read statistics written by ``save`` (safetensors only: no pickle; every field checked)."""
        return cls(**fields_from_state(read_state(path), device))

    def check_finite(self) -> None:
        """Raise ``ActivationError`` naming the first layer/head whose activations had NaN/inf."""
        for (layer, kind), flags in sorted(self.nonfinite.items()):
            if bool(flags.any()):
                heads = torch.nonzero(flags).flatten().tolist()
                raise ActivationError(
                    f"non-finite (NaN or inf) {kind} activations at layer {layer}, head(s) {heads}"
                )


def _stats_frame(stats: QKVStats) -> pd.DataFrame:
    """``QKVStats.to_frame``: one row per layer x head x kind: count, bias norm, mean norms, RMS, covariance trace."""
    rows = []
    for (layer, kind) in sorted(stats.moments, key=lambda k: (k[0], QKV.index(k[1]))):
        full, content = stats.mean(layer, kind, "full"), stats.mean(layer, kind, "content")
        tr = torch.diagonal(stats.cov(layer, kind), dim1=-2, dim2=-1).sum(-1)
        msq_f, msq_c = stats.mean_sq_norm(layer, kind, "full"), stats.mean_sq_norm(layer, kind, "content")
        b = stats.biases[(layer, kind)]
        n = stats.count(layer)
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


def require_stats(stats: object) -> QKVStats:
    if not isinstance(stats, QKVStats):
        raise InputError(f"expected QKVStats from interp.record_qkv or QKVStats.load, got {type(stats).__name__}")
    return stats


def _distinct_parts(a: QKVStats, b: QKVStats) -> tuple[frozenset, frozenset]:
    """The data fingerprints of the shards in ``a`` and in ``b`` (``data_parts``, else the one
    ``data_fingerprint``; none known: empty); shards in both (the same data merged twice) are refused."""
    mine, theirs = (s.data_parts or frozenset({s.data_fingerprint} - {None}) for s in (a, b))
    if mine & theirs:
        raise InputError(f"cannot merge statistics of the same data twice (data fingerprint "
                         f"{', '.join(sorted(mine & theirs))} is in both): its counts would double. Merge the "
                         "statistics of distinct shards (each rank's own batches), each once")
    return mine, theirs
