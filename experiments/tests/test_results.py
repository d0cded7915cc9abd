"""``experiments.training.results``, the run loop and results folder both training experiments share (their tables on a
tiny run: test_results_frozen.py; the t-interval: test_sink_results.py)."""

import pandas as pd
import pytest

from interp.errors import StaleResultsError
from experiments.training.results import refuse_other_recipes, run_plan, tag_rows


def test_the_loop_writes_every_finished_runs_tables_after_each_run(tmp_path):
    """After each planned run, the tables of every run finished so far (here: one row per run) are on disk."""
    finished, seen = [], []

    def train(item):
        finished.append(item)
        return f"trained {item}"

    def collect():
        return dict(runs=pd.DataFrame({"run": finished, "recipe": "r"}), heads=pd.DataFrame({"n": [len(finished)]}))

    def log(line):
        seen.append((line, pd.read_csv(tmp_path / "runs.csv").run.tolist() if (tmp_path / "runs.csv").exists()
                     else None))

    frames = run_plan(["a", "b"], train, collect, tmp_path, ("runs", "heads"), log)
    assert seen == [("trained a", None), ("trained b", ["a"])]  # logged before that run's tables are written
    assert pd.read_csv(tmp_path / "runs.csv").run.tolist() == ["a", "b"] == frames["runs"].run.tolist()
    assert pd.read_csv(tmp_path / "heads.csv").n.tolist() == [2]
    assert run_plan([], train, collect, tmp_path / "none", ("runs",), log) == {}


def test_a_folder_of_another_recipe_is_refused_in_both_forms(tmp_path):
    pd.DataFrame({"domain": ["text", "vision"], "recipe": ["t1", "v1"]}).to_csv(tmp_path / "runs.csv", index=False)
    refuse_other_recipes(tmp_path, {"text": "t1", "vision": "v1"}, by="domain")
    with pytest.raises(StaleResultsError, match=r"recipe vision v1, not this run's .*--overwrite"):
        refuse_other_recipes(tmp_path, {"text": "t1", "vision": "v2"}, by="domain")
    with pytest.raises(StaleResultsError, match=r"recipe v1, not this run.s t1: choose another --out"):
        refuse_other_recipes(tmp_path, "t1")
    refuse_other_recipes(tmp_path, "x", overwrite=True)
    refuse_other_recipes(tmp_path / "empty", "x")


def test_rows_are_tagged_with_the_recipe_and_keep_the_runs_fingerprint():
    rows = [dict(step=0, recipe="run-fp", loss=1.0)]
    assert tag_rows(rows, "recipe-fp") == [dict(step=0, loss=1.0, recipe="recipe-fp", fingerprint="run-fp")]
    assert rows == [dict(step=0, recipe="run-fp", loss=1.0)]  # the checkpoint's rows are not changed
