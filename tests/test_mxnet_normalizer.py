"""The MXNet normalizer on real MXNet 1.9 traces (fixtures/mxnet): every operator event kept
once and in agreement with MXNet's own aggregate, pairs, lanes, roles, steps and phases."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from opprof.analysis.breakdown import step_breakdown
from opprof.analysis.ops import native_totals
from opprof.normalizers import kineto, normalize, read_json
from opprof.normalizers import mxnet as mxnorm
from opprof.normalizers.events import INFERRED_TID
from opprof.taxonomy import mapping_table
from tests.conftest import FIXTURES, run_cli, shared_trace

SINGLE = FIXTURES / "mxnet" / "lenet5-single"
PS_SYNC = FIXTURES / "mxnet" / "lenet5-ps-sync"
PHASE_TASKS = ("opprof.load", "opprof.forward", "opprof.backward", "opprof.update")


def aggregate_mismatches(trace, folder: Path) -> list[str]:
    """Per worker rank and native name: count and total of the events table against MXNet's
    own aggregate (``rankR_worker.dumps.txt``), which must agree within 1%."""
    bad = []
    for dumps in sorted(folder.glob("rank*_worker.dumps.txt")):
        rank = int(dumps.name.removeprefix("rank").split("_")[0])
        agg = mxnorm.parse_aggregate(dumps.read_text())
        agg = agg[~agg["name"].str.startswith("MXNet C API ")]  # counters, not events
        ev = trace.events[trace.events["rank"] == rank]
        got = ev.groupby("name", observed=True)["dur"].agg(["size", "sum"])
        for row in agg.itertuples():
            count, total = got.loc[row.name] if row.name in got.index else (0, 0)
            if (abs(count - row.count) > 0.01 * row.count
                    or abs(total - row.total_ns) > 0.01 * row.total_ns + 1000):
                bad.append(f"rank {rank} {row.section}/{row.name}: trace {count} events "
                           f"{total} ns, MXNet {row.count} events {row.total_ns:.0f} ns")
    return bad


@pytest.fixture(scope="module")
def single():
    return normalize([SINGLE])


@pytest.fixture(scope="module")
def ps_sync():
    return normalize([PS_SYNC])


def test_claims_mxnet_dumps_and_not_kineto() -> None:
    for path in [*SINGLE.glob("*.json.gz"), *PS_SYNC.glob("*.json.gz")]:
        doc = read_json(path)
        assert mxnorm.claims_json(doc), path
        assert not kineto.claims_json(doc), path
    assert not mxnorm.claims_json(read_json(shared_trace("alexnet-1gpu.json.gz")))
    assert not mxnorm.claims_json({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a"}]})
    assert not mxnorm.claims_json([1, 2])


@pytest.mark.parametrize("folder", [SINGLE, PS_SYNC], ids=["single", "ps-sync"])
def test_events_agree_with_mxnets_own_aggregate(folder: Path) -> None:
    trace = normalize([folder])
    assert aggregate_mismatches(trace, folder) == []
    sections = set(mxnorm.parse_aggregate(next(folder.glob("*.dumps.txt")).read_text())["section"])
    assert {"operator", "MXNET_C_API", "opprof", "opprof,frame"} <= sections


def test_every_native_duration_is_one_event(single) -> None:
    """Each B/E (and b/e, ( )) pair becomes one event; the operator domain's copies do not."""
    with gzip.open(SINGLE / "rank0_worker.json.gz", "rt") as f:
        native = json.load(f)["traceEvents"]
    begins = Counter(e["name"] for e in native if e.get("ph") in ("B", "b", "(")
                     and e.get("cat") != "operator")
    begins.update(e["name"] for e in native if e.get("ph") == "B" and e.get("cat") == "operator")
    got = native_totals(single)["count"]
    assert dict(got[got > 0]) == dict(begins)
    assert (single.events["dur"] >= 0).all()


def test_no_counted_operator_overlaps_another_on_its_lane(ps_sync) -> None:
    ev = ps_sync.events
    ops = ev[ev["counted"]].sort_values(["rank", "pid", "tid", "ts"])
    end = ops["ts"] + ops["dur"]
    prev_end = end.groupby([ops["rank"], ops["pid"], ops["tid"]]).shift(1)
    assert not (ops["ts"] < prev_end).any()


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            total += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0 if cur_e is None else cur_e - cur_s)


def test_concurrent_kvstore_operators_count_once_per_instant(ps_sync) -> None:
    ev = ps_sync.events
    workers = ev[ev["role"] == "worker"]
    kv = workers[workers["name"].astype(str).str.startswith("KVStore")]
    assert len(kv) == 2 * 2 * 10  # 2 workers x 2 steps x 10 parameter arrays
    # push-pulls keep the parameter server's name, and so do the windows around them
    assert (kv["op"] == "push").all() and (kv["phase"] == "comm").all()
    assert not kv["counted"].any()  # nested in their window
    windows = workers[workers["name"] == mxnorm.COMM_WINDOW]
    assert windows["counted"].all() and (windows["kind"] == "comm").all()
    assert (windows["op"] == "push").all()
    assert set(windows["step"]) == {0, 1}
    for rank in (0, 1):
        mine = kv[kv["rank"] == rank]
        union = _union_ns(list(zip(mine["ts"], mine["ts"] + mine["dur"], strict=True)))
        assert windows.loc[windows["rank"] == rank, "dur"].sum() == union
    assert int(windows["detail"].str.split().str[0].astype(int).sum()) == len(kv)
    # the bytes a worker moves per step (push every gradient, pull every weight: 2 x 62,006
    # float32), read from the collector's .meta files beside the traces, sit on its windows
    per_step = windows.groupby(["rank", "step"])["bytes"].sum()
    assert (per_step == 2 * 4 * 62_006).all() and len(per_step) == 4
    assert ps_sync.meta["comm_bytes_per_step"] == {"0": 2 * 4 * 62_006, "1": 2 * 4 * 62_006}


def test_ranks_and_roles_come_from_file_names(ps_sync) -> None:
    ev = ps_sync.events
    roles = ev.groupby("rank", observed=True)["role"].first().astype(str).to_dict()
    assert roles == {0: "worker", 1: "worker", 2: "server"}
    assert ps_sync.ranks == [0, 1]
    assert ps_sync.meta["workers"] == 2 and ps_sync.meta["servers"] == 1
    assert ps_sync.meta["clock_offsets_ns"] == {"0": 0, "1": 0, "2": 0}
    assert ps_sync.meta["roles"] == {"0": "worker", "1": "worker", "2": "server"}


def test_servers_update_the_weights_within_the_workers_steps(ps_sync) -> None:
    ev = ps_sync.events
    server = ev[ev["role"] == "server"]
    updates = server[server["op"] == "weights_update"]
    assert len(updates) == 2 * 10  # the server updates each of the 10 arrays once per step
    assert set(updates["step"]) == {0, 1}
    bounds = ps_sync.step_bounds()
    assert set(bounds["rank"]) == {0, 1}  # servers have no steps of their own
    assert (bounds.groupby("rank").size() == 2).all()


@pytest.mark.parametrize("which", ["single", "ps_sync"])
def test_phases_sum_to_the_step_and_comm_only_in_ps(which: str, request) -> None:
    trace = request.getfixturevalue(which)
    steps = step_breakdown(trace)
    assert len(steps) == (2 if which == "single" else 4)
    phases = ["load", "h2d", "forward", "backward", "update", "comm", "other"]
    assert (steps[phases].sum(axis=1) == steps["dur_ns"]).all()
    for p in ("load", "forward", "backward", "update"):
        assert (steps[p] > 0).all(), p
    if which == "single":
        assert (steps["comm"] == 0).all()
    else:
        assert (steps["comm"] > 0).all()
        assert (steps.groupby("rank")["comm"].sum() > 0).all()


def test_step_and_phase_markers(single) -> None:
    ev = single.events
    names = Counter(ev["name"].astype(str))
    assert names["opprof.step#0"] == names["opprof.step#1"] == 1
    for task in PHASE_TASKS:
        assert names[task] == 2, task  # only the profiled steps carry markers
    load = ev[ev["name"] == "opprof.load"]
    assert (load["op"] == "data_load").all() and load["counted"].all()
    conv = ev[ev["name"] == "Convolution"]
    assert (conv["phase"] == "forward").all() and (conv["op"] == "convolution").all()
    bconv = ev[ev["name"] == "_backward_Convolution"]
    assert (bconv["phase"] == "backward").all()
    upd = ev[ev["name"] == "multi_sgd_mom_update"]
    assert (upd["op"] == "weights_update").all() and (upd["phase"] == "update").all()
    api = ev[ev["name"].astype(str).str.startswith("MX")]
    # a batch enters MXNet through nd.array's copy: data loading, here inside opprof.load
    copy = api["name"] == "MXNDArraySyncCopyFromCPU"
    assert copy.any() and (api.loc[copy, "op"] == "data_load").all()
    assert (api.loc[copy, "phase"] == "load").all() and (api.loc[copy, "kind"] == "io").all()
    api = api[~copy]
    assert len(api) and (api["kind"] == "runtime").all() and not api["counted"].any()


def test_every_operator_name_in_the_fixtures_has_a_row() -> None:
    table = mapping_table("mxnet")
    names = set()
    for path in [*SINGLE.glob("*.json.gz"), *PS_SYNC.glob("*.json.gz")]:
        names |= {e["name"] for e in read_json(path)["traceEvents"] if e.get("cat") == "operator"}
    cls = table.classify(sorted(names))
    assert (cls["row"] >= 0).all(), sorted(cls.index[cls["row"] < 0])


def test_timestamps_are_exact_nanoseconds(single) -> None:
    with gzip.open(SINGLE / "rank0_worker.json.gz", "rt") as f:
        first = min(e["ts"] for e in json.load(f)["traceEvents"] if e.get("ph") in ("B", "b", "("))
    assert int(single.events["ts"].min()) == first * 1000


def _doc(*events: dict) -> dict:
    return {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "cpu/0"}}, *events],
        "displayTimeUnit": "ms"}


def _span(name: str, b: int, e: int, tid: int = 7, cat: str = "operator") -> list[dict]:
    return [{"name": name, "cat": cat, "ph": "B", "ts": b, "pid": 0, "tid": tid},
            {"name": name, "cat": cat, "ph": "E", "ts": e, "pid": 0, "tid": tid}]


def test_pairs_and_lanes_of_overlapping_async_operators(tmp_path: Path) -> None:
    """Three concurrent kvstore operators on one thread (written in the order they end), and
    a DeleteVariable inside a FullyConnected: the kvstore ones paired right and counted once
    per instant through one window, the DeleteVariable nested and counted once."""
    big = 18_000_000_000_000_000_000  # MXNet's tids are unsigned 64-bit hashes
    events = [*_span("FullyConnected", 100, 200, big), *_span("DeleteVariable", 150, 151, big),
              *_span("KVStoreDistDefaultStoragePushPull", 310, 350, big),
              *_span("KVStoreDistDefaultStoragePushPull", 300, 400, big),
              *_span("KVStoreDistDefaultStoragePushPull", 320, 450, big),
              {"name": "act", "cat": "operator", "ph": "B", "ts": 500, "pid": 0, "tid": 1,
               "args": {"act_type": "tanh"}},
              {"name": "act", "cat": "operator", "ph": "E", "ts": 510, "pid": 0, "tid": 1}]
    path = tmp_path / "rank0_worker.json"
    path.write_text(json.dumps(_doc(*events)))
    ev = normalize([path]).events.sort_values("ts")
    kv = ev[ev["name"] == "KVStoreDistDefaultStoragePushPull"]
    assert sorted(kv["dur"] // 1000) == [40, 100, 130]
    assert not kv["counted"].any() and kv["tid"].nunique() == 1
    window = ev[ev["name"] == mxnorm.COMM_WINDOW]
    assert window[["ts", "dur"]].values.tolist() == [[300_000, 150_000]]
    assert window["counted"].all() and window["tid"].iloc[0] == kv["tid"].iloc[0]
    dv = ev[ev["name"] == "DeleteVariable"].iloc[0]
    assert not dv["counted"] and dv["op"] == "fully_connected"
    assert ev.loc[ev["name"] == "act", "detail"].tolist() == ["tanh"]


def test_an_unfinished_operator_is_left_out(tmp_path: Path) -> None:
    events = [*_span("Convolution", 100, 200),
              {"name": "Convolution", "cat": "operator", "ph": "B", "ts": 300, "pid": 0,
               "tid": 7}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_doc(*events)))
    ev = normalize([path]).events
    ev = ev[ev["tid"] != INFERRED_TID]  # the phase span opprof infers is no native event
    assert ev["name"].tolist() == ["Convolution"] and ev["dur"].tolist() == [100_000]


def test_parse_aggregate_reads_every_timed_section() -> None:
    agg = mxnorm.parse_aggregate((SINGLE / "rank0_worker.dumps.txt").read_text())
    conv = agg[(agg["section"] == "operator") & (agg["name"] == "Convolution")].iloc[0]
    assert conv["count"] == 4 and conv["total_ns"] > 0
    assert conv["min_ns"] <= conv["avg_ns"] <= conv["max_ns"]
    assert "Device Storage" not in set(agg["section"])  # kB, not time
    frames = agg[agg["section"] == "opprof,frame"]
    assert sorted(frames["name"]) == ["opprof.step#0", "opprof.step#1"]
    assert np.isclose(agg.loc[agg["name"] == "opprof.forward", "count"], 2).all()


def test_import_command_reads_a_ps_folder(tmp_path: Path) -> None:
    out = tmp_path / "ps.trace"
    res = run_cli("import", str(PS_SYNC), "-o", str(out))
    assert res.returncode == 0, res.stderr
    res = run_cli("report", str(out), "--by", "rank", "--format", "json")
    assert res.returncode == 0, res.stderr
    assert '"comm"' in res.stdout
