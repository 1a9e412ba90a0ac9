"""Phase inference on traces with no opprof marker: real user scripts (tests/scripts/) recorded
by each framework's own profiler (fixtures/unmarked/, re-recorded live by the slow tests).

On every such trace: the right number of steps per rank, the phases sum to each step
exactly, ``other`` is at most 10% of the step time, and every phase the script has is found
(load, forward, backward, update; comm in distributed runs) — while the operator totals
still equal the framework's own aggregate, and marked traces are left to their markers."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opprof.analysis.breakdown import step_breakdown
from opprof.analysis.ops import native_totals
from opprof.normalizers import closures, normalize
from opprof.normalizers.events import INFERRED_PREFIX, INFERRED_TID, finish, optimizer_steps
from opprof.taxonomy import PHASES, MappingRow, MappingTable
from tests.conftest import FIXTURES, run_cli
from tests.unmarked import SCRIPTS, record

UNMARKED = FIXTURES / "unmarked"
STEPS = 3  # profiled steps in every fixture (after 3 unprofiled warm-up steps)
COMPUTE = ("load", "forward", "backward", "update")

# fixture folder -> (framework, script, workers, the phases the script has on a worker)
CASES = {
    "torch-loop": ("torch", "torch_loop.py", 1, COMPUTE),
    "torch-ddp-2w": ("torch", "torch_ddp.py", 2, (*COMPUTE, "comm")),
    # Lightning's automatic optimization: forward and backward inside the optimizer's closure
    "lightning-fit": ("torch", "lightning_fit.py", 1, COMPUTE),
    "tf-keras-fit": ("tf", "tf_keras_fit.py", 1, COMPUTE),
    "tf-custom-loop": ("tf", "tf_custom_loop.py", 1, COMPUTE),
    "mxnet-gluon": ("mxnet", "mxnet_gluon.py", 1, COMPUTE),
    # dist_sync updates the weights on the parameter server (update_on_kvstore): the
    # workers push gradients and pull weights, so their step has comm and no update.
    "mxnet-gluon-dist-2w": ("mxnet", "mxnet_gluon.py", 2, ("load", "forward", "backward",
                                                             "comm")),
}


PARAMS = list(CASES)


def assert_inferred_goal(trace, workers: int, phases: tuple[str, ...]) -> pd.DataFrame:
    """The issue's goal on one unmarked trace; returns the step breakdown."""
    ranks = list(range(workers))
    assert trace.meta["inferred_phases"] == ranks
    steps = step_breakdown(trace)
    assert steps.groupby("rank").size().to_dict() == {r: STEPS for r in ranks}
    assert (steps[list(PHASES)].sum(axis=1) == steps["dur_ns"]).all()
    per_rank = steps.groupby("rank")[[*PHASES, "dur_ns"]].sum()
    share = per_rank[list(PHASES)].div(per_rank["dur_ns"], axis=0)
    assert (share["other"] <= 0.10).all(), share["other"].to_dict()
    for p in phases:
        assert (per_rank[p] > 0).all(), f"{p}: {per_rank[p].to_dict()}"
    for p in set(PHASES) - set(phases) - {"other", "h2d"}:
        assert (per_rank[p] == 0).all(), f"{p} found where the script has none"
    return steps


def native_names(folder: Path) -> Counter:
    """Event names of the native files, read without opprof (XPlane: none to read)."""
    names: Counter = Counter()
    for path in folder.glob("*.json.gz"):
        with gzip.open(path, "rt") as f:
            names.update(e.get("name", "") for e in json.load(f)["traceEvents"])
    return names


@pytest.fixture(scope="module")
def traces() -> dict:
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = normalize([UNMARKED / name])
        return cache[name]

    return get


@pytest.mark.parametrize("name", PARAMS)
def test_fixture_is_a_users_trace_without_opprof_markers(name: str) -> None:
    names = native_names(UNMARKED / name)
    assert not [n for n in names if n.startswith(("opprof", "ProfilerStep"))]
    for xplane in (UNMARKED / name).rglob("*.xplane.pb"):
        assert b"opprof" not in xplane.read_bytes()


@pytest.mark.parametrize("name", PARAMS)
def test_unmarked_fixture_meets_the_goal(name: str, traces) -> None:
    _, _, workers, phases = CASES[name]
    assert_inferred_goal(traces(name), workers, phases)


@pytest.mark.parametrize("name", PARAMS)
def test_inferred_spans_are_markers_on_their_own_lane(name: str, traces) -> None:
    ev = traces(name).events
    spans = ev[ev["tid"] == INFERRED_TID]
    assert len(spans) and spans["name"].astype(str).str.startswith(INFERRED_PREFIX).all()
    assert (spans["kind"] == "marker").all() and not spans["counted"].any()
    assert set(spans["phase"].astype(str)) <= {"load", "h2d", "forward", "backward", "update"}
    assert (spans["name"].astype(str) == INFERRED_PREFIX + spans["phase"].astype(str)).all()
    for _, s in spans.sort_values("ts").groupby("rank"):
        assert (s["ts"].to_numpy()[1:] >= (s["ts"] + s["dur"]).to_numpy()[:-1]).all()
    # every operator a worker runs inside a step has a phase of its own or inferred
    ops = ev[ev["counted"] & (ev["step"] >= 0) & (ev["device"] == "cpu")]
    assert (ops["phase"] != "other").mean() > 0.99


@pytest.mark.parametrize("name", PARAMS)
def test_operator_totals_still_equal_the_frameworks_own(name: str, traces) -> None:
    trace, folder = traces(name), UNMARKED / name
    fw = CASES[name][0]
    if fw == "tf":
        from tests.xprof_check import assert_totals_match_xprof

        for path in folder.rglob("*.xplane.pb"):
            assert assert_totals_match_xprof(trace, path, counts=False) > 50
    elif fw == "mxnet":
        from tests.test_mxnet_normalizer import aggregate_mismatches

        assert aggregate_mismatches(trace, folder) == []
    else:
        for kavg_path in folder.glob("rank*.key_averages.json"):
            rank = int(kavg_path.name.removeprefix("rank").split(".")[0])
            got = native_totals(type(trace)(trace.events[trace.events["rank"] == rank]))
            ev = trace.events
            pieces = set(ev.loc[ev["detail"] == closures.PIECE, "name"].astype(str))
            with gzip.open(folder / f"rank{rank}.pt.trace.json.gz", "rt") as f:
                counts = Counter(e["name"] for e in json.load(f)["traceEvents"]
                                 if e.get("ph") == "X")
            compared = 0
            for row in json.loads(kavg_path.read_text()):
                if counts.get(row["name"]) != row["count"] or row["name"].startswith("gloo:"):
                    # torch's two outputs disagree (see test_torch_vs_key_averages); an
                    # async collective's key_averages time is not its trace event's
                    continue
                if row["name"] in pieces:
                    # a step that ran its closure is counted outside it, in pieces
                    # (test_training_loops checks pieces and closures add up to torch's total)
                    continue
                total_us = got.loc[row["name"], "total_ns"] / 1000
                assert total_us == pytest.approx(row["cpu_time_total_us"], rel=0.01, abs=1.0)
                compared += 1
            assert compared > 20


def test_marked_traces_keep_their_markers() -> None:
    """A rank with phase markers gets no inferred span: its markers decide."""
    for folder in (FIXTURES / "torch", FIXTURES / "mxnet" / "lenet5-single",
                   FIXTURES / "tf" / "lenet5-allreduce-2w"):
        trace = normalize([folder])
        assert "inferred_phases" not in trace.meta
        assert not (trace.events["tid"] == INFERRED_TID).any()


def test_report_of_an_unmarked_trace_as_a_user_runs_it(tmp_path: Path) -> None:
    out = tmp_path / "loop.trace"
    r = run_cli("import", str(UNMARKED / "mxnet-gluon"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    r = run_cli("report", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["steps"]) == STEPS
    share = {p: v["share"] for p, v in doc["phases"].items()}
    assert share["other"] <= 0.10 and min(share[p] for p in COMPUTE) > 0


# --------------------------------------------------------------------------- the rules


TABLE = MappingTable("t", (
    MappingRow("fwd", "convolution", "forward", "", "fwd"),
    MappingRow("bwd", "convolution_backward", "backward", "", "bwd"),
    MappingRow("upd", "weights_update", "update", "", "upd"),
    MappingRow("load", "data_load", "load", "io", "load"),
    MappingRow("comm", "comm", "comm", "comm", "comm"),
    MappingRow("copy", "memory", "", "", "copy"),
))


def _trace(*events: tuple[str, int, int, int]):
    """(name, tid, start µs, end µs) on one worker rank → a finished trace."""
    raw = pd.DataFrame([{"rank": 0, "role": "worker", "pid": 1, "tid": tid, "device": "cpu",
                         "ts": s * 1000, "dur": (e - s) * 1000, "name": n, "kind": "cpu_op",
                         "bytes": 0, "detail": None, "link": -1} for n, tid, s, e in events])
    return finish(raw, TABLE, {})


def _phase_at(trace, t_us: int) -> str:
    spans = trace.events[trace.events["tid"] == INFERRED_TID]
    hit = spans[(spans["ts"] <= t_us * 1000) & (spans["ts"] + spans["dur"] > t_us * 1000)]
    return str(hit["phase"].iloc[0]) if len(hit) else "none"


def test_a_gap_goes_to_the_operator_that_starts_next() -> None:
    tr = _trace(("load", 1, 0, 10), ("fwd", 1, 20, 30), ("fwd", 1, 35, 40),
                ("bwd", 1, 50, 60), ("upd", 1, 70, 80), ("load", 1, 90, 95),
                ("fwd", 1, 100, 110), ("bwd", 1, 115, 120), ("upd", 1, 125, 130))
    assert [_phase_at(tr, t) for t in (15, 32, 45, 65, 85, 97)] == [
        "forward", "forward", "backward", "update", "load", "forward"]
    # steps end where the optimizer has updated every weight; the first starts at its load
    assert tr.step_bounds()[["start", "end"]].values.tolist() == [[0, 80_000],
                                                                   [80_000, 130_000]]
    steps = step_breakdown(tr)
    assert (steps["other"] == 0).all()
    assert steps[["load", "forward", "backward", "update"]].iloc[0].tolist() == [
        10_000, 30_000, 20_000, 20_000]


def test_the_first_marked_step_is_on_its_way_to_its_first_operator() -> None:
    """`opprof run` marks steps but not phases: the first step's marker starts before its first
    operator (the script's Python between steps), and that head is the same phase it is in
    every later step, not `other`."""
    raw = pd.DataFrame([{"rank": 0, "role": "worker", "pid": 1, "tid": 1, "device": "cpu",
                         "ts": s * 1000, "dur": (e - s) * 1000, "name": n,
                         "kind": "marker" if n.startswith("opprof.step") else "cpu_op",
                         "bytes": 0, "detail": None, "link": -1}
                        for n, s, e in (("opprof.step#0", 0, 50), ("load", 10, 15),
                                        ("fwd", 20, 30), ("bwd", 32, 40), ("upd", 42, 48),
                                        ("opprof.step#1", 50, 100), ("load", 60, 65),
                                        ("fwd", 70, 80), ("bwd", 82, 90), ("upd", 92, 98))])
    steps = step_breakdown(finish(raw, TABLE, {}))
    assert (steps["other"] == 0).all()
    assert steps["load"].tolist() == [17_000, 15_000]  # 0-15 and 48-50; 50-65


def test_an_operator_without_a_phase_takes_the_next_ones() -> None:
    tr = _trace(("fwd", 1, 0, 10), ("copy", 1, 12, 14), ("fwd", 1, 20, 30),
                ("copy", 1, 32, 34), ("bwd", 1, 40, 50), ("upd", 1, 55, 60))
    ev = tr.events[tr.events["name"] == "copy"]
    assert ev["phase"].astype(str).tolist() == ["forward", "backward"]
    assert ev["op"].astype(str).tolist() == ["memory", "memory"]


def test_early_optimizer_work_does_not_claim_the_time_before_it() -> None:
    """Keras computes learning-rate terms as the training function starts: those update
    operators stay update, but the host time before them is on the way to the forward pass."""
    tr = _trace(("upd", 2, 10, 12), ("fwd", 1, 20, 30), ("bwd", 1, 35, 45),
                ("upd", 1, 50, 55))
    assert _phase_at(tr, 15) == "forward" and _phase_at(tr, 47) == "update"
    ev = tr.events
    assert ev.loc[ev["name"] == "upd", "phase"].astype(str).tolist() == ["update", "update"]


def test_a_long_operator_on_another_thread_does_not_swallow_the_step() -> None:
    """MXNet: the Python thread blocks in the batch copy while the engine runs the step;
    the engine's gaps are not all load."""
    tr = _trace(("load", 9, 0, 100), ("fwd", 1, 10, 20), ("fwd", 1, 25, 30),
                ("bwd", 1, 40, 50), ("upd", 1, 60, 70))
    ev = tr.events
    assert ev.loc[ev["name"] == "fwd", "phase"].astype(str).tolist() == ["forward"] * 2
    steps = step_breakdown(tr)
    assert int(steps["forward"].iloc[0]) == 15_000  # the load op covers the gaps: load


def test_update_operators_interleaved_with_backward_make_one_step() -> None:
    """MXNet/TF update each weight as its gradient is ready: one step per forward pass."""
    rank = np.zeros(9, np.int64)
    ts = np.array([0, 10, 20, 25, 30, 35, 50, 60, 70])
    end = ts + 4
    update = np.array([0, 0, 1, 0, 1, 1, 0, 0, 1], bool)
    forward = np.array([1, 0, 0, 0, 0, 0, 1, 0, 0], bool)
    steps = optimizer_steps(rank, ts, end, update, forward, pd.Series({0: 0}))
    assert steps[["step", "start", "end"]].values.tolist() == [[0, 0, 39], [1, 39, 74]]


def test_comm_closes_the_step_of_a_worker_updated_elsewhere() -> None:
    tr = _trace(("fwd", 1, 0, 10), ("bwd", 1, 12, 20), ("comm", 2, 15, 30),
                ("fwd", 1, 35, 40), ("bwd", 1, 42, 45), ("comm", 2, 44, 50))
    assert tr.step_bounds()[["start", "end"]].values.tolist() == [[0, 30_000],
                                                                   [30_000, 50_000]]
    steps = step_breakdown(tr)
    assert (steps["comm"] > 0).all() and (steps["other"] == 0).all()


# --------------------------------------------------------------------------- live


@pytest.mark.slow
@pytest.mark.parametrize("name", PARAMS)
def test_a_fresh_recording_meets_the_goal(name: str, tmp_path: Path) -> None:
    """Re-record the fixture's script as the fixture was made, so the check cannot rot."""
    fw, script, workers, phases = CASES[name]
    out = record(fw, SCRIPTS / script, tmp_path / name, warmup=3, steps=STEPS, batch_size=4,
                 workers=workers)
    assert_inferred_goal(normalize([out]), workers, phases)
