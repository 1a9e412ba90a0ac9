"""The critical path across ranks on real traces (the shared Kineto GPU traces, the nsys
export, the committed torch / torch-ddp / TF / MXNet recordings): every step's bound-by parts
sum to the step exactly, replaying the unedited graph gives every measured step back, the
graph has the edges the trace holds, and `report --by critical` shows it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from opprof.analysis import critpath
from opprof.analysis.critpath import BOUND_BY, bound_by, build_graph, graph_of, replay
from opprof.loader import load
from tests.conftest import FIXTURES, NSYS_SQLITE, fixture_file, run_cli, shared_trace

GPU = ["nccl-2rank-rank0.json.gz", "sampled-128rank-rank0.json.gz",
       "sampled-128rank-rank1.json.gz", "alexnet-1gpu.json.gz", "amd-mi250-toy-train.json.gz",
       "compiled-triton-1gpu.json.gz", "cpu-only-gloo-rank34.json.gz"]
CPU = {"torch": FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz",
       "torch-ddp": FIXTURES / "torch-ddp",
       "tf-allreduce": FIXTURES / "tf" / "lenet5-allreduce-2w",
       "tf-ps-async": FIXTURES / "tf" / "lenet5-ps-async-2w1s",
       "mxnet": FIXTURES / "mxnet" / "lenet5-single",
       "mxnet-ps-sync": FIXTURES / "mxnet" / "lenet5-ps-sync",
       "tf": FIXTURES / "memory" / "tf-lenet5",
       "torch-collectives": FIXTURES / "torch-collectives",
       "tf-keras-fit": FIXTURES / "unmarked" / "tf-keras-fit",
       "mxnet-gluon-dist": FIXTURES / "unmarked" / "mxnet-gluon-dist-2w"}


def _nsys() -> object:
    return fixture_file(NSYS_SQLITE)


def _check(path: object) -> tuple[critpath.Graph, object]:
    trace = load(path)
    got = graph_of(trace)
    assert got is not None, f"{path}: no usable graph"
    g, order = got
    b = bound_by(g)
    assert len(b) and len(b) == len(g.steps)
    parts = b[list(BOUND_BY)].to_numpy(np.int64)
    assert (parts >= 0).all()
    assert (parts.sum(axis=1) == b["step_ns"].to_numpy()).all()  # exactly, in ns
    assert (b["path_ns"] == b["step_ns"] - b["idle"]).all()
    r = replay(g, None, order)
    assert np.allclose(r["replay_ns"], r["step_ns"], rtol=1e-9, atol=1.0)
    # the unedited replay takes the measured times (its lags exact): the walk agrees, vertex
    # by vertex
    assert critpath.replays_measured(g)
    m = g.times
    walked = critpath._replayed_times(g, g.lag.astype(np.float64), order, m, int(m.min()))
    assert np.array_equal(walked, (m - m.min()).astype(np.float64))
    return g, b


@pytest.mark.parametrize("name", GPU)
def test_gpu_traces_bound_by_sums_to_the_step_and_replay_is_exact(name: str) -> None:
    _check(shared_trace(name))


@pytest.mark.parametrize("name", ["compiled-adamw.pt.trace.json.gz",
                                  "compiled-cudagraphs.pt.trace.json.gz",
                                  "compiled-whole-step.pt.trace.json.gz", "resnet18-cuda.trace",
                                  "run-whole-step.trace"])
def test_our_h200_recordings_bound_by_sums_and_replay_is_exact(name: str) -> None:
    """Small models on an H200 are launch-bound: the host launching kernels holds the path."""
    g, b = _check(FIXTURES / "gpu" / name)
    assert (b["launch"] > 0.5 * b["step_ns"]).all(), b


def test_nsys_export() -> None:
    g, _ = _check(_nsys())
    assert (g.kind == critpath.LAUNCH_EDGE).sum() >= 15  # 5 kernels + 15 copies, linked
    assert (g.kind == critpath.SYNC_EDGE).any()  # blocking cudaMemcpy waits for the device


@pytest.mark.parametrize("name", list(CPU))
def test_cpu_recordings_of_every_framework(name: str) -> None:
    _check(CPU[name])


def test_gpu_graph_has_launch_stream_and_sync_edges() -> None:
    g, _ = _check(shared_trace("alexnet-1gpu.json.gz"))
    assert (g.kind == critpath.SYNC_EDGE).any()  # cudaDeviceSynchronize / blocking copies
    g, b = _check(shared_trace("nccl-2rank-rank0.json.gz"))
    kinds = set(np.unique(g.kind))
    assert {critpath.OWN, critpath.ORDER, critpath.LAUNCH_EDGE, critpath.THREAD} <= kinds
    # every edge runs forward in time, and binding edges carry the measured difference
    t = g.times
    assert (t[g.src] <= t[g.dst]).all()
    bound = g.binding[g.binding >= 0]
    assert (t[g.src[bound]] + g.lag[bound] == t[g.dst[bound]]).all()
    assert (b["comm"] > 0).all()  # NCCL kernels on the path


def test_collectives_are_matched_across_ranks() -> None:
    g, b = _check(CPU["torch-ddp"])
    coll = g.kind == critpath.COLLECTIVE
    assert coll.any()
    assert (g.rank[g.src[coll] >> 1] != g.rank[g.dst[coll] >> 1]).all()
    assert set(b["rank"]) == {0, 1}
    assert (b["sync"] > 0).any()  # a rank waited for the other inside a collective
    # two ranks of a 128-rank NCCL job: their NCCL kernels are matched as one collective
    g, b = _check([shared_trace("sampled-128rank-rank0.json.gz"),
                   shared_trace("sampled-128rank-rank1.json.gz")])
    coll = g.kind == critpath.COLLECTIVE
    assert coll.any() and g.on_device[g.dst[coll] >> 1].all()
    assert set(b["rank"]) == {0, 1}


def test_replay_moves_with_an_edit() -> None:
    g, order = graph_of(load(CPU["torch"]))
    base = replay(g, None, order)["replay_ns"].to_numpy()
    factor = np.where(g.op == "convolution", 2.0, 1.0)
    slower = replay(g, factor, order)["replay_ns"].to_numpy()
    assert (slower > base).all()
    faster = replay(g, np.where(g.op == "convolution", 0.5, 1.0), order)["replay_ns"]
    assert (faster.to_numpy() < base).all()


def test_graph_built_once_serves_both() -> None:
    trace = load(CPU["mxnet-ps-sync"])
    g = build_graph(trace)
    table = critpath.critical_path(trace, graph=g)
    assert table.drop(columns=["replay_ns"]).equals(bound_by(g))
    assert np.allclose(table["replay_ns"], table["step_ns"], rtol=1e-9, atol=1.0)


def test_report_by_critical_cli() -> None:
    path = CPU["torch-ddp"]
    out = run_cli("report", str(path), "--by", "critical", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["critical"]
    assert {r["rank"] for r in rows} == {0, 1}
    for r in rows:
        assert set(r["bound_by"]) == set(BOUND_BY)
        assert sum(r["bound_by"].values()) == r["step_ns"]
        assert r["path_ns"] == r["step_ns"] - r["bound_by"]["idle"]
        assert abs(r["replay_ns"] - r["step_ns"]) <= 1
    text = run_cli("report", str(path), "--by", "critical")
    assert text.returncode == 0 and "Critical path" in text.stdout and "launch" in text.stdout


def test_whatif_runs_over_the_graph() -> None:
    from opprof.model.whatif import context, whatif

    ctx = context(load(CPU["torch-ddp"]), "ddp")
    assert ctx.graph is not None
    null = whatif(ctx, comm=1.0)
    assert null.step_ns == ctx.base.step_ns and null.engine == "phases"
    slower = whatif(ctx, comm=2.0)
    assert slower.engine == "graph" and slower.step_ns > ctx.base.step_ns
    assert sum(slower.phases.values()) == pytest.approx(slower.step_ns, rel=1e-9)
    assert whatif(ctx, comm="hidden").engine == "phases"  # exposed comm is a phase term


def test_a_collectives_factor_scales_its_own_nodes_once() -> None:
    """--op all_reduce=F scales the all-reduce's nodes by F (it scaled them by F² and every
    other collective by F: the phase model's one comm lane was applied on top); --op comm=F
    is --comm F."""
    from opprof.model.whatif import context, whatif

    ctx = context(load(shared_trace("nccl-2rank-rank0.json.gz")), "nccl")
    g, order = ctx.graph
    base = replay(g, None, order)
    for op in ("all_reduce", "broadcast"):
        mine = (g.category == critpath.COMM) & (g.op == op)
        alone = replay(g, np.where(mine, 0.5, 1.0), order)
        want = float((alone["replay_ns"] - base["replay_ns"]).mean())
        w = whatif(ctx, {op: 0.5})
        assert w.engine == "graph"
        assert w.step_ns - ctx.base.step_ns == pytest.approx(want, rel=1e-9, abs=1e-3)
    assert whatif(ctx, {"comm": 0.5}).step_ns == pytest.approx(whatif(ctx, comm=0.5).step_ns)


def test_faster_kernels_do_not_shorten_a_host_bound_gpu_step() -> None:
    g, order = graph_of(load(shared_trace("nccl-2rank-rank0.json.gz")))
    base = replay(g, None, order)
    kernels = g.on_device & (g.category == critpath.COMPUTE)
    fast = replay(g, np.where(kernels, 0.5, 1.0), order)
    delta = fast["replay_ns"] - base["replay_ns"]
    assert (delta <= 0).all() and (delta > -0.01 * base["step_ns"]).all()
    slow_comm = replay(g, np.where(g.category == critpath.COMM, 2.0, 1.0), order)
    assert (slow_comm["replay_ns"] > base["replay_ns"]).all()  # NCCL kernels are on the path


# ------------------------------------------------- rank by rank, as a report of a job


@pytest.mark.parametrize("src", [
    ["fixtures/torch-ddp"], ["fixtures/torch-collectives"], ["fixtures/unmarked/torch-ddp-2w"],
    ["fixtures/mxnet/lenet5-ps-sync"], ["fixtures/tf/lenet5-allreduce-2w"],
    ["fixtures/tf/lenet5-ps-async-2w1s"]])
def test_walks_rank_by_rank_equal_the_whole_job_graph(src: list[str]) -> None:
    """Each rank's graph walked on its own, cut at its collective calls and joined by the
    calls' entries and exits alone, gives every (rank, step) the split the whole job's
    graph gives, and the same replay."""
    from opprof.analysis.critpath import COLUMNS, build_graph, critical_path
    from opprof.loader import load

    root = Path(__file__).resolve().parents[1]
    tr = load([str(root / s) for s in src])
    by_rank = critical_path(tr)
    whole = critical_path(tr, graph=build_graph(tr)).sort_values(["rank", "step"])
    assert len(by_rank) >= 2
    assert by_rank[COLUMNS].reset_index(drop=True).equals(whole[COLUMNS].reset_index(drop=True))
    assert np.allclose(by_rank["replay_ns"], whole["replay_ns"], equal_nan=True)


def test_report_of_a_job_carries_the_critical_path_from_its_workers(tmp_path: Path) -> None:
    """`report --by critical` walks each rank where it is read (a pool of processes here):
    the rows equal those of the job loaded whole."""
    from opprof.analysis.critpath import COLUMNS, critical_path
    from opprof.job import report
    from opprof.loader import load

    root = Path(__file__).resolve().parents[1]
    files = sorted(str(p) for p in (root / "fixtures" / "torch-ddp").glob("*.pt.trace.json.gz"))
    pooled = report(files, jobs=2, critical=True).critical
    here = report(files, jobs=1, critical=True).critical
    loaded = critical_path(load(files))
    assert len(pooled) == 4 and set(pooled["rank"]) == {0, 1}
    for df in (here, loaded):
        assert pooled[COLUMNS].equals(df[COLUMNS])
    assert (pooled[list(("compute", "comm", "launch", "sync", "load", "idle"))].sum(axis=1)
            == pooled["step_ns"]).all()
    assert report(files, jobs=1).critical.empty  # not asked: not built


GRAPH_INPUTS = [*CPU.values(), FIXTURES / "parallel-model" / "pp.trace",
                FIXTURES / "torch-parallel" / "fsdp-tp",
                FIXTURES / "shared" / "kineto-gpu" / "nccl-2rank-rank0.json.gz",
                FIXTURES / "gpu-public" / "resnet-checkpoint-ddp-mi300x.json.gz"]


def _longest_paths(g: critpath.Graph, order: np.ndarray, lag: np.ndarray) -> np.ndarray:
    """The replay's vertex times, vertex by vertex in ``order`` (the definition)."""
    t = (g.times - g.times.min()).astype(np.float64)
    for v in order:
        into = np.flatnonzero(g.dst == v)
        if len(into):
            t[v] = np.max(t[g.src[into]] + lag[into])
    return t


@pytest.mark.parametrize("path", GRAPH_INPUTS, ids=lambda p: p.name)
def test_topological_order_respects_every_edge_of_real_graphs(path: Path) -> None:
    g, order = graph_of(load([path]))
    assert sorted(order.tolist()) == list(range(2 * len(g.start)))
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order))
    assert (pos[g.src] < pos[g.dst]).all()
    kahn = critpath._kahn_order(g)
    assert kahn is not None and sorted(kahn.tolist()) == sorted(order.tolist())


def _assert_steps_replayed(g: critpath.Graph, t: np.ndarray, got) -> None:  # noqa: ANN001
    """Each step's replayed length is what the vertex times ``t`` give its end and start."""
    t0 = int(g.times.min())
    for s, r in zip(g.steps.itertuples(index=False), got["replay_ns"], strict=True):
        e = t[s.end_vertex] + (s.end - g.times[s.end_vertex])
        b = t[s.start_vertex] + (s.start - g.times[s.start_vertex]) if s.start_vertex >= 0 \
            else float(s.start - t0)
        assert r == pytest.approx(e - b, rel=1e-9, abs=1e-3)


@pytest.mark.parametrize("path", GRAPH_INPUTS[-4:], ids=lambda p: p.name)
def test_replay_is_the_longest_path_vertex_by_vertex(path: Path) -> None:
    """The replay (chains summed by pointer doubling, joins one by one) gives each step what
    the longest-path recurrence over every vertex gives, unedited and with every node's own
    time and every edge's lag scaled."""
    g, order = graph_of(load([path]))
    rng = np.random.default_rng(7)
    factor = rng.uniform(0.3, 1.7, len(g.start))
    edge_factor = rng.uniform(0.5, 1.5, len(g.src))
    lag = g.lag.astype(np.float64)
    own = (g.kind == critpath.OWN) | (g.kind == critpath.COLLECTIVE)
    lag[own] *= factor[g.dst[own] >> 1]
    lag *= edge_factor
    t = _longest_paths(g, order, lag)
    got = replay(g, factor, order, edge_factor=edge_factor)
    _assert_steps_replayed(g, t, got)
    unedited = replay(g, None, order)
    assert np.allclose(unedited["replay_ns"], replay(g, None, order)["replay_ns"])
    assert np.allclose(unedited["replay_ns"], unedited["step_ns"], rtol=0, atol=1)
    m = g.times
    assert np.array_equal(_longest_paths(g, order, g.lag.astype(np.float64)),
                          (m - m.min()).astype(np.float64))


@pytest.mark.parametrize("path", GRAPH_INPUTS[-2:], ids=lambda p: p.name)
def test_a_graph_whose_lags_are_not_exact_is_walked(path: Path) -> None:
    """An edge's lag longer than the time between its ends (or a vertex reached by none
    exactly) is no measured replay: the unedited replay walks it, as the definition does."""
    g, order = graph_of(load([path]))
    assert critpath.replays_measured(g)
    last = int(g.steps["end_vertex"].iloc[0])  # the node that ended the first step
    edge = np.flatnonzero((g.kind == critpath.OWN) & (g.dst == last))[0]
    g.lag = g.lag.copy()
    g.lag[edge] += 1_000_000  # 1 ms longer
    g.replayed = None
    assert not critpath.replays_measured(g)
    t = _longest_paths(g, order, g.lag.astype(np.float64))
    got = replay(g, None, order)
    _assert_steps_replayed(g, t, got)
    assert (got["replay_ns"] >= got["step_ns"] - 1).all()
    assert got["replay_ns"].iloc[0] >= got["step_ns"].iloc[0] + 999_999  # its step too


def _bound_by_walked(g: critpath.Graph) -> list[list[int]]:
    """The bound-by split, walked vertex by vertex from each step's end (the definition):
    each move to the binding predecessor adds its length, clamped to the step, to its
    category; a call bound to another rank's entry adds the transfer to comm, the wait from
    its own entry to sync, and goes on from that entry; a vertex met again ends the walk."""
    t = g.times
    rows = []
    for s in g.steps.itertuples(index=False):
        start, end = int(s.start), int(s.end)
        parts = dict.fromkeys(BOUND_BY, 0)
        cursor, v, seen = end, int(s.end_vertex), set()
        if v >= 0:
            cursor = max(min(cursor, int(t[v])), start)
            parts["idle"] += end - cursor
        while v >= 0 and cursor > start and v not in seen:
            seen.add(v)
            e = int(g.binding[v])
            if e < 0:
                break
            u, kind, node = int(g.src[e]), int(g.kind[e]), v >> 1
            new = max(min(int(t[u]), cursor), start)
            if kind == critpath.COLLECTIVE and g.rank[u >> 1] != g.rank[node]:
                parts["comm"] += cursor - new
                v = 2 * int(g.entry[node])
                cursor, new = new, max(min(int(t[v]), new), start)
                parts["sync"] += cursor - new
                cursor = new
                continue
            if kind == critpath.OWN:
                part = BOUND_BY[g.category[node]]
            elif kind == critpath.ORDER and g.main[node] and not g.on_device[node] \
                    and g.lag[e] > 0:
                # the thread's own gap, or its wait for a transfer in flight
                part = "comm" if g.waits is not None and g.waits[node] else "launch"
            elif kind == critpath.LAUNCH_EDGE:
                part = "launch"
            elif kind == critpath.SYNC_EDGE:
                part = "sync"
            else:
                part = "idle"
            parts[part] += cursor - new
            cursor, v = new, u
        parts["idle"] += cursor - start
        rows.append([int(s.rank), int(s.step), *parts.values()])
    return rows


@pytest.mark.parametrize("path", GRAPH_INPUTS, ids=lambda p: p.name)
def test_bound_by_is_the_walk_vertex_by_vertex(path: Path) -> None:
    """The split (moves worked out for every vertex at once, the walk listing vertices, the
    lengths summed per category at once) is the vertex-by-vertex walk's, exactly, on the
    whole-job graph and on each rank's own (the collective calls' edges left out)."""
    trace = load([path])
    for cross in (True, False):
        g = build_graph(trace, cross=cross)
        got = bound_by(g)
        assert got[["rank", "step", *BOUND_BY]].to_numpy().tolist() == _bound_by_walked(g)


def test_a_walk_that_comes_back_to_a_vertex_ends_there() -> None:
    """A cycle of binding predecessors (none in a graph build_graph makes: an edge never
    goes back in time) ends the walk where it would repeat, as the definition does."""
    g, _ = graph_of(load([GRAPH_INPUTS[-2]]))
    v = int(g.steps["end_vertex"].iloc[0])
    u = int(g.src[g.binding[v]])
    g.src, g.dst = np.append(g.src, v), np.append(g.dst, u)  # u's binding is now v: a cycle
    g.lag, g.kind = np.append(g.lag, 0), np.append(g.kind, critpath.ORDER)
    g.binding = g.binding.copy()
    g.binding[u] = len(g.src) - 1
    got = bound_by(g)
    assert got[["rank", "step", *BOUND_BY]].to_numpy().tolist() == _bound_by_walked(g)
    assert got["idle"].iloc[0] > 0


def test_a_pipeline_stage_waiting_for_its_neighbour_is_bound_by_comm() -> None:
    """A real two-stage pipeline (torch.distributed.pipelining over gloo): its sends and
    receives in flight, each on a lane of its own from its posting to its completion, are no
    rank's main thread and no step's last work, and the main thread's gaps in which one of
    them completed are its waits for the neighbour. So the path's comm is the breakdown's comm
    phase (the bubble) within a tenth of the step, and the stage's own Python is not the
    larger part (it was: `launch` 62% of a step, the path following an isend in flight)."""
    from opprof.analysis.breakdown import step_breakdown
    from opprof.analysis.critpath import critical_path

    trace = load([FIXTURES / "parallel-model" / "pp.trace"])
    crit = critical_path(trace).set_index(["rank", "step"])
    phases = step_breakdown(trace).set_index(["rank", "step"])
    assert len(crit) == len(phases) >= 4
    for key, row in crit.iterrows():
        assert abs(row["comm"] - phases.loc[key, "comm"]) <= 0.1 * row["step_ns"], key
        assert row["launch"] < row["comm"], key
        assert row["idle"] <= 0.01 * row["step_ns"], key


def test_a_walk_that_meets_the_step_befores_collective_ends_at_its_own_start() -> None:
    """A 2-stage × 2-replica pipeline with DDP on each stage (4 ranks, a reviewer's script):
    a step's walk reaches the previous step's asynchronous all-reduce, still running when the
    step began. Walked rank by rank it went on into that step (rank 1: a path of 34.5 ms in a
    21.6 ms step, idle −12.9 ms); it ends at its own start, as the whole job's graph does."""
    from opprof.analysis.critpath import COLUMNS, critical_path

    trace = load([FIXTURES / "torch-parallel" / "dp-pp-ddp.trace"])
    by_rank = critical_path(trace)
    whole = critical_path(trace, graph=build_graph(trace)).sort_values(["rank", "step"])
    assert len(by_rank) == 20
    assert (by_rank["idle"] >= 0).all() and (by_rank["path_ns"] <= by_rank["step_ns"]).all()
    assert by_rank[COLUMNS].reset_index(drop=True).equals(whole[COLUMNS].reset_index(drop=True))
