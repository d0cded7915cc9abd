"""The matched control of an exact ablation: the same displacement norm in random directions, and what its
draws say about the ablation's delta.

Whatever the method's displacement s_h = a' - a of each targeted head (-b_h for zero, E[XW]_h - b_h for mean,
...), draw d moves the head's activation to a' = a + u_h^(d) ||s_h||, with u_h^(d) a uniformly random unit vector
(``interp.record.patching.matched_shift``, fixed by (seed, layer, kind, d)): the same displacement norm in a random
direction (``control_patch_hooks``; ``displacement_norm`` is ||s||). An effect is specific to the bias's direction
only when it lies outside the deltas of these draws. How many draws a head reads (``used_draws``, in
``control_stages``), its p-value (``control_columns``: the Monte Carlo p, or ``normal_tail_p``) and the correction
across the table's heads (``adjust_controls``: Benjamini-Hochberg) are set out in ``interp.ablation.sweep``'s
module doc.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from interp.models.bridge import InterpBridge
from interp.record.patching import Hook, Target, bias_shift, by_site, matched_shift, shift_hook
from interp.record.stats import QKVStats
from interp.types import Method

CONTROL_ALPHA = 0.05  # bias_dependent: the Benjamini-Hochberg adjusted control_p at most this (false discovery rate)


def control_patch_hooks(model: InterpBridge, targets: Sequence[Target], method: Method, draw: int,
                        stats: Optional[QKVStats] = None, seed: int = 0) -> list[Hook]:
    """Hooks of draw ``draw`` of the matched control of ``method`` on ``targets`` (checked, as ``ablate_bias``'s
    door checks them): each targeted head's activation moved by a random direction of the norm ``method`` would
    move it by (``matched_shift``). No b_O fold for ``method="fold"``: its displacement is compensated, so it has
    no control."""
    return [shift_hook(layer, kind, matched_shift(bias_shift(model, layer, kind, method, stats, seed), layer, kind,
                                                  seed, draw), heads)
            for (layer, kind), heads in by_site(targets).items()]


def displacement_norm(model: InterpBridge, targets: Sequence[Target], method: Method,
                      stats: Optional[QKVStats] = None, seed: int = 0) -> float:
    """||s|| = sqrt(sum over targets of ||a'_h - a_h||^2): how far ``method`` moves the targeted heads'
    activations (zero: ||b_h||; random: ||r_h - b_h||, about sqrt(2) ||b_h||). 0 for absent biases."""
    total = 0.0
    for (layer, kind), heads in by_site(targets).items():
        shift = bias_shift(model, layer, kind, method, stats, seed)
        total += float((shift[sorted(heads)].double() ** 2).sum())
    return total ** 0.5


def used_draws(delta: float, controls: Sequence[float], stop: int, n_max: int) -> Optional[int]:
    """How many of a head's control draws (in draw order) its p-value reads under the sequential rule (Besag and
    Clifford 1991): the first n at which ``stop`` of them have |c_d| >= |delta|; else ``n_max`` once that many are
    drawn; None while more are needed. The draws are fixed by the seed, so the answer does not depend on how many
    were drawn past it (the rounds, the stacking)."""
    if stop > 0:
        hits = np.cumsum(np.abs(np.asarray(controls, dtype=float)) >= abs(delta))
        reached = np.flatnonzero(hits >= stop)
        if len(reached):
            return int(reached[0]) + 1
    return n_max if len(controls) >= n_max else None


def control_stages(n_max: int, stop: int) -> list[int]:
    """The draw counts after which the sequential rule is read: stop, 2 stop, 4 stop, ... and ``n_max`` (only
    ``n_max`` without early stopping). Each stage is one more round of patched forwards for the heads not yet
    decided."""
    if n_max <= 0:
        return []
    if stop <= 0 or stop >= n_max:
        return [n_max]
    ends, n = [], stop
    while n < n_max:
        ends.append(n)
        n *= 2
    return ends + [n_max]


def control_forwards(n_used: int, n_max: int, stop: int) -> int:
    """The control forwards a head with ``n_used`` draws in its p-value ran: up to the end of the stage in which it
    was decided (draws of that stage past its stop are run, then not read)."""
    if n_used <= 0:
        return 0
    return min(end for end in control_stages(n_max, stop) if end >= n_used)


def normal_tail_p(delta: float, controls: Sequence[float]) -> float:
    """P(|X| >= |delta|) for X a new draw from a normal fitted to the control deltas: with m and s their mean and
    standard deviation (n - 1 in the denominator) over n draws, X = m + s sqrt(1 + 1/n) T, T Student-t with n - 1
    degrees of freedom (the prediction for one more draw of the same normal, the fit's own uncertainty included).
    Exact for normal draws; its calibration on draws that are not is measured (mathematics page). NaN for fewer
    than 3 draws or draws without spread."""
    from scipy.special import stdtr  # Student-t CDF; scipy comes with scikit-learn; imported here, off the import path

    c = np.asarray(controls, dtype=float)
    n = len(c)
    sd = float(c.std(ddof=1)) if n > 1 else 0.0
    if n < 3 or not sd > 0:
        return float("nan")
    m, scale, a = float(c.mean()), sd * np.sqrt(1 + 1 / n), abs(delta)
    return float(min(1.0, stdtr(n - 1, (m - a) / scale) + stdtr(n - 1, (-a - m) / scale)))


def control_columns(delta: float, controls: Optional[Sequence[float]], stop: int = 0,
                    tail: str = "normal") -> dict:
    """The matched control's columns from its draws' deltas c_d in draw order (module doc): the draws read
    (``used_draws`` with ``stop``: all of them when ``stop`` is 0 or never reached), their band, the Monte Carlo
    p-value of |delta| among the |c_d| (``control_p_empirical``: stop / n when stopped, else
    (1 + #{|c_d| >= |delta|}) / (n + 1)), ``control_p`` (``tail`` "normal": ``normal_tail_p`` for a head that read
    every draw, the Monte Carlo p for one stopped inside its band; "sequential": the Monte Carlo p), delta in units
    of the draws' spread (``delta_z`` = (delta - mean c) / sd c) and whether delta is outside the band.
    ``bias_dependent`` and ``control_p_adjusted`` are read across the table's heads (``adjust_controls``).
    ``controls`` None or empty: no control (NaN, missing calls)."""
    if not controls:
        return dict(control_lo=float("nan"), control_hi=float("nan"), delta_z=float("nan"), control_p=float("nan"),
                    control_p_empirical=float("nan"), n_control=0, outside_control=None)
    c = np.asarray(controls, dtype=float)
    n = used_draws(delta, c, stop, len(c))
    c = c[:n]
    hits = int(np.sum(np.abs(c) >= abs(delta)))
    stopped = stop > 0 and hits >= stop
    empirical = stop / n if stopped else (1 + hits) / (n + 1)
    fitted = normal_tail_p(delta, c) if tail == "normal" and not stopped else float("nan")
    sd = float(c.std(ddof=1)) if n > 1 else 0.0
    return dict(control_lo=float(c.min()), control_hi=float(c.max()),
                delta_z=(delta - float(c.mean())) / sd if sd > 0 else float("nan"),
                control_p=empirical if np.isnan(fitted) else fitted, control_p_empirical=empirical, n_control=n,
                outside_control=bool(delta < c.min() or delta > c.max()))


def benjamini_hochberg(p: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values: q_(i) = min over j >= i of m p_(j) / j (p sorted ascending), at most 1.
    Calling the heads with q <= alpha controls the false discovery rate at alpha (independent or positively
    dependent tests)."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(scaled[::-1])[::-1].clip(max=1.0)
    out = np.empty(m)
    out[order] = adjusted
    return out


def adjust_controls(df: pd.DataFrame) -> pd.DataFrame:
    """``control_p_adjusted`` and ``bias_dependent`` of an ``ablate_bias`` table, read across its heads: the rows
    tested against their matched control (a control_p, no identity) form one family, adjusted by
    Benjamini-Hochberg; bias_dependent = control_p_adjusted <= 0.05 (the false discovery rate over those rows at
    5%). Identity rows keep p 1 and are not counted (their null is exact, not tested); rows without a control
    have neither."""
    if "control_p" not in df:
        return df
    df = df.copy()
    identity = df["identity"].fillna("") if "identity" in df else pd.Series("", index=df.index)
    tested = df.control_p.notna() & (identity == "")
    adjusted = pd.Series(np.nan, index=df.index)
    adjusted[tested] = benjamini_hochberg(df.control_p[tested].to_numpy(dtype=float))
    answered = df.control_p.notna() & ~tested
    adjusted[answered] = df.control_p[answered]
    df["control_p_adjusted"] = adjusted
    called = pd.array([None] * len(df), dtype="boolean")
    has = df.control_p.notna().to_numpy()
    called[has] = (adjusted[has] <= CONTROL_ALPHA).to_numpy()
    df["bias_dependent"] = called
    return df
