"""Running float64 moments of per-head vectors, merged exactly (Chan et al.'s parallel update)::

    n = n_a + n_b,   delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    M2   = M2_a + M2_b + delta delta^T * n_a n_b / n        (cov = M2 / n)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import InterpError

__all__ = ["Moments", "batch_moments"]


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
