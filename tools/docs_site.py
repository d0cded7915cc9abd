"""The documentation site's generated parts: the API reference from ``interp.__all__``, the CLI reference from the
command line's parser, both made at build time so that they follow the code.

mkdocs runs this file as a hook (``mkdocs.yml``: ``hooks``): ``on_files`` adds ``api.md``, one section per name in
``interp.__all__``, each pointing mkdocstrings at the module that defines the name (read from the object that
``interp._PUBLIC``'s lazy import returns), so the page follows the package when modules move. A public name
without a docstring of its own fails the build, as does a broken reference (``mkdocs build --strict``).
``on_page_markdown`` replaces the ``CLI_MARKER`` line of ``cli.md`` with one section per command of
``interp.cli.build_parser()``: its help and a table of its options. ``python tools/docs_site.py [api|cli]`` prints
a page.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI_MARKER = "<!-- generated: the commands and their options (tools/docs_site.py) -->"
INTRO = """# API reference

Every public name of `interp` (its `__all__`), with its docstring. Import each from the top, `interp.NAME`:
names are imported on first use, so `import interp` stays cheap. Analyzers return tidy long-form
`pandas.DataFrame`s (one row per layer, head, kind, ...); bad input raises one `interp.errors.InputError` naming
the problem and its fix. This page is generated from `interp.__all__` when the site is built.
"""


def _interp():
    """The checkout's interp (not an installed copy), imported lazily as users import it."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import interp

    return interp


def own_docstring(obj) -> str:
    """The object's own docstring: a class's inherited or dataclass-generated ``Name(field, ...)`` text is not one."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return ""
    if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("):
        return ""
    return inspect.cleandoc(doc)


def identifiers() -> dict[str, str]:
    """``interp.__all__``'s names -> the dotted path mkdocstrings reads (where each is defined or re-exported)."""
    interp = _interp()
    out = {}
    for name in interp.__all__:
        if name == "__version__":
            continue
        if inspect.ismodule(getattr(interp, name)):  # a submodule (errors, plots): documented where it lives
            out[name] = getattr(interp, name).__name__
        elif name == "InterpError":
            out[name] = "interp.errors.InterpError"
        else:  # where it is defined (interp._PUBLIC may name a package that re-exports it lazily)
            obj = getattr(interp, name)
            out[name] = f"{getattr(obj, '__module__', None) or interp._PUBLIC[name]}.{name}"
    return out


def missing_docstrings() -> list[str]:
    """The public names with no docstring of their own (the build fails on any)."""
    interp = _interp()
    return [name for name in interp.__all__ if name != "__version__" and not own_docstring(getattr(interp, name))]


def api_page() -> str:
    """The markdown of the API page: an index of every name, then one mkdocstrings block per name."""
    interp = _interp()
    paths = identifiers()
    modules = {n for n in paths if inspect.ismodule(getattr(interp, n))}
    names = sorted(paths, key=lambda n: (n not in modules, n.lower()))
    lines = [INTRO, f"`interp.__version__` is the library's version (`{interp.__version__}` when this page was built).",
             ""]
    for name in names:
        summary = " ".join(own_docstring(getattr(interp, name)).split("\n\n")[0].split())
        lines.append(f"- [`interp.{name}`][{paths[name]}]: {summary}")
    explained = set()
    for name in names:
        # null: the public members (mkdocs.yml filters them), documented ones; true: every member, private ones too
        members = "null" if name in modules or inspect.isclass(getattr(interp, name)) else "false"
        lines += ["", f"::: {paths[name]}", "    options:", f'      heading: "interp.{name}"',
                  f'      toc_label: "interp.{name}"', f"      members: {members}"]
        module = paths[name].rsplit(".", 1)[0]
        doc = own_docstring(getattr(interp, name))
        if name not in modules and ("module doc" in doc or "module's doc" in doc) and module not in explained:
            explained.add(module)  # the docstring defers to its module's: shown once, after the first that does
            lines += ["", f"::: {module}", "    options:", f'      heading: "The module doc it refers to: {module}"',
                      "      heading_level: 4", "      show_root_toc_entry: false", "      members: false"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def commands() -> dict[str, argparse.ArgumentParser]:
    """The CLI's subcommands, in the parser's order."""
    _interp()
    from interp.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def cli_reference() -> str:
    """Markdown: per command, its one-line help, its usage and a table of its options (help, choices, default)."""
    _interp()
    from interp.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    out = []
    for name, parser in commands().items():
        out += [f"### `interp {name}`", "", _cell(helps.get(name, "")), ""]
        rows = []
        for action in parser._actions:
            hidden = action.help == argparse.SUPPRESS or action.dest == "debug"  # --debug: said once on the page
            if isinstance(action, argparse._HelpAction) or not action.option_strings or hidden:
                continue
            flags = ", ".join(f"`{s}`" for s in action.option_strings)
            text = (action.help or "") % {"default": action.default, "prog": f"interp {name}"}
            if action.required:
                text += " (required)"
            if action.choices and "{" not in text and "one of" not in text:
                text += f" (one of: {', '.join(map(str, action.choices))})"
            rows.append(f"| {flags} | {_cell(text)} |")
        out += ["| option | what it does |", "| --- | --- |", *rows, ""] if rows else ["No options but `--debug`.", ""]
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    """mkdocs hook: the CLI page's marker becomes the generated command reference."""
    if page.file.src_uri == "cli.md":
        from mkdocs.exceptions import PluginError

        if CLI_MARKER not in markdown:
            raise PluginError(f"docs/cli.md lost its marker line {CLI_MARKER!r}")
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


def on_files(files, config):
    """mkdocs hook: add the generated api.md; a public name without a docstring fails the build."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    missing = missing_docstrings()
    if missing:
        raise PluginError(f"public names without a docstring: {', '.join(missing)}; document them in their modules")
    files.append(File.generated(config, "api.md", content=api_page()))
    return files


if __name__ == "__main__":
    print(cli_reference() if sys.argv[1:] == ["cli"] else api_page(), end="")
