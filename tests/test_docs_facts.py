"""tools/readme_facts.py: every fact README and docs quote between ``<!-- fact:NAME -->`` markers equals its
regeneration from the source (the family registry, findings 4c / 4d); a README edited by hand, or a source that
moved on, fails here until ``python tools/readme_facts.py`` is run."""

import importlib.util
import re
from pathlib import Path

import interp

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("readme_facts", ROOT / "tools" / "readme_facts.py")
facts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(facts)
README = (ROOT / "README.md").read_text()


def test_every_marked_file_equals_its_regeneration():
    files = facts.marked_files()
    assert ROOT / "README.md" in files
    for path in files:
        text = path.read_text()
        assert facts.render(text) == text, f"{path}: run `python tools/readme_facts.py`"


def test_readme_quotes_each_fact():
    assert {m["name"] for m in facts.SPAN.finditer(README)} == set(facts.FACTS)


def test_the_family_count_is_the_registry_and_the_readme_table():
    """The quoted count, the registry's size and the rows of README's generated family table agree."""
    quoted = [int(m["text"]) for m in facts.SPAN.finditer(README) if m["name"] == "family-count"]
    table = README.split("<!-- families:start")[1].split("<!-- families:end -->")[0]
    rows = [line for line in table.splitlines()[1:] if line.startswith("| ") and not line.startswith("| ---")]
    assert quoted == [len(interp.list_families())] and len(rows) - 1 == quoted[0]  # minus the header row


def test_the_verdicts_are_quoted_from_the_findings_and_the_withdrawn_one_is_not_claimed():
    findings = " ".join((ROOT / "docs" / "findings.md").read_text().split())
    for name in ("sink-verdict", "backcopy-verdict"):
        text = next(m["text"] for m in facts.SPAN.finditer(README) if m["name"] == name)
        assert text.startswith("**Verdict") and text in findings, name
    flat = " ".join(README.split())
    withdrawn = [m.start() for m in re.finditer("no first-token sink emerges at this scale", flat)]
    assert len(withdrawn) == 1 and flat[withdrawn[0] - 40: withdrawn[0]].endswith('their verdict, "')
    assert "Bigram-Backcopy" in README and "experiments/train_backcopy.py" in README


def test_an_unknown_fact_is_named():
    import pytest

    with pytest.raises(KeyError, match="unknown fact 'nope'"):
        facts.render("<!-- fact:nope -->1<!-- /fact -->")
