"""The count-model baseline (experiments.training.ngram): equal to a plain-Python interpolated Kneser-Ney
written from the textbook formula, a distribution over the 256 bytes, and it finds planted
structure."""

from collections import Counter, defaultdict

import numpy as np
import pytest

from interp.errors import InputError
from experiments.training.ngram import KneserNey, count_baseline


def reference_prob(text: bytes, n: int, d: float, history: bytes, w: int) -> float:
    """Interpolated Kneser-Ney by dictionaries (Chen & Goodman 1998): raw counts at order n,
    continuation counts below, uniform 1/256 at the bottom."""
    p = 1 / 256
    for k in range(1, n + 1):
        if k == n:
            counts = Counter(text[i:i + k] for i in range(len(text) - k + 1))
        else:
            counts = Counter(g[1:] for g in {text[i:i + k + 1] for i in range(len(text) - k)})
        ctx = history[len(history) - (k - 1):] if k > 1 else b""
        if len(history) < k - 1:
            continue
        total, types = 0, 0
        follow = defaultdict(int)
        for gram, c in counts.items():
            if gram[:-1] == ctx:
                total, types = total + c, types + 1
                follow[gram[-1]] = c
        if total:
            p = max(follow[w] - d, 0) / total + d * types / total * p
    return p


TEXT = b"the cat sat on the mat; the cat ate the rat. " * 3 + b"a bat sat."


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_equal_to_the_textbook_formula_and_a_distribution(n):
    model = KneserNey(np.frombuffer(TEXT, np.uint8), n, 0.7)
    rng = np.random.default_rng(n)
    histories = [b"the ca", b"xyzqw", b"at", b"", b" sat "[:n - 1], bytes(rng.integers(0, 256, 3).tolist())]
    for h in histories:
        lengths = min(len(h), n - 1)
        padded = np.zeros((256, n - 1), np.int64)
        if n > 1 and lengths:
            padded[:, n - 1 - lengths:] = np.frombuffer(h[len(h) - lengths:], np.uint8)
        logp = model.log_prob(padded, np.arange(256), np.full(256, lengths))
        assert np.exp(logp).sum() == pytest.approx(1.0, abs=1e-12)
        for w in (ord("t"), ord("a"), ord(" "), 0, 200):
            assert np.exp(logp[w]) == pytest.approx(reference_prob(TEXT, n, 0.7, h[len(h) - lengths:]
                                                                   if lengths else b"", w), rel=1e-12)


def test_planted_structure_and_the_tuned_baseline():
    period = np.frombuffer(b"abcdefgh" * 4000, np.uint8)  # each byte fixed by the one before it
    windows = period[: 64 * 10].reshape(10, 64)
    assert KneserNey(period, 1, 0.9).nats_per_byte(windows) == pytest.approx(np.log(8), abs=0.01)
    assert KneserNey(period, 2, 0.9).nats_per_byte(windows) < 0.01
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, 40_000).astype(np.uint8)  # nothing to learn: no order beats ln 256
    held = rng.integers(0, 256, (100, 64)).astype(np.uint8)
    frame = count_baseline(noise, held, 64, orders=(1, 2))
    assert list(frame.n) == [1, 2] and frame.best.sum() == 1
    assert (frame.val_nats_per_byte > np.log(256) - 0.02).all()
    with pytest.raises(InputError, match="discount"):
        KneserNey(noise, 2, 1.0)
