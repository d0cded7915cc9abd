"""Writing sections out: tables (CSV + Parquet), figures (PNG), statistics, ``report.html``
and ``summary.json``. The renderer only formats what the steps computed.

``report.html`` opens with the headline findings (the same numbers as ``summary.json``, each
with its sample size), then one part per section, each thing once: its text, interactive layer x
head heatmaps (hover for values) and sortable tables (``interp.figures.interactive``; plotly.js embedded,
so it opens offline), the PNG figures no heatmap already shows (embedded), and links to every PNG
and CSV of the section (the files beside ``report.html``, for papers).
"""

from __future__ import annotations

import base64
import gc
import html
import json
import shutil
from urllib.parse import quote
from pathlib import Path
from typing import Optional, Sequence

from interp.figures.interactive import heatmap_html, page_scripts, rows_of, sortable_table
from interp.io import (
    json_ready, atomic_path, begin_outputs, command_of, manifest_entries, refuse_overwriting,
    write_manifest, write_table,
)
from interp.report.sections import Section
from interp.figures.plots import save_figure


def _section_files(section: Section) -> list[str]:
    """The names of the files ``write_section`` writes for ``section``."""
    return ([f"{name}.{ext}" for name in section.tables for ext in ("csv", "parquet")]
            + [f"{name}.safetensors" for name in section.stats] + [f"{name}.png" for name in section.figures])


def write_section(section: Section, out: Path) -> dict[str, Path]:
    """Write a section's tables, figures and statistics into ``out``; return the figure paths. A file another
    command's manifest entry lists there is refused before anything is written (``refuse_overwriting``)."""
    refuse_overwriting(out, _section_files(section), command_of(out))
    for name, table in section.tables.items():
        write_table(table, out / name)
    for name, stats in section.stats.items():
        stats.save(out / f"{name}.safetensors")
    return {name: _written(fig, out / f"{name}.png") if isinstance(fig, Path) else save_figure(fig, out / f"{name}.png")
            for name, fig in section.figures.items()}


def _written(png: Path, path: Path) -> Path:
    """A figure written earlier (``write_and_release``) at ``path``: copied there if it was written elsewhere."""
    if png.resolve() != path.resolve():
        with atomic_path(path) as tmp:
            shutil.copyfile(png, tmp)
    return path


def write_and_release(sections: Sequence[Section], out: Path) -> None:
    """Write ``sections``' files now and keep only their figures' paths (``write_report`` later writes the
    tables again and the figures no more): a drawn figure holds its arrays, and once saved its renderer's pixels,
    until it is dropped (the single-input step's pattern grid on a ViT-S/14: about 40 MB)."""
    for section in sections:
        section.figures = write_section(section, out)
    gc.collect()  # figures are reference cycles: freed at a collection, which may otherwise come much later


def manifest_entry(out: Path, command: Optional[str] = None, file: Optional[str] = None) -> Optional[dict]:
    """The entry of ``out``'s manifest written by ``command`` and/or listing ``file`` (the latest such), or None."""
    found = [e for e in manifest_entries(out) if (command is None or e.get("command") == command)
             and (file is None or file in e.get("files", {}))]
    return found[-1] if found else None


def _headline_of(section: Section) -> str:
    """The section's headline led by the sample its numbers come from: "[n = 8 images] The largest ..."."""
    return f"[n = {section.sample}] {section.headline}" if section.sample else section.headline


def summary(sections: Sequence[Section], meta: dict) -> dict:
    """Every headline number (each with its sample size), by section, with what produced them; ``samples``: the
    data each section's numbers come from ("" for the weights alone)."""
    return json_ready(dict(meta=meta, headlines=[_headline_of(s) for s in sections if s.headline],
                            sections={s.key: s.numbers for s in sections},
                            samples={s.key: s.sample for s in sections},
                            seconds={s.key: s.seconds for s in sections}))


def _samples_line(sections: Sequence[Section]) -> str:
    """Which sections share which sample, e.g. "8 images: Shift ratio, Bias share; 4 images: Key prior"."""
    by_sample: dict[str, list[str]] = {}
    for s in sections:
        if s.sample:
            by_sample.setdefault(s.sample, []).append(s.title)
    return "; ".join(f"{sample}: {', '.join(titles)}" for sample, titles in by_sample.items())


_STYLE = ("body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;line-height:1.4}"
          "table.interp-sortable{border-collapse:collapse;margin:1em 0;font-size:90%}"
          "table.interp-sortable caption{text-align:left;font-weight:bold;padding:2px 0}"
          "table.interp-sortable th,table.interp-sortable td{border:1px solid #ccc;padding:2px 8px;text-align:right}"
          "table.interp-sortable th{background:#eee}"
          "figure{margin:1em 0}figure img{max-width:100%}"
          "p.interp-files{font-size:90%;color:#444}p.interp-files a{margin-right:.8em}")


def _figure(path: Path) -> str:
    """A PNG drawn inline (base64: the page needs no other file to show it)."""
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(path.stem)}" '
            f'class="interp-static" data-name="{html.escape(path.stem)}"></figure>')


def _links(names: Sequence[str]) -> str:
    return " ".join(f'<a href="{quote(n)}" download>{html.escape(n)}</a>' for n in names)


def _section_html(section: Section, index: int, figures: dict[str, Path], tables: dict) -> str:
    """One section, each thing once: its text, its interactive heatmaps (hover for values) and sortable tables,
    the figures no heatmap already shows, then every PNG and table of the section as a download (same folder)."""
    parts = [f'<h2 id="{html.escape(section.key)}">{html.escape(section.title)}</h2>\n'
             f"<p>{html.escape(section.text)}</p>"]
    if section.sample:
        parts.append(f'<p class="interp-sample"><small>Sample: {html.escape(section.sample)}.</small></p>')
    for j, spec in enumerate(section.heatmaps):
        if spec.table in tables and not rows_of(tables[spec.table], spec.query).empty:
            parts.append(heatmap_html(tables[spec.table], spec, f"heatmap-{index}-{j}"))
    for spec in section.top_tables:
        if spec.table in tables and not rows_of(tables[spec.table], spec.query).empty:
            parts.append(sortable_table(tables[spec.table], spec))
    parts += [_figure(figures[name]) for name in section.shown if name in figures]
    pngs = [figures[n].name for n in section.figures if n in figures]
    csvs = [f"{n}.csv" for n in section.tables]
    if pngs or csvs:
        parts.append('<p class="interp-files">'
                     + (f"Figures (PNG): {_links(pngs)}" if pngs else "")
                     + ("<br>" if pngs and csvs else "") + (f"Tables (CSV): {_links(csvs)}" if csvs else "") + "</p>")
    return "\n".join(parts)


def _render_report(sections: Sequence[Section], figures: dict[str, Path], meta: dict, out: Path) -> Path:
    """Write ``summary.json`` and ``report.html`` (headline findings first, each with its sample size, then the
    sections). Interactive heatmaps are the view of what they draw; the PNGs of the same are links beside them."""
    data = summary(sections, meta)
    with atomic_path(out / "summary.json") as tmp:
        tmp.write_text(json.dumps(data, indent=2))
    headlines = "".join(f"<li>{html.escape(h)}</li>" for h in data["headlines"])
    samples = _samples_line(sections)
    samples = (f"<p class=\"interp-samples\"><small>Samples (n), by section: {html.escape(samples)}.</small></p>"
               if samples else "")
    tables = {name: table for s in sections for name, table in s.tables.items()}
    body = "\n".join(_section_html(s, i, figures, tables) for i, s in enumerate(sections))
    produced = ", ".join(f"{k}: {v}" for k, v in meta.items())
    title = f"QKV bias report: {meta.get('model', '')} on {meta.get('dataset', '')}"
    report = out / "report.html"
    with atomic_path(report) as tmp:
        tmp.write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head>"
            f"<body><h1>{html.escape(title)}</h1>\n<h2>Headline findings</h2>\n<ul>{headlines}</ul>\n{samples}\n"
            f"{body}\n"
            f"<p><small>Produced by: {html.escape(produced)}. Numbers: summary.json.</small></p>\n"
            f"{page_scripts()}</body></html>"
        )
    return report


def write_report(sections: Sequence[Section], meta: dict, out: Path) -> Path:
    """Write every section's files, then ``summary.json`` and ``report.html`` (none if a file of another
    command's would be replaced: see ``write_section``)."""
    begin_outputs(out, meta.get("command"))
    refuse_overwriting(out, [n for s in sections for n in _section_files(s)] + ["summary.json", "report.html"],
                       command_of(out))
    figures: dict[str, Path] = {}
    for section in sections:
        figures.update(write_section(section, out))
    report = _render_report(sections, figures, meta, out)
    write_manifest(out, meta)
    return report
