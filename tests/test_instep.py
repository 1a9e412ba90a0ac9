"""The collectives a model-parallel step blocks in, measured as the step calls them
(`opprof calibrate`'s in-step calls: ``collectors/netbench.py``, ``opprof/model/instep.py``)
and used by the tensor- and pipeline-parallel models from one worker
(``opprof/model/fromsingle.py``): the real gloo calls (tiny), what is kept of them in the
network file, how the models price their collectives by it, and that a network file written
before (no ``in_step``) still gives the α–β behaviour. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opprof.collectors import netbench
from opprof.loader import load
from opprof.model.commmodel import Network
from opprof.model.fromsingle import predict_from_single
from opprof.model.instep import fit_in_step, in_step_of, pipeline_handoff
from opprof.model.ppsplit import StageTimes, simulate
from opprof.model.step import expected_max_normal
from opprof.pipeline.calibrate import read_network
from opprof.trace import Trace
from tests.conftest import FIXTURES, run_cli

MODEL = FIXTURES / "parallel-model"
SIZES = (4096, 65536)
BURSTS = (200_000, 1_000_000)
CALLS = 2
ROUNDS = 3  # the synthetic pipeline's steps per setting


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The in-step calls of a real 2-worker gloo job (2 sizes × 2 bursts × 2 calls)."""
    job = netbench.Job(fw="torch", workers=2, sizes=(4096,), repeat=1, threads=1,
                       timeout_s=600.0,
                       extra={"in_step": {"sizes": list(SIZES), "bursts_ns": list(BURSTS),
                                          "calls": CALLS, "pipeline_rounds": ROUNDS}})
    df = pd.DataFrame(netbench.run(job, tmp_path_factory.mktemp("instep")))
    return df[df["kind"].astype(str).str.startswith("in_step_")].reset_index(drop=True)


@pytest.fixture(scope="module")
def single() -> Trace:
    return load(MODEL / "single.trace")


def test_every_rank_times_every_in_step_call_with_its_enter_and_exit(
        samples: pd.DataFrame) -> None:
    assert set(samples["kind"]) == {"in_step_all_reduce", "in_step_p2p", "in_step_pipeline"}
    calls = samples[samples["kind"] != "in_step_pipeline"]
    for kind, d in calls.groupby("kind"):
        # per kind: each size × burst × call once on each of the 2 ranks
        assert len(d) == len(SIZES) * len(BURSTS) * CALLS * 2, kind
        assert set(d["bytes"]) == set(SIZES) and set(d["burst_ns"]) == set(BURSTS)
        assert (d.groupby(["bytes", "burst_ns", "call"])["rank"].nunique() == 2).all()
        assert (d["exit"] >= d["enter"]).all() and (d["ns"] == d["exit"] - d["enter"]).all()
    p2p = samples[samples["kind"] == "in_step_p2p"]
    # a send meets a receive: in each call one rank sends, the other receives
    roles = p2p.groupby(["bytes", "burst_ns", "call"])["role"].agg(lambda r: sorted(r))
    assert all(r == ["recv", "send"] for r in roles)


def test_the_synthetic_pipeline_times_every_step_of_both_stages(samples: pd.DataFrame) -> None:
    pipe = samples[samples["kind"] == "in_step_pipeline"]
    settings = [f for f, _ in netbench.PIPELINE_BURSTS_NS]
    assert sorted(set(pipe["burst_ns"])) == settings
    for (_, stage), d in pipe.groupby(["burst_ns", "stage"]):
        # the lower rank is stage 0; each timed step once, in order, after the warm-up
        assert list(d["rank"].unique()) == [stage] and list(d["round"]) == list(range(ROUNDS))
        assert (np.diff(d["exit"].to_numpy()) > 0).all()
        assert (d["forward_ns"] > 0).all() and (d["backward_ns"] > 0).all()
        assert (d["microbatches"] == netbench.PIPELINE_MICROBATCHES).all()
    # a step of m micro-batches lasts at least its own stage's compute
    m = netbench.PIPELINE_MICROBATCHES
    for _, d in pipe[pipe["stage"] == 0].groupby("burst_ns"):
        period = np.diff(d["exit"].to_numpy(np.float64))
        compute = m * (d["forward_ns"] + d["backward_ns"]).to_numpy()[1:]
        assert (period >= compute).all()


def test_the_hand_off_makes_the_schedule_of_the_bursts_last_the_measured_period(
        samples: pd.DataFrame) -> None:
    doc = fit_in_step(samples, 2)["pipeline"]
    assert doc["microbatches"] == netbench.PIPELINE_MICROBATCHES and doc["pairs"] == 1
    assert doc["bytes"] == netbench.PIPELINE_BYTES
    rows = doc["settings"]
    assert len(rows) == len(netbench.PIPELINE_BURSTS_NS)
    assert [r["compute_ns"] for r in rows] == sorted(r["compute_ns"] for r in rows)
    pipe = samples[samples["kind"] == "in_step_pipeline"]
    for r in rows:
        d = pipe[pipe["burst_ns"] == r["burst_ns"]]
        per = d.groupby("stage")[["forward_ns", "backward_ns"]].mean()
        times = [StageTimes(float(f), float(b), 0.0, 0.0)
                 for f, b in zip(per["forward_ns"], per["backward_ns"], strict=True)]
        first = d[d["stage"] == 0]["exit"].to_numpy(np.float64)
        assert r["period_ns"] == pytest.approx(float(np.mean(np.diff(first))))
        m = doc["microbatches"]
        assert r["ideal_ns"] == pytest.approx(simulate(times, m, [0.0], [0.0]).step_ns)
        x = r["handoff_ns"]
        assert x >= 0
        if x > 0:  # the schedule with that cost per hand-off lasts the measured period
            assert simulate(times, m, [x], [x]).step_ns == pytest.approx(r["period_ns"],
                                                                         rel=1e-6)
        else:  # the host handed off for free: the period is no longer than the schedule's
            assert r["period_ns"] <= r["ideal_ns"] * (1 + 1e-9)
    assert doc["handoff_ns"] == pytest.approx(np.median([r["handoff_ns"] for r in rows]))


def test_the_network_file_keeps_the_cost_after_the_last_rank_and_the_wait(
        samples: pd.DataFrame) -> None:
    doc = fit_in_step(samples, 2)
    assert doc["workers"] == 2 and set(doc) == {"workers", "all_reduce", "p2p", "pipeline"}
    for kind in ("all_reduce", "p2p"):
        d = doc[kind]
        assert [r["bytes"] for r in d["after_ns"]] == list(SIZES)
        assert all(r["calls"] == len(BURSTS) * CALLS * 2 and r["ns"] >= 0
                   for r in d["after_ns"])
        assert d["calls"] == len(SIZES) * len(BURSTS) * CALLS * 2
        assert d["wait_ns"] >= 0 and d["wait_per_burst"] >= 0
        assert [w["burst_ns"] for w in d["waits"]] == list(BURSTS)
        # the wait and what follows it make up each call: their means add up to the calls'
        k = samples[samples["kind"] == f"in_step_{kind}"]
        mean_after = np.mean([r["mean_ns"] for r in d["after_ns"]])
        # each size's cost is the median of its calls' time after the last rank entered
        last = k.groupby(["bytes", "burst_ns", "call"] + (["pair"] if kind == "p2p" else []))[
            "enter"].transform("max")
        after = (k["exit"] - last).astype(float)
        for r in d["after_ns"]:
            assert r["ns"] == pytest.approx(max(float(after[k["bytes"] == r["bytes"]].median()),
                                                0.0))
        mean_wait = np.mean([w["ns"] for w in d["waits"]])
        assert mean_after + mean_wait == pytest.approx(float(k["ns"].mean()), rel=1e-9)


def test_the_fitted_cost_reads_back_through_the_network(samples: pd.DataFrame) -> None:
    net = Network("allreduce", 50_000.0, 1.0, workers=2, source="calibrate",
                  info={"in_step": fit_in_step(samples, 2)})
    net = Network.from_dict(json.loads(json.dumps(net.to_dict())))
    ar = in_step_of(net, "all_reduce")
    assert ar is not None and list(ar.sizes) == list(SIZES)
    doc = net.info["in_step"]["all_reduce"]
    line = doc["after_fit"]
    assert line["ns"] >= 0 and line["per_byte"] >= 0
    # the line through two sizes is their means (unless one of its terms came out below 0)
    if line["ns"] > 0 and line["per_byte"] > 0:
        assert ar.after_ns(SIZES[0], 2) == pytest.approx(doc["after_ns"][0]["ns"])
    assert ar.after_ns(SIZES[1], 2) == pytest.approx(line["ns"] + line["per_byte"] * SIZES[1])
    assert ar.call_ns(SIZES[1], 1e6, 2) == pytest.approx(
        ar.after_ns(SIZES[1], 2) + doc["wait_ns"] + doc["wait_per_burst"] * 1e6)
    # a file without the line (an earlier calibrate of this round): between the sizes
    del net.info["in_step"]["all_reduce"]["after_fit"]
    old = in_step_of(net, "all_reduce")
    assert old is not None and old.line is None
    assert old.after_ns(1, 2) == pytest.approx(doc["after_ns"][0]["ns"])  # flat below
    assert ar.call_ns(SIZES[1], 1e6, 1) == 0.0  # nothing to wait for or move alone
    # more ranks: the wait for the slowest grows as E[max of N normals]
    ratio = expected_max_normal(4) / expected_max_normal(2)
    assert ar.wait(1e6, 4) == pytest.approx(ar.wait(1e6, 2) * ratio)


def test_calibrate_writes_the_in_step_calls_into_the_network_file(tmp_path: Path) -> None:
    out = tmp_path / "net.json"
    res = run_cli("calibrate", "--fw", "torch", "--workers", "2", "--threads", "1", "--sizes",
                  "16K", "--repeat", "1", "--colocation-rounds", "0", "-o", str(out),
                  "--format", "json", timeout=600)
    assert res.returncode == 0, res.stderr
    net = read_network(out)
    assert net is not None
    doc = net.info["in_step"]
    assert doc["workers"] == 2 and {"all_reduce", "p2p", "pipeline"} <= set(doc)
    assert len(doc["pipeline"]["settings"]) == len(netbench.PIPELINE_BURSTS_NS)
    assert pipeline_handoff(net) is not None
    assert [r["bytes"] for r in doc["all_reduce"]["after_ns"]] == list(netbench.IN_STEP_SIZES)
    # the in-step calls are not message sizes of the α–β fit
    assert [s["bytes"] for s in net.samples] == [16 << 10]
    assert in_step_of(net, "all_reduce") is not None and in_step_of(net, "p2p") is not None


# ------------------------------------------------------------------ the models


def _network(after: float = 2e6, wait: float = 5e5, per: float = 0.01) -> Network:
    """A network with an in-step cost (the shape calibrate writes; figures arbitrary)."""
    kind = {"after_ns": [{"bytes": 4096, "ns": after, "calls": 4},
                         {"bytes": 4 << 20, "ns": 4 * after, "calls": 4}],
            "wait_ns": wait, "wait_per_burst": per, "waits": [], "calls": 8}
    return Network("allreduce", 50_000.0, 1.0, workers=2, source="calibrate",
                   info={"in_step": {"workers": 2, "all_reduce": kind, "p2p": dict(kind)}})


def test_tensor_parallel_prices_each_collective_at_its_in_step_cost(single: Trace) -> None:
    net = _network()
    res = predict_from_single(single, "tp", [1, 2], network=net)
    one, two = res.predictions
    assert one.step_ns == pytest.approx(res.base.step_ns)  # degree 1: the measured step
    assert one.parts["allreduce_ns"] == 0.0 and one.parts["wait_ns"] == 0.0
    assert sum(two.terms.values()) == pytest.approx(two.step_ns)
    plan = res.model.tp  # type: ignore[union-attr]
    assert plan is not None
    ar = in_step_of(net, "all_reduce")
    assert ar is not None
    calls = 2 * len(plan.activation_bytes)
    assert two.parts["allreduce_ns"] == pytest.approx(
        sum(2 * ar.after_ns(float(n), 2) for n in plan.activation_bytes))
    # the wait: each call's after the mean compute between two collectives
    assert two.parts["wait_ns"] == pytest.approx(calls * ar.wait(two.parts["burst_ns"], 2))
    assert 0 < two.parts["burst_ns"] < two.step_ns
    # the α–β of the same network without its in-step cost prices them otherwise
    old = Network("allreduce", 50_000.0, 1.0, workers=2, source="calibrate")
    before = predict_from_single(single, "tp", [2], network=old).predictions[0]
    assert "burst_ns" not in before.parts
    assert before.parts["allreduce_ns"] != pytest.approx(two.parts["allreduce_ns"])


def test_a_network_file_written_before_keeps_the_alpha_beta(single: Trace) -> None:
    net = read_network(MODEL / "net.json")
    assert net is not None and "in_step" not in net.info
    assert in_step_of(net, "all_reduce") is None and in_step_of(net, "p2p") is None
    two = predict_from_single(single, "tp", [2], network=net).predictions[0]
    expected = sum(2.0 * float(np.asarray(net.cost_ns(float(n), 2)).reshape(-1)[0])
                   for n in predict_from_single(single, "tp", [2], network=net)
                   .model.tp.activation_bytes)  # type: ignore[union-attr]
    assert two.parts["allreduce_ns"] == pytest.approx(expected)
    pp = predict_from_single(single, "pp", [2], network=net).predictions[0]
    assert pp.parts["jitter"] == 0.0


def test_pipeline_transfers_and_jitter_come_from_the_in_step_send_recv(single: Trace) -> None:
    net = _network()
    res = predict_from_single(single, "pp", [1, 2], microbatches=4, network=net)
    one, two = res.predictions
    assert one.parts["jitter"] == 0.0  # one stage: no neighbour to wait for
    assert sum(two.terms.values()) == pytest.approx(two.step_ns)
    assert two.parts["jitter"] > 0
    p2p = in_step_of(net, "p2p")
    assert p2p is not None
    # each micro-batch's activation and gradient cross at the in-step cost after both ranks
    # are in the call (no wait added: the jitter is simulated)
    stages = two.stages
    assert stages is not None
    x = p2p.after_ns(4096, 2)  # below the smallest measured size: flat
    assert float(stages["transfer_ns"].max()) <= 2 * 4 * x * (1 + 1e-9)
    quiet = predict_from_single(single, "pp", [2], microbatches=4,
                                network=_network(wait=0.0, per=0.0)).predictions[0]
    assert quiet.parts["jitter"] == 0.0
    assert two.step_ns >= quiet.step_ns  # stages drifting apart wait for each other


def _with_handoff(net: Network, settings: list[tuple[float, float]]) -> Network:
    """``net`` with a pipeline hand-off: (compute per micro-batch, hand-off) per setting."""
    info = json.loads(json.dumps(net.info))
    info["in_step"]["pipeline"] = {
        "microbatches": 4, "bytes": 65536, "pairs": 1,
        "handoff_ns": float(np.mean([h for _, h in settings])),
        "settings": [{"burst_ns": int(c), "compute_ns": c, "period_ns": 0.0, "ideal_ns": 0.0,
                      "handoff_ns": h, "steps": 1} for c, h in settings]}
    return Network("allreduce", net.alpha_ns, net.beta_ns_per_byte, workers=2,
                   source="calibrate", info=info)


def test_a_calibrated_hand_off_prices_each_transfer(
        single: Trace) -> None:
    """With calibrate's pipeline hand-off, each activation and gradient costs the hand-off
    (the median over its settings; no jitter: it was fitted to a real pipeline's period);
    the bubble is what the schedule waits with free hand-offs, the transfers what they add;
    the terms still sum to the step."""
    net = _with_handoff(_network(), [(1e6, 1e6), (4e6, 2e6), (6e6, 9e6)])
    res = predict_from_single(single, "pp", [2], microbatches=4, network=net)
    two = res.predictions[0]
    assert two.parts["jitter"] == 0.0
    assert sum(two.terms.values()) == pytest.approx(two.step_ns)
    assert any("pipeline hand-off" in a for a in res.assumptions)
    hand = pipeline_handoff(net)
    assert hand is not None
    assert hand.ns == 2e6 and hand.bytes == 65536  # one slow setting does not move it
    stages = two.stages
    assert stages is not None
    assert two.terms["t_comm"] == pytest.approx(two.parts["bubble_ns"] + two.parts["transfer_ns"])
    assert float(stages["transfer_ns"].max()) <= float(stages["comm_ns"].max())
    # free hand-offs add nothing to the wait; dearer ones make the step longer
    free = predict_from_single(single, "pp", [2], microbatches=4,
                               network=_with_handoff(_network(), [(1e6, 0.0)])).predictions[0]
    assert free.parts["transfer_ns"] == 0.0 and free.parts["bubble_ns"] > 0
    dear = predict_from_single(single, "pp", [2], microbatches=4,
                               network=_with_handoff(_network(), [(1e6, 8e6)])).predictions[0]
    assert free.step_ns < two.step_ns < dear.step_ns


def test_jittered_schedule_is_deterministic_and_one_stage_is_untouched() -> None:
    times = [StageTimes(1e6, 2e6, 3e5, 1e5), StageTimes(1.2e6, 1.8e6, 3e5, 1e5)]
    a = simulate(times, 4, [2e5], [2e5], "gpipe", jitter=0.3)
    b = simulate(times, 4, [2e5], [2e5], "gpipe", jitter=0.3)
    plain = simulate(times, 4, [2e5], [2e5], "gpipe")
    assert a.step_ns == b.step_ns and (a.comm == b.comm).all()
    assert a.step_ns > plain.step_ns
    assert simulate(times, 4, [2e5], [2e5], "gpipe", jitter=0.0).step_ns == plain.step_ns
    solo = [times[0]]
    assert simulate(solo, 2, [], [], "gpipe", jitter=0.3).step_ns == pytest.approx(
        simulate(solo, 2, [], [], "gpipe").step_ns)


def test_ddp_buckets_cost_at_least_the_in_step_call() -> None:
    """A data-parallel torch step's all-reduce follows the backward pass's compute: with a
    calibrated in-step cost, a DDP bucket costs at least that call (the host's wake-ups
    included), not only the α–β of calls made back to back; the one-worker prediction, the
    terms' sum and a network without it are unchanged."""
    from opprof.model.predict import baseline, plan, predict

    base = baseline(load(FIXTURES / "colocation" / "torch-lenet5-base.trace"))
    n = float(base.gradients.total_bytes)
    assert 0 < n < 1 << 20  # lenet5: one bucket, the first (1 MiB)
    slow = _network(after=3e6)  # far above the α–β of 250 KB (0.3 ms)
    plain = Network("allreduce", 50_000.0, 1.0, workers=2, source="calibrate")
    with_call = predict(None, [1, 2], "allreduce", network=slow, base=base,
                        straggler=False).predictions
    without = predict(None, [1, 2], "allreduce", network=plain, base=base,
                      straggler=False).predictions
    assert with_call[0].step_ns == pytest.approx(base.step_ns)  # one worker: no call
    assert with_call[0].step_ns == pytest.approx(without[0].step_ns)
    ar = in_step_of(slow, "all_reduce")
    assert ar is not None
    ab = float(np.asarray(plain.cost_ns(n, 2)).reshape(-1)[0])
    assert ar.after_ns(0.0, 2) > ab
    # the bucket's call pays the in-step call's latency (its cost of no bytes) instead of
    # α, at the α–β's rate per byte; the step grows by at most the difference (the call
    # starts as the last gradients are made, beside the end of the backward pass)
    alpha = float(np.asarray(plain.cost_ns(0.0, 2)).reshape(-1)[0])
    costs = [plan(base, 2, "allreduce", 1, net)[0].cost(n) for net in (slow, plain)]
    assert costs == pytest.approx([ab - alpha + ar.after_ns(0.0, 2), ab])
    grown = with_call[1].step_ns - without[1].step_ns
    assert 0.5 * (costs[0] - costs[1]) < grown <= costs[0] - costs[1] + 1.0
    assert sum(with_call[1].terms().values()) == pytest.approx(with_call[1].step_ns)
    # an in-step call cheaper than α leaves the α–β
    cheap = _network(after=1.0)
    low = predict(None, [2], "allreduce", network=cheap, base=base,
                  straggler=False).predictions[0]
    same = predict(None, [2], "allreduce",
                   network=Network("allreduce", 50_000.0, 1.0, workers=2, source="calibrate"),
                   base=base, straggler=False).predictions[0]
    assert low.step_ns == pytest.approx(same.step_ns)


def test_a_kvstore_step_pays_the_in_step_latency_once_and_another_framework_none() -> None:
    """MXNet's keys go one after another after the backward pass: only the first follows the
    compute, so a parameter-server step pays the in-step latency once (with the wait before
    the update), not per key; a network another framework calibrated adds nothing."""
    from opprof.model.predict import baseline, plan
    from opprof.model.simulate import simulate as simulate_step

    base = baseline(load(FIXTURES / "colocation" / "mxnet-lenet5-base.trace"))
    kind = {"after_ns": [{"bytes": 4096, "ns": 3e6, "calls": 4}], "wait_ns": 0.0,
            "wait_per_burst": 0.0, "waits": [], "calls": 4}

    def net(framework: str, in_step: bool) -> Network:
        return Network("ps", 50_000.0, 1.0, workers=2, source="calibrate", framework=framework,
                       info={"in_step": {"workers": 2, "all_reduce": kind}} if in_step else {})

    def planned(n: Network) -> list[float]:
        p = plan(base, 2, "ps-sync", 1, n, straggler=False)[0]
        return [m["end_ns"] - m["start_ns"] for m in simulate_step(p).messages]

    keys, plain = planned(net("mxnet", True)), planned(net("mxnet", False))
    alpha = float(np.asarray(net("mxnet", False).cost_ns(0.0, 2)).reshape(-1)[0])
    assert len(keys) == len(plain) > 1  # one message per key
    assert keys[0] - plain[0] == pytest.approx(3e6 - alpha)  # the first one's latency, once
    assert keys[1:] == pytest.approx(plain[1:])  # every other key at the back-to-back cost
    assert planned(net("torch", True)) == pytest.approx(plain)
    # one worker pushes to its servers after its compute too: a one-worker parameter-server
    # base is simulated with the same latency, so that its own communication scales alike
    one = plan(base, 1, "ps-sync", 1, net("mxnet", True), straggler=False)[0]
    alpha1 = float(np.asarray(net("mxnet", False).cost_ns(0.0, 1)).reshape(-1)[0])
    assert one.first_extra_ns == pytest.approx(3e6 - alpha1)  # type: ignore[union-attr]
