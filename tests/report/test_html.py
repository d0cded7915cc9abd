"""``interp.report.html``: a folder's manifest lists exactly what its own command wrote."""

import json

from interp.io import atomic_path
from interp.report.html import begin_outputs, write_manifest


def _write(path, text):
    """A file written as commands write theirs (``atomic_path``: recorded as it lands)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def test_a_manifest_lists_only_files_its_own_command_wrote(tmp_path):
    begin_outputs(tmp_path)  # command 1 (another model, say)
    _write(tmp_path / "origin_shift.csv", "a\n1\n")
    write_manifest(tmp_path, dict(command="origin", model="a"))
    begin_outputs(tmp_path)  # command 2 into the same folder
    _write(tmp_path / "ablation.csv", "b\n2\n")
    _write(tmp_path / "sub" / "figure.png", "png")
    manifest = json.loads(write_manifest(tmp_path, dict(command="ablate", model="b")).read_text())
    assert sorted(manifest["files"]) == ["ablation.csv", "sub/figure.png"]
    assert manifest["meta"]["model"] == "b"


def test_beginning_twice_in_one_command_keeps_the_first_start(tmp_path):
    begin_outputs(tmp_path)
    _write(tmp_path / "first.csv", "x\n")
    begin_outputs(tmp_path)  # the demo begins its folder twice
    _write(tmp_path / "second.csv", "y\n")
    manifest = json.loads(write_manifest(tmp_path, dict(command="demo")).read_text())
    assert sorted(manifest["files"]) == ["first.csv", "second.csv"]


def test_a_folder_keeps_every_commands_entry_and_a_rerun_replaces_only_its_own(tmp_path):
    """--out into a folder another command wrote replaced its manifest: the earlier results were then described by
    the later command's data. Each command keeps its entry (data, files, hashes); a rerun replaces its own."""
    from interp.io import sha256_file

    begin_outputs(tmp_path, "record")
    _write(tmp_path / "qkv_stats.csv", "a\n1\n")
    write_manifest(tmp_path, dict(command="record", data="photos"))
    begin_outputs(tmp_path, "sinks")
    _write(tmp_path / "sink_profile.csv", "b\n2\n")
    write_manifest(tmp_path, dict(command="sinks", data="digits"))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    entries = {e["command"]: e for e in manifest["commands"]}
    assert list(entries) == ["record", "sinks"]
    assert (entries["record"]["meta"]["data"], list(entries["record"]["files"])) == ("photos", ["qkv_stats.csv"])
    assert (entries["sinks"]["meta"]["data"], list(entries["sinks"]["files"])) == ("digits", ["sink_profile.csv"])
    assert entries["record"]["files"]["qkv_stats.csv"] == sha256_file(tmp_path / "qkv_stats.csv")
    assert manifest["meta"] == entries["sinks"]["meta"]  # the top level: the latest command, as before
    begin_outputs(tmp_path, "record")  # a rerun: its old entry goes at once, the other command's stays
    assert [e["command"] for e in json.loads((tmp_path / "manifest.json").read_text())["commands"]] == ["sinks"]
    _write(tmp_path / "qkv_stats.csv", "a\n3\n")
    write_manifest(tmp_path, dict(command="record", data="mnist"))
    entries = {e["command"]: e for e in json.loads((tmp_path / "manifest.json").read_text())["commands"]}
    assert entries["record"]["meta"]["data"] == "mnist" and entries["sinks"]["meta"]["data"] == "digits"


def test_a_command_never_replaces_another_commands_file(tmp_path):
    """A second command whose tables share a name with the first's is refused before it writes anything."""
    import pandas as pd
    import pytest

    from interp.io import OutputError
    from interp.report.html import write_section
    from interp.report.sections import Section

    begin_outputs(tmp_path, "record")
    write_section(Section("recording", "R", "", tables={"qkv_stats": pd.DataFrame({"x": [1]})}), tmp_path)
    write_manifest(tmp_path, dict(command="record"))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    begin_outputs(tmp_path, "origin")
    other = Section("origin", "O", "", tables={"origin_shift": pd.DataFrame({"y": [2]}),
                                               "qkv_stats": pd.DataFrame({"x": [9]})})
    with pytest.raises(OutputError, match=r"qkv_stats.csv holds the results of 'interp record'.*another --out"):
        write_section(other, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written, nothing lost
    begin_outputs(tmp_path, "record")  # the same command again: overwrites, as a rerun does
    write_section(Section("recording", "R", "", tables={"qkv_stats": pd.DataFrame({"x": [5]})}), tmp_path)
    assert pd.read_csv(tmp_path / "qkv_stats.csv").x.tolist() == [5]


def test_sections_written_and_released_keep_their_pngs_and_let_their_figures_go(tmp_path):
    """``write_and_release`` (the demo, after each step): the section's files are written, its figures become the
    paths of their PNGs and the Figure objects are freed; the report written afterwards embeds those same PNGs,
    and a report into another folder copies them there."""
    import base64
    import gc
    import weakref

    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    from interp.report.html import write_and_release, write_report
    from interp.report.sections import Section

    fig, ax = plt.subplots()
    ax.imshow(np.arange(64.0).reshape(8, 8))
    ax.set(title="t", xlabel="x", ylabel="y")
    alive = weakref.ref(fig)
    section = Section("origin", "O", "", tables={"origin_shift": pd.DataFrame({"y": [2]})},
                      figures={"shift_ratio": fig}, shown=["shift_ratio"])
    del fig, ax
    begin_outputs(tmp_path, "demo")
    write_and_release([section], tmp_path)
    gc.collect()
    assert alive() is None  # nothing holds the drawn figure any more
    png = tmp_path / "shift_ratio.png"
    assert section.figures == {"shift_ratio": png} and png.read_bytes()[:4] == b"\x89PNG"
    drawn = png.read_bytes()
    report = write_report([section], dict(command="demo", model="m", dataset="d"), tmp_path).read_text()
    assert png.read_bytes() == drawn and base64.b64encode(drawn).decode() in report
    elsewhere = tmp_path / "copy"
    write_report([section], dict(command="demo", model="m", dataset="d"), elsewhere)
    assert (elsewhere / "shift_ratio.png").read_bytes() == drawn
