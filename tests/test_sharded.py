"""Sharded data parallelism, for real: users' FSDP2 (``fully_shard``), FSDP1
(``FullyShardedDataParallel``) and ZeroRedundancyOptimizer scripts under
``opprof run -- torchrun`` (gloo on loopback), ``opprof record --mode fsdp``, and the FSDP step
model (its identities and the simulation's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from opprof.analysis.breakdown import container, step_breakdown
from opprof.analysis.collectives import collective_part
from opprof.analysis.critpath import BOUND_BY, bound_by, graph_of, replay
from opprof.analysis.ops import op_events, op_table
from opprof.intervals import union_length
from opprof.loader import load
from opprof.model import predict
from opprof.model.commmodel import Network
from opprof.model.interference import measure
from opprof.model.predict import baseline
from opprof.model.sharded import (
    ShardedPlan,
    blocking_wait,
    fsdp_calls,
    optimizer_calls,
    segment_spread,
    simulate_sharded,
    trace_samples,
)
from opprof.model.step import expected_max_normal
from opprof.model.terms import terms
from opprof.taxonomy import COMM_OPS, PHASES
from tests.conftest import FIXTURES, run_cli
from tests.procs import needs

SCRIPTS = Path(__file__).parent / "scripts"
FSDP_NAME = r"^(?:FSDP::|fsdp::|FullyShardedDataParallel\.|RegisterPostBackwardFunction)"
COMPUTE_OPS_OF = ("forward", "backward", "update")


def opprof_run(tmp: Path, script: str, *args: str) -> Path:
    """``opprof run`` of a user's script under torchrun with two ranks; the trace."""
    needs("torch")
    out = tmp / f"{Path(script).stem}.trace"
    res = run_cli("run", "--steps", "2", "--warmup", "1", "--timing-steps", "1", "-o",
                  str(out), "--format", "json", "--", sys.executable, "-m",
                  "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPTS / script),
                  "--steps", "6", *args, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def fsdp2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return opprof_run(tmp_path_factory.mktemp("fsdp2"), "torch_fsdp2.py", "--blocks", "3")


@pytest.fixture(scope="module")
def fsdp2(fsdp2_path: Path):
    return load(fsdp2_path)


@pytest.fixture(scope="module")
def fsdp1(tmp_path_factory: pytest.TempPathFactory):
    return load(opprof_run(tmp_path_factory.mktemp("fsdp1"), "torch_fsdp1.py", "--blocks", "3"))


@pytest.fixture(scope="module")
def zero(tmp_path_factory: pytest.TempPathFactory):
    return load(opprof_run(tmp_path_factory.mktemp("zero"), "torch_zero.py", "--blocks", "2"))


def comm_time(trace) -> dict[str, int]:
    """Counted communication time in the steps of worker ranks, per op."""
    ev = trace.events
    c = ev[(ev["role"] == "worker") & (ev["step"] >= 0) & ev["counted"]
           & ev["op"].isin(COMM_OPS)]
    return {str(k): int(v) for k, v in c.groupby("op", observed=True)["dur"].sum().items()}


def fsdp_ranges(trace):
    ev = trace.events
    return ev[ev["name"].astype(str).str.match(FSDP_NAME)]


def check_phases_sum(trace) -> None:
    steps = step_breakdown(trace)
    assert len(steps) and (steps[list(PHASES)].sum(axis=1) == steps["dur_ns"]).all()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["fsdp2", "fsdp1"])
def test_fsdp_run_is_recognized_and_its_collectives_named(which, request) -> None:
    tr = request.getfixturevalue(which)
    assert tr.meta["mode"] == "fsdp" and tr.ranks == [0, 1]
    comm = comm_time(tr)
    assert comm.get("all_gather", 0) > 0 and comm.get("reduce_scatter", 0) > 0
    assert sum(v for k, v in comm.items() if k != "comm") >= 0.9 * sum(comm.values())
    check_phases_sum(tr)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["fsdp2", "fsdp1"])
def test_no_fsdp_range_is_a_compute_operator(which, request) -> None:
    f = fsdp_ranges(request.getfixturevalue(which))
    assert len(f) > 0
    ops = set(f["op"].dropna().astype(str))
    assert ops <= {"all_gather", "reduce_scatter", "memory"}, ops
    assert set(f["phase"].dropna().astype(str)) <= {"comm"}
    # gathering parameters and reducing gradients are there, with FSDP's copies beside them
    assert {"all_gather", "reduce_scatter"} <= ops


@pytest.mark.slow
@pytest.mark.parametrize("which", ["fsdp2", "fsdp1"])
def test_fsdp_all_gather_bytes_are_the_gathered_unit(which, request) -> None:
    """An all-gather's size (nccl-tests') is the gathered buffer: each unit's all-gather
    moves what its reduce-scatter reduces. FSDP1 on gloo calls the list ``c10d::allgather_``,
    which names no output shape, and its ``gloo:all_gather`` span names only the shard. The
    job's one process group names the collectives that carry none."""
    part = collective_part(request.getfixturevalue(which))
    gathered = set(part.loc[part["op"] == "all_gather", "bytes"])
    reduced = set(part.loc[part["op"] == "reduce_scatter", "bytes"])
    assert len(gathered) >= 2 and gathered == reduced
    assert set(part["group"]) == {"0 (default_pg)"} and (part["size"] == 2).all()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["fsdp2", "fsdp1"])
def test_operator_totals_count_each_instant_of_a_lane_once(which, request) -> None:
    """FSDP's pre-backward all-gather runs in an autograd node of the module's backward (a
    LayerNorm's, a view's): it is counted as all_gather, and that node's total leaves it out,
    so the host operator table sums each lane's operator time once."""
    tr = request.getfixturevalue(which)
    ev = op_events(tr)
    lanes = ev.groupby(["rank", "pid", "tid"], observed=True)
    union = sum(union_length(g["ts"].to_numpy(), (g["ts"] + g["dur"]).to_numpy())
                for _, g in lanes)
    assert op_table(tr)["total_ns"].sum() == union
    backward = ev[ev["phase"] == "backward"]
    comm = ev[ev["op"].isin(["all_gather", "reduce_scatter"])]
    assert (container(comm, backward) >= 0).any()  # the case this is about is there


@pytest.mark.slow
def test_a_collective_an_operator_waits_for_is_not_interference(fsdp2, fsdp2_path) -> None:
    """FSDP2's all-gather runs inside a backward node on the training thread: the node is not
    compute slowed beside a collective (its own time is what is compared), so the operator
    time the interference measure finds beside collectives is within the backward
    operators' own time, and the model of the run says where FSDP's copies come from."""
    n = len(step_breakdown(fsdp2))
    m = measure(fsdp2, n)
    ops = op_table(fsdp2, n_steps=n)
    backward_own = ops.loc[ops["phase"] == "backward", "ns_per_step"].sum()
    assert m is None or m.beside_ns <= backward_own
    res = run_cli("model", str(fsdp2_path), "--workers", "2", "--format", "json")
    assert res.returncode == 0, res.stderr
    notes = " ".join(json.loads(res.stdout)["notes"])
    # fitted to it (no network file): FSDP's calls as the training thread pays them
    assert "FSDP's copies inside the trace's FSDP calls" in notes


@pytest.mark.slow
def test_fsdp2_copies_are_memory_inside_the_all_gather(fsdp2) -> None:
    ev = fsdp2.events
    copy_in = ev[ev["name"] == "fsdp::all_gather_copy_in"]
    assert len(copy_in) and (copy_in["op"] == "memory").all() and copy_in["counted"].all()
    gathers = ev[ev["name"].astype(str).str.match(r"FSDP::all_gather \(")]
    assert len(gathers) and (gathers["op"] == "all_gather").all()


@pytest.mark.slow
def test_zero_run_is_recognized(zero) -> None:
    assert zero.meta["mode"] == "zero"
    assert comm_time(zero).get("all_reduce", 0) > 0  # DDP's gradients
    check_phases_sum(zero)


# ------------------------------------------------------------------ record --mode fsdp


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    needs("torch")
    out = tmp_path_factory.mktemp("record-fsdp") / "job.trace"
    res = run_cli("record", "--fw", "torch", "--model", "lenet5", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "--timing-steps", "1", "--workers", "2",
                  "--mode", "fsdp", "-o", str(out), "--format", "json", timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads(res.stdout)


@pytest.mark.slow
def test_record_mode_fsdp(recorded) -> None:
    out, report = recorded
    tr = load(out)
    assert (tr.meta["mode"], tr.meta["workers"], report["meta"]["mode"]) == ("fsdp", 2, "fsdp")
    units = tr.meta["unit_param_bytes"]
    assert len(units) == 6 and sum(units) == tr.meta["param_bytes"]  # root + 5 layers
    comm = comm_time(tr)
    assert comm.get("all_gather", 0) > 0 and comm.get("reduce_scatter", 0) > 0
    assert set(fsdp_ranges(tr)["op"].dropna().astype(str)) <= {"all_gather",
                                                                "reduce_scatter", "memory"}
    check_phases_sum(tr)


@pytest.mark.slow
def test_by_rank_splits_each_collective_into_wait_and_transfer(recorded) -> None:
    _, report = recorded
    kinds = {k["op"]: k for k in report["collective_kinds"]}
    assert "all_gather" in kinds
    for k in kinds.values():
        assert k["calls"] > 0 and k["wait_ns"] >= 0 and k["transfer_ns"] >= 0
        assert k["wait_ns"] + k["transfer_ns"] > 0
        assert 0 <= k["hidden"] <= 1


@pytest.mark.slow
def test_model_of_an_fsdp_run_at_its_own_size_is_the_measurement(recorded) -> None:
    out, _ = recorded
    res = run_cli("model", str(out), "--workers", "2,4", "--check", str(out),
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["base"]["mode"] == "fsdp"
    assert [p["mode"] for p in doc["predictions"]] == ["fsdp", "fsdp"]
    check = doc["check"]
    assert check["predicted_step_ns"] == pytest.approx(check["measured_step_ns"], rel=1e-9)
    res = run_cli("whatif", str(out), "--comm", "1", "--format", "json")
    assert res.returncode == 0, res.stderr
    w = json.loads(res.stdout)
    assert w["step_ns"] == pytest.approx(w["base_step_ns"], rel=1e-9)


@pytest.mark.slow
def test_fsdp_on_gloo_blocks_and_its_critical_path_holds(recorded) -> None:
    out, _ = recorded
    tr = load(out)
    # FSDP2 on gloo: the training thread waits in every all-gather and reduce-scatter (its
    # hooks run inside autograd's operators): no backward operator computes beside one
    assert measure(tr, terms(tr).steps) is None
    # every step's bound-by parts sum to it; the unedited graph replays every step
    got = graph_of(tr)
    assert got is not None
    g, order = got
    b = bound_by(g)
    assert (b[list(BOUND_BY)].sum(axis=1) == b["step_ns"]).all() and (b["comm"] > 0).all()
    r = replay(g, None, order)
    assert np.allclose(r["replay_ns"], r["step_ns"], rtol=1e-9, atol=1.0)
    # its collectives, fitted, carry each unit's unsharded bytes (the spans hold the unit's)
    fit = trace_samples(tr)
    assert len(fit) and set(fit["bytes"]) <= set(tr.meta["unit_param_bytes"])
    # and its model pays the wait for the slowest rank at every blocking collective
    base = baseline(tr)
    assert base.units.segment_sigma_ns is not None and base.units.segment_sigma_ns > 0


@pytest.mark.slow
def test_fsdp_calls_as_the_training_thread_pays_them(recorded) -> None:
    """Each FSDP2 collective on the training thread (its ``FSDP::all_gather (unit)`` range —
    copy-in, all-gather — and its copy-out; or ``FSDP::post_backward_reduce (unit)``) splits
    into the wait for the last rank to enter the same call and what it costs after: the
    times calibrate measures, so a model fitted to the trace has the same terms."""
    out, _ = recorded
    tr = load(out)
    calls, spread = fsdp_calls(tr)
    root, *inner = tr.meta["unit_param_bytes"]  # LeNet-5's root holds no parameters
    units = [n for n in (root, *inner) if n]
    steps = step_breakdown(tr)
    n_steps = steps.groupby("rank")["step"].nunique()
    assert (n_steps == n_steps.iloc[0]).all()
    per_rank_step = calls.groupby(["rank", "step", "kind"]).size().unstack("kind")
    # every unit with parameters gathered in forward, again in backward but the root (still
    # gathered), each reduce-scattered
    assert (per_rank_step["reduce_scatter"] == len(units)).all()
    assert (per_rank_step["all_gather"] == 2 * len(inner) + (root > 0)).all()
    assert set(calls["bytes"]) == set(units)
    assert (calls["wait_ns"] >= 0).all() and (calls["ns"] >= 0).all() and spread >= 0
    done = calls["exit"] + calls["copy_out_ns"]
    assert ((calls["wait_ns"] + calls["ns"]) == done - calls["enter"]).all()
    first_in = calls.groupby(["step", "kind", "unit"])["wait_ns"].transform("min")
    assert (first_in == 0).all()  # the last rank in waits for no one
    # where a step's exposed comm goes: the calls' waits and costs, and little else (FSDP's
    # hooks around them)
    per_step = (calls["wait_ns"] + calls["ns"]).sum() / len(steps)
    assert 0.5 * steps["comm"].mean() <= per_step <= steps["comm"].mean() * 1.01
    net = predict.network_from_trace(tr)
    assert net is not None and net.info["copies"] and net.info["copy_ns_per_byte"] == 0
    assert net.info["exit_spread_ns"] == pytest.approx(spread)


# ------------------------------------------------------------------ the simulation


def plan(workers: int, overlap: bool, copy: float = 0.0) -> ShardedPlan:
    phases = {"load": 1e6, "h2d": 0.0, "forward": 30e6, "backward": 60e6, "update": 5e6,
              "other": 1e5}
    return ShardedPlan(phases=phases, unit_bytes=np.array([1e5, 4e6, 4e6, 8e6]),
                       share=np.array([0.1, 0.3, 0.3, 0.3]),
                       cost=lambda kind, n: (workers - 1) * (1e4 + n / workers),
                       copy_ns_per_byte=copy, workers=workers, overlap=overlap)


def test_sharded_step_phases_sum_and_one_worker_moves_nothing() -> None:
    for workers in (1, 2, 8):
        for overlap in (False, True):
            sim = simulate_sharded(plan(workers, overlap, 0.1))
            assert sum(sim.phases.values()) == pytest.approx(sim.step_ns)
    one = simulate_sharded(plan(1, False, 0.1))
    assert one.phases["comm"] == 0 and not one.messages


def test_blocking_fsdp_pays_every_collective_and_prefetch_hides_some() -> None:
    p = plan(4, False)
    sim = simulate_sharded(p)
    units = p.unit_bytes
    # forward: every unit gathered; backward: every unit but the root gathered again; every
    # unit reduce-scattered
    expected = sum(p.cost("all_gather", n) for n in units) \
        + sum(p.cost("all_gather", n) for n in units[1:]) \
        + sum(p.cost("reduce_scatter", n) for n in units)
    assert [m["kind"] for m in sim.messages].count("all_gather") == 2 * len(units) - 1
    assert sim.phases["comm"] == pytest.approx(expected)
    assert sim.comm_busy_ns == pytest.approx(expected)
    ahead = simulate_sharded(plan(4, True))
    assert ahead.comm_busy_ns == pytest.approx(expected)
    assert ahead.step_ns < sim.step_ns and ahead.comm_hidden_ns > 0


def test_segment_spread_is_each_segment_sigma_over_the_steps() -> None:
    trace = load(FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz")
    ev = trace.events
    ops = ev[(ev["step"] >= 0) & ev["counted"] & (ev["kind"] == "cpu_op")]
    # one unit: a segment is the whole phase, from its first operator's start to the last end
    whole = 0.0
    for phase in ("forward", "backward"):
        o = ops[ops["phase"] == phase]
        span = (o["ts"] + o["dur"]).groupby(o["step"]).max() - o.groupby("step")["ts"].min()
        whole += float(span.std(ddof=1))
    one = segment_spread(trace, np.array([1.0]))
    assert one == pytest.approx(whole, rel=1e-9)
    # cut into units, the segments' σ add up to at least the whole's (σ of a sum ≤ Σ σ)
    assert segment_spread(trace, np.array([0.1, 0.3, 0.6])) >= one * (1 - 1e-9)
    # FSDP on gloo pays the wait at every blocking collective: E[max of N] × Σ σ
    base = baseline(trace)
    assert base.units.segment_sigma_ns is not None
    net = Network("fsdp", 1e4, 0.1, source="calibrate")
    p, policy = predict.plan(base, 4, "fsdp", 1, net, straggler=True)
    assert not policy.overlap
    assert p.straggler_ns == pytest.approx(base.units.segment_sigma_ns
                                           * expected_max_normal(4))


def test_blocking_wait_at_every_collective() -> None:
    """Every blocking collective waits for the slowest rank: E[max of N] × the σ of the
    ranks' arrival, from the compute segment before it and the exits' spread of the
    collective before; the U − 1 backward all-gathers right after a reduce-scatter pay the
    spread alone. Without a spread it is the segments' Σσ × E[max]."""
    sigmas = np.array([3e6, 4e6, 0.0, 5e6])  # two units: two forward, two backward segments
    e = expected_max_normal(2)
    assert blocking_wait(sigmas, 0.0, 2, 2) == pytest.approx(e * sigmas.sum())
    x = 4e6
    want = e * (np.sqrt(sigmas ** 2 + x ** 2).sum() + (3 * 2 - 1 - 4) * x)
    assert blocking_wait(sigmas, x, 2, 2) == pytest.approx(want)
    assert blocking_wait(sigmas, x, 2, 1) == 0.0  # one rank waits for no one


def test_model_waits_with_the_calibrated_exit_spread() -> None:
    trace = load(FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz")
    base = baseline(trace)
    assert base.units.segment_sigmas is not None
    net = Network("fsdp", 1e4, 0.1, source="calibrate", info={"exit_spread_ns": 2e6})
    p, _ = predict.plan(base, 4, "fsdp", 1, net, straggler=True)
    assert p.straggler_ns == pytest.approx(blocking_wait(
        base.units.segment_sigmas, 2e6, len(base.units.bytes), 4))
    assert p.straggler_ns > base.units.segment_sigma_ns * expected_max_normal(4)


def test_optimizer_calls_are_sgd_momentums_three_per_parameter() -> None:
    needs("torch")
    from opprof.collectors.torch_models import build

    trace = load(FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz")
    params = len(list(build("lenet5", 10).parameters()))
    # SGD with momentum: mul_ and add_ on the momentum buffer, add_ on the parameter
    assert optimizer_calls(trace) == 3 * params
    assert baseline(trace).units.optimizer_calls == 3 * params


def test_model_adds_each_optimizer_calls_dispatch_on_sharded_parameters() -> None:
    trace = load(FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz")
    base = baseline(trace)
    calls = base.units.optimizer_calls
    plain = Network("fsdp", 1e4, 0.1, source="calibrate", info={})
    dispatch = Network("fsdp", 1e4, 0.1, source="calibrate", info={"sharded_op_ns": 2e4})
    for n in (2, 4):
        p0, _ = predict.plan(base, n, "fsdp", 1, plain)
        p1, _ = predict.plan(base, n, "fsdp", 1, dispatch)
        assert p0.phases["update"] == pytest.approx(base.phases["update"] / n)
        assert p1.phases["update"] == pytest.approx(base.phases["update"] / n + calls * 2e4)
    # one worker shards nothing: the base's update as it was
    p1, _ = predict.plan(base, 1, "fsdp", 1, dispatch)
    assert p1.phases["update"] == pytest.approx(base.phases["update"])


# ------------------------------------------------------------------ calibrate --mode fsdp


@pytest.mark.slow
def test_calibrate_fsdp_fits_all_gather_and_reduce_scatter_with_their_copies(
        tmp_path: Path) -> None:
    needs("torch")
    out = tmp_path / "fsdp-net.json"
    res = run_cli("calibrate", "--fw", "torch", "--workers", "2", "--mode", "fsdp", "--sizes",
                  "64K,1M", "--repeat", "2", "-o", str(out), timeout=300)
    assert res.returncode == 0, res.stderr
    shown = " ".join(res.stdout.split())  # the table's title wraps on a narrow terminal
    assert "mean per size; all-gather, then reduce-scatter" in shown
    net = json.loads(out.read_text())
    assert net["collective"] == "fsdp" and net["workers"] == 2
    assert net["beta_ns_per_byte"] > 0 or net["alpha_ns"] > 0
    rs = net["info"]["reduce_scatter"]
    assert rs["beta_ns_per_byte"] > 0 or rs["alpha_ns"] > 0
    # FSDP's copies are inside the collectives' times: the model adds none of its own
    assert net["info"]["copy_ns_per_byte"] == 0 and net["info"]["copies"]
    assert net["info"]["exit_spread_ns"] >= 0 and net["info"]["wait_ns"] >= 0
    assert net["info"]["calls"] == 2 * 2 * 2  # two kinds × two sizes × two calls
    assert net["info"]["sharded_op_ns"] >= 0  # an optimizer's call on a DTensor, beyond
    assert [s["calls"] for s in net["samples"]] == [2, 2] and net["fit"]["center"] == "mean"


@pytest.mark.slow
def test_fsdp_calls_are_timed_from_the_last_rank_in(tmp_path: Path) -> None:
    """Each rank times FSDP's call from its own entry (after compute, as in training, so the
    ranks arrive apart) to its exit, on the host's clock: a call costs what it took after the
    last rank entered it, the earlier rank's wait left to the model's straggler term."""
    needs("torch")
    import pandas as pd

    from opprof.collectors import netbench
    from opprof.pipeline.calibrate import fsdp_calls

    job = netbench.Job(fw="torch", workers=2, sizes=(65536,), repeat=3, threads=1,
                       extra={"mode": "fsdp"})
    df = pd.DataFrame(netbench.run(job, tmp_path / "work"))
    assert set(df["kind"]) == {"all_gather", "reduce_scatter", "sharded_op", "local_op"}
    ops = df[df["kind"].isin(["sharded_op", "local_op"])]
    # each rank times the optimizer's calls on sharded parameters and on their shards alike
    assert (ops["ns"] > 0).all() and ops.groupby(["rank", "kind"]).size().nunique() == 1
    df = df.drop(ops.index)
    assert (df["exit"] - df["enter"] == df["ns"]).all() and (df["ns"] > 0).all()
    calls, spread = fsdp_calls(df)
    assert len(calls) == 2 * 3 and spread >= 0
    for (kind, k), call in calls.set_index(["kind", "call"]).iterrows():
        both = df[df["kind"] == kind].groupby("rank").nth(k)
        last = both["enter"].max()
        assert call["ns"] == pytest.approx((both["exit"] - last).mean())
        assert call["wait_ns"] == pytest.approx((last - both["enter"]).mean())
        assert call["ns"] <= both["ns"].max()  # the wait is out of it


def test_calibrate_units_are_a_models_fsdp_units(tmp_path: Path) -> None:
    needs("torch")
    from opprof.collectors.torch_models import build, unit_param_bytes
    from opprof.pipeline.calibrate import unit_sizes

    units = unit_param_bytes(build("resnet18", 10))
    assert unit_sizes("resnet18") == tuple(sorted(set(units))) and len(units) == 9
    res = run_cli("calibrate", "--fw", "torch", "--workers", "2", "--units", "resnet18", "-o",
                  str(tmp_path / "x.json"))
    assert res.returncode != 0 and "for --mode fsdp" in res.stderr
    assert "Traceback" not in res.stderr
    res = run_cli("calibrate", "--fw", "torch", "--workers", "2", "--mode", "fsdp", "--units",
                  "resnet181", "-o", str(tmp_path / "x.json"))
    assert res.returncode != 0 and "unknown model 'resnet181'" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_calibrate_units_of_a_recorded_trace(recorded) -> None:
    from opprof.pipeline.calibrate import unit_sizes

    out, _ = recorded
    units = load(out).meta["unit_param_bytes"]
    assert 0 in units  # LeNet-5's root holds no parameters of its own: nothing to time
    assert unit_sizes(str(out)) == tuple(sorted({n for n in units if n}))


def test_calibrate_fsdp_is_torch_only(tmp_path: Path) -> None:
    res = run_cli("calibrate", "--fw", "mxnet", "--workers", "2", "--mode", "fsdp", "-o",
                  str(tmp_path / "x.json"))
    assert res.returncode != 0 and "FSDP is PyTorch's" in res.stderr
    assert "Traceback" not in res.stderr
