"""The shipped seed-0 text arms (data/sinks/, float16) are small and reproduce their validation loss."""

from pathlib import Path

import pandas as pd
import pytest
from safetensors import safe_open

from experiments.training.sink_arms import SHIPPED_LM_DIR, TEXT_ARMS, load_sink_lm
from experiments.training.corpus import stdlib_corpus
from experiments.training.sinks import TextRecipe, lm_val_loss, recipe_fingerprint, val_windows

RUNS = Path(__file__).resolve().parents[2] / "docs" / "results" / "sinks" / "runs.csv"


def _meta(arm):
    with safe_open(str(SHIPPED_LM_DIR / f"{arm}.safetensors"), "pt") as fh:
        return fh.metadata()


def test_every_arm_ships_small_with_its_card():
    sizes = {arm: (SHIPPED_LM_DIR / f"{arm}.safetensors").stat().st_size for arm in TEXT_ARMS}
    assert max(sizes.values()) < 500_000 and sum(sizes.values()) < 3_000_000
    card = (SHIPPED_LM_DIR / "MODEL_CARD.md").read_text()
    runs = pd.read_csv(RUNS)
    last = runs[(runs.domain == "text") & (runs.seed == 0)]
    for arm, loss in last[last.step == last.step.max()].set_index("arm").val_loss.items():
        assert f"| `{arm}` |" in card and f"{loss:.4f}" in card
        assert float(_meta(arm)["val_loss"]) == pytest.approx(loss, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("arm", TEXT_ARMS)
def test_shipped_weights_reproduce_their_validation_loss(arm):
    recipe, meta = TextRecipe(), _meta(arm)
    corpus = stdlib_corpus(recipe.corpus_budget)
    if corpus.sha256 != meta["corpus_sha256"]:
        pytest.skip("this interpreter's standard library differs from the one the models were trained on")
    assert meta["recipe"] == recipe_fingerprint(recipe, corpus.sha256)
    loss = lm_val_loss(load_sink_lm(arm), val_windows(corpus.val, recipe.val_windows, recipe.shape.context), arm)
    assert loss == pytest.approx(float(meta["val_loss"]), abs=0.05)
