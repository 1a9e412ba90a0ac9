"""Chainer in the taxonomy: `record --fw chainer` on Chainer's own function hooks, its totals
equal to Chainer's TimerHook over the same steps; `opprof run` of a hand-written loop
(cleargrads / backward / update) and of a Trainer with extensions; ChainerMN over mpiexec."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from opprof.collectors.chainer import mpi_problem, mpiexec
from opprof.loader import load
from opprof.taxonomy import PHASES
from tests.conftest import REPO, run_cli
from tests.procs import needs

SCRIPTS = REPO / "tests" / "scripts"
PROTOCOL = ["--warmup", "1", "--timing-steps", "1", "--steps", "3"]
#: Chainer 7 imports only with this at start-up (setuptools' distutils shim off); opprof sets
#: it for what it starts, a test process imports chainer itself only in subprocesses.
CHAINER_ENV = {"SETUPTOOLS_USE_DISTUTILS": "stdlib"}

pytestmark = pytest.mark.slow


def _check(report: dict, steps: int) -> None:
    assert report["meta"]["framework"] == "chainer"
    assert len(report["steps"]) == steps
    for s in report["steps"]:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"], s
    for phase in ("forward", "backward", "update"):
        assert report["phases"][phase]["ns_per_step"] > 0, phase
    assert report["phases"]["other"]["share"] <= 0.10
    total = sum(o["ns_per_step"] for o in report["ops"])
    assert sum(o["ns_per_step"] for o in report["ops"] if o["op"] == "other") <= 0.10 * total


def _report(path: Path) -> dict:
    res = run_cli("report", str(path), "--format", "json")
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def lenet5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    needs("chainer")
    tmp = tmp_path_factory.mktemp("chainer")
    res = run_cli("record", "--fw", "chainer", "--model", "lenet5", "--batch-size", "16",
                  "--steps", "3", "--warmup", "1", "--timing-steps", "1",
                  "-o", str(tmp / "lenet5-chainer.trace"), cwd=tmp, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "lenet5-chainer.trace"


def test_record_chainer_lenet5_phases_and_operators(lenet5: Path) -> None:
    report = _report(lenet5)
    _check(report, 3)
    ops = {o["op"] for o in report["ops"]}
    assert {"convolution", "convolution_backward", "pooling", "pooling_backward",
            "fully_connected", "fully_connected_backward", "weights_update",
            "data_load"} <= ops
    assert report["meta"]["params"] == 62006


def test_chainer_totals_equal_timerhooks_report(lenet5: Path) -> None:
    """Per function, the calls and time opprof recorded equal what Chainer's own TimerHook,
    run beside opprof's hook over the same steps, reports (its summary is kept next to the
    trace)."""
    native = lenet5.with_suffix(".native")
    timer = json.loads((native / "rank0.timerhook.txt").read_text())
    trace = load(lenet5)
    ev = trace.events
    fn = ev[ev["name"].astype(str).str.match(r"(?:forward|backward):")]
    ours = fn.groupby(fn["detail"].astype(str))["dur"].agg(["size", "sum"])
    theirs = timer["summary"]
    assert set(ours.index) == set(theirs)
    names = sorted(theirs)
    np.testing.assert_array_equal(ours.loc[names, "size"],
                                  [theirs[n]["occurrence"] for n in names])
    # Each hook times the same calls, opprof's a few µs before TimerHook's at both ends (Chainer
    # calls the hooks one after the other); a process preempted between the two hooks (this
    # machine runs other jobs) moves one call by up to a scheduler slice: 25 ms of slack per
    # function, and the sum over all functions within 5%.
    mine = ours.loc[names, "sum"].to_numpy(float)
    timer_ns = np.array([theirs[n]["elapsed_ns"] for n in names], float)
    assert np.all(np.abs(mine - timer_ns) <= 0.05 * timer_ns + 25e6), (names, mine, timer_ns)
    assert mine.sum() == pytest.approx(timer_ns.sum(), rel=0.05)
    counted = fn[fn["counted"]]["dur"].sum()
    assert counted == pytest.approx(timer["total_ns"], rel=0.05)


@pytest.mark.parametrize("name", ["chainer_loop.py", "chainer_trainer.py"])
def test_opprof_run_of_chainer_scripts(tmp_path: Path, name: str) -> None:
    needs("chainer")
    res = run_cli("run", *PROTOCOL, "-o", str(tmp_path / "run.trace"), "--format", "json",
                  "--", sys.executable, str(SCRIPTS / name), "--steps", "10", cwd=tmp_path,
                  timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    _check(report, 3)
    losses = [r["loss"] for r in report["convergence"] if r["loss"] is not None]
    assert len(losses) == 10


def test_chainermn_two_ranks_under_mpiexec(tmp_path: Path) -> None:
    needs("chainer", "mpi4py")
    assert mpi_problem() is None, mpi_problem()
    res = run_cli("record", "--fw", "chainer", "--model", "lenet5", "--workers", "2",
                  "--mode", "allreduce", "--batch-size", "8", "--steps", "2", "--warmup", "1",
                  "--timing-steps", "1", "-o", str(tmp_path / "mn.trace"), cwd=tmp_path,
                  timeout=600, env={**CHAINER_ENV, "OMPI_MCA_plm_rsh_agent": "",
                                    **({} if os.geteuid() else
                                       {"OMPI_ALLOW_RUN_AS_ROOT": "1",
                                        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})})
    assert res.returncode == 0, res.stderr[-3000:]
    report = _report(tmp_path / "mn.trace")
    assert report["meta"]["workers"] == 2
    assert sorted({s["rank"] for s in report["steps"]}) == [0, 1]
    assert any(o["op"] == "all_reduce" for o in report["ops"])


def test_opprof_run_of_a_chainermn_script_under_mpiexec(tmp_path: Path) -> None:
    needs("chainer", "mpi4py")
    assert mpi_problem() is None, mpi_problem()
    mpi = [str(mpiexec()), "-n", "2", "--oversubscribe", "--mca", "btl", "self,tcp",
           "--mca", "btl_tcp_if_include", "lo"]
    res = run_cli("run", *PROTOCOL, "-o", str(tmp_path / "run.trace"), "--format", "json",
                  "--", *mpi, sys.executable, str(SCRIPTS / "chainermn_loop.py"), "--steps",
                  "8", cwd=tmp_path, timeout=600,
                  env={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["meta"]["framework"] == "chainer" and report["meta"]["mode"] == "allreduce"
    assert sorted({s["rank"] for s in report["steps"]}) == [0, 1]
    for s in report["steps"]:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"]
    assert any(o["op"] == "all_reduce" and o["phase"] == "comm" for o in report["ops"])


def test_bench_probes_chainer_with_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`opprof bench --fw chainer` from a shell without SETUPTOOLS_USE_DISTUTILS: the probe
    that imports Chainer gets the variable as every Chainer process does (it was skipped:
    'chainer does not import: No module named distutils.msvccompiler')."""
    from opprof.pipeline.bench import probe

    monkeypatch.delenv("SETUPTOOLS_USE_DISTUTILS", raising=False)
    modes, why = probe("chainer")
    assert modes is not None, why
