"""Multi-rank analysis: the wait/transfer split, stragglers, overlap and bytes by their
definitions on small hand-timed traces, then on real traces (the shared 128-rank NCCL job's
two ranks and the committed 2-rank gloo DDP fixture)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opprof.analysis.ranks import rank_analysis
from opprof.loader import load
from opprof.normalizers import normalize
from opprof.normalizers.events import finish
from opprof.taxonomy import PHASES, mapping_table
from tests.conftest import FIXTURES, run_cli, shared_trace

DDP = sorted((FIXTURES / "torch-ddp").glob("*.pt.trace.json.gz"))


def job(events: list[tuple], meta: dict | None = None):
    """A trace from (rank, tid, name, ts, dur, bytes) rows through the Kineto table."""
    raw = pd.DataFrame(events, columns=["rank", "tid", "name", "ts", "dur", "bytes"])
    raw = raw.assign(role="worker", pid=100, device="cpu", kind="cpu_op", detail=None, link=-1)
    return finish(raw, mapping_table("kineto"), meta or {})


def step(rank: int, start: int = 0, end: int = 100) -> tuple:
    return (rank, 1, "ProfilerStep#1", start, end - start, 0)


def test_wait_is_time_before_the_last_rank_enters() -> None:
    tr = job([step(0), (0, 1, "aten::conv2d", 0, 10, 0), (0, 2, "gloo:all_reduce", 10, 40, 400),
              step(1), (1, 1, "aten::conv2d", 0, 30, 0), (1, 2, "gloo:all_reduce", 30, 20, 400)])
    ra = rank_analysis(tr)
    r = ra.ranks.set_index("rank")
    assert r.loc[0, "comm_ns"] == 40 and r.loc[0, "wait_ns"] == 20 and r.loc[0, "transfer_ns"] == 20
    assert r.loc[1, "comm_ns"] == 20 and r.loc[1, "wait_ns"] == 0 and r.loc[1, "transfer_ns"] == 20
    assert r.loc[0, "own_ns"] == 80 and r.loc[1, "own_ns"] == 100
    assert r.loc[0, "bytes"] == 400 and r.loc[0, "bandwidth_Bps"] == pytest.approx(400 / 20e-9)
    assert r.loc[0, "wait_share"] == pytest.approx(0.5)
    assert ra.collectives["matched"].all()
    s = ra.stragglers.iloc[0]
    assert (s["step"], s["slowest_rank"], s["own_ns"]) == (1, 1, 100)
    assert s["median_own_ns"] == 90 and s["excess_ns"] == 10
    assert s["excess_share"] == pytest.approx(10 / 90)
    # The phases still sum to the step on every rank.
    assert (r[list(PHASES)].sum(axis=1) == r["dur_ns"]).all()


def test_wait_is_clipped_to_the_collective() -> None:
    # Rank 0 finished its part before rank 1 started (clock skew or a sub-group): all wait.
    tr = job([step(0), (0, 2, "gloo:all_reduce", 10, 5, 8), step(1),
              (1, 2, "gloo:all_reduce", 50, 5, 8)])
    c = rank_analysis(tr).collectives.set_index("rank")
    assert c.loc[0, "wait_ns"] == 5 and c.loc[0, "transfer_ns"] == 0
    assert c.loc[1, "wait_ns"] == 0 and c.loc[1, "transfer_ns"] == 5


def test_collectives_match_by_name_and_order_within_the_step() -> None:
    rows = [step(0), step(1)]
    for rank, starts in ((0, (10, 40)), (1, (20, 30))):
        rows += [(rank, 2, "gloo:all_reduce", t, 5, 8) for t in starts]
    rows += [(0, 2, "gloo:broadcast", 60, 5, 8)]  # only on rank 0: unmatched
    c = rank_analysis(job(rows)).collectives
    ar = c[c["name"] == "gloo:all_reduce"].set_index(["rank", "seq"])
    assert ar["matched"].all()
    assert ar.loc[(0, 0), "wait_ns"] == 5 and ar.loc[(1, 0), "wait_ns"] == 0  # 10 vs 20
    assert ar.loc[(0, 1), "wait_ns"] == 0 and ar.loc[(1, 1), "wait_ns"] == 5  # 40 vs 30
    bc = c[c["name"] == "gloo:broadcast"].iloc[0]
    assert not bc["matched"] and bc["wait_ns"] == 0 and bc["transfer_ns"] == 5


def test_no_wait_in_ps_async() -> None:
    tr = job([step(0), (0, 2, "gloo:all_reduce", 10, 40, 4), step(1),
              (1, 2, "gloo:all_reduce", 30, 20, 4)], {"mode": "ps-async"})
    ra = rank_analysis(tr)
    assert not ra.synchronous and (ra.ranks["wait_ns"] == 0).all()
    assert list(ra.ranks["transfer_ns"]) == [40, 20]
    assert ra.stragglers.iloc[0]["own_ns"] == 100  # step time when nobody waits


def test_a_compute_op_blocked_in_its_own_comm_call_does_not_hide_comm() -> None:
    # DDP shape: a backward op on the main thread blocks in c10d::allreduce_ while gloo's
    # thread runs the collective.
    tr = job([step(0), (0, 1, "autograd::engine::evaluate_function: ConvolutionBackward0", 10,
                        50, 0),
              (0, 1, "c10d::allreduce_", 20, 30, 0), (0, 2, "gloo:all_reduce", 15, 40, 64)])
    r = rank_analysis(tr).ranks.iloc[0]
    assert r["comm_ns"] == 40 and r["collectives"] == 1  # gloo span, not also c10d
    assert r["overlap_ns"] == 10  # [15, 20) and [50, 55): computing, not blocked
    assert r["overlap"] == pytest.approx(10 / 40)


def test_bytes_come_from_one_level_only() -> None:
    # No backend spans: each call's payload is its largest nested one (record_param_comms).
    tr = job([step(0), (0, 1, "c10d::allreduce_", 10, 40, 0),
              (0, 1, "record_param_comms", 12, 8, 800), (0, 1, "c10d::broadcast_", 60, 5, 16)])
    r = rank_analysis(tr).ranks.iloc[0]
    assert r["bytes"] == 816 and r["collectives"] == 2
    # With backend spans carrying bytes, those alone count.
    tr = job([step(0), (0, 1, "c10d::allreduce_", 10, 40, 999),
              (0, 2, "gloo:all_reduce", 12, 30, 800)])
    assert rank_analysis(tr).ranks.iloc[0]["bytes"] == 800


@pytest.fixture(scope="module")
def sampled():
    files = [shared_trace(f"sampled-128rank-rank{r}.json.gz") for r in (0, 1)]
    return files, load(files)


def test_sampled_128rank_job_imports_as_two_ranks(sampled) -> None:
    _, tr = sampled
    assert tr.ranks == [0, 1] and tr.meta["workers"] == 2
    assert {v["world_size"] for v in tr.meta["distributed"].values()} == {128}
    ra = rank_analysis(tr)
    assert list(ra.ranks["steps"]) == [2, 2]
    assert sorted(ra.stragglers["step"]) == [551, 552]
    assert set(ra.stragglers["slowest_rank"]) <= {0, 1}
    assert (ra.stragglers["excess_ns"] >= 0).all()


def test_sampled_comm_split_uses_the_nccl_kernels(sampled) -> None:
    files, tr = sampled
    ra = rank_analysis(tr)
    c = ra.collectives
    assert c["name"].str.startswith("ncclKernel_").all() and c["matched"].all()
    for rank, f in enumerate(files):
        with gzip.open(f, "rt") as fh:
            doc = json.load(fh)
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"
                   and e["name"].startswith("ncclKernel_")]
        assert (c["rank"] == rank).sum() == len(kernels)
    # Exactly one rank of each collective is the last to enter it and so waits nothing.
    per = c.groupby(["step", "name", "seq"])["wait_ns"].min()
    assert (per == 0).all()
    assert ((c["wait_ns"] >= 0) & (c["wait_ns"] <= c["dur"])).all()
    ps = ra.per_step
    assert (ps["wait_ns"] + ps["transfer_ns"] == ps["comm_ns"]).all()
    assert (ps[list(PHASES)].sum(axis=1) == ps["dur_ns"]).all()
    assert (ra.ranks["wait_ns"] > 0).any() and (ra.ranks["bandwidth_Bps"] > 0).all()


def _nccl_bytes(doc: dict) -> dict[int, int]:
    """Payload per step of the host nccl:* spans, computed from the raw JSON."""
    size = {"float": 4, "int": 4, "long": 8, "unsigned char": 1, "signed char": 1}
    steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"])
             for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    out = dict.fromkeys((s for s, _, _ in steps), 0)
    for e in doc["traceEvents"]:
        if e.get("cat") != "user_annotation" or not e["name"].startswith("nccl:"):
            continue
        a = e.get("args", {})
        n = int(np.prod(a["Input Dims"][0])) * size[a["Input type"][0]]
        for s, t0, t1 in steps:
            if t0 <= e["ts"] < t1:
                out[s] += n
    return out


def test_sampled_bytes_match_the_nccl_spans(sampled) -> None:
    files, tr = sampled
    ps = rank_analysis(tr).per_step.set_index(["rank", "step"])
    for rank, f in enumerate(files):
        with gzip.open(f, "rt") as fh:
            expect = _nccl_bytes(json.load(fh))
        for s, n in expect.items():
            assert ps.loc[(rank, s), "bytes"] == n, (rank, s)


def test_report_by_rank_on_the_sampled_job() -> None:
    files = [str(shared_trace(f"sampled-128rank-rank{r}.json.gz")) for r in (0, 1)]
    res = run_cli("report", *files, "--by", "rank")
    assert res.returncode == 0, res.stderr
    for title in ("Per rank", "Communication per rank", "Straggler per step"):
        assert title in res.stdout
    res = run_cli("report", *files, "--by", "rank", "--format", "json")
    doc = json.loads(res.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert {"wait_ns", "transfer_ns", "bytes", "bandwidth_Bps", "overlap"} <= set(doc["ranks"][0])
    assert [s["step"] for s in doc["stragglers"]] == [551, 552]
    res = run_cli("report", *files, "--by", "rank", "--format", "csv")
    head = res.stdout.splitlines()[0].split(",")
    assert head[:3] == ["rank", "steps", "dur_ns"] and "wait_ns" in head
    assert len(res.stdout.splitlines()) == 3


def test_ddp_fixture_all_reduces_every_gradient_once_per_step() -> None:
    tr = load(DDP)
    ra = rank_analysis(tr)
    assert tr.ranks == [0, 1]
    c = ra.collectives
    assert set(c["name"]) == {"gloo:all_reduce"} and c["matched"].all()
    # LeNet-5 has 62,006 float32 parameters: DDP all-reduces 248,024 bytes per step.
    assert (ra.per_step["bytes"] == 62_006 * 4).all()
    assert (ra.per_step["collectives"] == 1).all()
    r = ra.ranks
    assert (r[list(PHASES)].sum(axis=1) - r["dur_ns"]).abs().max() < 1e-6
    assert (r["wait_ns"] + r["transfer_ns"] - r["comm_ns"]).abs().max() < 1e-6


def test_clock_offsets_shift_each_rank(tmp_path: Path) -> None:
    base = load(DDP)
    moved = normalize(DDP, {"clock_offsets_ns": {"1": 5_000_000}})
    for rank, delta in ((0, 0), (1, 5_000_000)):
        a = base.events.loc[base.events["rank"] == rank, "ts"].to_numpy()
        b = moved.events.loc[moved.events["rank"] == rank, "ts"].to_numpy()
        assert (b - a == delta).all()
    assert moved.meta["clock_offsets_ns"] == {"0": 0, "1": 5_000_000}
    # The offset written into a trace file by the collector (opprofClock) is applied too.
    with gzip.open(DDP[1], "rb") as f:
        data = f.read()
    stamped = tmp_path / "rank1.pt.trace.json"
    stamped.write_bytes(data.replace(b'"opprofClock": {"offset_ns": 0, "error_ns": 0}',
                                     b'"opprofClock": {"offset_ns": -7, "error_ns": 3}', 1))
    tr = normalize([DDP[0], stamped])
    assert tr.meta["clock_offsets_ns"] == {"0": 0, "1": -7}
    assert tr.meta["clock_error_ns"]["1"] == 3
    a = base.events.loc[base.events["rank"] == 1, "ts"].to_numpy()
    b = tr.events.loc[tr.events["rank"] == 1, "ts"].to_numpy()
    assert (b - a == -7).all()


@pytest.mark.parametrize("folder", ["mxnet/lenet5-ps-sync", "tf/lenet5-allreduce-2w",
                                    "tf/lenet5-ps-async-2w1s"])
def test_other_frameworks_distributed_fixtures(folder: str) -> None:
    path = FIXTURES / folder
    tr = load([path])
    ra = rank_analysis(tr)
    assert tr.ranks == [0, 1] and list(ra.ranks["rank"]) == [0, 1]
    ps = ra.per_step
    assert (ps[list(PHASES)].sum(axis=1) == ps["dur_ns"]).all()
    assert (ps["wait_ns"] + ps["transfer_ns"] == ps["comm_ns"]).all()
    assert (ps["collectives"] > 0).all() and len(ra.stragglers) == ps["step"].nunique()
    if tr.meta.get("mode") == "ps-async":
        assert not ra.synchronous and (ps["wait_ns"] == 0).all()
