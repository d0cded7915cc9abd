"""The documentation site (mkdocs.yml; `make docs` builds it in strict mode, `make test` runs that build): the API
page is generated from ``interp.__all__`` and names every public name, each with a docstring of its own; the CLI
page is generated from the parser; README stays a user's page; and no page a user reads cites an issue number or
a commit hash (CHANGELOG.md included: it says what changed for a user, not how the work went)."""

import ast
import dataclasses
import importlib
import inspect
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

import interp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import docs_site  # noqa: E402

ISSUE = re.compile(r"\bissues? \d+", re.I)
HASH = re.compile(r"(?<![\w./-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")


def citations(text: str) -> list[str]:
    """Issue numbers ("issue 40", "Issues 38") and commit hashes (7 to 40 hex digits, with a digit and a letter)."""
    return ISSUE.findall(text) + HASH.findall(text)


def user_texts() -> dict[str, str]:
    """What a user reads: README, CHANGELOG, the docs pages (not the results data), the notebooks' cells (sources, as
    kept and as rendered) and the docstrings of the installed package (the experiments' scripts keep their lab notes)."""
    texts = {name: (ROOT / name).read_text() for name in ("README.md", "CHANGELOG.md")}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        if "results" not in page.relative_to(ROOT / "docs").parts:
            texts[str(page.relative_to(ROOT))] = page.read_text()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        texts[str(notebook.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in cells)
    for module in sorted((ROOT / "interp").rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    texts[f"{module.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}"] = doc
    return texts


def test_the_scan_finds_issue_numbers_and_commit_hashes_and_spares_numbers():
    assert citations("Issue 40 item 3; after issues 38-40; see issue 7") == ["Issue 40", "issues 38", "issue 7"]
    assert citations("before the rework (36909f6), main 696cc61, aa859e5's tables; b042a19") == [
        "36909f6", "696cc61", "aa859e5", "b042a19"]
    assert citations("rho 0.155, 6.7e-16, 1e-12, 2,508 tokens/s, 1234567 items, cafe, facade, "
                     "blocks.11.hook_q, sha256 in manifest.json") == []


def test_no_page_a_user_reads_cites_an_issue_or_a_commit():
    found = {where: hits for where, text in user_texts().items() if (hits := citations(text))}
    assert not found, (f"issue numbers or commit hashes where a user reads (CHANGELOG.md says what changed for a "
                       f"user, in a user's words): {found}")


def test_readme_is_a_users_page():
    """At most about 200 lines; the two commands, pip install, the ten lines, the CLI, the findings, the families
    and the docs are all there; every CLI line it shows is one the parser accepts."""
    from interp.cli import build_parser

    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for must in ("make demo", "make test", "pip install .", "## Ten lines", "## The command line", "docs/findings.md",
                 "docs/models.md", "make docs"):
        assert must in readme, must
    block = re.search(r"## The command line\s+```bash\n(.*?)```", readme, re.S).group(1)
    parser = build_parser()
    for line in block.strip().splitlines():
        args = shlex.split(line.split("  #")[0])
        assert args[0] == "interp"
        parser.parse_args(args[1:])  # SystemExit on a line the parser refuses


def test_every_relative_link_of_readme_exists():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert links and all((ROOT / link).exists() for link in links), [l for l in links if not (ROOT / l).exists()]


def test_the_api_page_names_every_public_name_once_from_where_it_is_defined():
    page = docs_site.api_page()
    blocks = re.findall(r"^::: (\S+)\n    options:\n      heading: \"interp\.(\w+)\"", page, re.M)
    assert sorted(name for _, name in blocks) == sorted(n for n in interp.__all__ if n != "__version__")
    assert interp.__version__ in page
    for path, name in blocks:
        module, attr = path.rsplit(".", 1)
        public = getattr(interp, name)
        is_module = inspect.ismodule(public)
        assert attr == name or is_module, (path, name)
        obj = importlib.import_module(path) if is_module else getattr(importlib.import_module(module), attr)
        assert obj is public or getattr(public, "__wrapped__", None) is obj or obj is getattr(obj, "__wrapped__",
                                                                                                public), name


def test_every_public_name_has_a_docstring_of_its_own():
    assert docs_site.missing_docstrings() == []


def test_a_dataclass_without_a_docstring_has_none_of_its_own():
    @dataclasses.dataclass
    class Plain:
        x: int

    @dataclasses.dataclass
    class Documented:
        """What it is."""

        x: int

    class Child(Documented):
        pass

    assert docs_site.own_docstring(Plain) == "" and docs_site.own_docstring(Child) == ""
    assert docs_site.own_docstring(Documented) == "What it is."


def test_the_cli_page_documents_every_command_and_option():
    from interp.cli import build_parser  # noqa: F401 - the parser docs_site reads

    page = docs_site.cli_reference()
    for name, parser in docs_site.commands().items():
        assert f"### `interp {name}`" in page, name
        section = page[page.index(f"### `interp {name}`"):]
        section = section[:section.find("\n### ", 1) if "\n### " in section[1:] else len(section)]
        for action in parser._actions:
            if action.option_strings and action.dest not in ("help", "debug"):
                assert f"`{action.option_strings[-1]}`" in section, (name, action.option_strings)
    assert docs_site.CLI_MARKER in (ROOT / "docs" / "cli.md").read_text()


def test_every_command_the_cli_page_shows_is_one_the_parser_accepts():
    from interp.cli import build_parser

    parser = build_parser()
    block = re.search(r"```bash\n(.*?)```", (ROOT / "docs" / "cli.md").read_text(), re.S).group(1)
    commands = [shlex.split(line) for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) >= 5
    for args in commands:
        args = args[args.index("interp.cli") + 1:] if "interp.cli" in args else args[1:]
        parser.parse_args(args)  # SystemExit on a line the parser refuses


def test_mkdocs_config_builds_offline_and_strict():
    """Strict mode, no plugin that fetches (no web fonts, no privacy/social plugins, no remote inventories), the
    generator hook, and every page of docs/ (results data aside) in the nav."""
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^strict: true$", config, re.M) and re.search(r"^  font: false$", config, re.M)
    assert "tools/docs_site.py" in config
    assert not re.search(r"privacy|social|inventories|https?://", config)
    nav = set(re.findall(r"([\w/-]+\.md)", config[config.index("\nnav:"):]))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")
             if "results" not in p.relative_to(ROOT / "docs").parts}
    assert pages | {"api.md"} == nav, (pages ^ nav)


@pytest.mark.parametrize("target", ["demo", "setup"])
def test_make_demo_needs_no_root(target):
    """`make -n demo` (and setup) on this machine show no apt-get for the browser: only `make test` installs it."""
    makefile = (ROOT / "Makefile").read_text()
    setup = re.search(r"^setup:(.*)$", makefile, re.M).group(1)
    assert "CHROMIUM" not in setup and "browser" not in setup
    test = re.search(r"^test:(.*)$", makefile, re.M).group(1)
    assert "browser" in test.split() and "docs" in test.split()
    assert "chromium" not in re.search(rf"^{target}:.*?(?=^\S)", makefile, re.M | re.S).group(0)
