"""Count models of bytes: the baseline a trained byte-level language model must beat.

An order-n model predicts byte w from the n-1 bytes before it by interpolated Kneser-Ney
(Chen & Goodman 1998, one discount D per model), with the lower orders on continuation counts:

    P_k(w | c) = max(N_k(c w) - D, 0) / N_k(c .)  +  D T_k(c) / N_k(c .) * P_{k-1}(w | c')
    P_0(w)     = 1 / 256

where c is the k-1 bytes before w, c' its last k-2, N_n = raw counts of the n-grams, N_k (k < n) =
the number of distinct bytes seen before the k-gram (continuation counts), T_k(c) = the number of
distinct bytes seen after c; a context never seen (N_k(c .) = 0) falls through to P_{k-1}.
Context does not cross the start of a window: the first bytes of a window are predicted from the
bytes of that window only, exactly the predictions the network is scored on
(``experiments.training.sinks.lm_loss``: bytes 2..context of each window).

Everything is counted with numpy over integer codes (code of bytes b_1..b_k = sum b_i 256^(k-i)),
so an order-5 model of tens of MB takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from interp.errors import InputError

N_SYMBOLS = 256


def _codes(data: np.ndarray, k: int) -> np.ndarray:
    """int64 code of every k-gram of ``data`` (len(data) - k + 1 of them)."""
    n = len(data) - k + 1
    code = np.zeros(max(n, 0), np.int64)
    for i in range(k):
        code = code * N_SYMBOLS + data[i:i + n]
    return code


def _unique_counts(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.unique(codes, return_counts=True)


@dataclass
class _Order:
    grams: np.ndarray     # sorted k-gram codes (context * 256 + w)
    counts: np.ndarray    # N_k(c w)
    contexts: np.ndarray  # sorted context codes
    totals: np.ndarray    # N_k(c .)
    types: np.ndarray     # T_k(c)


def _order(grams: np.ndarray, counts: np.ndarray) -> _Order:
    ctx = grams // N_SYMBOLS
    contexts, start, types = np.unique(ctx, return_index=True, return_counts=True)
    totals = np.add.reduceat(counts, start) if len(counts) else counts
    return _Order(grams, counts.astype(np.float64), contexts, totals.astype(np.float64), types.astype(np.float64))


def _lookup(keys: np.ndarray, table: np.ndarray, values: np.ndarray) -> np.ndarray:
    if len(table) == 0:
        return np.zeros(len(keys))
    i = np.searchsorted(table, keys).clip(0, len(table) - 1)
    return np.where(table[i] == keys, values[i], 0.0)


class KneserNey:
    """An order-``n`` interpolated Kneser-Ney byte model with discount ``discount`` (module doc),
    counted over ``train`` (uint8 array)."""

    def __init__(self, train: np.ndarray, n: int, discount: float) -> None:
        if not 1 <= n <= 7:
            raise InputError(f"the order n must lie in 1..7 (int64 codes); got {n}")
        if not 0 < discount < 1:
            raise InputError(f"the discount must lie strictly between 0 and 1; got {discount}")
        data = np.asarray(train, np.int64)
        self.n, self.discount, self.orders = n, discount, []
        for k in range(1, n + 1):
            if k == n:
                grams, counts = _unique_counts(_codes(data, k))
            else:  # continuation counts: distinct bytes before the k-gram
                longer = np.unique(_codes(data, k + 1))
                grams, counts = _unique_counts(longer % N_SYMBOLS ** k)
            self.orders.append(_order(grams, counts))

    def log_prob(self, histories: np.ndarray, targets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """ln P(target | history) per prediction: ``histories`` int64 [m, n-1] (the n-1 bytes before
        the target, most recent last), ``lengths`` how many of them are real (the rest is before the
        window's start and ignored)."""
        p = np.full(len(targets), 1.0 / N_SYMBOLS)
        for k in range(1, self.n + 1):
            order, h = self.orders[k - 1], k - 1
            ctx = np.zeros(len(targets), np.int64)
            for i in range(h):
                ctx = ctx * N_SYMBOLS + histories[:, self.n - 1 - h + i]
            total = _lookup(ctx, order.contexts, order.totals)
            count = _lookup(ctx * N_SYMBOLS + targets, order.grams, order.counts)
            types = _lookup(ctx, order.contexts, order.types)
            seen = (total > 0) & (lengths >= h)
            safe = np.where(seen, total, 1.0)
            mixed = np.maximum(count - self.discount, 0) / safe + self.discount * types / safe * p
            p = np.where(seen, mixed, p)
        return np.log(p)

    def nats_per_byte(self, windows: np.ndarray) -> float:
        """Mean cross-entropy of bytes 2..context of each window given the bytes before them in the
        window (the network's predictions, ``experiments.training.sinks.lm_loss``)."""
        windows = np.asarray(windows, np.int64)
        m, context = windows.shape
        pad = np.concatenate([np.zeros((m, self.n - 1), np.int64), windows], 1)
        hist, targets, lengths = [], [], []
        for t in range(1, context):
            hist.append(pad[:, t:t + self.n - 1])
            targets.append(windows[:, t])
            lengths.append(np.full(m, t))
        return float(-self.log_prob(np.concatenate(hist), np.concatenate(targets), np.concatenate(lengths)).mean())


DISCOUNTS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def count_baseline(train: np.ndarray, val_windows: np.ndarray, context: int, orders=(1, 2, 3, 4, 5, 6, 7),
                   discounts=DISCOUNTS, held_out: float = 0.1) -> pd.DataFrame:
    """One row per order n: the discount tuned on the last ``held_out`` of ``train`` (counted on the
    rest; windows of ``context`` bytes, disjoint), then the model counted on all of ``train`` and
    its validation nats/byte on ``val_windows``. Columns: n, discount, tune_nats_per_byte,
    val_nats_per_byte, best (the order with the lowest validation loss)."""
    train = np.asarray(train, np.uint8)
    cut = int(len(train) * (1 - held_out))
    tune_data = train[cut:][: (len(train) - cut) // context * context].reshape(-1, context)
    rows = []
    for n in orders:
        model, scores = KneserNey(train[:cut], n, discounts[0]), {}
        for d in discounts:  # the counts do not depend on the discount
            model.discount = d
            scores[d] = model.nats_per_byte(tune_data)
        best = min(scores, key=scores.get)
        rows.append(dict(n=n, discount=best, tune_nats_per_byte=scores[best],
                         val_nats_per_byte=KneserNey(train, n, best).nats_per_byte(val_windows)))
    frame = pd.DataFrame(rows)
    frame["best"] = frame.val_nats_per_byte == frame.val_nats_per_byte.min()
    return frame
