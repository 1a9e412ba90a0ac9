"""Traces of several hosts: `opprof import a.trace b.trace -o job.trace` and `opprof report
a.trace b.trace` take the hosts' .trace files of one job as that job."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from opprof import load
from opprof.errors import OpprofError
from opprof.job import report
from opprof.pipeline.imports import import_
from tests.conftest import FIXTURES, run_cli, shared_trace

RANKS = ("sampled-128rank-rank0.json.gz", "sampled-128rank-rank1.json.gz")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Each rank of the 128-rank job imported on its own, as two hosts would."""
    out = tmp_path_factory.mktemp("hosts")
    paths = []
    for i, name in enumerate(RANKS):
        paths.append(import_([shared_trace(name)], out / f"host{i}.trace", jobs=1).path)
    return paths


def test_import_merges_hosts_into_one_job(hosts: list[Path], tmp_path: Path) -> None:
    res = run_cli("import", *map(str, hosts), "-o", str(tmp_path / "job.trace"))
    assert res.returncode == 0, res.stderr
    assert "2 rank(s)" in res.stdout and "4 step(s)" in res.stdout
    job = load(tmp_path / "job.trace")
    whole = load([shared_trace(n) for n in RANKS])  # the native files together
    assert job.ranks == whole.ranks == [0, 1]
    assert len(job.events) == len(whole.events)
    assert job.meta["workers"] == 2 and job.meta["merged_from"] == [str(p) for p in hosts]
    assert sorted(job.meta["distributed"]) == ["0", "1"]
    assert job.meta["step_bounds"] == whole.meta["step_bounds"]


def test_report_takes_the_hosts_traces_as_the_job(hosts: list[Path]) -> None:
    a = report(hosts, jobs=1)
    b = report([shared_trace(n) for n in RANKS], jobs=1)
    pd.testing.assert_frame_equal(a.ranks, b.ranks)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    pd.testing.assert_frame_equal(a.collectives, b.collectives)
    assert a.comm_overlap == b.comm_overlap and a.meta["workers"] == 2


def test_overlapping_ranks_and_other_jobs_are_refused(hosts: list[Path],
                                                      tmp_path: Path) -> None:
    res = run_cli("import", str(hosts[0]), str(hosts[0]), "-o", str(tmp_path / "x.trace"))
    assert res.returncode == 2 and "both hold rank 0" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "x.trace").exists()
    other = import_([shared_trace("nccl-2rank-rank0.json.gz")], tmp_path / "other.trace",
                    jobs=1).path
    with pytest.raises(OpprofError, match=r"not one job \(world size 128 vs 2\)"):
        report([hosts[1], other], jobs=1)
    with pytest.raises(OpprofError, match="not one job"):
        load([hosts[0], other])


def test_two_jobs_whose_imported_traces_say_nothing_else_are_refused_by_time(
        tmp_path: Path) -> None:
    """Rank 0 of one real 2-rank gloo job and rank 1 of another (torch.profiler traces of
    users' scripts: no model, dataset or rendezvous to compare, the same world size) are not
    one job: their steps are days apart, where one job's ranks step together."""
    a = import_([FIXTURES / "torch-ddp" / "lenet5-gloo-2steps-rank0.pt.trace.json.gz"],
                tmp_path / "a.trace", jobs=1).path
    b = import_([FIXTURES / "torch-collectives" / "rank1.pt.trace.json.gz"],
                tmp_path / "b.trace", jobs=1).path
    res = run_cli("import", str(a), str(b), "-o", str(tmp_path / "x.trace"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert re.search(r"a\.trace and .*b\.trace are not one job \(their steps are [\d,]+ s "
                     r"apart\)", res.stderr), res.stderr
    assert not (tmp_path / "x.trace").exists()
