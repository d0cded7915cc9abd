"""interp.types: the API's Literals and the CLI's choices are one list each."""

import argparse
from typing import get_args

from interp import types
from interp.cli import build_parser


def _choices(parser: argparse.ArgumentParser) -> dict[tuple[str, str], tuple]:
    """(subcommand, option) -> the choices argparse will accept."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for inner in sub._actions:
                    if inner.choices is not None:
                        found[(name, inner.option_strings[-1])] = tuple(inner.choices)
    return found


def test_cli_choices_are_the_api_constants():
    choices = _choices(build_parser())
    assert choices[("ablate", "--method")] == types.METHODS == get_args(types.Method)
    assert choices[("ablate", "--estimate")] == (*get_args(types.Estimate), "both")
    assert choices[("ablate", "--scope")] == tuple(s for s in get_args(types.Scope) if s != "custom")
    assert set(choices[("demo", "--ablation-estimate")]) <= set(get_args(types.Estimate))
    normalize = {v for (cmd, opt), v in choices.items() if opt == "--normalize"}
    assert normalize == {get_args(types.Normalize)}, "every subcommand's --normalize takes the same values"


def test_data_sources_check_the_same_normalisations():
    from interp.data import sources

    assert sources.NORMALIZE is types.NORMALIZE


def test_ablate_takes_the_implicit_kinds_and_record_does_not():
    from interp.cli import check_args

    parser = build_parser()
    check_args(parser.parse_args(["ablate", "--model", "m", "--data", "d", "--kinds", "q,sink_v,massive"]))
    import pytest

    from interp.errors import InputError

    with pytest.raises(InputError, match="kinds must be"):  # a command without the implicit kinds refuses them
        check_args(argparse.Namespace(kinds="sink_v"))
    assert types.IMPLICIT_KINDS == ("sink_v", "massive")
