"""The performance model on real traces of every framework: the terms sum to the step, the
gradient profile agrees with what DDP actually all-reduced, operator wall shares add up, the
α–β fit, the simulation's identities and the prediction's refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opprof.analysis.breakdown import step_breakdown
from opprof.analysis.ops import op_table
from opprof.analysis.opshare import op_wall, phase_totals
from opprof.errors import OpprofError
from opprof.loader import load
from opprof.model.commmodel import Network, design, fit
from opprof.model.gradients import profile
from opprof.model.predict import baseline, check, predict
from opprof.model.resources import resource_mismatch, resources
from opprof.model.simulate import DDP, messages
from opprof.model.terms import TERMS, terms
from opprof.taxonomy import PHASES
from opprof.trace import save
from tests.conftest import FIXTURES, run_cli, shared_trace

TORCH = FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"
DDP_FILES = sorted((FIXTURES / "torch-ddp").glob("*.pt.trace.json.gz"))
TRACES = {
    "torch": [TORCH],
    "torch-ddp": DDP_FILES,
    "mxnet": [FIXTURES / "mxnet" / "lenet5-single"],
    "mxnet-ps": [FIXTURES / "mxnet" / "lenet5-ps-sync"],
    "tf-allreduce": [FIXTURES / "tf" / "lenet5-allreduce-2w"],
    "tf-ps-async": [FIXTURES / "tf" / "lenet5-ps-async-2w1s"],
}


@pytest.fixture(scope="module")
def traces() -> dict:
    return {k: load(v) for k, v in TRACES.items()}


@pytest.mark.parametrize("name", list(TRACES))
def test_terms_plus_other_equal_the_measured_step_exactly(traces: dict, name: str) -> None:
    t = terms(traces[name])
    rows = t.per_step
    assert len(rows) > 0
    assert (rows[list(TERMS)].sum(axis=1) == rows["dur_ns"]).all()
    assert rows[list(TERMS)].dtypes.map(lambda d: d.kind == "i").all()
    assert sum(t.mean().values()) == pytest.approx(t.step_ns, rel=1e-12)
    spread = t.spread.set_index("term")
    assert spread.loc["step", "mean_ns"] == pytest.approx(t.step_ns)
    assert (spread["min_ns"] <= spread["max_ns"]).all()
    # exposed comm never exceeds the time a collective ran
    assert (rows["t_comm"] <= rows["comm_busy_ns"]).all()


def test_terms_on_a_real_gpu_trace_sum_to_the_step() -> None:
    t = terms(load(shared_trace("nccl-2rank-rank0.json.gz")))
    rows = t.per_step
    assert (rows[list(TERMS)].sum(axis=1) == rows["dur_ns"]).all()


def test_torch_gradients_are_what_ddp_all_reduced(traces: dict) -> None:
    """The gradient bytes read from AccumulateGrad shapes equal gloo's all_reduce payload."""
    ddp = traces["torch-ddp"]
    g = profile(ddp)
    ev = ddp.events
    gloo = ev[ev["name"] == "gloo:all_reduce"]
    per_step = gloo.groupby(["rank", "step"])["bytes"].sum()
    assert (per_step == g.total_bytes).all()
    assert g.total_bytes == 248_024  # lenet5: 62,006 float32 parameters
    # every (rank, step) has one gradient per parameter tensor, in ready order
    sizes = g.tensors.groupby(["rank", "step"]).size()
    assert (sizes == 10).all()
    assert (g.tensors.groupby(["rank", "step"])["ready_ns"].diff().dropna() >= 0).all()
    # and DDP's bucketing of them gives the one bucket gloo reduced
    sent = messages(g.layers["ready_frac"].to_numpy(), g.layers["bytes"].to_numpy(), DDP)
    assert [n for _, n in sent] == sorted(set(gloo["bytes"]))


@pytest.mark.parametrize("name", ["mxnet", "tf-allreduce"])
def test_gradients_without_shapes_are_layers_in_backward_order(traces: dict, name: str) -> None:
    g = profile(traces[name])
    assert len(g.layers) >= 5  # lenet5: 2 conv + 3 dense
    assert (g.layers["ready_frac"].diff().dropna() >= -1e-9).all()
    assert set(g.layers["op"]) <= {"convolution_backward", "fully_connected_backward",
                                   "batch_norm_backward"}


@pytest.mark.parametrize("name", list(TRACES))
def test_operator_wall_shares_add_up_to_the_phases(traces: dict, name: str) -> None:
    tr = traces[name]
    steps = step_breakdown(tr)
    w = op_wall(tr, steps)
    got = phase_totals(w).set_index(["rank", "step"])
    want = steps.set_index(["rank", "step"])
    for p in PHASES:
        assert np.allclose(got[p], want[p], rtol=0, atol=1e-3)
    attributed = w[w["op"] != "(unattributed)"]
    assert (attributed["wall_ns"] >= -1e-6).all()
    assert (w.loc[w["op"] == "(unattributed)", "wall_ns"] >= -1e-3).all()


def test_operator_wall_time_is_its_time_on_a_serial_run(traces: dict) -> None:
    tr = traces["torch"]
    w = op_wall(tr)
    n = len(step_breakdown(tr))
    wall = w[w["op"] != "(unattributed)"].groupby("op")["wall_ns"].sum() / n
    ops = op_table(tr, n_steps=n).groupby("op")["ns_per_step"].sum()
    assert set(wall.index) == set(ops.index)
    for op in ops.index:
        assert wall[op] == pytest.approx(ops[op], rel=1e-9)


def test_alpha_beta_fit_recovers_the_cost_equation() -> None:
    rng = np.random.default_rng(0)
    sizes = np.repeat(4 ** np.arange(1, 10) * 1024, 5)
    for collective, n, s in (("allreduce", 4, 1), ("ps", 4, 2)):
        a, b = design(sizes, collective, n, s)
        ns = (a * 40_000 + b * 1.5) * rng.normal(1.0, 0.02, len(sizes))
        ns[3] *= 5  # one outlier the robust fit must shrug off
        net = fit(pd.DataFrame({"bytes": sizes, "ns": ns}), collective, n, s)
        assert net.alpha_ns == pytest.approx(40_000, rel=0.1)
        assert net.beta_ns_per_byte == pytest.approx(1.5, rel=0.03)
        assert net.bandwidth_Bps == pytest.approx(1e9 / net.beta_ns_per_byte)
        back = Network.from_dict(json.loads(json.dumps(net.to_dict())))
        assert back.cost_ns(1e6, 8, 2) == pytest.approx(net.cost_ns(1e6, 8, 2))


def test_ring_all_reduce_cost_follows_the_formula() -> None:
    net = Network("allreduce", alpha_ns=10.0, beta_ns_per_byte=2.0)
    assert net.cost_ns(1000, 1) == 0  # nothing to exchange alone
    assert net.cost_ns(1000, 4) == pytest.approx(2 * 3 * 10 + 2 * 3 / 4 * 1000 * 2)
    ps = Network("ps", alpha_ns=10.0, beta_ns_per_byte=2.0)
    assert ps.cost_ns(1000, 4, 2) == pytest.approx(2 * 10 + 2 * 2 * 1000 * 2)
    assert ps.cost_ns(1000, 1, 4) == pytest.approx(2 * 10 + 2 * 1 * 1000 * 2)


def test_a_collective_costs_what_was_measured_at_its_size() -> None:
    # a calibration whose cost per byte grows past 16 MiB (the buffers outgrow the caches)
    sizes = np.array([4 << 10, 1 << 20, 16 << 20, 64 << 20])
    ns = np.array([2e5, 1.2e6, 2e7, 2e8])
    net = fit(pd.DataFrame({"bytes": sizes, "ns": ns}), "allreduce", 2)
    at = net.cost_ns(sizes.astype(float), 2)
    assert at == pytest.approx(ns)  # the measured medians, not the α–β line
    mid = float(net.cost_ns(40 << 20, 2))
    assert mid == pytest.approx(2e7 + (2e8 - 2e7) * 24 / 48)  # linear between 16 and 64 MiB
    assert float(net.cost_ns(128 << 20, 2)) == pytest.approx(2e8 + 64 * (2e8 - 2e7) / 48)
    # below the smallest size α–β stands in; another N moves the curve by α–β's ratio
    alpha_beta = Network("allreduce", net.alpha_ns, net.beta_ns_per_byte)
    assert float(net.cost_ns(1 << 10, 2)) == pytest.approx(float(alpha_beta.cost_ns(1 << 10, 2)))
    ratio = float(alpha_beta.cost_ns(40 << 20, 8)) / float(alpha_beta.cost_ns(40 << 20, 2))
    assert float(net.cost_ns(40 << 20, 8)) == pytest.approx(mid * ratio)
    assert float(net.cost_ns(40 << 20, 1)) == 0
    # FSDP's reduce-scatter follows its own measured curve
    rs = fit(pd.DataFrame({"bytes": sizes, "ns": 2 * ns}), "fsdp", 2)
    fsdp = fit(pd.DataFrame({"bytes": sizes, "ns": ns}), "fsdp", 2)
    fsdp.info["reduce_scatter"] = {"alpha_ns": rs.alpha_ns,
                                   "beta_ns_per_byte": rs.beta_ns_per_byte,
                                   "samples": rs.samples}
    assert fsdp.kind_cost_ns("reduce_scatter", 16 << 20, 2) == pytest.approx(4e7)
    assert fsdp.kind_cost_ns("all_gather", 16 << 20, 2) == pytest.approx(2e7)


def test_one_message_size_fits_beta_alone(traces: dict) -> None:
    """From the DDP fixture's own collectives: one size, so α = 0 and the fit says so."""
    r = predict(traces["torch-ddp"], [2, 4])
    assert r.network.source == "trace"
    assert r.network.alpha_ns == 0 and r.network.beta_ns_per_byte > 0
    assert "one message size" in r.network.fit["note"]


@pytest.mark.parametrize("name", list(TRACES))
def test_prediction_at_the_trace_own_worker_count_is_the_measured_step(traces: dict,
                                                                       name: str) -> None:
    tr = traces[name]
    base = baseline(tr)
    r = predict(tr, [base.workers], base=base)
    p = r.predictions[0]
    assert p.step_ns == base.step_ns
    assert p.phases == base.phases
    assert sum(p.phases.values()) == pytest.approx(p.step_ns, rel=1e-12)


def test_one_worker_prediction_adds_communication_only(traces: dict) -> None:
    tr = traces["torch"]
    r = predict(tr, [1, 2, 4, 8], mode="allreduce")
    base = r.base
    steps = [p.step_ns for p in r.predictions]
    assert steps[0] == base.step_ns and r.predictions[0].speedup == 1.0
    assert steps == sorted(steps)  # more workers, more communication per step
    for p in r.predictions:
        for ph in ("forward", "backward", "update", "load", "other"):
            assert p.phases[ph] == base.phases[ph]
        assert p.speedup == pytest.approx(p.workers * base.step_ns / p.step_ns)
        assert p.efficiency == pytest.approx(p.speedup / p.workers)
    assert r.network.source == "assumed"


def test_parameter_server_moves_the_optimizer_to_the_servers(traces: dict) -> None:
    tr = traces["mxnet"]
    r = predict(tr, [2], mode="ps-sync", servers=1)
    p = r.predictions[0]
    optimizer = r.base.optimizer_ns
    assert 0 < optimizer < r.base.phases["update"]
    # the worker keeps the loop's own time around push and pull; the servers' optimizer is
    # waited for inside the exposed communication
    assert p.phases["update"] == pytest.approx(r.base.phases["update"] - optimizer)
    assert p.exposed_comm_ns > optimizer


def test_check_refuses_workers_with_other_resources(traces: dict, tmp_path: Path) -> None:
    base = traces["torch"]
    base.meta.update(threads=2, cpus=2, workers=1, device="cpu")
    meas = traces["torch-ddp"]
    meas.meta.update(threads=1, cpus=2, workers=2, device="cpu", mode="allreduce")
    r = predict(base, [2], mode="allreduce")
    with pytest.raises(OpprofError, match=r"2 vs 1 threads per worker.*--threads 1"):
        check(r, meas, "ddp")
    # the CLI says it in one line
    a, b = tmp_path / "base.trace", tmp_path / "ddp.trace"
    save(base, a)
    save(meas, b)
    res = run_cli("model", str(a), "--workers", "2", "--check", str(b))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "threads per worker" in res.stderr


def test_resources_compare_cores_per_worker() -> None:
    alone = resources({"device": "cpu", "threads": {"intra_op": 0, "cpus": 2}, "workers": 1,
                       "hosts": ["h"]})
    shared = resources({"device": "cpu", "threads": {"intra_op": 0, "cpus": 2}, "workers": 2,
                        "hosts": ["h"]})
    assert alone.threads == 2 and alone.effective == 2 and shared.effective == 1
    assert "cores per worker" in resource_mismatch(alone, shared)
    one = resources({"device": "cpu", "threads": 1, "cpus": 2, "workers": 1, "hosts": ["h"]})
    ddp = resources({"device": "cpu", "threads": 1, "cpus": 2, "workers": 2, "hosts": ["h"]})
    assert resource_mismatch(one, ddp) is None


def test_check_compares_term_by_term(traces: dict) -> None:
    tr = traces["torch-ddp"]
    r = predict(tr, [2])
    c = check(r, tr, "itself")
    assert c.error == 0 and (c.terms["error_ns"] == 0).all()
    with_interference = [t for term in TERMS for t in
                         ((term, "t_interf", "t_coloc") if term == "t_b" else (term,))]
    assert list(c.terms["term"]) == [*with_interference, "step"]


def test_model_json_has_the_documented_shape(tmp_path: Path) -> None:
    res = run_cli("model", str(TORCH), "--workers", "1,2,4", "--mode", "allreduce",
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc["terms"]) == set(TERMS)
    assert sum(doc["terms"].values()) == pytest.approx(doc["base"]["step_ns"])
    assert {"alpha_ns", "beta_ns_per_byte", "collective", "source"} <= set(doc["network"])
    assert [p["workers"] for p in doc["predictions"]] == [1, 2, 4]
    for p in doc["predictions"]:
        assert {"workers", "mode", "step_ns", "speedup", "efficiency",
                "exposed_comm_ns"} <= set(p)
    assert doc["check"] is None
    for fmt in ("rich", "md", "csv"):
        out = run_cli("model", str(TORCH), "--workers", "2", "--format", fmt)
        assert out.returncode == 0 and out.stdout.strip(), out.stderr


def test_model_with_a_network_file_uses_it(tmp_path: Path) -> None:
    net = Network("allreduce", 50_000.0, 2.0, workers=2, source="calibrate", backend="gloo")
    path = tmp_path / "net.json"
    path.write_text(json.dumps(net.to_dict()))
    res = run_cli("model", str(TORCH), "--workers", "2", "--network", str(path), "--format",
                  "json")
    doc = json.loads(res.stdout)
    assert doc["network"]["alpha_ns"] == 50_000 and doc["network"]["source"] == "calibrate"
    wrong = tmp_path / "ps.json"
    wrong.write_text(json.dumps({**net.to_dict(), "collective": "ps"}))
    res = run_cli("model", str(TORCH), "--workers", "2", "--mode", "allreduce", "--network",
                  str(wrong))
    assert res.returncode == 2 and "needs allreduce" in res.stderr


@pytest.mark.parametrize("bad,msg", [
    ("[1, 2", "not JSON"), ('{"x": 1}', "not an opprof network file"),
    ('{"opprof_network": 1, "collective": "allreduce", "alpha_ns": -1, "beta_ns_per_byte": 1}',
     "non-negative"),
])
def test_bad_network_file_is_one_line(tmp_path: Path, bad: str, msg: str) -> None:
    path = tmp_path / "net.json"
    path.write_text(bad)
    res = run_cli("model", str(TORCH), "--network", str(path))
    assert res.returncode == 2 and msg in res.stderr and "Traceback" not in res.stderr


def test_model_of_a_missing_trace_is_one_line() -> None:
    res = run_cli("model", "nope.trace")
    assert res.returncode == 2 and "nope.trace: no such file" in res.stderr


def test_model_of_one_rank_of_an_expert_parallel_job_names_the_trace_not_a_flag() -> None:
    """One rank's file of a 128-rank dp+ep job, no --mode given: the trace's layout chose
    expert parallel, which a one-worker trace cannot be split into; the one line says so
    (the trace and its layout, what to give instead), not an option the user never gave."""
    trace = shared_trace("sampled-128rank-rank0.json.gz")
    res = run_cli("model", str(trace), "--workers", "1,2,4")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and "--mode ep" not in line, line
    assert "sampled-128rank-rank0.json.gz" in line and "dp+ep" in line, line
    res = run_cli("model", str(trace), "--workers", "1,2,4", "--mode", "allreduce")
    assert res.returncode == 0, res.stderr  # what the line offers runs


def test_one_worker_has_no_communication_even_where_gradient_sizes_are_unknown() -> None:
    """One rank of a 128-rank job whose collectives carry no sizes: the base's measured
    communication is kept for 2 and 4 workers (nothing better is known, and the note says so),
    but one worker talks to no one: its step is the base's compute, speed-up 1.00x."""
    trace = shared_trace("sampled-128rank-rank0.json.gz")
    res = run_cli("model", str(trace), "--workers", "1,2,4", "--mode", "allreduce",
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    pred = {p["workers"]: p for p in doc["predictions"]}
    base = doc["base"]
    assert pred[1]["exposed_comm_ns"] == 0.0
    assert pred[1]["speedup"] == pytest.approx(1.0)
    for n in (2, 4):
        assert pred[n]["exposed_comm_ns"] > 0
        assert pred[n]["comm_busy_ns"] >= pred[n]["exposed_comm_ns"]
        assert pred[n]["step_ns"] == pytest.approx(base["step_ns"])
    # the kept communication is the base's own: one worker's step is the rest of it
    assert pred[1]["step_ns"] == pytest.approx(base["step_ns"] - pred[2]["exposed_comm_ns"])
    assert any("kept as measured" in n for n in doc.get("notes", [])), doc.get("notes")


def test_pipeline_split_of_a_gpu_trace_whose_operators_lack_shapes() -> None:
    """A Kineto GPU trace (HTA's NCCL run) split into 2 pipeline stages: operators recorded
    without shapes have no ``detail`` (pandas' NA), read as no shapes, not a crash."""
    res = run_cli("model", str(shared_trace("nccl-2rank-rank0.json.gz")), "--workers", "2",
                  "--mode", "pp", "--microbatches", "4", "--schedule", "1f1b",
                  "--format", "json")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    (pred,) = doc["predictions"]
    assert pred["degree"] == 2 and pred["schedule"] == "1f1b" and pred["step_ns"] > 0


def test_speedup_is_nan_free_and_efficiency_at_most_one(traces: dict) -> None:
    r = predict(traces["tf-allreduce"], [1, 2, 3, 16])
    for p in r.predictions:
        assert not math.isnan(p.speedup) and 0 < p.efficiency <= 1.0 + 1e-9


def _plan(policy, cost_per_byte: float = 1.0, **kw):
    from opprof.model.step import StepPlan

    phases = {"load": 10.0, "h2d": 0.0, "forward": 100.0, "backward": 200.0, "update": 30.0,
              "other": 5.0}
    return StepPlan(phases=phases, ready_frac=np.array([0.25, 0.5, 1.0]),
                    grad_bytes=np.array([2 << 20, 30 << 20, 10]), policy=policy,
                    cost=lambda n: n * cost_per_byte / (1 << 20), **kw)


def test_simulated_buckets_overlap_backward_and_expose_only_the_tail() -> None:
    from opprof.model.simulate import AFTER_BACKWARD, simulate

    # DDP: bucket 1 (2 MiB ≥ 1 MiB) ready at 25% of backward, bucket 2 (30 MiB ≥ 25 MiB) at
    # 50%, bucket 3 (10 B) at the end; each costs 1 ns per MiB.
    r = simulate(_plan(DDP))
    assert [m["bytes"] for m in r.messages] == [2 << 20, 30 << 20, 10]
    b0 = 10 + 100  # backward starts after load and forward
    assert [m["start_ns"] for m in r.messages] == [b0 + 50, b0 + 100, b0 + 200]
    assert r.phases["comm"] == pytest.approx(10 / (1 << 20))  # only the last bucket shows
    assert r.step_ns == pytest.approx(sum(r.phases.values()))
    # slow link: bucket 2 takes 30 × 10 = 300 ns from 100 ns into backward → 200 ns exposed
    slow = simulate(_plan(DDP, cost_per_byte=10.0))
    assert slow.phases["comm"] == pytest.approx(b0 + 100 + 300 - (b0 + 200) + 10 * 10 / (1 << 20))
    # after-backward: one message of everything, all of it exposed
    after = simulate(_plan(AFTER_BACKWARD))
    assert len(after.messages) == 1 and after.phases["comm"] == pytest.approx(32 + 10 / (1 << 20))


def test_simulated_tf_packing_is_update_time() -> None:
    from opprof.model.simulate import MWMS, simulate

    r = simulate(_plan(MWMS, pack_ns=11.0))
    assert len(r.messages) == 1 and r.phases["update"] == 30.0 + 11.0
    assert r.phases["comm"] == pytest.approx(32 + 10 / (1 << 20))
    alone = simulate(_plan(MWMS, pack_ns=11.0, communicate=False))
    assert alone.phases["update"] == 30.0  # one worker packs nothing


def test_simulated_parameter_server_puts_the_optimizer_between_push_and_pull() -> None:
    from opprof.model.simulate import KVSTORE, simulate

    r = simulate(_plan(KVSTORE, server_update_ns=7.0))
    # one key per gradient, one after another from the end of backward, each with its share
    # of the servers' optimizer time
    assert [m["bytes"] for m in r.messages] == [2 << 20, 30 << 20, 10]
    ends = [m["end_ns"] for m in r.messages]
    assert ends == sorted(ends) and r.messages[0]["start_ns"] == 10 + 100 + 200
    assert r.phases["comm"] == pytest.approx(32 + 10 / (1 << 20) + 7.0)


def test_prefetched_io_is_hidden_behind_the_step() -> None:
    from opprof.model.simulate import simulate

    r = simulate(_plan(DDP, io_prefetch=True, io_busy_ns=400.0))
    rest = 100 + 200 + 30 + 5 + r.phases["comm"]
    assert r.phases["load"] == pytest.approx(max(0.0, 400.0 - rest))
    hidden = simulate(_plan(DDP, io_prefetch=True, io_busy_ns=100.0))
    assert hidden.phases["load"] == 0.0


def test_expected_maximum_of_normals() -> None:
    from opprof.model.step import expected_max_normal

    assert expected_max_normal(1) == 0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-4)
    assert expected_max_normal(4) == pytest.approx(1.0294, rel=1e-3)
