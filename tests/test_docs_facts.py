"""tools/readme_facts.py: every fact README and docs quote between ``<!-- fact:NAME -->`` markers equals its
regeneration from the source (the family registry, findings 4c / 4d); a page edited by hand, or a source that
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
MODELS_PAGE = (ROOT / "docs" / "models.md").read_text()
FINDINGS = (ROOT / "docs" / "findings.md").read_text()
DATA = (ROOT / "docs" / "data.md").read_text()


def test_every_marked_file_equals_its_regeneration():
    files = facts.marked_files()
    assert ROOT / "README.md" in files
    for path in files:
        text = path.read_text()
        assert facts.render(text) == text, f"{path}: run `python tools/readme_facts.py`"


def test_the_docs_quote_each_fact_where_a_reader_looks_for_it():
    """README the family count; the models page the count beside its table; the findings page the two verdicts in
    its summary; the data page the commands that take --data. Every fact is quoted somewhere."""
    assert {m["name"] for m in facts.SPAN.finditer(README)} == {"family-count"}
    assert {m["name"] for m in facts.SPAN.finditer(MODELS_PAGE)} == {"family-count"}
    assert {m["name"] for m in facts.SPAN.finditer(FINDINGS)} == {"sink-verdict", "backcopy-verdict"}
    assert {m["name"] for m in facts.SPAN.finditer(DATA)} == {"data-commands"}
    quoted = {m["name"] for path in facts.marked_files() for m in facts.SPAN.finditer(path.read_text())}
    assert quoted == set(facts.FACTS)


def test_the_family_count_is_the_registry_and_the_docs_table():
    """The count README and the models page quote, the registry's size and the rows of the generated family table
    agree."""
    quoted = [int(m["text"]) for text in (README, MODELS_PAGE) for m in facts.SPAN.finditer(text)
              if m["name"] == "family-count"]
    table = MODELS_PAGE.split("<!-- families:start")[1].split("<!-- families:end -->")[0]
    rows = [line for line in table.splitlines()[1:] if line.startswith("| ") and not line.startswith("| ---")]
    assert quoted == [len(interp.list_families())] * 2 and len(rows) - 1 == quoted[0]  # minus the header row


def test_the_verdicts_are_quoted_from_the_findings_and_the_withdrawn_one_is_not_claimed():
    """The findings' summary quotes each section's verdict (its text is the section's, word for word), and the first
    runs' withdrawn verdict appears once in all the docs, as withdrawn, never as a claim."""
    summary = FINDINGS[FINDINGS.index("## The zoo models at a glance"):FINDINGS.index("\n## 1. ")]
    sections = " ".join(FINDINGS[FINDINGS.index("\n## 1. "):].split())
    for name in ("sink-verdict", "backcopy-verdict"):
        text = next(m["text"] for m in facts.SPAN.finditer(summary) if m["name"] == name)
        assert text.startswith("**Verdict") and text in sections, name
    pages = [README, *(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")) if "results" not in p.parts)]
    flat = [" ".join(text.split()) for text in pages]
    withdrawn = [(f, m.start()) for f in flat for m in re.finditer("no first-token sink emerges at this scale", f)]
    assert len(withdrawn) == 1 and withdrawn[0][0][withdrawn[0][1] - 40: withdrawn[0][1]].endswith('their verdict, "')
    assert "Bigram-Backcopy" in summary and "experiments.train_backcopy" in summary


def test_an_unknown_fact_is_named():
    import pytest

    with pytest.raises(KeyError, match="unknown fact 'nope'"):
        facts.render("<!-- fact:nope -->1<!-- /fact -->")
