"""``ablate_bias(model, data, options=SweepOptions(...))`` equals the keyword form; each option is declared once
(``interp.ablation.options``) and read by the sweep, the command line and the pipeline (issue 38)."""

import argparse
import dataclasses

import pandas as pd
import pytest

import interp
from interp.ablation import SweepOptions
from interp.ablation.options import OPTION_NAMES, add_flags, flag_values
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs

KEYWORDS = dict(method="mean", estimate="auto", top_k=1, sample_k=1, n_control=2, n_boot=20, seed=3, stack=2)


@pytest.fixture(scope="module")
def qwen():
    return interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu")


def data():
    return [tiny_inputs("qwen2", batch=2, pos=8, seed=s) for s in range(2)]


def test_options_object_gives_the_keyword_forms_table(qwen):
    by_keywords = interp.ablate_bias(qwen, data(), progress=False, **KEYWORDS)
    by_options = interp.ablate_bias(qwen, data(), options=SweepOptions(progress=False, **KEYWORDS))
    assert (by_keywords.estimate == "exact").sum() >= 2 and by_keywords.delta.abs().max() > 0
    pd.testing.assert_frame_equal(by_keywords, by_options)
    # both together, where they agree: the same table
    agreeing = interp.ablate_bias(qwen, data(), options=SweepOptions(progress=False, **KEYWORDS), top_k=1)
    pd.testing.assert_frame_equal(by_keywords, agreeing)


def test_a_keyword_that_contradicts_options_is_one_clear_error(qwen):
    options = SweepOptions(n_control=2, progress=False)
    with pytest.raises(InputError, match=r"both options= and keyword.*n_control=3 vs options.n_control=2"):
        interp.ablate_bias(qwen, data(), options=options, n_control=3)
    with pytest.raises(InputError, match=r"method='zero' vs options.method='mean'"):
        interp.ablate_bias(qwen, data(), kinds=("q",), method="zero", options=dataclasses.replace(options, method="mean"))
    with pytest.raises(InputError, match="unknown keyword.*n_controls"):
        interp.ablate_bias(qwen, data(), n_controls=3)
    with pytest.raises(InputError, match="takes an interp.ablation.options.SweepOptions; got dict"):
        interp.ablate_bias(qwen, data(), options=dict(n_control=3))


def test_the_command_line_flags_come_from_the_declaration():
    parser = argparse.ArgumentParser()
    add_flags(parser)
    flagged = [f for f in dataclasses.fields(SweepOptions) if f.metadata["flag"]]
    assert {f.name for f in flagged} >= {"top_k", "sample_k", "n_boot", "n_control", "seed", "force_exact"}
    defaults = flag_values(parser.parse_args([]))
    assert defaults == {f.name: f.default for f in flagged}  # one default: the field's
    given = flag_values(parser.parse_args(["--top-k", "2", "--n-control", "0", "--force-exact"]))
    assert SweepOptions(**given) == SweepOptions(top_k=2, n_control=0, force_exact=True)
    assert set(OPTION_NAMES) == {f.name for f in dataclasses.fields(SweepOptions)}
