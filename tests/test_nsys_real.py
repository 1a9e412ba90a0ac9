"""The nsys importer on a real Nsight Systems export (fixtures/shared/nsys: an MPI + CUDA saxpy
on an A100 system, from Pipit's test data): every kernel, copy, CUDA runtime call and NVTX
range read, each kernel under the runtime call that launched it; an export lacking a table
is read with what it has and says so in one ⚠ line."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from opprof.job import report
from opprof.normalizers import normalize

EXPORT = Path(__file__).resolve().parents[1] / "fixtures" / "shared" / "nsys" / \
    "saxpy-mpi-cuda.sqlite"


def _count(sql: str) -> int:
    con = sqlite3.connect(EXPORT)
    try:
        return int(con.execute(sql).fetchone()[0])
    finally:
        con.close()


@pytest.fixture(scope="module")
def trace():
    return normalize([EXPORT])


def test_real_export_counts_equal_the_exports_tables(trace) -> None:
    ev = trace.events
    kinds = ev["kind"].astype(str).value_counts().to_dict()
    assert kinds["kernel"] == _count("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL") == 5
    assert kinds["memcpy"] == _count("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY") == 15
    assert kinds["runtime"] == _count("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME") == 95
    # the push/pop ranges (eventType 59); the export's other NVTX rows name domains/categories
    assert kinds["marker"] == _count(
        "SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType = 59") == 22
    assert trace.meta["source_formats"] == ["nsys"] and trace.meta["device"] == "cuda"
    assert not trace.meta.get("read_warnings")


def test_every_kernel_and_copy_has_the_runtime_call_that_launched_it(trace) -> None:
    ev = trace.events
    calls = set(ev.loc[ev["kind"] == "runtime", "link"].tolist())
    device = ev[ev["kind"].isin(["kernel", "memcpy"])]
    assert len(device) == 20
    assert set(device["link"].tolist()) <= calls
    # a kernel's time lies after its launch began
    launch = ev[ev["kind"] == "runtime"].drop_duplicates("link").set_index("link")["ts"]
    assert (device["ts"].to_numpy() >= launch.reindex(device["link"]).to_numpy()).all()


@pytest.mark.parametrize("damage", ["DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME",
                                    "DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME"])
def test_export_without_runtime_calls_is_read_and_says_so(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "saxpy.sqlite"
    shutil.copyfile(EXPORT, db)
    con = sqlite3.connect(db)
    con.execute(damage)
    con.commit()
    con.close()
    rep = report([str(db)], jobs=1)
    warnings = rep.meta["read_warnings"]
    assert warnings == {"GPU activities with no CUDA runtime call to launch them (no "
                        "runtime-call rows in the nsys export): their host operators "
                        "unknown": 20}
    ev = normalize([db]).events
    assert (ev["kind"] == "kernel").sum() == 5 and (ev["kind"] == "runtime").sum() == 0


def test_export_without_kernel_table_says_the_launches_lost_their_kernels(
        tmp_path: Path) -> None:
    db = tmp_path / "saxpy.sqlite"
    shutil.copyfile(EXPORT, db)
    con = sqlite3.connect(db)
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    con.commit()
    con.close()
    launches = _count("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                      "ON s.id = r.nameId WHERE s.value LIKE '%Launch%'")
    assert launches >= 5
    rep = report([str(db)], jobs=1)
    assert list(rep.meta["read_warnings"].values()) == [launches]
