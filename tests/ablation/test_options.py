"""Options of ``ablate_bias`` are keywords, one way, each declared once (``interp.ablation.options``: its default,
how it binds the results, where it applies) and read by the sweep, the command line and the pipeline; a value of the
wrong type, an unknown name and a value where the option does not apply are each one ``InputError``."""

import argparse
import dataclasses
import inspect

import pytest

import interp
from interp.ablation import SweepOptions
from interp.ablation.options import OPTION_NAMES, add_flags, flag_values
from interp.errors import InputError
from interp.models import tiny_hf_model, tiny_inputs


@pytest.fixture(scope="module")
def qwen():
    return interp.load_model(tiny_hf_model("qwen2", n_layers=2), device="cpu")


def data():
    return [tiny_inputs("qwen2", batch=2, pos=8, seed=s) for s in range(2)]


def test_ablate_bias_takes_its_options_one_way_as_keywords(qwen):
    params = inspect.signature(interp.ablate_bias).parameters
    assert "options" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values())
    with pytest.raises(InputError, match=r"no option 'options'"):
        interp.ablate_bias(qwen, data(), options=SweepOptions(n_control=2))
    with pytest.raises(InputError, match=r"no option 'n_controls' \(did you mean 'n_control'\?\)"):
        interp.ablate_bias(qwen, data(), n_controls=3)


@pytest.mark.parametrize("keywords, names", [
    (dict(force_exact="False"), "force_exact must be True or False; got 'False'"),
    (dict(overwrite="0"), "overwrite must be True or False; got '0'"),
    (dict(reuse_prefix="no"), "reuse_prefix must be True or False; got 'no'"),
    (dict(progress=1), r"progress must be True or False; got 1 \(int\)"),
    (dict(shard=(0.5, 2)), r"shard\[0\] must be an integer; got 0.5 \(float\)"),
    (dict(shard=(True, 2)), r"shard\[0\] must be an integer; got True \(bool\)"),
    (dict(top_k=2.0), r"top_k must be an integer; got 2.0 \(float\)"),
    (dict(n_boot=True), r"n_boot must be an integer; got True \(bool\)"),
    (dict(seed="3"), r"seed must be an integer; got '3' \(str\)"),
    (dict(abs_threshold="100"), r"abs_threshold must be a number; got '100' \(str\)"),
    (dict(max_batches=1.5), r"max_batches must be an integer or None; got 1.5 \(float\)"),
])
def test_an_option_of_the_wrong_type_is_refused_by_the_object_and_the_keyword_alike(qwen, keywords, names):
    with pytest.raises(InputError, match=names):
        SweepOptions(**keywords)
    with pytest.raises(InputError, match=names):
        interp.ablate_bias(qwen, data(), **keywords)


def test_an_unknown_option_names_the_nearest_one():
    with pytest.raises(InputError, match=r"no option 'topk' \(did you mean 'top_k'\?\)"):
        SweepOptions(topk=1)
    # numpy integers are integers; a list is a pair
    import numpy as np
    assert SweepOptions(top_k=np.int64(2), shard=[0, 2]) == SweepOptions(top_k=2, shard=(0, 2))


@pytest.mark.parametrize("keywords, why", [
    (dict(estimate="exact", top_k=3), "top_k=3 does not apply with estimate=exact"),
    (dict(estimate="exact", sample_k=0), "sample_k=0 does not apply with estimate=exact"),
    (dict(estimate="attribution", n_control=50), "n_control=50 does not apply with estimate=attribution"),
    (dict(estimate="atp", n_boot=10), "n_boot=10 does not apply with estimate=atp"),
    (dict(estimate="attribution", reuse_prefix=False), "reuse_prefix=False does not apply"),
    (dict(estimate="exact", n_projections=4), "n_projections=4 does not apply"),
    (dict(kinds=("q",), positions=[0]), r"positions=\[0\] does not apply to kinds \['q'\]"),
    (dict(kinds=("q",), abs_threshold=5.0), "abs_threshold=5.0 does not apply to kinds"),
    (dict(overwrite=True), "overwrite=True does not apply without out="),
])
def test_an_option_where_it_does_not_apply_is_refused_saying_why(qwen, keywords, why, tmp_path):
    with pytest.raises(InputError, match=why):
        interp.ablate_bias(qwen, data(), **keywords)
    assert not list(tmp_path.iterdir())


def test_an_option_at_its_default_or_where_it_applies_runs(qwen, tmp_path):
    # the defaults apply everywhere; top_k with auto, n_control with exact, overwrite with out
    df = interp.ablate_bias(qwen, data(), kinds=("q",), estimate="exact", layers=[0], heads=[0], n_control=2,
                            n_boot=10, progress=False, out=tmp_path, overwrite=True)
    assert set(df.estimate) == {"exact"} and (df.n_control == 2).all()
    auto = interp.ablate_bias(qwen, data(), kinds=("q",), top_k=1, sample_k=0, n_control=0, n_boot=0, progress=False)
    assert (auto.estimate == "exact").sum() == 1


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
    # the keywords for one estimate of "both": what does not apply to attribution back at its default
    both = SweepOptions(n_control=3, estimate="exact")
    assert both.keywords("attribution")["n_control"] == 19 and both.keywords("exact")["n_control"] == 3


def test_the_command_line_refuses_a_flag_that_applies_to_none_of_its_estimates(tmp_path, capsys):
    from interp.cli import main

    rc = main(["ablate", "--model", "gpt2", "--data", "wikitext", "--estimate", "exact", "--top-k", "3", "--out", str(tmp_path / "o")])
    assert rc == 1 and "top_k=3 does not apply with estimate=exact" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before the model loads or the folder is made
