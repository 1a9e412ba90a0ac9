"""Model parallelism read from real traces: the layout (``meta.mode``, ``meta.parallelism``),
each collective's dimension, blocking collectives as exposed time, pipelines (schedule,
micro-batches, bubble), experts (all-to-all bytes per peer), and the model-parallel model —
on the users' scripts of ``tests/scripts/`` recorded under ``opprof run`` into
``fixtures/torch-parallel/`` (see fixtures/README.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from opprof.analysis.breakdown import container, step_breakdown
from opprof.analysis.report import build_report
from opprof.filters import communication, counted, on_host, workers
from opprof.loader import load
from opprof.model.parallel import check_parallel, parallel_base, predict_parallel
from opprof.parallelism import MESH_NAMES, assign_groups, layout, mesh_dim
from opprof.taxonomy import COMM_OPS, PHASES
from opprof.walltime import blocked_spans, functional_waits
from tests.conftest import FIXTURES, run_cli

PARALLEL = FIXTURES / "torch-parallel"
#: fixture → (mode, {dimension: (degree, groups)})
LAYOUTS = {
    "tp": ("tp", {"tp": (2, [[0, 1]])}),
    "tp-funcol": ("tp", {"tp": (2, [[0, 1]])}),
    "pp-gpipe": ("pp", {"pp": (2, [[0, 1]])}),
    "pp-1f1b": ("pp", {"pp": (2, [[0, 1]])}),
    "pp-interleaved": ("pp", {"pp": (2, [[0, 1]])}),
    "pp-manual": ("pp", {"pp": (2, [[0, 1]])}),
    "moe": ("dp+ep", {"dp": (2, [[0, 1]]), "ep": (2, [[0, 1]])}),
    "fsdp-tp": ("fsdp+tp", {"fsdp": (2, [[0, 2], [1, 3]]), "tp": (2, [[0, 1], [2, 3]])}),
}
SCHEDULES = {"pp-gpipe": "gpipe", "pp-1f1b": "1f1b", "pp-interleaved": "interleaved-1f1b",
             "pp-manual": "gpipe"}


@pytest.fixture(scope="module")
def traces():
    return {name: load(PARALLEL / name) for name in LAYOUTS}


@pytest.fixture(scope="module")
def reports(traces):
    return {name: build_report(t) for name, t in traces.items()}


# ------------------------------------------------------------------ the layout

#: One name of each MESH_NAMES row, and what it names.
MESH_EXAMPLES = [("mesh_dp_shard", "fsdp"), ("mesh_dp", "dp"), ("mesh_tp", "tp"),
                 ("pp", "pp"), ("mesh_cp", "cp"), ("mesh_ep", "ep")]


@pytest.mark.parametrize("row", range(len(MESH_NAMES)))
def test_mesh_name_row_names_its_dimension(row: int) -> None:
    name, dim = MESH_EXAMPLES[row]
    assert MESH_NAMES[row][1] == dim
    assert mesh_dim(name) == dim


@pytest.mark.parametrize("desc, dim", [
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    ("DATA_PARALLEL_GROUP", "dp"), ("DATA_PARALLEL_GROUP_GLOO", "dp"),
    ("DATA_PARALLEL_GROUP_WITH_CP", "dp"), ("INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", "dp"),
    ("CONTEXT_PARALLEL_GROUP", "cp"), ("EXPERT_MODEL_PARALLEL_GROUP", "ep"),
    ("EXPERT_DATA_PARALLEL_GROUP", "dp"), ("EXPERT_TENSOR_PARALLEL_GROUP", "tp"),
    ("TENSOR_AND_DATA_PARALLEL_GROUP", None), ("EMBEDDING_GROUP", None)])
def test_megatron_group_descriptions_name_their_dimension(desc: str, dim: str | None) -> None:
    """Megatron-LM's ``new_group(…, group_desc=…)``: the group a gloo or NCCL trace lists."""
    assert mesh_dim(desc) == dim


def test_unknown_group_descriptions_name_no_dimension() -> None:
    assert mesh_dim("default_pg") is None
    assert mesh_dim("undefined") is None
    assert mesh_dim(None) is None


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_is_named_from_the_trace(traces, name: str) -> None:
    mode, dims = LAYOUTS[name]
    meta = traces[name].meta
    assert meta["mode"] == mode
    got = {d: (v["degree"], v["groups"]) for d, v in meta["parallelism"].items()}
    assert got == dims


def test_a_data_parallel_trace_keeps_its_mode() -> None:
    trace = load(FIXTURES / "torch-ddp")
    assert trace.meta.get("mode") is None  # a native folder: as it was before
    assert set(trace.meta["parallelism"]) == {"dp"}
    assert layout([{"dims": {"dp": {"calls": 3, "ranks": [0, 1], "size": 2}}}], 2) == (
        None, {"dp": {"degree": 2, "groups": [[0, 1]], "calls": 3}})


def test_ddp_inside_a_compiled_backward_is_data_parallel() -> None:
    """A torch.compile'd model under DDP (HTA's V100 trace, an excerpt): DDP's all-reduces
    fire inside ``CompiledFunctionBackward``, the backward of torch.compile's autograd
    Function, not a hand-written one: they are data parallel, not tensor parallel."""
    trace = load(FIXTURES / "gpu-public" / "ddp-compiled-backward-v100.json.gz")
    ev = trace.events
    names = ev["name"].astype(str)
    assert names.str.contains("CompiledFunctionBackward").any()
    assert (names == "c10d::allreduce_").sum() == 7  # the window ends inside the seventh
    assert set(trace.meta["parallelism"]) == {"dp"}
    coll = build_report(trace).collectives
    assert set(coll["op"]) == {"all_reduce"} and set(coll["dim"]) == {"dp"}


def test_a_recorded_mode_with_the_same_model_dimensions_stays() -> None:
    facts = [{"dims": {"dp": {"calls": 1, "ranks": [0, 1], "size": 2},
                       "ep": {"calls": 2, "ranks": [0, 1], "size": 2}}}]
    assert layout(facts, 2, "ep")[0] == "ep"
    assert layout(facts, 2, "allreduce")[0] == "dp+ep"


def test_a_dimension_of_one_rank_is_not_in_the_mode() -> None:
    """Lightning's ModelParallelStrategy with data_parallel_size=1 broadcasts over 1-rank
    data-parallel groups: the job is tensor parallel (it read ``dp+tp``)."""
    facts = [{"dims": {"dp": {"calls": 1, "ranks": [r], "size": 1},
                       "tp": {"calls": 2, "ranks": [0, 1], "size": 2}}} for r in (0, 1)]
    mode, par = layout(facts, 2)
    assert mode == "tp"
    assert par["dp"] == {"degree": 1, "groups": [[0], [1]], "calls": 2}


def test_groups_go_to_the_dimension_their_description_names() -> None:
    groups = [{"pg": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3], "size": 4},
              {"pg": "1", "desc": "mesh_dp", "ranks": [0, 2], "size": 2},
              {"pg": "3", "desc": "mesh_tp", "ranks": [0, 1], "size": 2}]
    got = assign_groups(["fsdp", "tp"], groups)
    assert got["fsdp"]["pg"] == "1" and got["tp"]["pg"] == "3"
    # no description: the one group no dimension took, not the default group
    plain = [groups[0], {"pg": "1", "desc": "undefined", "ranks": [0, 1, 2, 3], "size": 4}]
    assert assign_groups(["tp"], plain)["tp"]["pg"] == "1"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_collective_carries_its_dimension(traces, reports, name: str) -> None:
    ev = traces[name].events
    comm = ev[(ev["step"] >= 0) & ev["counted"] & ev["op"].isin(sorted(COMM_OPS))
              & (ev["op"] != "barrier")]
    assert len(comm)
    assert comm["detail"].astype(str).str.contains("parallel=").all()
    dims = set(reports[name].collectives["dim"])
    assert dims and dims <= set(LAYOUTS[name][1])


# ------------------------------------------------------------------ exposed communication

@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_phases_sum_to_the_step(traces, name: str) -> None:
    steps = step_breakdown(traces[name])
    assert (steps[list(PHASES)].sum(axis=1) == steps["dur_ns"]).all()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_operator_other_stays_small(reports, name: str) -> None:
    rep = reports[name]
    other = rep.ops.loc[rep.ops["op"] == "other", "ns_per_step"].sum()
    assert other <= 0.10 * rep.steps["dur_ns"].mean()


@pytest.mark.parametrize("name", ["tp", "tp-funcol", "fsdp-tp"])
def test_tensor_parallel_collectives_are_exposed_not_hidden(reports, name: str) -> None:
    rep = reports[name]
    tp = rep.collectives[rep.collectives["dim"] == "tp"]
    hidden = (tp["hidden"] * tp["time_ns"]).sum() / tp["time_ns"].sum()
    assert hidden <= 0.20
    # the comm phase holds at least half of their time
    if name != "fsdp-tp":
        assert rep.steps["comm"].mean() >= 0.5 * tp["ns_per_step"].sum()


def test_a_wait_inside_an_operator_is_not_compute(traces) -> None:
    """DTensor's all-reduce is waited for in ``wait_tensor`` inside the next operator on the
    DTensor (``aten::add``): that time is communication, not forward."""
    ev = traces["tp"].events
    wait = ev[ev["name"].astype(str) == "_c10d_functional::wait_tensor"]
    assert len(wait) and (wait["op"] == "comm").all() and wait["counted"].all()
    assert (wait["phase"] == "comm").all()


@pytest.mark.parametrize("name", ["tp", "tp-funcol"])
def test_an_operator_waiting_for_a_functional_collective_is_blocked_from_its_start(
        traces, name: str) -> None:
    """The operator that runs ``wait_tensor`` consumes the collective's result: it is
    blocked from its own start to the wait's end (its dispatch before the wait is not work
    beside the collective); any other call inside an operator blocks it only while it runs."""
    ev = traces[name].events
    host = workers(ev) & counted(ev) & on_host(ev)
    cols = ["rank", "pid", "tid", "ts", "dur"]
    compute = ev.loc[host & ev["phase"].isin(["forward", "backward", "update"]), cols]
    comm = ev.loc[host & communication(ev), cols]
    spans = blocked_spans(comm, compute, functional_waits(ev))
    owner = compute.iloc[container(comm.loc[spans.index], compute)]
    end = (comm["ts"] + comm["dur"]).loc[spans.index].to_numpy()
    wait = ev.loc[spans.index, "name"].astype(str).str.endswith("::wait_tensor").to_numpy()
    assert wait.sum() >= 4
    assert (spans["ts"].to_numpy()[wait] == owner["ts"].to_numpy()[wait]).all()
    assert (spans["ts"].to_numpy()[~wait] == comm.loc[spans.index, "ts"].to_numpy()[~wait]).all()
    assert (spans["ts"] + spans["dur"]).to_numpy().tolist() == end.tolist()


def test_a_synchronous_call_waits_for_its_collective(traces) -> None:
    """``dist.all_to_all_single`` blocks in ``Work.wait()`` (not profiled) until gloo's span
    ends: opprof's ``opprof.wait`` covers that on the caller's thread."""
    ev = traces["moe"].events
    waits = ev[ev["name"].astype(str) == "opprof.wait"]
    assert len(waits) and waits["op"].isin(["all_to_all", "all_reduce"]).all()
    spans = ev[ev["name"].astype(str).str.startswith("gloo:")]
    ends = set((spans["ts"] + spans["dur"]).tolist())
    assert ((waits["ts"] + waits["dur"]).isin(ends)).all()


def test_no_wait_is_added_to_data_parallel_hooks() -> None:
    ev = load(FIXTURES / "torch-ddp").events
    assert not (ev["name"].astype(str) == "opprof.wait").any()


def test_asynchronous_point_to_point_spans_enclose_nothing(traces) -> None:
    """gloo's ``isend``/``irecv`` spans start inside their ``c10d::`` call and end long after
    it on the same thread: they get lanes of their own, and the layers run meanwhile stay
    forward and backward."""
    ev = traces["pp-gpipe"].events
    spans = ev[ev["name"].astype(str).isin(["gloo:send", "gloo:recv"])]
    assert len(spans) and (spans["tid"] <= -1000).all() and spans["counted"].all()
    layers = ev[ev["name"].astype(str).str.contains("AddmmBackward0")]
    assert (layers["phase"] == "backward").all()


# ------------------------------------------------------------------ pipelines

@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_pipeline_schedule_microbatches_and_bubble(reports, name: str) -> None:
    p = reports[name].pipeline
    assert set(p["rank"]) == {0, 1}
    assert (p["schedule"] == SCHEDULES[name]).all()
    assert (p["microbatches"] == 4).all()
    assert (p["bubble_ns"] > 0).all()  # every stage waits for its neighbour
    for r in p.to_dict("records"):
        stages = len(r["stages"])
        assert len(r["microbatch_forward_ns"]) == 4 and len(r["microbatch_backward_ns"]) == 4
        assert r["order"].count("F") == 4 * stages


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_stage_that_waits_is_not_updating(reports, name: str) -> None:
    rep = reports[name]
    steps = rep.steps.set_index(["rank", "step"])
    for r in rep.pipeline.to_dict("records"):
        s = steps.loc[(r["rank"], r["step"])]
        assert r["bubble_ns"] <= s["comm"]  # the wait is comm: not backward, not update
        assert s["update"] < 0.25 * s["dur_ns"]


def test_interleaved_schedule_reads_its_stages(reports) -> None:
    p = reports["pp-interleaved"].pipeline
    assert {tuple(s) for s in p["stages"]} == {(0, 2), (1, 3)}


def test_pipeline_json_is_the_contract() -> None:
    res = run_cli("report", str(PARALLEL / "pp-1f1b"), "--by", "pipeline", "--format", "json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["pipeline"]
    assert rows and {"rank", "step", "stage", "schedule", "microbatches", "bubble_ns"} <= set(
        rows[0])
    assert {r["schedule"] for r in rows} == {"1f1b"}


def test_pipeline_view_in_the_console_and_html(tmp_path: Path) -> None:
    res = run_cli("report", str(PARALLEL / "pp-gpipe"), "--by", "pipeline")
    assert res.returncode == 0, res.stderr
    assert "Pipeline (gpipe)" in res.stdout and "bubble" in res.stdout
    page = tmp_path / "pp.html"
    res = run_cli("report", str(PARALLEL / "pp-gpipe"), "--format", "html", "-o", str(page))
    assert res.returncode == 0, res.stderr
    assert "Pipeline" in page.read_text()


# ------------------------------------------------------------------ experts

def _raw_splits(folder: Path) -> dict[int, list[list[int]]]:
    """Per rank, the input split sizes of each ``c10d::alltoall_base_`` with splits, read
    from the files independently of opprof."""
    out = {}
    for f in sorted(folder.glob("rank*.pt.trace.json.gz")):
        doc = json.load(gzip.open(f))
        rank = doc["distributedInfo"]["rank"]
        out[rank] = [json.loads(e["args"]["Concrete Inputs"][4])
                     for e in doc["traceEvents"] if e.get("name") == "c10d::alltoall_base_"
                     and e["args"]["Concrete Inputs"][4] != "[]"]
    return out


def test_all_to_all_bytes_per_peer_come_from_the_split_sizes(reports) -> None:
    rep = reports["moe"]
    raw = _raw_splits(PARALLEL / "moe")
    e = rep.experts
    assert set(e["rank"]) == {0, 1}
    for rank, g in e.groupby("rank"):
        # bytes per row: 32 floats (--width 32); the profiled steps' calls, summed
        rows_sent = np.sum(raw[rank][-len(g) * int(g["calls"].iloc[0]):], axis=0)
        assert list(np.sum(np.stack(g["send_bytes_per_peer"].to_list()), axis=0)) == list(
            rows_sent * 32 * 4)
    assert (e["peer_imbalance"] >= 1).all()


def test_experts_load_imbalance_is_max_over_mean(reports) -> None:
    load_ = reports["moe"].expert_load
    assert len(load_)
    for r in load_.to_dict("records"):
        got = np.array(r["recv_bytes_per_rank"], float)
        assert r["imbalance"] == pytest.approx(got.max() / got.mean())


def test_experts_view_renders() -> None:
    res = run_cli("report", str(PARALLEL / "moe"), "--by", "experts")
    assert res.returncode == 0, res.stderr
    assert "bytes per peer" in res.stdout and "max/mean" in res.stdout


# ------------------------------------------------------------------ diff

def test_diff_shows_collectives_by_dimension() -> None:
    res = run_cli("diff", str(PARALLEL / "tp"), str(PARALLEL / "fsdp-tp"), "--format", "json")
    assert res.returncode == 0, res.stderr
    comm = json.loads(res.stdout)["comm"]
    assert {r["dim"] for r in comm} == {"tp", "fsdp"}


# ------------------------------------------------------------------ the model

def test_the_model_at_the_base_layout_is_the_measured_step(traces) -> None:
    for name, dim in (("tp", "tp"), ("pp-gpipe", "pp")):
        result = predict_parallel(traces[name], dim, [2])
        assert result.predictions[0].step_ns == pytest.approx(result.base.step_ns)


def test_tensor_parallel_at_one_rank_drops_its_collectives(traces) -> None:
    result = predict_parallel(traces["tp"], "tp", [1, 2, 4])
    one, two, four = result.predictions
    assert one.terms["tp_comm"] == 0 and one.terms["tp_dtensor"] == 0
    assert one.terms["tp_compute"] == pytest.approx(2 * two.terms["tp_compute"])
    assert four.terms["tp_comm"] > two.terms["tp_comm"]  # a ring of 4 costs more


def test_more_microbatches_shrink_the_bubble(traces) -> None:
    base = parallel_base(traces["pp-gpipe"])
    assert base.microbatches == 4 and base.f_mb_ns > 0 and base.b_mb_ns > 0
    steps = [predict_parallel(traces["pp-gpipe"], "pp", [2], microbatches=m).predictions[0]
             for m in (2, 4, 8)]
    assert steps[0].step_ns > steps[1].step_ns > steps[2].step_ns


def test_check_against_a_measured_run(traces) -> None:
    result = predict_parallel(traces["pp-gpipe"], "pp", [2])
    check = check_parallel(result, traces["pp-1f1b"], "pp-1f1b")
    assert check.degrees["pp"] == 2 and check.microbatches == 4
    assert check.measured_ns == pytest.approx(build_report(traces["pp-1f1b"]).steps[
        "dur_ns"].mean())


def test_model_command_for_a_tensor_parallel_trace() -> None:
    res = run_cli("model", str(PARALLEL / "tp"), "--workers", "1,2,4", "--format", "json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["dimension"] == "tp"
    assert [p["degrees"]["tp"] for p in out["predictions"]] == [1, 2, 4]


def test_model_of_a_dimension_the_trace_did_not_run_is_one_line() -> None:
    res = run_cli("model", str(PARALLEL / "tp"), "--mode", "pp", "--workers", "2")
    assert res.returncode != 0
    assert "ran no pp" in res.stderr and "Traceback" not in res.stderr
    # a DDP job read from its Kineto files (no mode recorded) names its layout, not "single"
    res = run_cli("model", str(FIXTURES / "torch-ddp"), "--mode", "tp", "--workers", "2")
    assert res.returncode == 2 and "ran no tp (its layout: dp)" in res.stderr, res.stderr


@pytest.mark.parametrize("name", ["fsdp-tp", "moe", "pp-interleaved", "tp", "tp-funcol"])
def test_each_dimensions_calls_are_its_collectives_counted_once(name: str) -> None:
    """`meta.parallelism`'s calls are the collectives `--by comm` counts: each once, by what
    times it, not again as its wait (``wait_tensor``) or its call beside gloo's span that ran
    it (a TP job's 60 all-reduces read as 180 calls; FSDP's pre-backward range of the root,
    which gathers nothing, as one more; found by scripts we had not written)."""
    trace = load([FIXTURES / "torch-parallel" / name])
    table = build_report(trace).collectives.groupby("dim")["calls"].sum().to_dict()
    assert {d: v["calls"] for d, v in trace.meta["parallelism"].items()} == table
