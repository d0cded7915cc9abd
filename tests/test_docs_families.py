"""Findings section 3's family table and sentences are read from docs/results/families/family_tests.csv
(experiments/families.py); a regenerated CSV that disagrees fails here."""

import re

import pandas as pd
import pytest

from interp.analysis.frequency import NULLS
from test_docs import FINDINGS, RESULTS, agrees, numbers

CSV = pd.read_csv(RESULTS / "families" / "family_tests.csv")
DEFAULT = CSV[CSV.null == NULLS[0]]
SECTION = FINDINGS[FINDINGS.index("**Families, tested**"):FINDINGS.index("## 3b.")]


def _row(model: str, weights: str) -> list[str]:
    lines = [line for line in SECTION.splitlines() if line.startswith(f"| {model} | {weights} |")]
    assert len(lines) == 1, (model, weights)
    return [c.strip() for c in lines[0].strip("|").split("|")]


@pytest.mark.parametrize("model, weights", DEFAULT[["model", "weights"]].itertuples(index=False, name=None))
def test_every_family_row_equals_the_csv(model, weights):
    r = DEFAULT[(DEFAULT.model == model) & (DEFAULT.weights == weights)].iloc[0]
    cells = _row(model, weights)
    assert [int(cells[2]), int(cells[3])] == [r.n_items, r.n_heads]
    assert agrees(cells[4], r.family_p)
    ari, lo, hi = numbers(cells[5])
    assert agrees(ari, r.replication_ari) and agrees(lo, r.replication_lo) and agrees(hi, r.replication_hi)
    assert agrees(cells[6], r.separation)
    assert cells[7].startswith("yes" if r.structure else "no") and int(numbers(cells[7])[0]) == r.k
    if r.k > 1:
        assert [int(n) for n in numbers(cells[7])[1:]] == [int(n) for n in r.family_sizes.split()]
    assert agrees(cells[8], r.permutation_p)


def test_the_table_has_every_default_row_and_the_sentences_quote_it():
    assert sum(line.startswith(tuple(f"| {m} |" for m in DEFAULT.model)) for line in SECTION.splitlines()) == len(DEFAULT)
    get = {(m, w): r for (m, w), r in DEFAULT.set_index(["model", "weights"]).iterrows()}
    text = SECTION[SECTION.index("No trained model"):]
    assert agrees(re.search(r"DINOv2 p = ([\d.]+)", text).group(1), get["dinov2-s14", "trained"].family_p)
    mini = get["minilm-l6", "trained"]
    assert [agrees(q, v) for q, v in zip(numbers(text[text.index("MiniLM"):text.index("Heads differ")]),
                                         [mini.replication_ari, mini.replication_lo, mini.replication_hi,
                                          mini.family_p])] == [True] * 4
    smol = get["smollm2-135m", "random init"]
    quoted = numbers(text[text.index("whose layer 0"):text.index("there the test")])
    assert [agrees(q, v) for q, v in zip(quoted, [0, smol.family_p, smol.replication_ari, smol.replication_lo,
                                                  smol.replication_hi])][1:] == [True] * 4
    assert smol.structure and not DEFAULT[DEFAULT.weights == "trained"].structure.any()
    plain = CSV[(CSV.null == "gaussian_covariance") & CSV.model.isin(["gpt2-shape", "vit-b16-shape"])]
    assert plain.structure.all() and (plain.k == 2).all() and (plain.family_p == 0.005).all()
    assert (CSV.permutation_p == 0.05).all() and (CSV.n_null == 199).all()
