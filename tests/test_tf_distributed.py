"""TensorFlow multi-worker recording: a real 2-worker MultiWorkerMirroredStrategy run on
loopback (one XPlane per worker, merged into one trace on one clock, ring all-reduce as comm,
totals equal to xprof's), and dead or hung tasks ending the run with one clear error and no
process left behind."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from opprof.analysis.breakdown import step_breakdown
from opprof.collectors import RecordConfig, record
from opprof.errors import OpprofError
from opprof.taxonomy import PHASES
from tests.faults import Fault, injected
from tests.procs import needs  # (before the imports it guards)
from tests.xprof_check import assert_totals_match_xprof

needs("tensorflow", "xprof")

CONFIG = {"fw": "tf", "model": "lenet5", "batch_size": 8, "steps": 2, "warmup": 1,
          "timing_steps": 1, "workers": 2, "mode": "allreduce", "timeout_s": 240}


def leftover_tasks(workdir: Path) -> list[str]:
    """Processes still running a task of this workdir (ps, independently of opprof)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if str(workdir) in ln and "collectors.worker" in ln]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from opprof.normalizers import normalize

    workdir = tmp_path_factory.mktemp("tf-allreduce")
    rec = record(RecordConfig(**CONFIG), workdir)
    return workdir, rec, normalize(rec.native, rec.meta)


def test_one_xplane_per_worker_merged_into_one_trace(run) -> None:
    workdir, rec, trace = run
    assert [p.relative_to(workdir).parts[0] for p in rec.native] == ["worker0", "worker1"]
    assert rec.meta["workers"] == 2 and rec.meta["mode"] == "allreduce"
    assert [t["rank"] for t in rec.meta["tasks"]] == [0, 1]
    assert trace.ranks == [0, 1]
    assert sorted(trace.events["role"].unique()) == ["worker"]
    assert leftover_tasks(workdir) == []


def test_ring_all_reduce_is_comm_every_step_on_every_rank(run) -> None:
    _, _, trace = run
    ev = trace.events
    coll = ev[(ev["name"] == "CollectiveReduceV2") & (ev["step"] >= 0)]
    assert coll.groupby("rank")["step"].nunique().to_dict() == {0: 2, 1: 2}
    assert set(coll["op"]) == {"all_reduce"} and coll["counted"].all()
    sb = step_breakdown(trace)
    assert (sb[list(PHASES)].sum(axis=1) == sb["dur_ns"]).all()
    assert (sb["busy_comm"] > 0).all() and (sb["forward"] > 0).all()


def test_ranks_share_one_clock(run) -> None:
    _, _, trace = run
    b = trace.step_bounds().pivot(index="step", columns="rank", values="end")
    # Every step ends with the same all-reduce on both workers.
    assert (abs(b[0] - b[1]) < 50_000_000).all()


def test_totals_match_xprof_framework_op_stats_on_each_worker(run) -> None:
    _, rec, trace = run
    for path in rec.native:
        assert assert_totals_match_xprof(trace, path) > 50


def test_a_dead_worker_ends_the_run_with_one_clear_error(tmp_path: Path) -> None:
    config = RecordConfig(**CONFIG)
    t0 = time.monotonic()
    with pytest.raises(OpprofError, match=r"tf allreduce: worker 1 exited with code 3 during "
                                          r"warmup \(0/1 steps done\)") as err, \
            injected(Fault("worker 1", "warmup", "exit")):
        record(config, tmp_path)
    assert time.monotonic() - t0 < config.timeout_s
    assert "stopped the other processes" in str(err.value) and "\n" not in str(err.value)
    assert "no profile was recorded" in str(err.value)
    assert leftover_tasks(tmp_path) == []


def test_a_hung_worker_ends_the_run_at_the_timeout(tmp_path: Path) -> None:
    config = RecordConfig(**{**CONFIG, "timeout_s": 25})
    t0 = time.monotonic()
    with pytest.raises(OpprofError, match=r"tf allreduce: worker 0 and worker 1 hung in "
                                          r"start-up and the run passed its 25s limit"), \
            injected(Fault("worker 1", "setup", "hang")):
        record(config, tmp_path)
    assert time.monotonic() - t0 < config.timeout_s + 10
    assert leftover_tasks(tmp_path) == []
