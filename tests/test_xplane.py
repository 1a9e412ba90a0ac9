"""The XPlane normalizer on real TensorFlow profiles (fixtures/tf): nothing xprof shows is
lost, TF op names and scopes are classified right, thread-pool work is not counted twice,
ranks and roles and one clock across processes, and totals agree with xprof's own
framework_op_stats."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from opprof.analysis.breakdown import step_breakdown
from opprof.errors import OpprofError
from opprof.taxonomy import CANONICAL_OPS, PHASES
from tests.conftest import FIXTURES, run_cli
from tests.procs import needs
from tests.xprof_check import assert_totals_match_xprof

needs("xprof")

ALLREDUCE = FIXTURES / "tf" / "lenet5-allreduce-2w"
PS = FIXTURES / "tf" / "lenet5-ps-async-2w1s"
TORCH = FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"
MXNET = FIXTURES / "mxnet" / "lenet5-single"


def xplanes(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.xplane.pb"))


@pytest.fixture(scope="module")
def allreduce():
    from opprof.normalizers import normalize

    return normalize([ALLREDUCE])


@pytest.fixture(scope="module")
def ps():
    from opprof.normalizers import normalize

    return normalize([PS])


def viewer_events(path: Path) -> pd.DataFrame:
    """xprof's trace viewer events for one file, read independently of opprof's frame."""
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([str(path)], "trace_viewer",
                                                   {"use_saved_result": False})
    events = json.loads(data)["traceEvents"]
    return pd.DataFrame([e for e in events if e.get("ph") == "X"])


def rank_of(trace, path: Path) -> int:
    return next(r["rank"] for r in trace.meta["ranks"] if r["source"] == str(path))


def test_a_folder_holds_only_xplane_files_for_the_taker(tmp_path: Path) -> None:
    from opprof.normalizers import expand, normalize, xplane

    logdir = tmp_path / "logdir"
    shutil.copytree(ALLREDUCE, logdir)
    # xprof caches its own tool results as .pb files beside the XPlane: never taken.
    for f in xplanes(logdir):
        (f.parent / "ALL_HOSTS.op_stats_v2.pb").write_bytes(b"\x08\x01")
    files = [f for f, _ in expand([logdir])]
    assert files == xplanes(logdir)
    assert all(xplane.claims_file(f, b"") for f in files)
    assert not xplane.claims_file(Path("ALL_HOSTS.op_stats_v2.pb"), b"")
    assert len(normalize([logdir]).meta["ranks"]) == 2


def test_every_trace_viewer_event_is_a_row(allreduce) -> None:
    ev = allreduce.events
    for path in xplanes(ALLREDUCE):
        native = viewer_events(path)
        mine = ev[(ev["rank"] == rank_of(allreduce, path)) & (ev["tid"] != -1)]
        assert len(mine) == len(native)
        got = mine["name"].astype(str).value_counts().sort_index()
        want = native["name"].value_counts().sort_index()
        pd.testing.assert_series_equal(got, want, check_names=False)
        assert int(mine["dur"].sum()) == pytest.approx(native["dur"].sum() * 1000, rel=1e-6)


def test_the_trace_viewer_event_cap_never_cuts_events(monkeypatch, allreduce) -> None:
    from opprof.normalizers import normalize

    monkeypatch.setenv("TF_PROFILER_TRACE_VIEWER_MAX_EVENTS", "100")
    assert len(normalize([ALLREDUCE]).events) == len(allreduce.events)


def test_names_are_xprofs_and_detail_is_the_full_op_name(allreduce) -> None:
    ev = allreduce.events
    conv = ev[ev["name"].astype(str) == "_MklNativeConv2DBackpropInput"]
    assert len(conv) == 8  # 2 ranks x 2 steps x 2 conv layers
    assert conv["detail"].astype(str).str.contains("conv2d").all()
    assert not ev["name"].astype(str).str.contains("opprof.step#|tf.data: ", regex=True).any()


def test_scope_decides_what_the_op_type_cannot(allreduce) -> None:
    ev = allreduce.events
    name, detail = ev["name"].astype(str), ev["detail"].astype(str)
    matmul = ev[name.str.contains("MatMul")]
    grad = detail[matmul.index].str.startswith("gradients/")
    assert set(matmul.loc[grad, "op"]) == {"fully_connected_backward"}
    assert set(matmul.loc[~grad, "op"]) == {"fully_connected"}
    upd = ev[detail.str.startswith("sgd/") & ~name.str.contains("Collective|::")]
    assert set(upd["op"]) == {"weights_update"} and set(upd["phase"]) == {"update"}
    assert set(ev.loc[name == "MaxPoolGrad", "op"]) == {"pooling_backward"}
    assert set(ev.loc[name == "ReluGrad", "op"]) == {"activation_backward"}


def test_collectives_are_comm_on_every_rank(allreduce) -> None:
    ev = allreduce.events
    coll = ev[(ev["name"] == "CollectiveReduceV2") & (ev["step"] >= 0)]
    assert sorted(coll["rank"].unique()) == [0, 1]
    assert (coll["op"] == "all_reduce").all() and (coll["phase"] == "comm").all()
    assert coll["counted"].all()
    sb = step_breakdown(allreduce)
    assert (sb["busy_comm"] > 0).all()


def test_thread_pool_work_is_never_counted(allreduce) -> None:
    ev = allreduce.events
    for wrapper in ("ThreadpoolListener::Region", "ExecutorState::Process", "ParallelFor",
                    "KernelAndDeviceFunc::Run", "EagerKernelExecute", "opprof_update"):
        sel = ev[ev["name"].astype(str) == wrapper]
        assert len(sel), wrapper
        assert not sel["counted"].any(), wrapper
    # Counted events on one thread never overlap: nothing is counted twice on a lane.
    c = ev[ev["counted"]].sort_values(["rank", "tid", "ts"])
    same_lane = (c["rank"].to_numpy()[1:] == c["rank"].to_numpy()[:-1]) & (
        c["tid"].to_numpy()[1:] == c["tid"].to_numpy()[:-1])
    ends = (c["ts"] + c["dur"]).to_numpy()
    assert (c["ts"].to_numpy()[1:][same_lane] >= ends[:-1][same_lane]).all()


def test_input_pipeline_threads_are_data_load(allreduce) -> None:
    ev = allreduce.events
    names = ev["name"].astype(str)
    assert set(ev.loc[names.str.startswith("Iterator::"), "op"]) == {"data_load"}
    flips = ev[names == "ReverseV2"]
    assert len(flips) and set(flips["op"]) == {"data_load"} and set(flips["phase"]) == {"load"}


def test_steps_phases_and_one_clock(allreduce) -> None:
    b = allreduce.step_bounds()
    assert b.groupby("rank")["step"].apply(list).to_dict() == {0: [0, 1], 1: [0, 1]}
    sb = step_breakdown(allreduce)
    assert (sb[list(PHASES)].sum(axis=1) == sb["dur_ns"]).all()
    assert allreduce.meta["clock"] == "epoch"
    # Both workers meet in an all-reduce every step: on one clock their steps end together.
    ends = b.pivot(index="step", columns="rank", values="end")
    assert (abs(ends[0] - ends[1]) < 50_000_000).all()
    assert abs(int(b["start"].iloc[0]) - 1.7e18) < 3e17  # epoch nanoseconds


def test_totals_match_xprof_framework_op_stats(allreduce, ps) -> None:
    for trace, folder in ((allreduce, ALLREDUCE), (ps, PS)):
        for path in xplanes(folder):
            if "chief0" in path.parts:
                continue  # the scheduler runs no TF op
            assert assert_totals_match_xprof(trace, path) > 50


def test_parameter_server_roles_steps_and_receive_waits(ps) -> None:
    ev = ps.events
    roles = {r["rank"]: r["role"] for r in ps.meta["ranks"]}
    assert roles == {0: "worker", 1: "worker", 2: "server", 3: "scheduler"}
    assert ps.meta["workers"] == 2 and ps.meta["servers"] == 1
    # Workers: one step per execution of the scheduled function; servers/scheduler: none.
    b = ps.step_bounds()
    assert sorted(b["rank"].unique()) == [0, 1] and (b.groupby("rank").size() >= 1).all()
    assert (ev.loc[ev["role"] != "worker", "step"] == -1).all()
    # Receives wait on a lane of their own as comm; their Start/Done halves are markers.
    waits = ev[(ev["tid"] == -1) & (ev["role"] == "worker")]
    assert len(waits) and (waits["op"] == "recv").all() and waits["counted"].all()
    assert waits["detail"].astype(str).str.startswith("waiting for ").all()
    sends = ev[(ev["name"] == "_Send") & (ev["role"] == "worker")]
    assert len(sends) and (sends["op"] == "send").all()
    # The optimizer runs on the parameter server.
    server_update = ev[(ev["role"] == "server") & (ev["op"] == "weights_update")]
    assert len(server_update) and not len(ev[(ev["role"] == "worker")
                                             & (ev["op"] == "weights_update")])
    sb = step_breakdown(ps)
    assert (sb[list(PHASES)].sum(axis=1) == sb["dur_ns"]).all() and (sb["comm"] > 0).all()


def test_ranks_fall_back_to_the_folder_names() -> None:
    from opprof.normalizers.xplane import _assign_ranks

    hosts = [{"path": Path(f"run/{d}/plugins/profile/x/h.xplane.pb"), "role": None,
              "rank": None, "task": None, "raw": pd.DataFrame({"rank": [0], "role": ["w"]})}
             for d in ("ps0", "worker1", "worker0", "chief0")]
    _assign_ranks(hosts)
    assert [(h["role"], h["rank"]) for h in hosts] == [
        ("server", 2), ("worker", 1), ("worker", 0), ("scheduler", 3)]


def test_broken_files_are_one_clear_error(tmp_path: Path) -> None:
    from opprof.normalizers import normalize

    empty = tmp_path / "empty.xplane.pb"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.xplane.pb"
    junk.write_bytes(b"this is not a protobuf at all" * 10)
    for f, msg in ((empty, "empty"), (junk, "not a readable XPlane")):
        with pytest.raises(OpprofError, match=msg):
            normalize([f])
    res = run_cli("import", str(junk), "-o", str(tmp_path / "x.trace"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_cli_imports_a_logdir_and_diffs_against_torch(tmp_path: Path) -> None:
    from opprof.trace import read_parquet

    out = tmp_path / "tf.trace"
    res = run_cli("import", str(ALLREDUCE), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "2 rank(s)" in res.stdout and "xplane" in res.stdout
    meta = read_parquet(out).meta  # the run described itself on its opprof.clock markers
    assert (meta["model"], meta["mode"], meta["batch_size"]) == ("lenet5", "allreduce", 8)
    for other, label in ((TORCH, "torch"), (MXNET, "mxnet")):
        res = run_cli("diff", str(out), str(other), "--format", "md")
        assert res.returncode == 0, res.stderr
        assert "tf lenet5 x2" in res.stdout and label in res.stdout
        # The closing sentence names the canonical operator that explains most of the gap.
        sentence = res.stdout.split("\n\n")[1]
        assert re.search(rf"; ({'|'.join(CANONICAL_OPS)}) explains most of it", sentence)
