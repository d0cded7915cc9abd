"""Findings section 3's family table and sentences are read from docs/results/families/family_tests.csv
(experiments/families.py); a regenerated CSV that disagrees fails here."""

import re

import pandas as pd
import pytest

from test_docs import FINDINGS, RESULTS, agrees, numbers

CSV = pd.read_csv(RESULTS / "families" / "family_tests.csv")
DEFAULT = CSV[CSV.null == "gaussian_layer_means"]  # the earlier default null, the table findings quotes as such
SECTION = FINDINGS[FINDINGS.index("**Families, tested, as the earlier"):FINDINGS.index("**Two questions, and the untrained")]


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


CALIBRATION = pd.read_csv(RESULTS / "families" / "calibration.csv")


def test_calibration_covers_four_untrained_architectures_at_eight_seeds_with_every_feature():
    assert sorted(CALIBRATION.architecture.unique()) == ["BERT", "GPT-2", "LLaMA-style", "ViT"]
    assert (CALIBRATION.groupby("architecture").seed.nunique() == 8).all() and (CALIBRATION.n_features == 12).all()


def test_untrained_models_are_not_called_specialised_nor_families():
    """At least 7 of 8 seeds per architecture: no specialisation against 8 other untrained seeds, and no
    families (structure) within layers; the raw within-layer p is reported beside it."""
    per = CALIBRATION.groupby("architecture")
    assert (per.specialised.sum() <= 1).all() and (per.structure.sum() <= 1).all()
    assert (per.old_null_structure.sum() <= 1).all()


def test_the_layer_test_sees_the_untrained_layer_difference_and_says_so():
    """Untrained GPT-2 and LLaMA-style differ by layer in every seed (layer 0 reads embeddings): the layer test
    reports it (that is why a layer difference alone is no evidence of training)."""
    per = CALIBRATION.groupby("architecture")
    assert per.layers_differ.sum()[["GPT-2", "LLaMA-style"]].tolist() == [8, 8]
    assert (CALIBRATION.layer_effect_lo <= CALIBRATION.layer_effect).all()
    assert (CALIBRATION.layer_effect <= CALIBRATION.layer_effect_hi + 0.05).all()


def test_findings_calibration_table_equals_the_csv():
    section = FINDINGS[FINDINGS.index("**Two questions, and the untrained"):FINDINGS.index("## 3b.")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| architecture")
            and not line.startswith("| ---")]
    assert len(rows) == 4
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        g = CALIBRATION[CALIBRATION.architecture == cells[0]]
        assert [int(x) for x in cells[1:7]] == [len(g), g.specialised.sum(), g.structure.sum(),
                                               (g.family_p <= 0.05).sum(), g.old_null_structure.sum(),
                                               g.layers_differ.sum()]
        assert agrees(cells[7], g.layer_effect.median())
    llama = CALIBRATION[CALIBRATION.architecture == "LLaMA-style"]
    assert f"in {(llama.family_p <= 0.05).sum()} of 8 LLaMA-style seeds" in " ".join(section.split())


POWER = pd.read_csv(RESULTS / "families" / "power.csv")


def _rate(placement: str, share: float, test: str) -> pd.Series:
    cell = POWER[(POWER.placement == placement) & (POWER.share.round(2) == round(share, 2)) & (POWER.test == test)]
    return cell.set_index("delta").rate.sort_index()


def _first_found(placement: str, share: float, test: str, bar: float = 0.8) -> float:
    rate = _rate(placement, share, test)
    return float(rate[rate >= bar].index.min()) if (rate >= bar).any() else float("inf")


def test_the_power_grid_is_complete_and_planted_from_minilm():
    assert set(POWER.placement) == {"across", "along"} and (POWER.runs == 10).all() and (POWER.n_heads == 72).all()
    assert (POWER.n_features == 12).all() and {0, 2, 3, 4, 5, 8} <= set(POWER.delta)
    assert {12, 16} <= set(POWER[POWER.placement == "across"].delta)


def test_an_along_layer_family_is_found_by_the_layer_test_at_delta_5_or_less():
    """Whole layers shifted (1 or 2 of 6): the layer test finds them in >= 8 of 10 runs by delta 5; the earlier
    default null, which kept layer means, at most 1 of 10 at any delta (it cannot see them); the within-layer
    test none (not its question)."""
    for share in (1 / 6, 1 / 3):
        assert _first_found("along", share, "layer effect") <= 5
        assert _rate("along", share, "earlier null (layer means kept)").max() <= 0.1
        assert _rate("along", share, "within-layer families").max() == 0


def test_no_test_rejects_beyond_chance_without_a_family():
    at_zero = POWER[POWER.delta == 0]
    assert (at_zero.rejected <= 2).all()  # 10 runs at alpha 0.05: 3 or more has probability 0.012


def test_findings_power_sentences_equal_the_csv():
    section = " ".join(FINDINGS[FINDINGS.index("**Power**"):FINDINGS.index("## 3b.")].split())
    for share, label in ((1 / 6, "one layer"), (1 / 3, "two layers")):
        rate = _rate("along", share, "layer effect")
        delta = _first_found("along", share, "layer effect")
        assert f"{label} of six at delta {delta:g} ({int(rate[delta] * 10)} of 10)" in section
    across = _rate("across", 1 / 3, "within-layer families")
    earlier = _rate("across", 1 / 3, "earlier null (layer means kept)")
    assert f"{int(across[8] * 10)} of 10 at delta 8 (earlier null {int(earlier[8] * 10)} of 10)" in section
    assert f"{int(across[12] * 10)} of 10 at delta 12 (earlier null {int(earlier[12] * 10)} of 10)" in section
    sixth = _rate("across", 1 / 6, "within-layer families")
    assert f"a sixth of the heads, {int(sixth[16] * 10)} of 10 at delta 16" in section
    assert _first_found("across", 1 / 3, "within-layer families") == 12  # the within-layer test pays power


SPECIAL = pd.read_csv(RESULTS / "families" / "specialisation.csv")
SPECIAL_TESTS = pd.read_csv(RESULTS / "families" / "specialisation_tests.csv").set_index("model")


def test_findings_trained_against_untrained_equals_the_csvs():
    text = " ".join(FINDINGS[FINDINGS.index("**Trained against untrained**"):FINDINGS.index("## 3b.")].split())
    trained = SPECIAL[SPECIAL.weights == "trained"].set_index(["model", "statistic"])
    quoted = re.findall(r"z (-?[\d.]+), Holm p ([\d.e-]+)", text)
    order = [("minilm-l6", "layer_effect"), ("minilm-l6", "hf_ratio_spread"), ("minilm-l6", "within_layer_split"),
             ("dinov2-s14", "layer_effect"), ("dinov2-s14", "within_layer_split"), ("dinov2-s14", "hf_ratio_spread")]
    assert len(quoted) == len(order)
    for (z, p), key in zip(quoted, order):
        assert agrees(z, trained.loc[key].z) and agrees(p, trained.loc[key].p_holm), key
    mini, dino = SPECIAL_TESTS.loc["minilm-l6"], SPECIAL_TESTS.loc["dinov2-s14"]
    eta = numbers(text[text.index("eta^2"):text.index("far more")])
    assert [agrees(q, v) for q, v in zip(eta[1:], [mini.layer_effect, mini.layer_effect_lo, mini.layer_effect_hi,
                                                   mini.layer_p])] == [True] * 4
    family_ps = re.findall(r"family_p ([\d.]+)", text)
    assert agrees(family_ps[0], mini.family_p) and agrees(family_ps[1], dino.family_p)
    assert (SPECIAL_TESTS.n_features == 12).all() and (SPECIAL.n_features == 12).all()
    assert not SPECIAL_TESTS.structure.any() and (SPECIAL.n_random == 8).all()
    # the verdicts the text gives
    assert trained.loc[("minilm-l6", "layer_effect")].specialised
    assert trained.loc[("dinov2-s14", "layer_effect")].z < 0
    assert not trained.loc[("minilm-l6", "within_layer_split")].specialised
    assert not trained.loc[("dinov2-s14", "within_layer_split")].specialised
