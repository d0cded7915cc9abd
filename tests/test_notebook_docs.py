"""The rendered tutorials (docs/notebooks/*.md, `make notebooks-docs`) cannot drift from the notebooks.

Cheap: nothing is executed. Each notebook must have its rendered Markdown, whose code blocks are
exactly the notebook's code cells, in order (a notebook edited without rerunning
benchmarks/render_notebooks.py fails here), with the outputs a reader came for (text or figures)
and every figure it links present beside it.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DOCS = ROOT / "docs" / "notebooks"
FIX = "rerun `make notebooks-docs` (or python benchmarks/render_notebooks.py NN) and commit docs/notebooks"


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
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.(?:png|jpg|svg))\)", text)
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
