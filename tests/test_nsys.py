"""Nsight Systems SQLite exports import: every row kept, kernels under the operator that
launched them, NVTX names and version differences handled, clear errors."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from opprof.errors import OpprofError
from opprof.normalizers import normalize
from tests.conftest import run_cli
from tests.nvidia_sqlite import SESSION_UTC_NS, K, torch_job, write_nsys

RANK_PIDS = (4242, 4243)
PID_SQL = "((globalPid >> 24) & 16777215)"
TID_PID_SQL = "((globalTid >> 24) & 16777215)"


@pytest.fixture(scope="module")
def nsys_db(tmp_path_factory) -> Path:
    return write_nsys(tmp_path_factory.mktemp("nsys") / "ddp.sqlite", torch_job(ranks=2, steps=2))


@pytest.fixture(scope="module")
def trace(nsys_db: Path):
    return normalize([nsys_db])


def _rows(db: Path, sql: str) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        return {name: n for name, n in con.execute(sql)}
    finally:
        con.close()


def _counts(trace, kind: str) -> dict[str, int]:
    ev = trace.events
    return ev[ev["kind"] == kind]["name"].astype(str).value_counts().to_dict()


def test_export_is_recognised_and_described(trace) -> None:
    m = trace.meta
    assert m["source_formats"] == ["nsys"]
    assert m["workers"] == 2 and trace.ranks == [0, 1]
    assert m["device"] == "cuda" and m["gpus"] == ["NVIDIA A100-SXM4-80GB"]
    assert m["nsys_version"] == ["2024.6.2.225"]
    assert m["framework"] == "torch"
    # ranks follow the devices the processes use; the launcher (NVTX only) is left out
    assert m["nsys_processes"] == {"0": "ddp.sqlite:4242", "1": "ddp.sqlite:4243"}
    assert m["nsys_skipped_events"] == 1
    assert "torchrun" not in set(trace.events["name"].astype(str))


def test_kernel_and_api_counts_per_name_equal_the_table_rows(nsys_db: Path, trace) -> None:
    kernels = _rows(nsys_db, f"SELECT s.value, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                             f"JOIN StringIds s ON s.id = k.demangledName "
                             f"WHERE {PID_SQL} IN {RANK_PIDS} GROUP BY s.value")
    assert _counts(trace, "kernel") == kernels
    assert sum(kernels.values()) == 2 * 2 * 18  # ranks x steps x kernels per step
    api = _rows(nsys_db, f"SELECT s.value, COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                         f"JOIN StringIds s ON s.id = r.nameId "
                         f"WHERE {TID_PID_SQL} IN {RANK_PIDS} GROUP BY s.value")
    assert _counts(trace, "runtime") == api


def test_copies_and_sets_are_named_like_kineto_with_their_bytes(nsys_db: Path, trace) -> None:
    ev = trace.events
    copies = ev[ev["kind"] == "memcpy"]
    by_kind = _rows(nsys_db, "SELECT copyKind, COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                             "GROUP BY copyKind")
    assert copies["name"].astype(str).value_counts().to_dict() == {
        "Memcpy HtoD (Pinned -> Device)": by_kind[1],
        "Memcpy DtoH (Device -> Pageable)": by_kind[2]}
    total = _rows(nsys_db, "SELECT 'b', SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY")["b"]
    assert int(copies["bytes"].sum()) == total
    h2d = copies[copies["name"].astype(str).str.startswith("Memcpy HtoD")]
    assert set(h2d["op"].astype(str)) == {"h2d"} and set(h2d["phase"].astype(str)) == {"h2d"}
    sets = ev[ev["kind"] == "memset"]
    assert set(sets["name"].astype(str)) == {"Memset (Device)"} and len(sets) == 4


def test_nvtx_ranges_keep_the_operator_name_and_move_torch_suffixes_to_detail(
        nsys_db: Path, trace) -> None:
    # an independent reading of the table: text, or the registered string, cut at ", seq = "
    nvtx = _rows(nsys_db, f"""
        WITH t AS (SELECT COALESCE(n.text, s.value) AS x FROM NVTX_EVENTS n
                   LEFT JOIN StringIds s ON s.id = n.textId
                   WHERE n.eventType IN (34, 59, 60) AND {TID_PID_SQL} IN {RANK_PIDS})
        SELECT CASE WHEN instr(x, ', seq = ') > 0 THEN substr(x, 1, instr(x, ', seq = ') - 1)
                    ELSE x END, COUNT(*) FROM t GROUP BY 1""")
    ev = trace.events
    host = ev[(ev["device"] == "cpu") & ev["kind"].isin(["cpu_op", "marker", "io", "comm"])]
    assert host["name"].astype(str).value_counts().to_dict() == nvtx
    conv = ev[ev["name"] == "aten::conv2d"]
    assert len(conv) == 4 and conv["detail"].str.match(r"seq = \d+, op_id = \d+$").all()
    assert set(conv["kind"].astype(str)) == {"cpu_op"}
    # registered strings (textId) resolve; user ranges are markers, torch's ops operators
    markers = ev[ev["kind"] == "marker"]
    assert {"opprof.forward", "opprof.backward", "opprof.step#0", "pin_memory batch",
            "epoch 0"} <= set(markers["name"].astype(str))
    assert (ev.loc[ev["name"] == "epoch 0", "dur"] == 0).all()  # an NVTX mark
    pin = ev[ev["name"] == "pin_memory batch"]  # a start/end range on the pin thread
    assert set(pin["tid"]) == {4242 + 19, 4243 + 19}


def test_kernels_land_under_the_operator_that_launched_them(trace) -> None:
    ev = trace.events
    kern = ev[ev["kind"] == "kernel"]

    def ops_of(kernel) -> set[tuple[str, str]]:
        sel = kern[kern["name"] == kernel.demangled]
        return set(zip(sel["op"].astype(str), sel["phase"].astype(str), strict=True))

    assert ops_of(K["conv"]) == {("convolution", "forward")}
    assert ops_of(K["bn"]) == {("batch_norm", "forward")}
    assert ops_of(K["relu"]) == {("activation", "forward")}
    assert ops_of(K["softmax"]) == {("loss", "forward")}
    assert ops_of(K["gemm"]) == {("fully_connected", "forward"),
                                 ("fully_connected_backward", "backward")}
    assert ops_of(K["dgrad"]) == ops_of(K["wgrad"]) == {("convolution_backward", "backward")}
    assert ops_of(K["bn_bw"]) == {("batch_norm_backward", "backward")}
    assert ops_of(K["relu_bw"]) == {("activation_backward", "backward")}
    assert ops_of(K["nll_bw"]) == {("loss_backward", "backward")}
    assert ops_of(K["nccl"]) == {("all_reduce", "comm")}
    assert ops_of(K["sgd"]) == {("weights_update", "update")}
    # launched outside every range, or with no recorded launch: the op their own name gives
    # (kineto.csv's kernel rows: a fill or a copy is memory), phase other, and still there
    assert ops_of(K["fill"]) == ops_of(K["copy"]) == {("memory", "other")}
    assert (kern["name"] == K["copy"].demangled).sum() == 4
    assert kern["counted"].all()
    # kernels run on the device lane of their stream, not on a host thread
    assert set(kern["device"].astype(str)) == {"cuda:0", "cuda:1"}
    assert set(kern["tid"]) == {7, 13}


def test_steps_come_from_the_step_ranges_and_hold_all_gpu_work(trace) -> None:
    b = trace.step_bounds()
    assert b.groupby("rank").size().to_dict() == {0: 2, 1: 2}
    dev = trace.events[trace.events["kind"].isin(["kernel", "memcpy", "memset"])]
    assert (dev["step"] >= 0).all()  # the loss.item() sync ends each step


def test_timestamps_are_utc_nanoseconds(trace) -> None:
    assert int(trace.events["ts"].min()) >= SESSION_UTC_NS


def test_older_export_layouts_import_the_same(nsys_db: Path, trace, tmp_path: Path) -> None:
    """Before 2021: text only (no textId), no mangledName, TARGET_INFO_CUDA_GPU, no
    session start time (timestamps stay session-relative)."""
    old = tmp_path / "old.sqlite"
    shutil.copy(nsys_db, old)
    con = sqlite3.connect(old)
    con.executescript("""
        UPDATE NVTX_EVENTS SET text = (SELECT value FROM StringIds WHERE id = textId)
            WHERE textId IS NOT NULL;
        ALTER TABLE NVTX_EVENTS DROP COLUMN textId;
        ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN mangledName;
        ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN greenContextId;
        DROP TABLE TARGET_INFO_GPU; DROP TABLE TARGET_INFO_CUDA_DEVICE;
        DROP TABLE TARGET_INFO_SESSION_START_TIME; DROP TABLE META_DATA_EXPORT;
        CREATE TABLE TARGET_INFO_CUDA_GPU (deviceId INTEGER, name TEXT);
        INSERT INTO TARGET_INFO_CUDA_GPU VALUES (0, 'Tesla V100-SXM2-32GB'),
            (1, 'Tesla V100-SXM2-32GB');
    """)
    con.commit()
    con.close()
    tr = normalize([old])
    assert tr.meta["gpus"] == ["Tesla V100-SXM2-32GB"]
    assert int(tr.events["ts"].min()) < SESSION_UTC_NS
    for col in ("name", "op", "phase", "kind"):
        assert (tr.events[col].astype(str).value_counts().to_dict()
                == trace.events[col].astype(str).value_counts().to_dict())


def test_two_exports_are_two_groups_of_ranks(nsys_db: Path) -> None:
    tr = normalize([nsys_db, nsys_db])
    assert tr.ranks == [0, 1, 2, 3] and tr.meta["workers"] == 4


def test_a_report_without_nsys_on_path_is_a_clear_error(tmp_path: Path) -> None:
    if shutil.which("nsys"):
        pytest.skip("nsys is installed here")
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not really a report")
    with pytest.raises(OpprofError, match="needs nsys on PATH"):
        normalize([rep])
    res = run_cli("import", str(rep), "-o", str(tmp_path / "x.trace"))
    assert res.returncode == 2
    assert "needs nsys on PATH" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "x.trace").exists()


def test_sqlite_that_is_not_an_nsys_export_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "other.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, text TEXT)")
    con.commit()
    con.close()
    with pytest.raises(OpprofError, match="no kernels, CUDA calls or NVTX ranges"):
        normalize([db])
