"""The model's interference term (compute slowed beside collectives), its identities on real
traces, the thread defaults of multi-worker runs per framework, the resource refusal's fix, and
--check's interval and noisy verdict."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from opprof.collectors.config import RecordConfig
from opprof.collectors.launch import compute_processes, with_default_threads
from opprof.errors import OpprofError
from opprof.loader import load
from opprof.model.commmodel import Network
from opprof.model.interference import Interference, from_cores, measure
from opprof.model.predict import (
    NOISY_CV,
    baseline,
    check,
    interference_for,
    predict,
    spread,
)
from opprof.model.resources import Resources
from opprof.model.simulate import AFTER_BACKWARD, DDP, simulate
from opprof.model.step import StepPlan
from opprof.model.terms import terms
from opprof.render.verdicts import check_verdict
from opprof.trace import save
from tests.conftest import FIXTURES, run_cli

TRACES = {
    "torch": [FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"],
    "torch-ddp": sorted((FIXTURES / "torch-ddp").glob("*.pt.trace.json.gz")),
    "mxnet-ps": [FIXTURES / "mxnet" / "lenet5-ps-sync"],
    "tf-allreduce": [FIXTURES / "tf" / "lenet5-allreduce-2w"],
}
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.fixture(scope="module")
def traces() -> dict:
    return {k: load(v) for k, v in TRACES.items()}


def _plan(policy, interference: float = 0.0, communicate: bool = True,
          comm_interference: float = 0.0) -> StepPlan:
    phases = {"load": 10.0, "h2d": 0.0, "forward": 100.0, "backward": 200.0, "update": 30.0,
              "other": 5.0}
    return StepPlan(phases=phases, ready_frac=np.array([0.25, 0.5, 1.0]),
                    grad_bytes=np.array([2 << 20, 30 << 20, 10]), policy=policy,
                    cost=lambda n: 40.0 * n / (30 << 20), communicate=communicate,
                    interference=interference, comm_interference=comm_interference)


def test_interference_is_zero_when_nothing_overlaps(traces: dict) -> None:
    # collectives after backward, or none at all: nothing runs beside compute
    assert simulate(_plan(AFTER_BACKWARD, interference=1.0)).interference_ns == 0
    assert simulate(_plan(DDP, interference=1.0, communicate=False)).interference_ns == 0
    # a 1-worker trace has no collective beside its operators; its 1-worker prediction none
    one = traces["torch"]
    assert measure(one, terms(one).steps) is None
    p = predict(one, [1]).predictions[0]
    assert p.interference_ns == 0 and p.terms()["t_interf"] == 0
    # MXNet's keys and TF's packed all-reduce go after backward: no interference at 2 workers
    for name in ("mxnet-ps", "tf-allreduce"):
        for q in predict(traces[name], [2, 4]).predictions:
            assert q.interference_ns == 0


def test_interference_lengthens_backward_by_the_overlap() -> None:
    s = 1.0
    plain, slowed = simulate(_plan(DDP)), simulate(_plan(DDP, interference=s))
    assert plain.interference_ns == 0 < slowed.interference_ns
    assert slowed.phases["backward"] == pytest.approx(200.0 + slowed.interference_ns)
    # the fixed point: extra = T·s/(1+s), T = the collectives' time inside the longer backward
    b0, b1 = 110.0, 110.0 + slowed.phases["backward"]
    beside = sum(max(0.0, min(m["end_ns"], b1) - max(m["start_ns"], b0))
                 for m in slowed.messages)
    assert slowed.interference_ns == pytest.approx(beside * s / (1 + s), abs=1.0)
    assert slowed.step_ns == pytest.approx(sum(slowed.phases.values()))


def test_a_collective_beside_backward_runs_slower_by_its_own_slowdown() -> None:
    plain = simulate(_plan(DDP)).messages
    slowed = simulate(_plan(DDP, comm_interference=1.0)).messages
    # bucket 1 (2 MiB, 2.7 ns of work) starts at 25% of backward and ends inside it: 2× as long
    d0 = plain[0]["end_ns"] - plain[0]["start_ns"]
    assert slowed[0]["end_ns"] - slowed[0]["start_ns"] == pytest.approx(2 * d0)
    # the last bucket starts when backward ends: nothing beside it, its cost as calibrated
    assert slowed[-1]["end_ns"] - slowed[-1]["start_ns"] == pytest.approx(
        plain[-1]["end_ns"] - plain[-1]["start_ns"])
    # slower collectives beside backward: more of it beside compute, more interference
    a = simulate(_plan(DDP, interference=0.5)).interference_ns
    b = simulate(_plan(DDP, interference=0.5, comm_interference=1.0)).interference_ns
    assert 0 < a < b


@pytest.mark.parametrize("name", list(TRACES))
def test_predicted_terms_sum_to_the_predicted_step(traces: dict, name: str) -> None:
    net = Network("allreduce", 50_000.0, 1.0, source="calibrate",
                  info={"interference": 0.5, "comm_interference": 2.0}) \
        if name in ("torch", "torch-ddp") else None
    r = predict(traces[name], [1, 2, 4, 8], network=net)
    for p in r.predictions:
        t = p.terms()
        assert list(t) == ["t_io", "t_h2d", "t_f", "t_b", "t_interf", "t_coloc", "t_u",
                           "t_comm", "other"]
        assert sum(t.values()) == pytest.approx(p.step_ns, rel=1e-12)
        assert 0 <= t["t_interf"] <= p.phases["backward"]


def test_calibrated_interference_adds_to_a_ddp_prediction(traces: dict) -> None:
    base = traces["torch"]
    kw = {"source": "calibrate"}
    plain = predict(base, [2], mode="allreduce",
                    network=Network("allreduce", 50_000.0, 1.0, info={"interference": 0.0},
                                    **kw)).predictions[0]
    slowed = predict(base, [2], mode="allreduce",
                     network=Network("allreduce", 50_000.0, 1.0, info={"interference": 1.0},
                                     **kw)).predictions[0]
    assert plain.interference_ns == 0 < slowed.interference_ns
    assert slowed.interference.source.startswith("calibrate")
    assert slowed.step_ns >= plain.step_ns


def test_interference_sources() -> None:
    cpu = Resources("cpu", threads=1, cpus=2, hosts=1, workers=1)
    assert from_cores(cpu, 2).slowdown == pytest.approx(1.0)  # 1 thread + gloo on 1 core
    assert from_cores(cpu, 2).comm_slowdown == pytest.approx(1.0)  # a fair share each
    assert from_cores(cpu, 1).slowdown == 0  # a free core for the collective
    assert from_cores(Resources("cpu", 2, 2, 1, 1), 2).slowdown == pytest.approx(0.5)
    assert from_cores(Resources("cuda:0", 8, 64, 1, 1), 8).slowdown == 0
    assert Interference(1.0, "x").extra_ns(100.0) == pytest.approx(50.0)
    assert Interference(0.0, "x").extra_ns(100.0) == 0


def test_measured_interference_in_a_ddp_trace(traces: dict) -> None:
    ddp = traces["torch-ddp"]
    m = measure(ddp, terms(ddp).steps)
    base = baseline(ddp)
    assert m is not None and base.interference == m  # its backward ran beside gloo
    assert m.slowdown >= 0 and 0 <= m.extra_ns <= m.beside_ns and m.matched > 0
    assert interference_for(base, Network("allreduce", 1.0, 1.0, source="trace"),
                            2).slowdown == pytest.approx(m.slowdown)
    # at its own worker count the prediction is the measurement, the term included
    p = predict(ddp, [2]).predictions[0]
    assert p.interference_ns == pytest.approx(min(m.extra_ns, base.phases["backward"]))
    assert p.step_ns == base.step_ns


def test_a_wait_in_its_own_call_is_not_beside_a_collective() -> None:
    # DDP's c10d::allreduce_ calls run inside autograd's AccumulateGrad on the training
    # thread; gloo transfers on its own threads. Without gloo's spans, no operator ran beside
    # a collective: the calls an operator waits in are its own, not compute beside one.
    ddp = load(FIXTURES / "unmarked" / "torch-ddp-2w")
    ev = ddp.events
    name = ev["name"].astype(str)
    nested = ev[name.eq("c10d::allreduce_") & (ev["step"] >= 0)]
    assert len(nested) and nested["dur"].sum() > 0
    m = measure(ddp, terms(ddp).steps)
    assert m is not None and m.beside_ns > 0  # gloo's spans beside the backward operators
    ddp.events = ev[~name.str.startswith("gloo:")].reset_index(drop=True)
    assert measure(ddp, terms(ddp).steps) is None


@pytest.mark.parametrize(("fw", "mode", "servers", "procs"), [
    ("torch", "allreduce", 1, 2), ("torch", "fsdp", 1, 2), ("tf", "allreduce", 1, 2),
    ("mxnet", "ps-sync", 1, 3), ("tf", "ps-async", 1, 3)])
def test_thread_defaults_split_the_host_among_computing_processes(
        fw: str, mode: str, servers: int, procs: int) -> None:
    config = RecordConfig(fw=fw, model="lenet5", workers=2, servers=servers, mode=mode)
    assert compute_processes(config) == procs
    assert with_default_threads(config).threads == max(1, (CPUS or 1) // procs)
    # the user's choice and a 1-process run stay as they are
    assert with_default_threads(RecordConfig(fw=fw, model="lenet5", workers=2,
                                             servers=servers, mode=mode,
                                             threads=3)).threads == 3
    assert with_default_threads(RecordConfig(fw=fw, model="lenet5")).threads is None


def test_resource_refusal_names_the_run_to_record_again(traces: dict) -> None:
    base = traces["tf-allreduce"]
    one = load(TRACES["torch"])
    one.meta.update(framework="tf", threads=1, cpus=2, workers=1, device="cpu",
                    model=base.meta.get("model"), batch_size=base.meta.get("batch_size"))
    base.meta.update(threads={"intra_op": 0, "inter_op": 0, "cpus": 2}, cpus=2, workers=2,
                     device="cpu")
    r = predict(one, [2], mode="allreduce")
    with pytest.raises(OpprofError) as err:
        check(r, base, "tf2")
    msg = str(err.value)
    assert "1 vs 2 threads per worker" in msg
    assert "record the 2-worker run with the baseline's threads" in msg and "--threads 1" in msg
    assert "--threads 2" not in msg


def test_check_interval_and_noisy_verdict() -> None:
    rng = np.random.default_rng(0)
    quiet = 100e6 * (1 + 0.01 * rng.standard_normal(20))
    s = spread(quiet, float(quiet.mean()) * 1.002)
    assert not s.noisy and check_verdict(s).startswith("within the measured noise")
    assert s.interval_ns[0] < 1.002 * quiet.mean() < s.interval_ns[1]
    assert s.error_interval[0] <= 0.002 <= s.error_interval[1]
    far = spread(quiet, float(quiet.mean()) * 1.2)
    assert not far.noisy and "beyond the measured noise" in check_verdict(far)
    assert far.error_interval[0] > 0
    noisy = 100e6 * (1 + 3 * NOISY_CV * rng.standard_normal(20))
    n = spread(noisy, 100e6)
    assert n.noisy and check_verdict(n).startswith("too noisy to judge") and n.cv > NOISY_CV
    two = spread(np.array([100e6, 104e6]), 100e6)  # too few steps to pin the mean
    assert two.noisy and "known to" in check_verdict(two)


def test_check_reports_its_spread(traces: dict) -> None:
    ddp = traces["torch-ddp"]
    c = check(predict(ddp, [2]), ddp, "itself")
    assert c.spread is not None and c.spread.steps == terms(ddp).steps
    assert c.spread.interval_ns[0] <= c.predicted_step_ns <= c.spread.interval_ns[1]
    assert c.error == 0


def test_model_json_and_console_show_the_term_and_the_verdict(traces: dict,
                                                              tmp_path: Path) -> None:
    path = tmp_path / "ddp.trace"
    save(traces["torch-ddp"], path)
    res = run_cli("model", str(path), "--workers", "2,4", "--check", str(path),
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    for p in doc["predictions"]:
        assert p["terms"]["t_interf"] == p["interference_ns"] >= 0
        assert p["interference"]["source"].startswith("the trace")
        assert sum(p["terms"].values()) == pytest.approx(p["step_ns"])
    spread = doc["check"]["spread"]
    assert {"steps", "cv", "half_width", "interval_ns", "error_interval", "noisy",
            "verdict"} <= set(spread)
    text = run_cli("model", str(path), "--workers", "2", "--check", str(path)).stdout
    assert "interference" in text and "t_interf" in text
    assert spread["verdict"].split(":")[0] in text
