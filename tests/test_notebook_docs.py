"""The rendered tutorials (docs/notebooks/*.md, `make notebooks-docs`) cannot drift from the notebooks.

Cheap: nothing is executed. Each notebook must have its rendered Markdown, whose code blocks are
exactly the notebook's code cells, in order (a notebook edited without rerunning
tools/render_notebooks.py fails here), with the outputs a reader came for (text or figures)
and every figure it links present beside it; no code cell shows one figure twice (a cell whose value is a
matplotlib Figure that the inline backend also draws shows it twice, byte for byte).
"""

import hashlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DOCS = ROOT / "docs" / "notebooks"
IMAGE = r"!\[[^\]]*\]\(([^)]+\.(?:png|jpg|svg))\)"
FIX = "rerun `make notebooks-docs` (or python tools/render_notebooks.py NN) and commit docs/notebooks"


def _code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return [s for c in cells if c["cell_type"] == "code" and (s := "".join(c["source"]).strip())]


def _code_blocks(markdown: str) -> list[str]:
    return [s for b in re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.S | re.M) if (s := b.strip())]


def test_every_notebook_is_rendered():
    assert NOTEBOOKS
    missing = [p.name for p in NOTEBOOKS if not (DOCS / f"{p.stem}.md").exists()]
    assert not missing, f"not rendered: {missing}; {FIX}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_rendered_notebook_has_the_notebooks_code_and_its_outputs(notebook):
    rendered = DOCS / f"{notebook.stem}.md"
    if not rendered.exists():
        pytest.fail(f"{rendered.relative_to(ROOT)} is missing; {FIX}")
    text = rendered.read_text()
    assert _code_blocks(text) == _code_cells(notebook), f"{notebook.name} changed since it was rendered; {FIX}"
    images = re.findall(IMAGE, text)
    outputs = re.findall(r"^    \S", text, flags=re.M)  # nbconvert indents text outputs by four spaces
    assert images or outputs, f"{rendered.name} shows no output: was it executed?"
    absent = [i for i in images if not (DOCS / i).exists()]
    assert not absent, f"{rendered.name} links figures that are not there: {absent}; {FIX}"


def test_a_changed_cell_is_caught():
    """The check itself: one edited code cell, or one more, makes the rendered blocks differ."""
    notebook = NOTEBOOKS[0]
    cells = _code_cells(notebook)
    blocks = _code_blocks("".join(f"```python\n{c}\n```\n\n    output\n\n" for c in cells))
    assert blocks == cells
    assert blocks != cells[:-1] + [cells[-1] + "  # edited"] and blocks != cells + ["print(1)"]


def _repeated_figures(markdown: str, folder: Path) -> list[tuple[int, list[str]]]:
    """(code cell number from 1, the images it shows that repeat an earlier image of the same cell byte for byte)
    for every code cell of a rendered notebook that shows a figure twice."""
    outputs = re.split(r"^```python\n.*?^```$", markdown, flags=re.S | re.M)[1:]  # after each code block
    repeated = []
    for cell, output in enumerate(outputs, 1):
        seen: set[str] = set()
        again = []
        for name in re.findall(IMAGE, output):
            digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
            if digest in seen:
                again.append(name)
            seen.add(digest)
        if again:
            repeated.append((cell, again))
    return repeated


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_figure_is_shown_once(notebook):
    rendered = DOCS / f"{notebook.stem}.md"
    repeated = _repeated_figures(rendered.read_text(), DOCS)
    assert not repeated, (f"{rendered.name}: code cells show a figure twice {repeated}: a cell's value that is a "
                          "Figure is shown, and the inline backend draws it again; end the line with ';' or "
                          "plt.close it first; " + FIX)


def test_a_figure_shown_twice_is_caught(tmp_path):
    """The check itself: the same bytes twice in one cell's output are caught; the same figure in two cells, and
    two different figures in one, are not."""
    (tmp_path / "a.png").write_bytes(b"figure a")
    (tmp_path / "a_again.png").write_bytes(b"figure a")
    (tmp_path / "b.png").write_bytes(b"figure b")
    cell = "```python\nplots.figure()\n```\n\n"
    twice = cell + "![png](a.png)\n\n![png](a_again.png)\n\n" + cell + "![png](b.png)\n"
    assert _repeated_figures(twice, tmp_path) == [(1, ["a_again.png"])]
    once = cell + "![png](a.png)\n\n![png](b.png)\n\n" + cell + "![png](a_again.png)\n"
    assert _repeated_figures(once, tmp_path) == []
