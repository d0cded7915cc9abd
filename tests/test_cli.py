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


def test_unknown_model_is_one_clear_line():
    r = run("inventory", "--model", "no-such-model")
    assert r.returncode == 1
    assert "unknown model source 'no-such-model'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_demo_quick_writes_tables_figures_and_report(tmp_path):
    assert ZOO["dinov2-s14"].available(), "`make models` should have fetched dinov2-s14"
    r = run("demo", "--quick", "--out", str(tmp_path), timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
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
    assert report.count("<img") == 14 and "dinov2-s14" in report  # 8 + single_input (3) + sinks (3)
    assert report.index("Headline findings") < report.index("Bias inventory")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["meta"]["model"] == "dinov2-s14" and summary["headlines"]
    assert len(summary["meta"]["model_fingerprint"]) == 16
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert "report.html" in manifest["files"] and manifest["meta"]["data_fingerprint"]
    assert summary["sections"]["invariances"]["k_bias_pattern_max_abs_diff"] < 1e-9
    abl = pd.read_csv(tmp_path / "ablation.csv")
    estimated, exact = abl[abl.estimate == "atp_distance"], abl[abl.estimate == "exact"]
    assert len(estimated) == 12 * 6 * 3
    k_rows = abl[abl.kind == "k"]  # b_k is inert by the identity, answered without a forward: say so, delta 0
    assert (k_rows.identity.fillna("").str.contains("b_k")).all() and (k_rows.delta == 0).all()
    assert exact.kind.value_counts().to_dict() == {"q": 10, "v": 10}  # per kind the top 5 and 5 at random; k by identity
    assert exact.groupby(["kind", "exact_because"]).size().to_dict() == {
        ("q", "sample"): 5, ("q", "top"): 5, ("v", "sample"): 5, ("v", "top"): 5}
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


CLUSTER_COLUMNS = ("cluster", "silhouette", "silhouette_mean", "k", "null_silhouette", "p_value", "separation",
                   "structure")


def test_origin_reads_the_statistics_record_wrote_and_refuses_others(tmp_path):
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
    other_model = run("origin", "--model", "digits-vit-nobias", "--stats", str(tmp_path / "rec"), "--out",
                      str(tmp_path / "no"))
    assert other_model.returncode == 1 and "recorded on another model" in other_model.stderr
    other_data = run("origin", "--model", "digits-vit", "--stats", str(tmp_path / "rec"), "--max-items", "8",
                     "--out", str(tmp_path / "no"))
    assert other_data.returncode == 1 and "recorded on other data" in other_data.stderr
    assert "Traceback" not in other_model.stderr + other_data.stderr


def test_scores_runs_on_the_data_record_used_and_refuses_others(tmp_path):
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
    other_data = run("scores", "--model", "digits-vit", "--stats", str(tmp_path / "rec"), "--max-items", "3",
                     "--out", str(tmp_path / "no"))
    assert other_data.returncode == 1 and "recorded on other data" in other_data.stderr
    other_model = run("scores", "--model", "digits-vit-nobias", "--stats", str(tmp_path / "rec"), "--out",
                      str(tmp_path / "no"))
    assert other_model.returncode == 1 and "recorded on another model" in other_model.stderr


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

    assert run("--version").stdout.strip() == f"interp {__version__}"
    for argv in (("--debug", "inventory", "--model", "no-such-model"), ("inventory", "--model", "no-such-model",
                                                                       "--debug")):
        r = run(*argv)
        assert r.returncode != 0 and "Traceback" in r.stderr  # --debug shows it, before or after the subcommand


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
                     "--layers", "0", "--estimate", "both", "--out", str(tmp_path)]) == 0
    tables = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".csv", ".parquet"))
    assert tables == ["ablation.csv", "ablation.parquet"]
    rows = pd.read_csv(tmp_path / "ablation.csv")
    assert set(rows.estimate) == {"attribution", "exact"} and (rows.layer == 0).all()
    same = pd.read_parquet(tmp_path / "ablation.parquet")
    assert same[["layer", "head", "estimate"]].astype(str).equals(rows[["layer", "head", "estimate"]].astype(str))
