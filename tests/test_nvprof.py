"""nvprof --export-profile databases import: every row kept, NVTX markers paired and placed
on their thread, kernels under the operator that launched them — and the same job seen by
nvprof and by Nsight Systems gives the same operator totals."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from opprof.analysis.ops import op_table
from opprof.normalizers import normalize
from opprof.normalizers.nvprof import RUNTIME_CBID
from tests.nvidia_sqlite import EPOCH_NS, K, torch_job, write_nsys, write_nvprof


@pytest.fixture(scope="module")
def job():
    return torch_job(ranks=1, steps=2)


@pytest.fixture(scope="module")
def nvvp(tmp_path_factory, job) -> Path:
    return write_nvprof(tmp_path_factory.mktemp("nvprof") / "ddp.nvvp", job)


@pytest.fixture(scope="module")
def trace(nvvp: Path):
    return normalize([nvvp])


def _sql(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_export_is_recognised_and_described(trace) -> None:
    m = trace.meta
    assert m["source_formats"] == ["nvprof"] and m["workers"] == 1
    assert m["gpus"] == ["Tesla V100-SXM2-16GB"] and m["device"] == "cuda"
    assert int(trace.events["ts"].min()) >= EPOCH_NS  # absolute CUPTI nanoseconds


def test_counts_per_name_equal_the_table_rows(nvvp: Path, trace) -> None:
    ev = trace.events
    kernels = dict(_sql(nvvp, "SELECT s.value, COUNT(*) FROM "
                              "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL k JOIN StringTable s "
                              "ON s._id_ = k.name GROUP BY s.value"))
    assert ev[ev["kind"] == "kernel"]["name"].astype(str).value_counts().to_dict() == kernels
    api = {RUNTIME_CBID[cbid]: n for cbid, n in
           _sql(nvvp, "SELECT cbid, COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY cbid")}
    assert ev[ev["kind"] == "runtime"]["name"].astype(str).value_counts().to_dict() == api
    opened = _sql(nvvp, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MARKER WHERE flags IN (1, 2)")
    host = ev[(ev["device"] == "cpu") & (ev["kind"] != "runtime")]
    assert len(host) == opened[0][0]
    (copies,), (sets,) = (_sql(nvvp, f"SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_{t}")
                          for t in ("MEMCPY", "MEMSET"))
    assert (ev["kind"] == "memcpy").sum() == copies[0] and (ev["kind"] == "memset").sum() == sets[0]
    names = set(ev.loc[ev["kind"] == "memcpy", "name"].astype(str))
    assert names == {"Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)"}


def test_markers_pair_start_and_end_on_their_thread(trace, job) -> None:
    ev = trace.events
    want = {(n["text"].split(", seq = ")[0], n["tid"], n["start"] + EPOCH_NS,
             (n["end"] or n["start"]) - n["start"]) for n in job.nvtx if n["pid"] == 4242}
    host = ev[(ev["device"] == "cpu") & (ev["kind"] != "runtime")]
    got = set(zip(host["name"].astype(str), host["tid"], host["ts"], host["dur"], strict=True))
    assert got == want
    conv = ev[ev["name"] == "aten::conv2d"]
    assert conv["detail"].str.match(r"seq = \d+, op_id = \d+$").all()


def test_kernels_land_under_the_operator_that_launched_them(trace) -> None:
    kern = trace.events[trace.events["kind"] == "kernel"]

    def ops_of(kernel) -> set[tuple[str, str]]:
        sel = kern[kern["name"] == kernel.mangled]  # nvprof keeps mangled names
        return set(zip(sel["op"].astype(str), sel["phase"].astype(str), strict=True))

    assert ops_of(K["conv"]) == {("convolution", "forward")}
    assert ops_of(K["dgrad"]) == {("convolution_backward", "backward")}
    assert ops_of(K["bn_bw"]) == {("batch_norm_backward", "backward")}
    assert ops_of(K["nccl"]) == {("all_reduce", "comm")}
    assert ops_of(K["sgd"]) == {("weights_update", "update")}
    # no launch recorded: the op their own name gives (kineto.csv's kernel rows), phase other
    assert ops_of(K["fill"]) == ops_of(K["copy"]) == {("memory", "other")}
    assert len(kern) == 2 * 18


def test_same_job_in_nvprof_and_nsys_gives_the_same_operator_totals(
        trace, job, tmp_path: Path) -> None:
    nsys = normalize([write_nsys(tmp_path / "ddp.sqlite", job)])
    for where in ("host", "device"):
        a = op_table(trace, where).set_index(["op", "phase"])[["count", "total_ns"]]
        b = op_table(nsys, where).set_index(["op", "phase"])[["count", "total_ns"]]
        assert a.sort_index().equals(b.sort_index()), where


def test_driver_calls_fill_in_only_where_no_runtime_call_has_the_id(
        nvvp: Path, tmp_path: Path) -> None:
    db = tmp_path / "driver.nvvp"
    shutil.copy(nvvp, db)
    con = sqlite3.connect(db)
    corr, start = con.execute("SELECT correlationId, start FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                              "WHERE cbid = 211 LIMIT 1").fetchone()
    # cuLaunchKernel under that cudaLaunchKernel (same id), and one launch of its own
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_DRIVER VALUES (NULL, 307, ?, ?, 4242, 4242, "
                "?, 0)", (start + 500, start + 2500, corr))
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_DRIVER VALUES (NULL, 307, ?, ?, 4242, 4242, "
                "777777, 0)", (start + 500, start + 2500))
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_MARKER_DATA SET category = 3 "
                "WHERE id = (SELECT MIN(id) FROM CUPTI_ACTIVITY_KIND_MARKER_DATA)")
    con.commit()
    con.close()
    ev = normalize([db]).events
    assert (ev["name"] == "cuLaunchKernel").sum() == 1
    assert set(ev.loc[ev["name"] == "cuLaunchKernel", "kind"].astype(str)) == {"runtime"}
    assert ev["detail"].astype(str).str.contains("category = 3").sum() == 1
