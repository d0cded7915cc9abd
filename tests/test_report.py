"""``interp.report``: a folder's manifest lists exactly what its own command wrote."""

import json

from interp.report import begin_outputs, write_manifest


def test_a_manifest_lists_only_files_its_own_command_wrote(tmp_path):
    begin_outputs(tmp_path)  # command 1 (another model, say)
    (tmp_path / "origin_shift.csv").write_text("a\n1\n")
    write_manifest(tmp_path, dict(command="origin", model="a"))
    begin_outputs(tmp_path)  # command 2 into the same folder
    (tmp_path / "ablation.csv").write_text("b\n2\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "figure.png").write_bytes(b"png")
    manifest = json.loads(write_manifest(tmp_path, dict(command="ablate", model="b")).read_text())
    assert sorted(manifest["files"]) == ["ablation.csv", "sub/figure.png"]
    assert manifest["meta"]["model"] == "b"


def test_beginning_twice_in_one_command_keeps_the_first_start(tmp_path):
    begin_outputs(tmp_path)
    (tmp_path / "first.csv").write_text("x\n")
    begin_outputs(tmp_path)  # the demo begins its folder twice
    (tmp_path / "second.csv").write_text("y\n")
    manifest = json.loads(write_manifest(tmp_path, dict(command="demo")).read_text())
    assert sorted(manifest["files"]) == ["first.csv", "second.csv"]
