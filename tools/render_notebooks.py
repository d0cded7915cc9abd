"""Execute the tutorials and render them, with their outputs, as Markdown under docs/notebooks/.

    python tools/render_notebooks.py            # every notebook (make notebooks-docs)
    python tools/render_notebooks.py 01 03      # those whose name starts so

Each ``notebooks/NN_name.ipynb`` is run top to bottom in a fresh kernel (working directory
``notebooks/``, as in JupyterLab and under nbmake) and written as ``docs/notebooks/NN_name.md``
with its figures in ``docs/notebooks/NN_name_files/``. The notebooks themselves stay stored without
outputs. What Markdown cannot show is said instead of dropped silently: a plotly figure becomes
a line naming it (open the notebook, or report.html, for the hover), a progress bar's widget
becomes nothing (its text form is kept where tqdm printed one). ``tests/test_notebook_docs.py``
checks, without running anything, that each rendered file holds exactly its notebook's code cells:
a notebook changed without rerunning this script fails that test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbconvert import MarkdownExporter

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS, DOCS = ROOT / "notebooks", ROOT / "docs" / "notebooks"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def _readable_outputs(nb: nbformat.NotebookNode) -> None:
    """Plotly figures -> a line saying so; widget views (progress bars) dropped; the rest as executed."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if PLOTLY in data:
                title = (data[PLOTLY].get("layout", {}).get("title") or {}).get("text", "")
                text = f"[interactive plotly figure{': ' + title if title else ''} (hover in the notebook)]"
                out = nbformat.v4.new_output("display_data", data={"text/plain": text})
            elif WIDGET in data:
                continue
            kept.append(out)
        cell.outputs = kept


def render(path: Path, timeout: int) -> float:
    """Run one notebook and write its Markdown; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.time()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}},
                   allow_errors=False).execute()
    seconds = time.time() - t0
    _readable_outputs(nb)
    files = f"{path.stem}_files"
    body, resources = MarkdownExporter().from_notebook_node(nb, resources={"output_files_dir": files})
    DOCS.mkdir(parents=True, exist_ok=True)
    for old in (DOCS / files).glob("*") if (DOCS / files).exists() else []:
        old.unlink()
    for name, data in resources.get("outputs", {}).items():
        (DOCS / name).parent.mkdir(parents=True, exist_ok=True)
        (DOCS / name).write_bytes(data)
    header = (f"<!-- rendered from notebooks/{path.name} by tools/render_notebooks.py "
              f"(executed in {seconds:.0f} s); edit the notebook, not this file -->\n\n")
    (DOCS / f"{path.stem}.md").write_text(header + body)
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("only", nargs="*", help="notebook name prefixes (default: all)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per cell (default: %(default)s)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    paths = sorted(q for q in NOTEBOOKS.glob("*.ipynb") if not args.only or q.name.startswith(tuple(args.only)))
    for path in paths:
        print(f"{path.name}: {render(path, args.timeout):.0f} s -> docs/notebooks/{path.stem}.md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
