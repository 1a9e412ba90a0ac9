"""The model's co-location term: other processes computing on a worker's host slow its compute.
The curve calibrate measures, the placement from the trace's hosts per rank, the term in every
mode's prediction (its identities: the terms sum to the step, the base's own N is the
measurement, a null what-if moves nothing), and --check's with / without."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opprof.collectors.netbench import Conductor
from opprof.loader import load
from opprof.model.colocation import (
    Curve,
    colocation,
    curve_from_cores,
    fit_loop,
    per_host,
    placement,
    slowdowns,
    spread_over,
)
from opprof.model.commmodel import Network
from opprof.model.predict import check, predict
from opprof.model.resources import Resources
from opprof.model.whatif import context, whatif
from opprof.pipeline.calibrate import read_network
from tests.conftest import FIXTURES, run_cli

COLOC = FIXTURES / "colocation"
TORCH_BASE = COLOC / "torch-lenet5-base.trace"
TORCH_DDP = COLOC / "torch-lenet5-ddp2.trace"
TORCH_NET = COLOC / "torch-net.json"
MXNET_BASE = COLOC / "mxnet-lenet5-base.trace"
MXNET_PS = COLOC / "mxnet-lenet5-ps2.trace"
MXNET_NET = COLOC / "mxnet-net.json"
TERMS = ["t_io", "t_h2d", "t_f", "t_b", "t_interf", "t_coloc", "t_u", "t_comm", "other"]


@pytest.fixture(scope="module")
def traces() -> dict:
    return {p.stem: load(p) for p in (TORCH_BASE, TORCH_DDP, MXNET_BASE, MXNET_PS)}


def _net(path: Path, slowdown: float | None) -> Network:
    """The fixture's calibration, its co-location set to ``slowdown`` at 2 workers (None:
    without a co-location loop, as an older network file)."""
    net = read_network(path)
    assert net is not None
    if slowdown is None:
        net.info.pop("colocation", None)
    else:
        net.info["colocation"] = {**net.info["colocation"], "slowdown": {"2": slowdown}}
    return net


# ------------------------------------------------------------------ the curve and placement


def test_curve_interpolates_between_measured_counts_and_grows_beyond() -> None:
    c = Curve({2: 0.1, 4: 0.5}, "calibrate", threads=1, cpus=8)
    assert c.at(1) == 0 and c.at(0.5) == 0
    assert c.at(2) == pytest.approx(0.1) and c.at(4) == pytest.approx(0.5)
    assert c.at(3) == pytest.approx(0.3)
    assert c.at(1.5) == pytest.approx(0.05)  # s(1) = 0
    # beyond the largest count: linear in the neighbours (8 workers: 7 of them, 4 had 3)
    assert c.at(8) == pytest.approx(0.5 * 7 / 3)
    # ... and at least the cores' oversubscription: 16 one-thread workers on 8 CPUs are 2×
    # as crowded as 8, which ran 1.5 × slower than alone at 4
    tight = Curve({2: 0.1, 4: 0.5}, "calibrate", threads=1, cpus=2)
    assert tight.at(8) == pytest.approx(max(0.5 * 7 / 3, 1.5 * (8 / 2) / (4 / 2) - 1))
    assert Curve({2: -0.03}, "calibrate").at(2) == 0  # noise below 0 reads as none


def test_cores_curve_counts_oversubscription_only() -> None:
    res = Resources("cpu", 1, 2, 1, 1)
    c = curve_from_cores(res)
    assert c.at(2) == 0 and c.at(4) == pytest.approx(1.0) and c.at(3) == pytest.approx(0.5)
    assert curve_from_cores(Resources("cpu", None, None, 1, 1)).at(4) == 0


def test_placement_is_the_trace_hosts_per_rank(traces: dict) -> None:
    meta = traces["torch-lenet5-ddp2"].meta
    hosts = {r["host"] for r in meta["per_rank"]}
    assert len(hosts) == 1
    p = placement(meta)
    assert p.workers_on_host == (2, 2) and p.hosts == 1 and p.source.startswith("the trace")
    ps = placement(traces["mxnet-lenet5-ps2"].meta)
    # two workers and their server (and the scheduler, which computes nothing) on one host
    assert ps.workers_on_host == (2, 2) and ps.servers_on_host == (1, 1)
    assert ps.crowds(0.0) == [2, 2] and ps.crowds(0.5) == [2.5, 2.5]


def test_workers_on_other_hosts_do_not_count() -> None:
    meta = {"workers": 3, "servers": 1, "per_rank": [
        {"rank": 0, "role": "worker", "host": "a"}, {"rank": 1, "role": "worker", "host": "a"},
        {"rank": 2, "role": "worker", "host": "b"}, {"rank": 0, "role": "server", "host": "b"},
        {"rank": None, "role": "scheduler", "host": "a"}]}
    p = placement(meta)
    assert p.workers_on_host == (2, 2, 1) and p.servers_on_host == (0, 0, 1) and p.hosts == 2
    c = colocation(Curve({2: 0.2}, "calibrate"), p)
    assert c.slowdown == pytest.approx(0.4 / 3) and c.max_slowdown == pytest.approx(0.2)
    # without hosts in the metadata: spread over its hosts, one when it names none
    assert placement({"workers": 4, "hosts": ["a", "b"]}).workers_on_host == (2, 2, 2, 2)
    assert placement({"workers": 3}).workers_on_host == (3, 3, 3)
    assert per_host(5, 2).workers_on_host == (2, 2, 2, 2, 1)
    assert spread_over(3, 2, 2, "x").servers_on_host == (1, 1, 1)


def test_gpu_workers_each_compute_on_their_own_device() -> None:
    c = colocation(Curve({2: 0.3}, "calibrate"), spread_over(4, 0, 1, "x"), device="cuda:0")
    assert c.slowdown == 0 and c.source.startswith("GPU")


# ------------------------------------------------------------------ what calibrate measures


def test_the_loop_is_each_round_ratio_of_medians_without_the_first_step() -> None:
    rows = []
    for rnd, (alone, together) in enumerate([(10.0, 12.0), (20.0, 23.0), (10.0, 10.5)]):
        for i, ns in enumerate([99.0, alone, alone, alone]):  # a slow first step: left out
            rows.append({"round": rnd, "k": 1, "index": i, "ns": ns, "rank": rnd % 2})
        for r in (0, 1):
            for i, ns in enumerate([99.0, together, together * 1.02]):
                rows.append({"round": rnd, "k": 2, "index": i, "ns": ns, "rank": r})
    ratios = fit_loop(pd.DataFrame(rows))
    expect = [np.median([t, t, t * 1.02, t * 1.02]) / a
              for a, t in [(10.0, 12.0), (20.0, 23.0), (10.0, 10.5)]]
    assert ratios[2] == pytest.approx(expect)
    assert slowdowns(ratios)[2] == pytest.approx(float(np.median(expect)) - 1)


def test_the_conductor_interleaves_alone_and_together_and_rotates_who_is_alone() -> None:
    c = Conductor(3, 4, 0.1, 10.0)
    try:
        phases = c.schedule()
    finally:
        c.close()
    assert len(phases) == 4 * 3
    by_round = [[len(ranks) for rnd, ranks in phases if rnd == r] for r in range(4)]
    assert by_round == [[1, 2, 3], [3, 2, 1], [1, 2, 3], [3, 2, 1]]
    alone = [ranks[0] for _, ranks in phases if len(ranks) == 1]
    assert alone == [0, 1, 2, 0]
    assert all(len(set(ranks)) == len(ranks) for _, ranks in phases)


def test_the_recorded_calibration_holds_the_loop() -> None:
    doc = json.loads(TORCH_NET.read_text())["info"]["colocation"]
    assert doc["model"] == "lenet5" and doc["batch_size"] == 32
    assert len(doc["ratios"]["2"]) == doc["rounds"]
    assert doc["slowdown"]["2"] == pytest.approx(float(np.median(doc["ratios"]["2"])) - 1)
    assert doc["together_ns"]["2"] > 0 and doc["alone_ns"] > 0


# ------------------------------------------------------------------ the term in the model


@pytest.mark.parametrize("slowdown", [0.0, 0.1, 0.35])
def test_a_colocated_prediction_slows_the_compute_by_the_calibrated_factor(
        traces: dict, slowdown: float) -> None:
    base = traces["torch-lenet5-base"]
    r = predict(base, [1, 2], mode="allreduce", network=_net(TORCH_NET, slowdown))
    one, two = r.predictions
    b = r.base.phases
    # one worker: the measurement, no co-location
    assert one.colocation_ns == 0 and one.step_ns == pytest.approx(r.base.step_ns, rel=1e-12)
    # two on one host: forward and the update × (1 + s), exactly; backward too, with the
    # interference the slower backward meets
    assert two.phases["forward"] == pytest.approx(b["forward"] * (1 + slowdown))
    assert two.phases["update"] == pytest.approx(b["update"] * (1 + slowdown))
    t = two.terms()
    assert t["t_f"] == pytest.approx(b["forward"]) and t["t_u"] == pytest.approx(b["update"])
    assert t["t_coloc"] == pytest.approx(slowdown * (b["forward"] + b["update"] + t["t_b"]))
    assert list(t) == TERMS and sum(t.values()) == pytest.approx(two.step_ns, rel=1e-12)
    assert two.colocation is not None and two.colocation.crowd == 2


def test_a_parameter_server_optimizer_is_not_slowed(traces: dict) -> None:
    r = predict(traces["mxnet-lenet5-base"], [2], mode="ps-sync",
                network=_net(MXNET_NET, 0.2))
    p = r.predictions[0]
    assert set(p.colocation_parts) == {"forward", "backward", "update"}
    assert p.phases["forward"] == pytest.approx(r.base.phases["forward"] * 1.2)
    # what stays of the worker's update (all but the optimizer's operators) is slowed
    assert p.phases["update"] == pytest.approx(
        (r.base.phases["update"] - r.base.optimizer_ns) * 1.2)
    assert sum(p.terms().values()) == pytest.approx(p.step_ns, rel=1e-12)


def test_fsdp_slows_the_shard_update_too(traces: dict) -> None:
    net = Network("fsdp", 1e5, 0.5, source="calibrate",
                  info={"colocation": {"slowdown": {"2": 0.25}, "model": "lenet5"}})
    r = predict(traces["torch-lenet5-base"], [2], mode="fsdp", network=net)
    p = r.predictions[0]
    assert set(p.colocation_parts) == {"forward", "backward", "update"}
    assert p.colocation_parts["update"] == pytest.approx(p.phases["update"] * 0.25 / 1.25)
    assert sum(p.terms().values()) == pytest.approx(p.step_ns, rel=1e-12)


def test_workers_on_their_own_hosts_have_no_colocation(traces: dict) -> None:
    net = _net(TORCH_NET, 0.3)
    alone = predict(traces["torch-lenet5-base"], [4], mode="allreduce", network=net,
                    workers_per_host=1).predictions[0]
    shared = predict(traces["torch-lenet5-base"], [4], mode="allreduce", network=net,
                     workers_per_host=2).predictions[0]
    assert alone.colocation_ns == 0
    assert shared.colocation_ns > 0 and shared.step_ns > alone.step_ns


def test_the_most_crowded_host_sets_the_pace(traces: dict) -> None:
    net = _net(TORCH_NET, 0.3)
    r = predict(traces["torch-lenet5-base"], [3], mode="allreduce", network=net,
                workers_per_host=2, straggler=False)
    p = r.predictions[0]
    assert p.colocation is not None
    assert p.colocation.slowdown == pytest.approx(0.2) and p.colocation.max_slowdown == 0.3
    even = predict(traces["torch-lenet5-base"], [3], mode="allreduce", network=net,
                   workers_per_host=3, straggler=False).predictions[0]
    # the lone worker waits for the pair: the wait is the compute the pair takes longer
    b = r.base.phases
    compute = b["forward"] + b["backward"] + b["update"]
    assert p.wait_ns == pytest.approx(0.1 * compute)
    assert even.wait_ns == 0


def test_a_multi_worker_base_carries_its_own_colocation(traces: dict) -> None:
    ddp = traces["torch-lenet5-ddp2"]
    r = predict(ddp, [1, 2], network=_net(TORCH_NET, 0.25))
    one, two = r.predictions
    m = r.base.phases
    # at its own N the prediction is the measurement, the term its own co-location
    assert two.step_ns == pytest.approx(r.base.step_ns, rel=1e-12)
    assert two.phases["forward"] == pytest.approx(m["forward"])
    assert two.terms()["t_f"] == pytest.approx(m["forward"] / 1.25)
    # one worker alone computes without it
    assert one.phases["forward"] == pytest.approx(m["forward"] / 1.25)
    assert one.colocation_ns == 0


def test_null_whatif_moves_nothing_with_a_colocation_calibration(traces: dict) -> None:
    for name, path in (("torch-lenet5-base", TORCH_NET), ("torch-lenet5-ddp2", TORCH_NET)):
        ctx = context(traces[name], name)
        w = whatif(ctx, network=_net(path, 0.4))
        assert w.step_ns == pytest.approx(ctx.base.step_ns, rel=1e-12)
        assert w.phases == ctx.base.phases
    ctx = context(traces["torch-lenet5-base"])
    more = whatif(ctx, workers=2, mode="allreduce", network=_net(TORCH_NET, 0.4))
    less = whatif(ctx, workers=2, mode="allreduce", network=_net(TORCH_NET, 0.0))
    assert more.phases["forward"] == pytest.approx(1.4 * less.phases["forward"])


# ------------------------------------------------------------------ --check


@pytest.mark.parametrize("base,measured,net,mode", [
    ("torch-lenet5-base", "torch-lenet5-ddp2", TORCH_NET, "allreduce"),
    ("mxnet-lenet5-base", "mxnet-lenet5-ps2", MXNET_NET, "ps-sync")])
def test_check_says_how_much_of_the_error_colocation_explains(
        traces: dict, base: str, measured: str, net: Path, mode: str) -> None:
    r = predict(traces[base], [2], mode=mode, network=_net(net, 0.15))
    c = check(r, traces[measured], measured)
    assert c.colocation is not None
    cc = c.colocation
    m = c.measured_step_ns
    assert cc.error == pytest.approx(c.error)
    assert cc.error_without == pytest.approx((cc.step_without_ns - m) / m)
    assert cc.explained == pytest.approx(abs(cc.error_without) - abs(cc.error))
    assert cc.predicted_ns > 0 and cc.step_without_ns < c.predicted_step_ns
    rows = c.terms.set_index("term")
    assert rows.loc["t_coloc", "predicted_ns"] == pytest.approx(cc.predicted_ns)
    assert rows.loc["t_coloc", "measured_ns"] == pytest.approx(cc.measured_ns)
    # the measured terms (its co-location and interference taken out) still sum to its step
    assert rows.loc[TERMS, "measured_ns"].sum() == pytest.approx(m, rel=1e-9)
    assert rows.loc[TERMS, "predicted_ns"].sum() == pytest.approx(c.predicted_step_ns,
                                                                   rel=1e-9)
    # without a co-location in the calibration the term is zero, and so is what it explains
    plain = check(predict(traces[base], [2], mode=mode, network=_net(net, 0.0)),
                  traces[measured], measured)
    assert plain.colocation is not None and plain.colocation.predicted_ns == 0
    assert plain.colocation.explained == pytest.approx(0.0, abs=1e-12)
    assert plain.error == pytest.approx(cc.error_without)


def test_a_trace_checked_against_itself_is_exact_with_colocation(traces: dict) -> None:
    ddp = traces["torch-lenet5-ddp2"]
    c = check(predict(ddp, [2], network=_net(TORCH_NET, 0.2)), ddp, "itself")
    assert c.error == pytest.approx(0.0, abs=1e-12)
    assert np.allclose(c.terms["error_ns"].to_numpy(float), 0.0, atol=1e-3)


def test_model_cli_shows_the_term_and_what_it_explains(tmp_path: Path) -> None:
    res = run_cli("model", str(TORCH_BASE), "--workers", "2", "--mode", "allreduce",
                  "--network", str(TORCH_NET), "--check", str(TORCH_DDP), "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    p = doc["predictions"][-1]
    assert p["terms"]["t_coloc"] == p["colocation_ns"] > 0
    assert p["colocation"]["source"].startswith("calibrate")
    assert p["colocation"]["workers_per_host"] == 2
    assert sum(p["terms"].values()) == pytest.approx(p["step_ns"])
    cc = doc["check"]["colocation"]
    assert {"predicted_ns", "measured_ns", "step_without_ns", "error_without", "error",
            "explained", "slowdown"} <= set(cc)
    assert doc["check"]["spread"]["verdict"]  # the noise verdict stays
    text = " ".join(run_cli("model", str(TORCH_BASE), "--workers", "2", "--mode", "allreduce",
                            "--network", str(TORCH_NET), "--check", str(TORCH_DDP)
                            ).stdout.split())
    assert "co-location" in text and "t_coloc" in text and "without it the step" in text
    apart = run_cli("model", str(TORCH_BASE), "--workers", "4", "--workers-per-host", "1",
                    "--network", str(TORCH_NET), "--format", "json")
    assert json.loads(apart.stdout)["predictions"][0]["colocation_ns"] == 0
    md = run_cli("model", str(TORCH_BASE), "--workers", "2", "--network", str(TORCH_NET),
                 "--check", str(TORCH_DDP), "--format", "md").stdout
    assert "Co-location:" in md and "t_coloc" in md


def test_calibrate_refuses_an_unknown_model_in_one_line(tmp_path: Path) -> None:
    res = run_cli("calibrate", "--fw", "torch", "--workers", "2", "--model", "nosuchnet",
                  "-o", str(tmp_path / "n.json"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "nosuchnet" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    gone = tmp_path / "gone.trace"
    res = run_cli("calibrate", "--fw", "torch", "--workers", "2", "--model", str(gone),
                  "-o", str(tmp_path / "n.json"))
    assert res.returncode == 2 and "no such file" in res.stderr and str(gone) in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "n.json").exists()
