"""Screenshots of report.html's main views, taken in Debian's chromium (playwright, offline), into
docs/results/report/: the headline findings, a heatmap with its hover, a table sorted by a click, and the
single-input overlay. Look at them after a change to the report.

    python tools/report_screenshots.py                       # digits-vit, quick demo steps (~1-3 min)
    python tools/report_screenshots.py --report out/demo/report.html
"""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "report"


def make_report(out: Path) -> Path:
    import interp
    from interp.report.pipeline import make_context, run_steps
    from interp.report.html import write_report

    shutil.rmtree(out, ignore_errors=True)  # a scratch folder: the report is made anew each time
    ctx = make_context(interp.load_model("digits-vit", device="cpu"), "digits", quick=True, out=out)
    sections = run_steps(ctx)
    return write_report(sections, dict(model="digits-vit", dataset="digits", quick=True), out)


def save_small(png: bytes, path: Path, width: int = 1100) -> None:
    """The screenshot scaled to ``width`` px and stored with a 128-colour palette (a few tens of kB)."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    if image.width > width:
        image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    image.quantize(128).save(path, optimize=True)
    print(f"{path.relative_to(ROOT)}: {image.width}x{image.height}, {path.stat().st_size / 1024:.0f} kB")


def shoot(report: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page(viewport=dict(width=1400, height=1000))
        refused: list[str] = []
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:"))
                   else (refused.append(r.request.url), r.abort()))
        page.goto(report.resolve().as_uri(), wait_until="load")
        page.wait_for_function("document.querySelectorAll('.interp-plot .main-svg').length > 0")
        def box(locator) -> dict:  # in page coordinates (bounding_box is relative to the viewport)
            b = locator.bounding_box()
            return dict(b, y=b["y"] + page.evaluate("window.scrollY"))

        def region(y0: float, y1: float) -> bytes:
            return page.screenshot(full_page=True, clip=dict(x=0, y=max(0, y0), width=1400, height=y1 - max(0, y0)))

        # 1. the headline findings and the samples line
        samples = box(page.locator("p.interp-samples"))
        save_small(region(0, samples["y"] + samples["height"] + 10), out / "headlines.png")
        # 2. the shift-ratio heatmap, hovering a cell
        plot = page.locator(".interp-plot").first
        plot.scroll_into_view_if_needed()
        drag = plot.locator(".nsewdrag").first.bounding_box()
        page.mouse.move(drag["x"] + drag["width"] * 0.6, drag["y"] + drag["height"] * 0.4)
        page.wait_for_selector(".hoverlayer .hovertext")
        save_small(plot.screenshot(), out / "heatmap_hover.png")
        page.mouse.move(0, 0)
        # 3. the ablation table, sorted by delta (one click: ascending)
        table = page.locator("table.interp-sortable", has_text="run exactly").first
        table.locator("th", has_text="delta").first.click()
        save_small(table.screenshot(), out / "table_sorted.png")
        # 4. the single-input section's overlay figure, captions under every panel
        overlay = page.locator("img[data-name='single_input_overlay']")
        if overlay.count():
            save_small(overlay.screenshot(), out / "single_input_overlay.png")
        # 5. a section end to end: title, text, sample, embedded figure, links
        head, end = box(page.locator("#attention_distance")), box(page.locator("#attention_distance ~ p.interp-files").first)
        save_small(region(head["y"] - 10, end["y"] + end["height"] + 10), out / "section.png")
        browser.close()
    if refused:
        raise SystemExit(f"the report asked for the network: {refused}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="an existing report.html (default: make digits-vit's, quick)")
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "report-screenshots")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    shoot(args.report or make_report(args.work), args.out)


if __name__ == "__main__":
    main()
