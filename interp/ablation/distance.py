"""A one-pass estimate for distance metrics, whose first-order estimate is zero by construction.

A distance metric compares the ablated run's features f' = f + df with the intact f:
``cos(f', f)`` (``feature_cosine``, ``embedding_cosine``). Its gradient at the intact model
is zero, so attribution and AtP* see nothing. Its second-order expansion is

    cos(f + df, f) ~ 1 - ||P df||^2 / (2 ||f||^2),      P = I - f f^T / ||f||^2

and ||P df||^2 is estimated without forming df, by random projections (Hutchinson): for
r ~ N(0, P) per sample, E[(r . df)^2] = ||P df||^2. Each projection g_r = sum_s r_s . f_s /
||f_s|| is a task metric with a nonzero gradient, so AtP* (``atp_star_deltas``; plain
attribution where the family refuses score recomputation) estimates its change
e_r ~ sum_s r_s . P df_s / ||f_s|| for *every* variant from one forward and backward. Then

    delta ~ -(1 / 2B) * mean over R projections of e_r^2          (per batch of B samples)

weighted over batches like the exact metric. The estimate is as good as AtP*'s linear
map for df, with a relative spread of about sqrt(2 / (R B)) from the projections: good
enough to rank heads, which is what ``estimate="auto"`` uses it for before running the
top heads exactly.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from interp.ablation.attribution import EstimateInputs, Projections, batch_estimates
from interp.ablation.metrics import distance_features
from interp.data import Batch


def _features(name: str) -> Callable:
    """The features f_s a distance metric compares (P-projected), whose projections g_r(f) = sum_s r_s . f_s
    (r already P-projected and / ||f_s||) are the task metrics the estimate linearises."""
    def features(out: Tensor, hidden: Optional[Tensor], ref: dict, batch: Batch) -> Tensor:
        return distance_features(name, out, hidden, ref, batch)[0]
    return features


def _directions(intact: Tensor, n: int, generator: torch.Generator) -> list[Tensor]:
    """``n`` draws of r ~ N(0, P) per sample, divided by ||f_s|| (float64)."""
    f = intact.detach().double().cpu()
    norm = f.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    unit = f / norm
    out = []
    for _ in range(n):
        r = torch.randn(f.shape, generator=generator, dtype=torch.float64)
        r = r - (r * unit).sum(-1, keepdim=True) * unit
        out.append(r / norm)
    return out


def distance_deltas(job: EstimateInputs, metric_name: str, n_projections: int = 8, seed: int = 0) -> list[float]:
    """The second-order estimate of each variant's change in a distance metric (see the module doc): per
    batch, one forward and one backward per projection (``batch_estimates``), in parts of ``job.items_per_part``
    items where that is set (each projection's estimate is the sum of its parts')."""
    pattern = not job.model.interp.spec.score_refusal  # AtP* where scores can be recomputed, else linear
    generator = torch.Generator().manual_seed(seed)
    total = sum(job.weights)
    estimate = torch.zeros(len(job.variants), dtype=torch.float64)
    for batch, ref, weight in zip(job.batches, job.refs, job.weights):
        intact = ref["features"] if metric_name == "feature_cosine" else ref["embedding"]
        directions = torch.stack(_directions(intact, n_projections, generator))
        n_samples = intact.shape[0]
        step = job.items_per_part if 0 < job.items_per_part < n_samples else n_samples
        if step == n_samples:
            projected = batch_estimates(job, batch, ref, Projections(_features(metric_name), directions), pattern)
        else:  # g_r is a sum over items and no item's activations reach another's: its estimate adds up over parts
            projected = sum(batch_estimates(job, batch.items(lo, lo + step),
                                            {k: v[lo:lo + step] for k, v in ref.items()},
                                            Projections(_features(metric_name), directions[:, lo:lo + step]), pattern)
                            for lo in range(0, n_samples, step))
        squares = (projected ** 2).sum(0)
        estimate += (weight / total) * -(squares / n_projections) / (2 * n_samples)
    return estimate.tolist()
