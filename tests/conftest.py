"""Shared test fixtures: paths to the real traces and a helper to run the real CLI."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
#: Real traces recorded elsewhere (HTA's and Pipit's test data, MIT), copied into the
#: repository: fixtures/README.md.
SHARED_TRACES = FIXTURES / "shared"
KINETO_GPU = SHARED_TRACES / "kineto-gpu"
NSYS_SQLITE = SHARED_TRACES / "nsys" / "saxpy-mpi-cuda.sqlite"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (the README's test command runs two workers), each worker's torchrun
    jobs rendezvous on a port of their own: torchrun's ``--master-port`` defaults to 29500
    unless ``PET_MASTER_PORT`` says otherwise, and two jobs started at once on the default
    would meet each other. Other jobs pick a free port (``collectors.supervisor.free_port``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and "PET_MASTER_PORT" not in os.environ:
        os.environ["PET_MASTER_PORT"] = str(29600 + 37 * int(worker[2:]))


@pytest.fixture
def folder(tmp_path: Path):
    """A run's working folder; afterwards, any process the run left there is stopped."""
    from tests.procs import free_leftovers

    yield tmp_path
    free_leftovers(str(tmp_path))


def shared_trace(name: str) -> Path:
    """A Kineto trace from fixtures/shared/kineto-gpu; a test whose input is missing fails."""
    return fixture_file(KINETO_GPU / name)


def fixture_file(path: Path) -> Path:
    """``path``, a file of the repository a test reads: the test fails when it is missing
    (never skips, never runs on less)."""
    if not path.is_file():
        pytest.fail(f"the test's input {path} is missing from the repository")
    return path


def native_x_events(path: Path) -> list[dict]:
    """The complete events of a Kineto file, read independently of opprof."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the installed `opprof` command line as a user would (``env``: variables to set)."""
    return subprocess.run([sys.executable, "-m", "opprof", *args], cwd=cwd,
                          env={**os.environ, **env} if env else None,
                          capture_output=True, text=True, timeout=timeout)


#: A bench matrix made of the fixtures' real recordings (framework, workers, mode, fixture):
#: lenet5 on torch, MXNet and TF, one worker and two.
FIXTURE_BENCH = [("torch", 1, "single", "memory/torch-lenet5"),
                 ("torch", 2, "allreduce", "torch-ddp"),
                 ("mxnet", 1, "single", "mxnet/lenet5-single"),
                 ("mxnet", 2, "ps-sync", "mxnet/lenet5-ps-sync"),
                 ("tf", 1, "single", "memory/tf-lenet5"),
                 ("tf", 2, "allreduce", "tf/lenet5-allreduce-2w")]


def bench_from_fixtures(folder: Path) -> Path:
    """A bench folder as `opprof bench` writes it (traces, bench.json/csv/md, bench.html,
    figures/), from the fixtures' recordings instead of new ones (seconds, no training)."""
    from opprof.analysis.matrix import Run, compare, summarize
    from opprof.loader import load
    from opprof.pipeline.bench import add_predictions, write_outputs, write_visuals
    from opprof.trace import save

    folder.mkdir(parents=True, exist_ok=True)
    runs = []
    for fw, workers, mode, fixture in FIXTURE_BENCH:
        run = Run(fw, "lenet5", workers, mode, status="ok", wall_s=0.0)
        trace = load(REPO / "fixtures" / fixture)
        save(trace, folder / f"{run.name}.trace")
        run.summary = summarize(trace)
        runs.append(run)
    add_predictions(runs, folder, None)
    table, ratios = compare(runs, 10)
    write_outputs(folder, runs, table, ratios, {"source": "tests.conftest.FIXTURE_BENCH"})
    write_visuals(folder, say=lambda line: None)
    return folder
