"""The pipeline's sections hold the numbers the report prints; summary.json equals the tables."""

import json

import pandas as pd
import pytest

import interp
from interp.report.pipeline import STEPS, make_context, run_steps, summarise_ablation
from interp.report.html import write_report


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    ctx = make_context(interp.load_model("digits-vit", device="cpu"), "digits", quick=True, out=out)
    sections = run_steps(ctx, log=lambda _: None)
    report = write_report(sections, dict(model="digits-vit", dataset="digits"), out)
    return out, sections, report


def test_every_step_made_sections_with_numbers(written):
    out, sections, report = written
    keys = [s.key for s in sections]
    assert len(keys) == len(set(keys))
    from interp.report.pipeline import OPT_IN_STEPS

    assert [s for s in STEPS if s not in OPT_IN_STEPS] == ["inventory", "recording", "origin", "scores", "invariances",
                                                           "frequency", "sinks", "ablation", "single_input"]
    assert OPT_IN_STEPS == {"specialisation"} <= set(STEPS)  # asked for by name (interp specialisation), not the demo
    assert all(s.numbers for s in sections)
    assert all(name in s.figures for s in sections for name in s.shown)


def test_summary_numbers_equal_the_tables(written):
    out, sections, report = written
    summary = json.loads((out / "summary.json").read_text())
    inv = pd.read_csv(out / "bias_invariances.csv")
    numbers = summary["sections"]["invariances"]
    assert numbers["k_bias_pattern_max_abs_diff"] == inv[inv.check == "k_bias_pattern"].max_abs_diff.max()
    assert numbers["max_k_bias_norm"] == pytest.approx(inv[inv.check == "k_bias_pattern"].bias_norm.max())
    origin = pd.read_csv(out / "origin_shift.csv")
    top = origin.loc[origin.shift_ratio.idxmax()]
    largest = summary["sections"]["origin_shift"]["largest_shift_ratio"]
    assert (largest["layer"], largest["head"], largest["kind"]) == (top.layer, top["head"], top.kind)
    abl = pd.read_csv(out / "ablation.csv")
    abl = abl[abl.estimate == "exact"]  # the one-pass estimate ranks; the headline numbers are exact
    best = abl.loc[abl.delta.abs().idxmax()]
    first = summary["sections"]["ablation"]["top_heads"][0]
    assert (first["layer"], first["head"], first["kind"]) == (best.layer, best["head"], best.kind)
    assert first["delta"] == pytest.approx(best.delta)
    assert summary["sections"]["recording"]["positions_counted"] == 4 * 17  # quick: one batch of 4 digits


def test_report_opens_with_the_headline_findings(written):
    out, sections, report = written
    html = report.read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert html.index("Headline findings") < html.index(">Bias inventory</h2>")
    for headline in summary["headlines"]:
        assert headline.replace("'", "&#x27;") in html
    assert html.count("<img") == sum(len(s.shown) for s in sections)


def test_ablation_section_refuses_nothing_and_names_its_metric(written):
    out, sections, report = written
    abl = pd.read_csv(out / "ablation.csv")
    section = summarise_ablation(abl, "digits-vit")
    assert section.numbers["metric"] == "cross_entropy" and section.numbers["baseline"] == abl.baseline.iloc[0]
    assert set(section.numbers["max_abs_delta"]) == {"q", "k", "v"}


def test_manifest_is_written_last_and_lists_every_file(written):
    from interp.io import sha256_file

    out, sections, report = written
    manifest = json.loads((out / "manifest.json").read_text())
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*")
               if p.is_file() and p.name != "manifest.json"}
    assert set(manifest["files"]) == on_disk and "report.html" in on_disk and "summary.json" in on_disk
    assert all(sha256_file(out / name) == digest for name, digest in manifest["files"].items())


def test_a_new_run_removes_the_old_manifest_first(tmp_path):
    from interp.report.html import begin_outputs

    (tmp_path / "manifest.json").write_text('{"meta": {"command": "report"}, "files": {}}')  # ours, one command
    begin_outputs(tmp_path, "report")
    assert not (tmp_path / "manifest.json").exists()


def test_report_is_self_contained_and_interactive(written):
    import re

    out, sections, report = written
    page = report.read_text()
    library = re.search(r'<script id="plotly-js">.*?</script>', page, flags=re.S)
    assert library and len(library.group(0)) > 1_000_000  # plotly.js itself, embedded
    text = page.replace(library.group(0), "")  # (its own map-tile and logo links are never loaded here)
    # nothing the page loads comes from the network: no remote src/href/url(), no <link>, no @import
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, flags=re.I)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", text, flags=re.I) and "<link" not in text
    assert "@import" not in text
    assert "Plotly.newPlot" in text and text.count('class="interp-sortable"') >= 2
    assert text.index("Headline findings") < text.index("interp-heatmap")


def test_each_interactive_heatmap_holds_the_data_of_its_table(written):
    """Each trace's cells against the table's CSV read with plain pandas (not through interp.figures.interactive): the
    one row at that layer, head (and facet value) that the heatmap's query picks; a size's rounding negatives
    (above -1e-6) are drawn as 0 (interp.figures.colours)."""
    import math
    import re

    out, sections, report = written
    payloads = [json.loads(m.replace("<\\/", "</")) for m in re.findall(
        r'<script type="application/json" class="interp-heatmap" data-target="[^"]+">(.*?)</script>',
        report.read_text(), flags=re.S)]
    expected = [h for s in sections for h in s.heatmaps]
    assert len(payloads) == len(expected) >= 6
    for payload in payloads:
        table = pd.read_csv(out / f"{payload['table']}.csv")
        rows = (table.query(payload["query"]) if payload["query"] else table).dropna(subset=["head"])
        facet, value = payload["facet"], payload["value"]
        traces = payload["figure"]["data"]
        assert [t["name"] for t in traces] == ([str(f) for f in dict.fromkeys(rows[facet])] if facet else [value])
        for trace in traces:
            part = rows[rows[facet].astype(str) == trace["name"]] if facet else rows
            assert trace["x"] == sorted(part["head"].astype(int).unique())
            assert trace["y"] == sorted(part.layer.astype(int).unique())
            for layer, row in zip(trace["y"], trace["z"]):
                for head, got in zip(trace["x"], row):
                    hit = part[(part.layer == layer) & (part["head"] == head)][value]
                    assert len(hit) <= 1
                    want = float(hit.iloc[0]) if len(hit) else math.nan
                    want = 0.0 if -1e-6 < want < 0 and value != "delta" and value != "share" else want
                    assert (got is None and math.isnan(want)) or got == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_every_figure_has_a_title_axis_labels_and_labelled_colour_bars(written):
    out, sections, report = written
    figures = {name: fig for s in sections for name, fig in s.figures.items()}
    assert len(figures) >= 9
    for name, fig in figures.items():
        titles = [fig._suptitle.get_text() if fig._suptitle else ""] + [ax.get_title() for ax in fig.axes]
        assert any(t.strip() for t in titles), f"{name} has no title"
        assert "digits-vit" in " ".join(titles), f"{name}'s title does not name the model"
        for ax in fig.axes:
            if ax.get_label() == "<colorbar>":
                assert (ax.get_ylabel() or ax.get_xlabel()).strip(), f"{name}: a colour bar without a label"
            elif ax.get_position().width > 0.05 and (ax.has_data() or ax.texts):  # colour strips are narrow
                assert ax.get_xlabel().strip() and ax.get_ylabel().strip(), f"{name}: an axis without labels"


def test_a_model_without_bias_says_so_instead_of_drawing_a_flat_field():
    from interp.figures.plots import origin_shift_figures

    model = interp.load_model("digits-vit-nobias", device="cpu")
    origin = interp.origin_shift(model, interp.record_qkv(model, "digits", max_batches=1, progress=False))
    fig = origin_shift_figures(origin, "digits-vit-nobias")["shift_ratio"]
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert notes == ["no b_q in this model", "no b_k in this model", "no b_v in this model"]
    assert not any(ax.get_label() == "<colorbar>" for ax in fig.axes)  # no -0.1..0.1 scale for a non-quantity


def test_a_failing_step_leaves_the_earlier_results_and_a_report_that_says_so(tmp_path, monkeypatch):
    import interp.report.pipeline as pipeline
    from interp.report.demo import run_demo
    from interp.errors import StepFailedError

    def broken(ctx):
        raise RuntimeError("planted failure in the frequency step")

    monkeypatch.setitem(pipeline.STEPS, "frequency", broken)
    with pytest.raises(StepFailedError, match="step 'frequency' failed.*planted failure"):
        run_demo(model="digits-vit", data="digits", out=tmp_path, quick=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["meta"]["failed_step"] == "frequency"
    names = [s for s in pipeline.STEPS if s not in pipeline.OPT_IN_STEPS]
    assert summary["sections"]["failed"]["not_run"] == names[names.index("frequency") + 1:]
    assert "inventory" in summary["sections"] and (tmp_path / "origin_shift.csv").exists()
    report = (tmp_path / "report.html").read_text()
    assert "Step &#x27;frequency&#x27; failed" in report or "Step 'frequency' failed" in report
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert "origin_shift.csv" in manifest["files"]


def test_the_report_says_each_thing_once_and_offers_every_png_as_a_download(written):
    """A figure an interactive heatmap already draws (same quantity, per head) is a link, not a second picture
    beside it; every PNG and CSV of the folder is linked once, by name, from its section."""
    import re

    out, sections, report = written
    page = report.read_text()
    inline = re.findall(r'<img [^>]*data-name="([^"]+)"', page)
    assert sorted(inline) == sorted(n for s in sections for n in s.shown) and len(inline) >= 8
    drawn_interactively = {"shift_ratio", "bias_share", "key_prior_share", "sink_mass_grid"} | {
        n for s in sections for n in s.figures if n.startswith("ablation_delta")}
    assert drawn_interactively <= {p.stem for p in out.glob("*.png")} and not drawn_interactively & set(inline)
    links = re.findall(r'<a href="([^"]+)" download>', page)
    assert sorted(h for h in links if h.endswith(".png")) == sorted(p.name for p in out.glob("*.png"))
    assert sorted(h for h in links if h.endswith(".csv")) == sorted(p.name for p in out.glob("*.csv"))


def test_each_headline_states_the_sample_its_numbers_come_from(written):
    """One sample for every step: quick mode reads one batch of 4 digits and every section that reads data reads
    exactly it (the count checked against the positions recorded, 17 per digit); one input reads 1 image."""
    out, sections, report = written
    summary = json.loads((out / "summary.json").read_text())
    info = interp.load_model("digits-vit", device="cpu").interp
    per_image = (info.image_size // info.patch_size) ** 2 + info.n_prefix_tokens
    images = summary["sections"]["recording"]["positions_counted"] // per_image
    assert images == 4
    headlines = dict(zip([s.key for s in sections if s.headline], summary["headlines"]))
    assert headlines["origin_shift"].startswith(f"[n = {images} images] The largest bias shift")
    for key in ("key_prior", "invariances", "head_families", "implicit_biases", "ablation"):
        assert headlines[key].startswith(f"[n = {images} images] "), headlines[key]
    samples = {k: v for k, v in summary["samples"].items() if k not in ("inventory", "single_input")}
    assert set(samples.values()) == {f"{images} images"}, samples  # one sample
    assert summary["samples"]["single_input"].startswith("1 image (") and summary["samples"]["inventory"] == ""
    page = report.read_text()
    assert all(h.replace("'", "&#x27;") in page for h in summary["headlines"])
    assert f"Samples (n), by section: {images} images: Recording, Shift ratio" in page


def test_lazy_data_gives_the_numbers_of_the_data_held_in_a_list():
    """``make_context`` reads its data lazily (``DataBatches``); the steps' numbers and tables equal those of a
    context holding the same batches in a list, as ``make_context`` held them before."""
    from interp.models import tiny_hf_model
    from interp.report.sections import Context, DataBatches

    model = interp.load_model(tiny_hf_model("vit", n_layers=2, n_heads=2), device="cpu")
    lazy = make_context(model, "digits", max_batches=2)
    held = Context(model, "digits", list(lazy.batches))
    assert isinstance(lazy.batches, DataBatches) and len(held.batches) == 2
    steps = ["recording", "invariances"]
    got, want = run_steps(lazy, steps, log=lambda _: None), run_steps(held, steps, log=lambda _: None)
    assert [s.key for s in got] == [s.key for s in want]
    for a, b in zip(got, want):
        assert a.numbers == b.numbers and a.text == b.text
        for name, table in b.tables.items():
            pd.testing.assert_frame_equal(a.tables[name], table)
    assert lazy.analysed == held.analysed
