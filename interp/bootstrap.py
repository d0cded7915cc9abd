"""Percentile bootstrap over items: the ``*_lo`` / ``*_hi`` columns of interp's tables.

Every interval is a 95% percentile bootstrap over *items* (sequences or images), never over
tokens or batches: ``n_boot`` resamples of the n items with replacement, drawn as one
``[n_boot, n]`` matrix of indices by ``numpy.random.default_rng(seed).integers(0, n, (n_boot, n))``;
the statistic is recomputed on each resample from the resampled items' per-item sums (a ratio
of sums stays a ratio of sums, so a token-weighted mean stays token-weighted); the interval is
the 2.5th and 97.5th percentile of the resampled values (resamples where the statistic is
undefined, e.g. a zero denominator, are left out). Before resampling the items are put in a
canonical order (sorted by a hash of each item's real tokens or pixels and its label), so an
interval depends on the items and the seed only: not on the batching, nor on the order in which
the items arrived. Deterministic given ``seed``.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any, Callable, Optional, Sequence

import numpy as np

from interp.errors import InputError

LEVEL = 0.95
#: percentiles of the resampled values that bound an interval
PERCENTILES = (100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2)


def check_bootstrap(n_boot: Any, seed: Any) -> tuple[int, int]:
    """(n_boot, seed) as integers: n_boot >= 0 resamples (0: no intervals, the columns are NaN), seed >= 0."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 0:
        raise InputError(f"n_boot must be an integer >= 0 (bootstrap resamples over items; 0 leaves the intervals "
                         f"out); got {n_boot!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be an integer >= 0 (it fixes the bootstrap resamples); got {seed!r}")
    return int(n_boot), int(seed)


def item_keys(batch: Any) -> list[str]:
    """One key per item of ``batch`` (inputs, attention_mask, labels on the host): a hash of its real
    tokens (padding dropped, wherever it sits) or pixels, and its label."""
    keys = []
    for row in range(batch.inputs.shape[0]):
        x = batch.inputs[row]
        if batch.attention_mask is not None:
            x = x[batch.attention_mask[row].bool()]
        h = hashlib.blake2b(digest_size=12)
        h.update(str((str(x.dtype), tuple(x.shape))).encode())
        h.update(x.detach().cpu().contiguous().numpy().tobytes())
        if batch.labels is not None:
            h.update(batch.labels[row].detach().cpu().contiguous().numpy().tobytes())
        keys.append(h.hexdigest())
    return keys


def resample_indices(n_items: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n_items] indices into the canonically ordered items (what a brute-force check redraws)."""
    return np.random.default_rng(seed).integers(0, n_items, size=(n_boot, n_items))


class Resampler:
    """Bootstrap resamples of items that arrived in some order with ``keys``: ``weights[b, i]`` is how
    often arrived item i is drawn in resample b."""

    def __init__(self, keys: Sequence[str], n_boot: int, seed: int) -> None:
        self.n_boot, self.seed, n = n_boot, seed, len(keys)
        order = np.argsort(np.asarray(keys, dtype=object), kind="stable")  # canonical position -> arrived item
        self.weights = np.zeros((n_boot, n))
        if n_boot and n:
            idx = order[resample_indices(n, n_boot, seed)]
            rows = np.repeat(np.arange(n_boot), n)
            np.add.at(self.weights, (rows, idx.reshape(-1)), 1.0)

    def sums(self, per_item: np.ndarray) -> np.ndarray:
        """[n_boot, ...]: each resample's sum of ``per_item`` [n_items, ...]."""
        per_item = np.asarray(per_item, dtype=np.float64)
        return (self.weights @ per_item.reshape(per_item.shape[0], -1)).reshape((self.n_boot,) + per_item.shape[1:])

    def resampled(self, statistic: Callable[[np.ndarray], float]) -> np.ndarray:
        """[n_boot]: ``statistic(take)`` on each resample, ``take`` the arrived items' indices with their
        repeats (sorted: for statistics that do not depend on the items' order, e.g. a rank correlation)."""
        items = np.arange(self.weights.shape[1])
        return np.array([statistic(np.repeat(items, w.astype(int))) for w in self.weights], dtype=np.float64)

    def interval(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) over the first axis of resampled ``values`` (NaN where none is finite, or no resamples)."""
        values = np.asarray(values, dtype=np.float64)
        if self.n_boot == 0:
            nan = np.full(values.shape[1:], np.nan)
            return nan, nan.copy()
        values = np.where(np.isfinite(values), values, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN slice: NaN, said by the value itself
            lo, hi = np.nanpercentile(values, PERCENTILES, axis=0)
        return lo, hi

    def ratio_interval(self, numerator: np.ndarray, denominator: np.ndarray,
                       scale: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
        """Interval of sum(numerator) / sum(denominator) (per item sums; times ``scale`` if given)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = self.sums(numerator) / self.sums(denominator)
        return self.interval(ratio if scale is None else ratio * scale)
