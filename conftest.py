"""Test tiers, threads and CUDA skips for the whole suite.

Tiers (README, "Tests"), decided here in one place:

* ``unit``: in-process tests on tiny or shipped models; the default of a bare ``pytest``.
* ``integration``: a separate process (the CLI end to end, torchrun, a SIGKILL), a notebook, or a
  training run.
* ``slow``: the real zoo models (MiniLM, SmolLM2, DINOv2) or the full MNIST.

``pytest --tier unit|integration|all`` picks the tiers (``integration`` means unit + integration);
naming a file or a test runs it whatever its tier. ``make test`` (CI) runs ``--tier all`` on two
workers (pytest-xdist).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: every process a test starts (the CLI, a notebook's kernel, torchrun's
    # ranks) gets one thread too; two threads each made four spin on two cores (+22% CPU, measured).
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_name] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Two xdist workers on two cores: one thread each, or they spin against each other.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

TIERS = ("unit", "integration", "all")
ROOT = Path(__file__).resolve().parent

# Node-id prefixes (relative to the checkout) of the integration tier, with why.
INTEGRATION = (
    "tests/test_faults.py::test_sweep_killed",            # 3 forked CLI processes, SIGKILLed
    "tests/test_faults.py::test_recording_killed",        # 1 forked CLI process, SIGKILLed
    "tests/record/test_recording.py::test_interp_record_under_torchrun",
    "tests/record/test_recording.py::test_interp_record_on_an_image_folder_under_torchrun",
    "tests/record/test_recording.py::test_two_process_gloo",        # torch.multiprocessing, two ranks
    "tests/ablation/test_sweep.py::test_interp_ablate_under_torchrun",
    "tests/test_cli.py::test_models_lists_the_zoo",       # the CLI in a subprocess
    "tests/test_cli.py::test_help_answers_without_importing_torch",
    "tests/test_cli.py::test_version_and_debug_anywhere",
    "tests/test_structure.py::test_import_has_no_side_effects",
    "tests/report/test_report_browser.py",                      # chromium, in its own processes
    "experiments/tests/test_mnist_vit.py::test_one_epoch_smoke_run_of_every_variant",
    "experiments/tests/test_sink_training.py",
    "experiments/tests/test_backcopy.py::test_training",
    "tests/test_gpu_sinks.py::test_the_gpu_command_runs_at_a_tiny_size_on_the_cpu",  # train_sinks.py in a process
)


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default=None,
                     help="unit (the default of a bare `pytest`), integration (unit + separate processes, "
                          "notebooks, training runs) or all (+ the real zoo models; CI)")


def _tier_of(item) -> str:
    if "slow" in item.keywords:
        return "slow"
    if item.path.suffix == ".ipynb" or item.nodeid.startswith(INTEGRATION):  # node ids are relative to ROOT
        return "integration"
    return "unit"


def _chosen_tier(config) -> str:
    if config.getoption("--tier"):
        return config.getoption("--tier")
    whole = {ROOT, ROOT / "tests", ROOT / "experiments"}
    named = [Path(a.split("::")[0]).resolve() for a in config.args]
    # a file or a test named on the command line runs whatever its tier
    return "unit" if all(p in whole for p in named) else "all"


def pytest_collection_modifyitems(config, items):
    tier = _chosen_tier(config)
    allowed = {"unit": {"unit"}, "integration": {"unit", "integration"}, "all": {"unit", "integration", "slow"}}[tier]
    keep, drop = [], []
    for item in items:
        item_tier = _tier_of(item)
        if item_tier == "integration":
            item.add_marker(pytest.mark.integration)
        (keep if item_tier in allowed else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_cli():
    """``interp.cli.main(argv)`` in this process on one thread, as a CLI process the suite starts (and each
    torchrun rank) runs: the reference of a multi-process or killed run without paying another process's
    start and imports. Returns the exit code; the output is in ``capsys``."""
    from interp.cli import main

    def run(argv: list) -> int:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return main([str(a) for a in argv])
        finally:
            torch.set_num_threads(before)

    return run


def _cli_rank(argv: list) -> tuple:
    """One rank of ``torchrun_forked``: ``interp.cli.main(argv)`` on one thread (torchrun's per-rank default);
    returns (exit code, stdout, stderr)."""
    import contextlib
    import io

    from interp.cli import main

    torch.set_num_threads(1)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def torchrun_forked():
    """``interp.cli.main(argv)`` on ``nproc`` ranks under torch's elastic agent, the launcher ``torchrun --standalone``
    runs (its argument parser, the same c10d rendezvous on localhost, the same RANK / LOCAL_RANK / WORLD_SIZE /
    MASTER_ADDR / MASTER_PORT in each rank), the ranks forked from this process rather than started as new ``python -m
    interp.cli`` processes: each of those imported torch, transformers and interp again (~15 s of CPU a rank, ~35 s a
    test). ``tests/record/test_recording.py::test_interp_record_under_torchrun_equals_one_process`` runs the real
    ``torchrun`` command. Returns {rank: (exit code, stdout, stderr)}."""
    import signal
    import uuid

    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    def run(argv: list, nproc: int = 2) -> dict:
        config, _, _ = config_from_args(parse_args(
            ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", str(uuid.uuid4()),
             "--nproc_per_node", str(nproc), "--start-method", "fork", "-m", "interp.cli"]))
        handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
        try:  # the agent handles these signals while its ranks run: this process's own handlers come back after
            return elastic_launch(config, entrypoint=_cli_rank)([str(a) for a in argv])
        finally:
            for s, handler in handlers.items():
                signal.signal(s, handler)

    return run
