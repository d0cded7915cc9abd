"""report.html in a real browser (Debian's chromium, driven by playwright: `make setup` installs playwright, `make test`
the browser where it is missing and the user is root; without one the test skips, saying what to install, except
under CI=true, where it must run): it loads
with every request but file:// ones refused, logs no console error, a heatmap's hover gives the value of its
table's row, and a sortable table's column sorts. The report is a tiny random ViT's, on three cheap steps."""

import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

import interp
from interp.models import tiny_hf_model
from interp.report.pipeline import make_context, run_steps
from interp.report.html import write_report

CHROMIUM = Path("/usr/bin/chromium")
INSTALL = "apt-get install chromium (Debian's; `make test` as root installs it)"


def find_chromium() -> Path | None:
    """Debian's chromium, else one on PATH; None when there is none."""
    if CHROMIUM.exists():
        return CHROMIUM
    return next((Path(p) for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


def missing(what: str) -> None:
    """No browser here: skip with one line saying what to install, or fail under CI, where this test must run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: the browser test must run, but {what}")
    pytest.skip(what)


def test_without_a_browser_the_test_skips_saying_what_to_install_but_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        missing(f"no chromium found to open report.html in: {INSTALL}")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: the browser test must run, but no chromium"):
        missing(f"no chromium found to open report.html in: {INSTALL}")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser")
    ctx = make_context(interp.load_model(tiny_hf_model("vit"), device="cpu"), "digits", quick=True, out=out)
    sections = run_steps(ctx, ["inventory", "recording", "origin"], log=lambda _: None)
    return write_report(sections, dict(model="tiny-vit", dataset="digits"), out)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright import sync_api
    except ImportError:
        missing("playwright is missing: pip install -e '.[test]' (`make setup` does)")
    executable = find_chromium()
    if executable is None:
        missing(f"no chromium found to open report.html in: {INSTALL}")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(executable))
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page(browser, report):
    """The report opened once, offline: every request that is not file:// (or an inline data: URL) is aborted and
    noted in ``page.refused``; console errors and uncaught exceptions in ``page.errors``."""
    context = browser.new_context(viewport=dict(width=1400, height=900))
    page = context.new_page()
    page.refused, page.errors = [], []

    def offline(route):
        url = route.request.url
        if url.startswith(("file:", "data:")):
            route.continue_()
        else:
            page.refused.append(url)
            route.abort()

    page.route("**/*", offline)
    page.on("console", lambda m: page.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda exc: page.errors.append(f"uncaught: {exc}"))
    page.goto(report.as_uri(), wait_until="load")
    page.wait_for_function("document.querySelectorAll('.interp-plot .main-svg').length > 0")
    yield page
    context.close()


def _payloads(report: Path) -> list[dict]:
    """Each heatmap's figure JSON (as embedded), with the id of the element it is drawn in (``target``)."""
    return [dict(json.loads(m[1].replace("<\\/", "</")), target=m[0]) for m in re.findall(
        r'<script type="application/json" class="interp-heatmap" data-target="([^"]+)">(.*?)</script>',
        report.read_text(), flags=re.S)]


def test_the_report_loads_offline_and_draws_every_heatmap_without_errors(page, report):
    assert page.refused == []  # nothing but the file itself (and its inline data: images) was asked for
    drawn = page.evaluate("Array.from(document.querySelectorAll('.interp-plot')).map("
                          "d => d.querySelectorAll('g.hm image, g.heatmaplayer image').length)")
    assert len(drawn) == len(_payloads(report)) >= 2 and all(n >= 1 for n in drawn), drawn
    images = page.evaluate("Array.from(document.images).map(i => [i.dataset.name, i.complete && i.naturalWidth])")
    assert images and all(width > 0 for _, width in images), images  # the inline PNGs decode
    assert page.errors == []


def test_hovering_a_cell_shows_the_value_of_its_table_row(page, report):
    """The mouse over the cell of the largest shift ratio (first panel) shows that row's layer, head and value."""
    payload = _payloads(report)[0]
    table = pd.read_csv(report.parent / f"{payload['table']}.csv")
    facet = payload["figure"]["data"][0]["name"]
    rows = table[table[payload["facet"]] == facet]
    target = rows.loc[rows[payload["value"]].idxmax()]
    layers, heads = sorted(rows.layer.unique()), sorted(rows["head"].unique())
    # the first panel's plotting area: rows are layers top down (reversed axis), columns heads
    plot = f"#{payload['target']}"
    box = page.locator(f"{plot} .nsewdrag").first.bounding_box()
    x = box["x"] + (heads.index(target["head"]) + 0.5) * box["width"] / len(heads)
    y = box["y"] + (layers.index(target.layer) + 0.5) * box["height"] / len(layers)
    page.mouse.move(x, y)
    page.wait_for_selector(f"{plot} .hoverlayer .hovertext")
    shown = page.locator(f"{plot} .hoverlayer .hovertext").first.text_content()
    found = re.search(r"layer (\d+), head (\d+).*?" + payload["value"] + r" = ([-+0-9.e]+)", shown)
    assert found, shown
    assert (int(found[1]), int(found[2])) == (target.layer, target["head"])
    assert float(found[3]) == pytest.approx(target[payload["value"]], rel=5e-4)  # drawn to 4 significant digits
    assert page.errors == []


def test_clicking_a_column_header_sorts_the_table(page, report):
    table = page.locator("table.interp-sortable").first
    headers = table.locator("th").all_text_contents()
    column = headers.index("bias_norm")

    def values():
        return [float(v) for v in table.locator(f"tbody tr td:nth-child({column + 1})").evaluate_all(
            "cells => cells.map(c => c.dataset.value)")]

    before = values()
    origin = pd.read_csv(report.parent / "origin_shift.csv")
    shown = origin.assign(a=origin.shift_ratio.abs()).nlargest(len(before), "a").bias_norm
    assert before == pytest.approx(shown.tolist())  # the rows of the table, largest |shift_ratio| first
    assert before != sorted(before)  # (else the click below proves nothing)
    table.locator("th", has_text="bias_norm").click()
    assert values() == sorted(before)
    table.locator("th", has_text="bias_norm").click()
    assert values() == sorted(before, reverse=True)
    assert page.errors == []


def test_the_figure_links_point_at_the_pngs_beside_the_report(page, report):
    links = page.eval_on_selector_all("p.interp-files a", "as => as.map(a => a.getAttribute('href'))")
    pngs = sorted(p.name for p in report.parent.glob("*.png"))
    assert sorted(h for h in links if h.endswith(".png")) == pngs and pngs
    assert all((report.parent / h).exists() for h in links)
