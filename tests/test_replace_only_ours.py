"""We only replace what we wrote: a sweep log or a manifest that interp did not write (or a complete line that is
not JSON) is refused with a message naming the file, and the file is kept byte for byte; a torn last line is only
what a crash of ours leaves, a last line without its newline."""

import json

import pytest

import interp
from interp.errors import InputError, InterpError, StaleResultsError
from interp.models import tiny_hf_model, tiny_inputs

RUN = dict(kinds=("q",), layers=[0], heads=[0], estimate="exact", n_control=0, n_boot=0, progress=False)


@pytest.fixture(scope="module")
def gpt2():
    return interp.load_model(tiny_hf_model("gpt2", n_layers=2), device="cpu")


def data():
    return [tiny_inputs("gpt2", batch=2, pos=8)]


def test_overwrite_no_keeps_the_log_of_another_seed(gpt2, tmp_path):
    interp.ablate_bias(gpt2, data(), out=tmp_path, seed=0, **RUN)
    before = (tmp_path / "ablation.jsonl").read_bytes()
    with pytest.raises(InputError, match="overwrite must be True or False"):
        interp.ablate_bias(gpt2, data(), out=tmp_path, seed=5, overwrite="no", **RUN)
    assert (tmp_path / "ablation.jsonl").read_bytes() == before
    with pytest.raises(StaleResultsError, match="seed: 0 there, 5 now"):  # and without it: refused, as before
        interp.ablate_bias(gpt2, data(), out=tmp_path, seed=5, **RUN)
    assert (tmp_path / "ablation.jsonl").read_bytes() == before


def test_a_complete_line_that_is_not_json_is_refused_and_kept(gpt2, tmp_path):
    interp.ablate_bias(gpt2, data(), out=tmp_path, **RUN)
    log = tmp_path / "ablation.jsonl"
    damaged = log.read_text() + "this line is complete but not JSON\n"
    log.write_text(damaged)
    with pytest.raises(StaleResultsError, match=r"ablation.jsonl, line 3: unreadable.*complete"):
        interp.ablate_bias(gpt2, data(), out=tmp_path, **RUN)
    assert log.read_text() == damaged


def test_a_torn_last_line_without_its_newline_is_dropped_and_the_rest_resumed(gpt2, tmp_path):
    first = interp.ablate_bias(gpt2, data(), out=tmp_path, **RUN)
    log = tmp_path / "ablation.jsonl"
    whole = log.read_text()
    log.write_text(whole + '{"_key": "torn', encoding="utf-8")
    again = interp.ablate_bias(gpt2, data(), out=tmp_path, **RUN)
    assert log.read_text() == whole and again.delta.tolist() == first.delta.tolist()


@pytest.mark.parametrize("content", ['{"_key": "x", "delta": 0.5}\n', "col_a,col_b\n1,2\n", "", '{"_fingerprint": 3}\n'])
def test_a_log_we_did_not_write_is_refused_even_with_overwrite(gpt2, tmp_path, content):
    log = tmp_path / "ablation.jsonl"
    log.write_text(content)
    for overwrite in (False, True):
        with pytest.raises(StaleResultsError, match="without a fingerprint of interp.*even with overwrite=True"):
            interp.ablate_bias(gpt2, data(), out=tmp_path, overwrite=overwrite, **RUN)
        assert log.read_text() == content


def test_a_log_of_ours_from_another_run_is_replaced_with_overwrite(gpt2, tmp_path):
    interp.ablate_bias(gpt2, data(), out=tmp_path, seed=0, **RUN)
    interp.ablate_bias(gpt2, data(), out=tmp_path, seed=5, overwrite=True, **RUN)
    header = json.loads((tmp_path / "ablation.jsonl").read_text().splitlines()[0])["_fingerprint"]
    assert header["seed"] == 5


def test_a_folder_where_the_log_goes_is_one_input_error(gpt2, tmp_path):
    (tmp_path / "ablation.jsonl").mkdir()
    with pytest.raises(InputError, match=r"ablation.jsonl is a folder, where the sweep log goes"):
        interp.ablate_bias(gpt2, data(), out=tmp_path, **RUN)


@pytest.mark.parametrize("foreign", [{"name": "my experiment", "files": ["a.csv"]}, {}, {"meta": "x"},
                                     {"commands": "all of them"}, {"meta": {"command": "x"}, "extra": 1}])
def test_inventory_refuses_and_keeps_a_manifest_another_tool_wrote(tmp_path, capsys, foreign):
    from interp.cli import main

    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(foreign))
    assert main(["inventory", "--model", "no-such-model", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "manifest.json is not a manifest interp wrote" in err and "unknown model" not in err
    assert json.loads(manifest.read_text()) == foreign
    with pytest.raises(InterpError, match="not a manifest interp wrote"):
        interp.io.begin_outputs(tmp_path, "inventory")
    assert json.loads(manifest.read_text()) == foreign


def test_a_manifest_of_ours_is_still_accepted():
    from interp.io import is_our_manifest

    assert is_our_manifest({"meta": {"command": "record"}, "files": {}, "commands": [{"command": "record"}]})
    assert is_our_manifest({"meta": {"command": "report"}, "files": {}})  # one command's, the older format
