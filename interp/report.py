"""Writing sections out: tables (CSV + Parquet), figures (PNG), statistics, ``report.html``
and ``summary.json``. The renderer only formats what the steps computed.

``report.html`` opens with the headline findings (the same numbers as ``summary.json``),
then one part per section: its text, interactive layer x head heatmaps (hover for values)
and sortable tables (``interp.interactive``; plotly.js embedded, so it opens offline), and
its PNG figures.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Optional, Sequence

from interp.interactive import heatmap_html, page_scripts, rows_of, sortable_table
from interp.io import (
    json_ready, atomic_path, begin_outputs, command_of, manifest_entries, refuse_overwriting,
    write_manifest, write_table,
)
from interp.sections import Section
from interp.plots import save_figure


def section_files(section: Section) -> list[str]:
    """The names of the files ``write_section`` writes for ``section``."""
    return ([f"{name}.{ext}" for name in section.tables for ext in ("csv", "parquet")]
            + [f"{name}.safetensors" for name in section.stats] + [f"{name}.png" for name in section.figures])


def write_section(section: Section, out: Path) -> dict[str, Path]:
    """Write a section's tables, figures and statistics into ``out``; return the figure paths. A file another
    command's manifest entry lists there is refused before anything is written (``refuse_overwriting``)."""
    refuse_overwriting(out, section_files(section), command_of(out))
    for name, table in section.tables.items():
        write_table(table, out / name)
    for name, stats in section.stats.items():
        stats.save(out / f"{name}.safetensors")
    return {name: save_figure(fig, out / f"{name}.png") for name, fig in section.figures.items()}


def manifest_entry(out: Path, command: Optional[str] = None, file: Optional[str] = None) -> Optional[dict]:
    """The entry of ``out``'s manifest written by ``command`` and/or listing ``file`` (the latest such), or None."""
    found = [e for e in manifest_entries(out) if (command is None or e.get("command") == command)
             and (file is None or file in e.get("files", {}))]
    return found[-1] if found else None


def summary(sections: Sequence[Section], meta: dict) -> dict:
    """Every headline number, by section, with what produced them."""
    return json_ready(dict(meta=meta, headlines=[s.headline for s in sections if s.headline],
                            sections={s.key: s.numbers for s in sections},
                            seconds={s.key: s.seconds for s in sections}))


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(path.stem)}" style="max-width:100%">'


_STYLE = ("body{font-family:sans-serif;max-width:1400px;margin:2em auto;line-height:1.4}"
          "table.interp-sortable{border-collapse:collapse;margin:1em 0;font-size:90%}"
          "table.interp-sortable th,table.interp-sortable td{border:1px solid #ccc;padding:2px 8px;text-align:right}"
          "table.interp-sortable th{background:#eee}")


def _section_html(section: Section, index: int, figures: dict[str, Path], tables: dict) -> str:
    """One section: its text, its interactive heatmaps and tables, then its PNG figures (for papers)."""
    parts = [f"<h2>{html.escape(section.title)}</h2>\n<p>{html.escape(section.text)}</p>"]
    for j, spec in enumerate(section.heatmaps):
        if spec.table in tables and not rows_of(tables[spec.table], spec.query).empty:
            parts.append(heatmap_html(tables[spec.table], spec, f"heatmap-{index}-{j}"))
    for spec in section.top_tables:
        if spec.table in tables and not rows_of(tables[spec.table], spec.query).empty:
            parts.append(sortable_table(tables[spec.table], spec))
    parts += [_img(figures[name]) for name in section.shown if name in figures]
    return "\n".join(parts)


def render_report(sections: Sequence[Section], figures: dict[str, Path], meta: dict, out: Path) -> Path:
    """Write ``summary.json`` and ``report.html`` (headline findings first, then the sections)."""
    data = summary(sections, meta)
    with atomic_path(out / "summary.json") as tmp:
        tmp.write_text(json.dumps(data, indent=2))
    headlines = "".join(f"<li>{html.escape(h)}</li>" for h in data["headlines"])
    tables = {name: table for s in sections for name, table in s.tables.items()}
    body = "\n".join(_section_html(s, i, figures, tables) for i, s in enumerate(sections))
    produced = ", ".join(f"{k}: {v}" for k, v in meta.items())
    title = f"QKV bias report: {meta.get('model', '')} on {meta.get('dataset', '')}"
    report = out / "report.html"
    with atomic_path(report) as tmp:
        tmp.write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head>"
            f"<body><h1>{html.escape(title)}</h1>\n<h2>Headline findings</h2>\n<ul>{headlines}</ul>\n{body}\n"
            f"<p><small>Produced by: {html.escape(produced)}. Numbers: summary.json.</small></p>\n"
            f"{page_scripts()}</body></html>"
        )
    return report


def write_report(sections: Sequence[Section], meta: dict, out: Path) -> Path:
    """Write every section's files, then ``summary.json`` and ``report.html`` (none if a file of another
    command's would be replaced: see ``write_section``)."""
    begin_outputs(out, meta.get("command"))
    refuse_overwriting(out, [n for s in sections for n in section_files(s)] + ["summary.json", "report.html"],
                       command_of(out))
    figures: dict[str, Path] = {}
    for section in sections:
        figures.update(write_section(section, out))
    report = render_report(sections, figures, meta, out)
    write_manifest(out, meta)
    return report
