"""Facts the README and docs quote, generated from their one source, so they cannot drift.

    python tools/readme_facts.py            # rewrite every marked span in README.md and docs/*.md
    python tools/readme_facts.py --check    # exit 1 (naming the files) where a span differs

A fact is quoted between markers, inline or over lines::

    <!-- fact:NAME -->the generated text<!-- /fact -->

and ``FACTS[NAME]()`` gives its text from the source: ``family-count`` from the family registry
(``interp.models.families``), ``data-commands`` from the CLI's parser, ``sink-verdict`` and ``backcopy-verdict`` from the verdicts of
docs/findings.md sections 4c (the rerun under the stopping rule) and 4d (the Bigram-Backcopy control).
tests/test_docs_facts.py keeps every marked file
equal to its regeneration. (The family table itself: ``interp families --readme README.md``.)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = ROOT / "docs" / "findings.md"
SPAN = re.compile(r"(<!-- fact:(?P<name>[a-z0-9-]+) -->)(?P<text>.*?)(<!-- /fact -->)", re.S)


def family_count() -> str:
    """How many model families the registry describes."""
    from interp.models.families import list_families

    return str(len(list_families()))


def data_commands() -> str:
    """The CLI commands that take ``--data``, from the parser."""
    import argparse

    from interp.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return ", ".join(f"`{name}`" for name, parser in sub.choices.items()
                     if any("--data" in action.option_strings for action in parser._actions))


def _section(text: str, heading: str) -> str:
    """The body of the findings section whose heading starts with ``heading``, to the next ``## ``."""
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _verdict(section: str) -> str:
    """The section's last verdict: its bold sentence and the sentence after it, on one line."""
    paragraph = [p for p in section.split("\n\n") if p.startswith("**Verdict")][-1]
    flat = " ".join(paragraph.split())
    bold_end = flat.index("**", 2) + 2
    rest = re.split(r"(?<=[.])\s+(?=[A-Z*`])", flat[bold_end:].strip())
    return f"{flat[:bold_end]} {rest[0]}"


def sink_verdict() -> str:
    """Findings 4c's verdict (the rerun under the stopping rule: the first release's 'no sink' is withdrawn)."""
    return _verdict(_section(FINDINGS.read_text(), "4c."))


def backcopy_verdict() -> str:
    """Findings 4d's verdict (the Bigram-Backcopy positive control)."""
    return _verdict(_section(FINDINGS.read_text(), "4d."))


FACTS: dict[str, Callable[[], str]] = {"family-count": family_count, "data-commands": data_commands,
                                       "sink-verdict": sink_verdict, "backcopy-verdict": backcopy_verdict}


def render(text: str) -> str:
    """``text`` with every fact span's text regenerated; an unknown fact name is a ``KeyError`` naming it."""
    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in FACTS:
            raise KeyError(f"unknown fact {name!r}: one of {sorted(FACTS)}")
        return f"{match[1]}{FACTS[name]()}{match[4]}"

    return SPAN.sub(fill, text)


def marked_files() -> list[Path]:
    """README.md and the docs that quote a fact."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in files if SPAN.search(p.read_text())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only say which files differ (exit 1 if any)")
    args = ap.parse_args()
    stale = []
    for path in marked_files():
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    verb = "differ" if args.check else "updated"
    print(f"{verb}: {', '.join(str(p.relative_to(ROOT)) for p in stale)}" if stale else "every fact is current")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
