"""The `interp` command: the demo end to end (quick), and clear errors without tracebacks."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from interp.models.zoo import ZOO


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "interp.cli", *args], capture_output=True, text=True, **kw)


def test_models_lists_the_zoo():
    r = run("models")
    assert r.returncode == 0 and "minilm-l6" in r.stdout and "available" in r.stdout


def test_unknown_model_is_one_clear_line(run_cli, capsys):
    # interp.cli.main in this process (the entry point itself: test_models_lists_the_zoo): a process of its own
    # imported torch, transformers and interp again (~15 s of CPU) to print the same line
    code = run_cli(["inventory", "--model", "no-such-model"])
    err = capsys.readouterr().err
    assert code == 1
    assert "unknown model source 'no-such-model'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_demo_quick_writes_tables_figures_and_report(tmp_path, run_cli, capsys):
    assert ZOO["dinov2-s14"].available(), "`make models` should have fetched dinov2-s14"
    # in this process (the entry point itself: test_models_lists_the_zoo); a second start-up cost ~15 s of CPU.
    # The smallest sample that runs every step: one batch of 2 photographs (the families' halves hold 1 each, the
    # ablation's bootstrap resamples 2); the ablation's exact heads cost 20 forwards each, in proportion to it
    assert run_cli(["demo", "--quick", "--batch-size", "2", "--out", tmp_path]) == 0, capsys.readouterr().err[-2000:]
    for stem in ("bias_spec", "origin_shift", "score_decomposition", "bias_invariances", "qkv_stats",
                 "frequency_profile", "frequency_shift_q_bias", "sink_profile", "sink_shares", "implicit_value_bias",
                 "massive_activations", "ablation"):
        assert (tmp_path / f"{stem}.csv").exists() and (tmp_path / f"{stem}.parquet").exists()
    for fig in ("shift_ratio", "bias_share", "key_prior_share", "clusters", "attention_distance",
                "spectrum_clustermap", "sink_mass_grid", "implicit_vs_explicit", "massive_activations",
                "ablation_top_zero_exact", "ablation_delta_zero_atp_distance",
                "ablation_exact_vs_atp_distance_zero"):
        assert (tmp_path / f"{fig}.png").stat().st_size > 10_000
    report = (tmp_path / "report.html").read_text()
    # drawn once each: the intervals (3), families, distance, spectra, sinks (2), ablations (2), one input (3)
    assert report.count("<img") == 13 and "dinov2-s14" in report
    assert report.index("Headline findings") < report.index("Bias inventory")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["meta"]["model"] == "dinov2-s14" and summary["headlines"]
    # one sample for every step that reads data, said beside each headline
    assert summary["meta"]["analysed"] and all(a == dict(items=2, batches=1) for a in summary["meta"]["analysed"].values())
    assert {v for k, v in summary["samples"].items() if k not in ("inventory", "single_input")} == {"2 images"}
    assert all(h.startswith("[n = 2 images] ") for h in summary["headlines"])
    assert len(summary["meta"]["model_fingerprint"]) == 16
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert "report.html" in manifest["files"] and manifest["meta"]["data_fingerprint"]
    assert summary["sections"]["invariances"]["k_bias_pattern_max_abs_diff"] < 1e-9
    abl = pd.read_csv(tmp_path / "ablation.csv")
    estimated, exact = abl[abl.estimate == "atp_distance"], abl[abl.estimate == "exact"]
    assert len(estimated) == 12 * 6 * 3
    k_rows = abl[abl.kind == "k"]  # b_k is inert by the identity, answered without a forward: say so, delta 0
    assert (k_rows.identity.fillna("").str.contains("b_k")).all() and (k_rows.delta == 0).all()
    assert exact.kind.value_counts().to_dict() == {"q": 4, "v": 4}  # quick: per kind the top 2 and 2 at random
    assert exact.groupby(["kind", "exact_because"]).size().to_dict() == {
        ("q", "sample"): 2, ("q", "top"): 2, ("v", "sample"): 2, ("v", "top"): 2}
    assert exact.n_control.between(5, 199).all() and exact.bias_dependent.notna().all()  # each with its matched control
    assert exact.delta_lo.notna().all() and (exact.delta_lo <= exact.delta_hi).all()  # bootstrap over items
    inv = pd.read_csv(tmp_path / "bias_invariances.csv")
    assert (inv.max_abs_diff < 1e-9).all()  # float64: DINOv2's b_k (norm up to ~150) is inert


@pytest.mark.parametrize("command", ["origin", "scores", "frequency", "sinks"])
def test_analysis_subcommands_list_their_options_and_write_their_tables(command, tmp_path, capsys):
    from interp.cli import main as cli_main

    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    help_text = capsys.readouterr().out
    for option in ("--model", "--data", "--out", "--quick", "--device", "--debug"):
        assert option in help_text, (command, option)
    assert cli_main([command, "--model", "digits-vit", "--data", "digits", "--quick", "--out", str(tmp_path)]) == 0
    written = {p.name for p in tmp_path.iterdir()}
    expected = {"origin": "origin_shift.csv", "scores": "score_decomposition.csv", "frequency": "frequency_profile.csv",
                "sinks": "sink_profile.csv"}
    assert expected[command] in written and "manifest.json" in written
    assert_manifest_lists_every_file(tmp_path, command)
    # --layers / --heads: exactly the same rows of the full run, no others
    aimed = tmp_path / "aimed"
    assert cli_main([command, "--model", "digits-vit", "--data", "digits", "--quick", "--layers", "1", "--heads",
                     "0,2,3", "--out", str(aimed)]) == 0
    full, part = pd.read_csv(tmp_path / expected[command]), pd.read_csv(aimed / expected[command])
    keep = full[full.layer.eq(1) & full["head"].isin([0, 2, 3])].reset_index(drop=True)
    if command == "frequency":  # the families are fitted on the selected heads: compare the profile's own columns
        part, keep = (t.drop(columns=[c for c in t.columns if c in CLUSTER_COLUMNS]) for t in (part, keep))
    pd.testing.assert_frame_equal(part, keep, check_exact=True)
    meta = json.loads((aimed / "manifest.json").read_text())["meta"]
    assert (meta["layers"], meta["heads"]) == ([1], [0, 2, 3])


from interp.analysis.frequency import FAMILY_COLUMNS as CLUSTER_COLUMNS  # noqa: E402


def test_origin_reads_the_statistics_record_wrote_and_refuses_others(tmp_path, capsys):
    """origin --stats: the numbers of origin recomputing, no copy of the statistics (a reference in the
    manifest); statistics of another model, or of other data, are refused by fingerprint."""
    from interp.cli import main as cli_main

    data = ["--data", "digits", "--max-items", "16"]
    assert cli_main(["record", "--model", "digits-vit", *data, "--out", str(tmp_path / "rec")]) == 0
    assert cli_main(["origin", "--model", "digits-vit", "--stats", str(tmp_path / "rec"), "--out",
                     str(tmp_path / "read")]) == 0
    assert cli_main(["origin", "--model", "digits-vit", *data, "--batch-size", "8", "--out",
                     str(tmp_path / "again")]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "read" / "origin_shift.csv"),
                                  pd.read_csv(tmp_path / "again" / "origin_shift.csv"), check_exact=True)
    assert not list((tmp_path / "read").glob("qkv_stats*"))  # referenced, not copied
    meta = json.loads((tmp_path / "read" / "manifest.json").read_text())["meta"]
    recorded = json.loads((tmp_path / "rec" / "manifest.json").read_text())["meta"]
    assert meta["stats"]["file"] == str((tmp_path / "rec" / "qkv_stats.safetensors").resolve())
    assert meta["stats"]["data_fingerprint"] == recorded["data_fingerprint"]
    assert meta["positions"] == recorded["tokens_recorded"]
    # refused with exit code 1 and one line (main returns it; an exception would escape here)
    assert cli_main(["origin", "--model", "digits-vit-nobias", "--stats", str(tmp_path / "rec"), "--out",
                     str(tmp_path / "no")]) == 1
    assert "recorded on another model" in capsys.readouterr().err
    assert cli_main(["origin", "--model", "digits-vit", "--stats", str(tmp_path / "rec"), "--max-items", "8",
                     "--out", str(tmp_path / "no")]) == 1
    assert "recorded on other data" in capsys.readouterr().err


def test_scores_runs_on_the_data_record_used_and_refuses_others(tmp_path, capsys):
    """scores --stats: the data and its flags come from the recording's manifest (the same table as scores
    given those flags), the statistics are referenced in the manifest; another model or other data is refused."""
    from interp.cli import main as cli_main

    data = ["--data", "digits", "--max-items", "6", "--batch-size", "3"]
    assert cli_main(["record", "--model", "digits-vit", *data, "--out", str(tmp_path / "rec")]) == 0
    assert cli_main(["scores", "--model", "digits-vit", "--stats", str(tmp_path / "rec"), "--out",
                     str(tmp_path / "read")]) == 0
    assert cli_main(["scores", "--model", "digits-vit", *data, "--out", str(tmp_path / "again")]) == 0
    for table in ("score_decomposition.csv", "bias_invariances.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "read" / table), pd.read_csv(tmp_path / "again" / table),
                                      check_exact=True)
    meta = json.loads((tmp_path / "read" / "manifest.json").read_text())["meta"]
    recorded = json.loads((tmp_path / "rec" / "manifest.json").read_text())["meta"]
    assert meta["stats"]["data_fingerprint"] == recorded["data_fingerprint"]
    assert (meta["positions"], meta["items"]) == (recorded["tokens_recorded"], 6)
    assert cli_main(["scores", "--model", "digits-vit", "--stats", str(tmp_path / "rec"), "--max-items", "3",
                     "--out", str(tmp_path / "no")]) == 1
    assert "recorded on other data" in capsys.readouterr().err
    assert cli_main(["scores", "--model", "digits-vit-nobias", "--stats", str(tmp_path / "rec"), "--out",
                     str(tmp_path / "no")]) == 1
    assert "recorded on another model" in capsys.readouterr().err


def test_origin_on_a_file_uses_as_many_tokens_as_record(tmp_path):
    """interp record counted 867 tokens of a JSONL file, interp origin 574 of the same file (issue 25)."""
    from interp.cli import main as cli_main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Sentence {i} of a small corpus, said {'again ' * i}."}) + "\n"
                              for i in range(40)))
    assert cli_main(["record", "--model", "minilm-l6", "--data", str(corpus), "--out", str(tmp_path / "rec")]) == 0
    assert cli_main(["origin", "--model", "minilm-l6", "--data", str(corpus), "--out", str(tmp_path / "o")]) == 0
    recorded = json.loads((tmp_path / "rec" / "manifest.json").read_text())["meta"]
    used = json.loads((tmp_path / "o" / "manifest.json").read_text())["meta"]
    counted = pd.read_csv(tmp_path / "o" / "qkv_stats.csv")["count"]
    assert used["items"] == 40 and used["positions"] == recorded["tokens_recorded"] == counted.iloc[0] > 40 * 8


def test_version_and_debug_anywhere():
    from interp import __version__

    from interp.cli import main as cli_main
    from interp.errors import UnknownSourceError

    assert run("--version").stdout.strip() == f"interp {__version__}"
    # --debug, before or after the subcommand, lets the exception out (the interpreter prints its traceback;
    # test_unknown_model_is_one_clear_line: without it, one line); in this process: no second start-up
    for argv in (["--debug", "inventory", "--model", "no-such-model"], ["inventory", "--model", "no-such-model",
                                                                       "--debug"]):
        with pytest.raises(UnknownSourceError, match="no-such-model"):
            cli_main(argv)


def test_record_uses_the_data_flags_on_a_built_in_set_and_says_so(tmp_path):
    """--seq-len, --max-items and --batch-size on python-docs were ignored (1,322 tokens recorded)."""
    import json

    from interp.cli import main as cli_main

    out = tmp_path / "rec"
    assert cli_main(["record", "--model", "minilm-l6", "--data", "python-docs", "--seq-len", "16", "--max-items",
                     "2", "--batch-size", "1", "--out", str(out)]) == 0
    meta = json.loads((out / "manifest.json").read_text())["meta"]
    assert meta["tokens_recorded"] <= 2 * 16 and meta["data_options"] == dict(batch_size=1, seq_len=16, max_items=2)


def test_help_answers_without_importing_torch():
    code = ("import sys\nfrom interp.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'interp --help imported torch'\n"
            "import interp\nassert interp.load_model.__interp_public__ and 'torch' in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_ablate_writes_one_table(tmp_path):
    """ablation.csv duplicated ablation_zero_exact.csv (issue 25): one table, every estimate's rows in it."""
    from interp.cli import main as cli_main

    assert cli_main(["ablate", "--model", "digits-vit", "--data", "digits", "--max-batches", "1", "--kinds", "q",
                     "--layers", "0", "--estimate", "both", "--n-control", "0", "--out", str(tmp_path)]) == 0
    tables = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".csv", ".parquet"))
    assert tables == ["ablation.csv", "ablation.parquet"]
    rows = pd.read_csv(tmp_path / "ablation.csv")
    assert set(rows.estimate) == {"attribution", "exact"} and (rows.layer == 0).all()
    same = pd.read_parquet(tmp_path / "ablation.parquet")
    assert same[["layer", "head", "estimate"]].astype(str).equals(rows[["layer", "head", "estimate"]].astype(str))


# ----- the command line and the API give the same numbers on the same file (issue 31) -------------------------

@pytest.fixture(scope="module")
def digit_folder(tmp_path_factory):
    """10 digits as PNG files: 3 batches of 4, 4, 2 (more than the 2 batches the commands once analysed)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    folder = tmp_path_factory.mktemp("digit_pngs")
    for i, image in enumerate(load_digits().images[:10]):
        Image.fromarray((image * 16).clip(0, 255).astype(np.uint8)).save(folder / f"{i:02d}.png")
    return folder


@pytest.fixture(scope="module")
def digits_vit():
    import interp

    return interp.load_model("digits-vit", device="cpu")


def _api_tables(command, model, data):
    """What the API computes for each command, on all of ``data``, by table name."""
    import interp
    from interp.analysis.frequency import frequency_shift_under_ablation
    from interp.analysis.sinks import sink_shares

    if command in ("record", "origin"):
        stats = interp.record_qkv(model, data, progress=False)
        if command == "record":
            return {"qkv_stats": stats.to_frame()}
        return {"qkv_stats": stats.to_frame(), "origin_shift": interp.origin_shift(model, stats, data=data)}
    if command == "scores":  # the float64 identity checks read the first INVARIANCE_BATCHES (2) of the data
        return {"score_decomposition": interp.score_decomposition(model, data),
                "bias_invariances": interp.bias_invariances(model, data, max_batches=2)}
    if command == "frequency":  # 2 heads: no families fitted (cluster_heads' permutation null costs 10 s here)
        aim = dict(layers=[1], heads=[0, 1])
        profile = interp.frequency_profile(model, data, **aim)
        return {"frequency_profile": profile, "frequency_shift_q_bias": frequency_shift_under_ablation(
            model, data, kinds=("q",), **aim)}
    if command == "sinks":
        profile = interp.sink_profile(model, data, threshold=0.3, progress=False)
        return {"sink_profile": profile, "sink_shares": sink_shares(profile),
                "implicit_value_bias": interp.implicit_value_bias(model, data, progress=False),
                "massive_activations": interp.massive_activations(model, data, progress=False)}
    return {"ablation": interp.ablate_bias(model, data, kinds=("q", "v"), estimate="exact", layers=[1], n_boot=20,
                                           n_control=2, progress=False)}


# 2 control draws a head: the control columns are compared all the same (the default 19: 17 more forwards a head)
FLAGS = {"ablate": ["--kinds", "q,v", "--estimate", "exact", "--layers", "1", "--n-boot", "20", "--n-control", "2"],
         "frequency": ["--layers", "1", "--heads", "0,1"]}


@pytest.mark.parametrize("command", ["record", "origin", "scores", "frequency", "sinks", "ablate"])
def test_the_command_line_gives_the_api_numbers_on_the_same_file(command, digit_folder, digits_vit, tmp_path):
    """Every analysis command reads all of the file (3 batches; frequency and sinks once analysed the first 2 while
    the manifest counted all 10 items) and writes the API's table on it, number for number (both through CSV)."""
    import io

    from interp.cli import main as cli_main
    from interp.data import open_data

    out = tmp_path / command
    flags = FLAGS.get(command, [])
    assert cli_main([command, "--model", "digits-vit", "--data", str(digit_folder), "--batch-size", "4", "--device",
                     "cpu", "--out", str(out), *flags]) == 0
    data = open_data(digits_vit, str(digit_folder), dict(batch_size=4))
    for name, table in _api_tables(command, digits_vit, data).items():
        api, cli = pd.read_csv(io.StringIO(table.to_csv(index=False))), pd.read_csv(out / f"{name}.csv")
        if name == "frequency_profile":  # the command's table adds the families (one, for 2 heads)
            cli = cli.drop(columns=list(CLUSTER_COLUMNS))
        pd.testing.assert_frame_equal(cli, api, check_exact=True, obj=name)
    meta = json.loads((out / "manifest.json").read_text())["meta"]
    analysed = meta.get("analysed") or {command: dict(items=meta["items_analysed"], batches=meta["batches_analysed"])}
    invariances = analysed.pop("invariances", dict(items=8, batches=2))  # said as read: its first 2 batches
    assert invariances == dict(items=8, batches=2) and all(a == dict(items=10, batches=3) for a in analysed.values())
    assert meta["max_batches"] is None


def test_one_folder_keeps_each_commands_data_and_refuses_a_command_that_would_replace_anothers(tmp_path, capsys):
    """record then sinks into one --out: sinks' manifest replaced record's, so `origin --stats` read the sinks'
    data flags (4 items) for statistics recorded on 8 and refused them. Each command keeps its entry; a command
    whose files would replace another's (origin writes qkv_stats too) is refused, the record's files untouched."""
    from interp.cli import main as cli_main
    from interp.io import sha256_file

    into = ["--model", "digits-vit", "--data", "digits", "--out", str(tmp_path)]
    assert cli_main(["record", *into, "--max-items", "8"]) == 0
    assert cli_main(["sinks", *into, "--max-items", "4", "--layers", "0"]) == 0
    commands = json.loads((tmp_path / "manifest.json").read_text())["commands"]
    entries = {e["command"]: e for e in commands}
    assert [e["command"] for e in commands] == ["record", "sinks"]
    assert (entries["record"]["meta"]["data_options"]["max_items"], entries["sinks"]["meta"]["items"]) == (8, 4)
    assert "qkv_stats.safetensors" in entries["record"]["files"] and "sink_profile.csv" in entries["sinks"]["files"]
    assert cli_main(["origin", "--model", "digits-vit", "--stats", str(tmp_path), "--out", str(tmp_path / "o")]) == 0
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["meta"]["items"] == 8
    recorded = sha256_file(tmp_path / "qkv_stats.csv")
    capsys.readouterr()
    for command in ("origin", "demo"):  # refused before the model loads (no such model: never reached)
        assert cli_main([command, "--model", "no-such-model", "--data", "digits", "--out", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert "holds the results of 'interp" in err and "choose another --out" in err, err
    assert sha256_file(tmp_path / "qkv_stats.csv") == recorded and not (tmp_path / "origin_shift.csv").exists()
    assert [e["command"] for e in json.loads((tmp_path / "manifest.json").read_text())["commands"]] == [
        "record", "sinks"]


def test_an_output_folder_that_cannot_hold_the_results_is_refused_before_the_model_loads(tmp_path, capsys,
                                                                                       monkeypatch):
    """--out a file, a folder below a file, a folder that is not writable, a manifest.json that is not JSON (it
    would have been removed): one line each, before any work, and nothing there changes."""
    import interp.io
    from interp.cli import main as cli_main

    file = tmp_path / "results.csv"
    file.write_text("mine\n")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "manifest.json").write_text("not json")
    (tmp_path / "listed").mkdir()
    (tmp_path / "listed" / "manifest.json").write_text("[1, 2]")
    (tmp_path / "folder" / "manifest.json").mkdir(parents=True)
    cases = {str(file): "is a file, not a folder", str(file / "sub"): "is a file, not a folder",
             **{str(tmp_path / n): "is not a manifest interp wrote" for n in ("odd", "listed", "folder")}}
    for command in ("record", "sinks", "ablate", "demo", "inventory"):
        for out, message in cases.items():
            argv = [command, "--model", "no-such-model", "--out", out] + (["--data", "digits"] if command in (
                "record", "ablate") else [])
            assert cli_main(argv) == 1
            err = capsys.readouterr().err
            assert message in err and "unknown model" not in err, (command, out, err)
    assert file.read_text() == "mine\n" and (tmp_path / "odd" / "manifest.json").read_text() == "not json"
    assert (tmp_path / "listed" / "manifest.json").read_text() == "[1, 2]"
    monkeypatch.setattr(interp.io.os, "access", lambda *a: False)  # (as root every folder is writable)
    assert cli_main(["sinks", "--model", "no-such-model", "--out", str(tmp_path / "new")]) == 1
    assert "is not writable: choose another output folder" in capsys.readouterr().err


# Every command that writes an output folder, with a cheap run (the shipped 4-layer ViT, one batch of 8 digits), or
# the test that checks its folder's manifest where a test already runs it.
CHEAP_RUNS = {
    "inventory": [],
    "record": ["--data", "digits", "--max-batches", "1"],
    "ablate": ["--data", "digits", "--max-batches", "1", "--kinds", "v", "--estimate", "exact", "--n-control", "1",
               "--n-boot", "0"],
    **{c: "test_analysis_subcommands_list_their_options_and_write_their_tables"
       for c in ("origin", "scores", "frequency", "sinks")},
    "demo": "tests/report/test_pipeline.py::test_manifest_is_written_last_and_lists_every_file",
    "compare": "tests/test_compare.py::test_cli_equals_api_on_the_shipped_digits_vits",
    "single-input": "test_single_input_command_writes_single_inputs_tables",
    "specialisation": ["--data", "digits", "--quick"],
}


def assert_manifest_lists_every_file(out, command):
    """``out``'s manifest: one entry, ``command``'s, listing exactly the files on disk with their sha256."""
    from interp.io import sha256_file

    manifest = json.loads((out / "manifest.json").read_text())
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert [e["command"] for e in manifest["commands"]] == [command] and manifest["meta"]["command"] == command
    assert set(manifest["files"]) == on_disk and on_disk, command
    assert all(sha256_file(out / name) == digest for name, digest in manifest["files"].items()), command


def test_every_command_with_an_output_folder_is_checked():
    """A new command that writes a folder must join CHEAP_RUNS (so its manifest is checked)."""
    import argparse

    from interp.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    writing = {name for name, p in sub.choices.items() if any("--out" in a.option_strings for a in p._actions)}
    assert writing == set(CHEAP_RUNS)


@pytest.mark.parametrize("command", [c for c, run in CHEAP_RUNS.items() if isinstance(run, list)])
def test_a_command_ends_its_folder_with_a_manifest_of_every_file(command, tmp_path, run_cli, capsys):
    """README: every output folder ends with manifest.json, sha256 of every file (inventory wrote none)."""
    out = tmp_path / command
    argv = [command, "--model", "digits-vit", *CHEAP_RUNS[command], "--out", out]
    assert run_cli(argv) == 0, capsys.readouterr().err[-2000:]
    assert_manifest_lists_every_file(out, command)


def _through_csv(table):
    import io

    return pd.read_csv(io.StringIO(table.to_csv(index=False)))


ONE_INPUT_TABLES = ("patterns", "heads", "key_prior", "positions")


def test_single_input_command_writes_single_inputs_tables(digit_folder, digits_vit, tmp_path):
    """`interp single-input` on an image file: the tables of interp.single_input on the same file, number for number
    (both through CSV), its figures (patterns, key prior, overlays intact and without b_q) and a manifest."""
    import interp
    from interp.cli import main as cli_main

    image, out = digit_folder / "03.png", tmp_path / "one"
    assert cli_main(["single-input", "--model", "digits-vit", "--input", str(image), "--device", "cpu",
                     "--out", str(out)]) == 0
    view = interp.single_input(digits_vit, str(image))
    for name in ONE_INPUT_TABLES:
        pd.testing.assert_frame_equal(pd.read_csv(out / f"single_input_{name}.csv"),
                                      _through_csv(getattr(view, name)), check_exact=True, obj=name)
    for fig in ("patterns", "key_prior", "overlay", "overlay_no_b_q"):
        assert (out / f"single_input_{fig}.png").stat().st_size > 10_000, fig
    meta = json.loads((out / "manifest.json").read_text())["meta"]
    assert meta["command"] == "single-input" and meta["data_fingerprint"] == view.meta["data_fingerprint"]
    assert meta["model_fingerprint"] == view.meta["model_fingerprint"] and meta["query"] == "cls"
    assert_manifest_lists_every_file(out, "single-input")


def test_a_timm_model_with_weights_from_the_command_line(digit_folder, tmp_path):
    """--model timm:NAME --weights FILE --model-args JSON: the model the API loads from the same file (the trained
    digits ViT as timm weights), in `inventory`, `single-input` and `demo`, table for table."""
    import torch

    import interp
    from interp.cli import main as cli_main
    from interp.models.digits import digits_vit_as_timm

    trained = digits_vit_as_timm("digits-vit")
    torch.save(trained.state_dict(), tmp_path / "digits.pth")
    args = dict(img_size=8, patch_size=trained.patch_embed.patch_size[0], embed_dim=trained.embed_dim,
                depth=len(trained.blocks), num_heads=trained.blocks[0].attn.num_heads,
                mlp_ratio=trained.blocks[0].mlp.fc1.out_features / trained.embed_dim)
    flags = ["--model", "timm:vit_tiny_patch16_224", "--weights", str(tmp_path / "digits.pth"),
             "--model-args", json.dumps(args)]
    assert cli_main(["inventory", *flags, "--out", str(tmp_path / "inv")]) == 0
    model = interp.load_model("timm:vit_tiny_patch16_224", weights=tmp_path / "digits.pth", model_args=args,
                              device="cpu")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "inv" / "bias_spec.csv"), _through_csv(interp.bias_spec(model)))
    assert cli_main(["single-input", *flags, "--input", str(digit_folder / "03.png"), "--device", "cpu",
                     "--out", str(tmp_path / "one")]) == 0
    view = interp.single_input(model, str(digit_folder / "03.png"))
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "one" / "single_input_heads.csv"), _through_csv(view.heads),
                                  check_exact=True)
    # the demo too: its statistics (quick: the first batch of 4) are the API's on that model and batch
    assert cli_main(["demo", *flags, "--data", str(digit_folder), "--quick", "--out", str(tmp_path / "demo")]) == 0
    from interp.data import open_data

    first = list(open_data(model, str(digit_folder), dict(batch_size=4)))[:1]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "demo" / "qkv_stats.csv"),
                                  _through_csv(interp.record_qkv(model, first, progress=False).to_frame()),
                                  check_exact=True)
    meta = json.loads((tmp_path / "demo" / "manifest.json").read_text())["meta"]
    assert (meta["weights"], meta["model_args"]) == (str(tmp_path / "digits.pth"), args)
