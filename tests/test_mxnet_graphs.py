"""MXNet's compiled graphs and the Module API under `opprof run`: a Gluon block hybridized
with ``static_alloc``/``static_shape`` shows the operators inside its CachedOp, ``Module.fit``
and a ``forward_backward`` + ``update`` loop are profiled step by step; bulk execution is off
for the profiled steps only and put back after."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.procs import needs  # (before the imports it guards)

needs("mxnet")

from opprof.loader import load  # noqa: E402
from opprof.taxonomy import PHASES  # noqa: E402
from tests.conftest import REPO, run_cli  # noqa: E402
from tests.test_mxnet_normalizer import aggregate_mismatches  # noqa: E402

SCRIPTS = REPO / "tests" / "scripts"
STEPS = 5
#: A bulk segment: operators run as one engine operator, named by them, comma-joined.
SEGMENT = re.compile(r"\w+(?:,\w+)+")


def opprof_run(tmp: Path, name: str) -> tuple[Path, dict]:
    """``opprof run --steps 5 --warmup 2`` on a script (docs/frameworks.md); (trace, report)."""
    import sys

    res = run_cli("run", "--steps", str(STEPS), "--warmup", "2", "-o", "x.trace", "--format",
                  "json", "--", sys.executable, str(SCRIPTS / name), cwd=tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    # `import mxnet` imports its Module before it has `mx.nd`: no false "not profiled"
    assert "cannot hook" not in res.stderr, res.stderr[-3000:]
    return tmp / "x.trace", json.loads(res.stdout)


@pytest.fixture(scope="module", params=["mxnet_hybrid_static.py", "mxnet_module_fit.py",
                                        "mxnet_module_loop.py"])
def run(request, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp(request.param.removesuffix(".py"))
    return (request.param, tmp, *opprof_run(tmp, request.param))


@pytest.mark.slow
def test_steps_phases_and_other(run) -> None:
    """Every profiled step: forward, backward and update non-empty, phases summing to it
    exactly; phase ``other`` and op ``other`` (over all phases) at most 10% of the step."""
    _, _, _, report = run
    steps = report["steps"]
    assert len(steps) == STEPS
    for s in steps:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"], s
        for phase in ("forward", "backward", "update"):
            assert s["phases"][phase] > 0, (phase, s)
    total = sum(s["dur_ns"] for s in steps)
    assert report["phases"]["other"]["share"] <= 0.10
    op_other = sum(r["total_ns"] for r in report["ops"] if r["op"] == "other")
    assert op_other <= 0.10 * total, op_other / total


@pytest.mark.slow
def test_graph_operators_are_seen_one_by_one(run) -> None:
    """No bulk segment in the profiled steps: the graph's own operators (convolution and its
    gradient among them) each map to their canonical op, and the totals agree with MXNet's
    own aggregate."""
    _, tmp, trace_path, report = run
    trace = load(trace_path)
    ev = trace.events
    ops = ev[ev["kind"] == "cpu_op"]
    assert not ops["name"].astype(str).str.fullmatch(SEGMENT.pattern).any()
    counted = set(ev.loc[ev["counted"], "op"].astype(str))
    assert {"convolution", "convolution_backward", "fully_connected",
            "fully_connected_backward", "weights_update"} <= counted
    assert aggregate_mismatches(trace, tmp / "x.native") == []


@pytest.mark.slow
def test_what_was_switched_and_its_cost_are_in_the_report(run) -> None:
    name, tmp, trace_path, report = run
    m = report["meta"]
    api = "Module executor" if "module" in name else "hybridized Gluon block"
    assert api in m["graphs"] and "bulk execution off for the profiled steps" in m["graphs"]
    assert m["unbulked_step_ns"] > 0 and m["unprofiled_step_ns"] > 0
    if "module" in name:
        assert m["optimizer"] == "SGD" and m["batch_size"] == 16
    res = run_cli("report", str(trace_path), cwd=tmp)
    assert res.returncode == 0, res.stderr
    assert re.search(r"note: bulk execution off .* one step so, unprofiled, took [\d.]+ ms "
                     r"against [\d.]+ ms \([\d.]+x\)", " ".join(res.stdout.split()))


@pytest.mark.slow
def test_bulking_is_off_for_the_profiled_steps_only(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """In one process: a static CachedOp runs in bulk segments before, one operator each
    while unbulked, and in segments again (with the user's own flags) after restore."""
    from opprof.collectors.mxnet_graphs import StaticGraphs, track_blocks
    from opprof.collectors.mxnet_lib import import_mxnet
    from opprof.normalizers.mxnet import parse_aggregate

    mx = import_mxnet()
    from mxnet import autograd, gluon

    monkeypatch.setattr(gluon.HybridBlock, "_build_cache", gluon.HybridBlock._build_cache)
    track_blocks(gluon.HybridBlock)  # undone by monkeypatch after the test
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3), gluon.nn.Activation("relu"), gluon.nn.Flatten(),
            gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(2))
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    own_flags = list(net._flags)
    x = mx.nd.ones((2, 1, 8, 8))

    mx.profiler.set_config(profile_symbolic=True, profile_imperative=True,
                           aggregate_stats=True, filename=str(tmp_path / "profile.json"))

    def step_names() -> set[str]:
        """The engine operators of one training step (MXNet's aggregate, reset)."""
        mx.profiler.set_state("run")
        with autograd.record():
            out = net(x).sum()
        out.backward()
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        agg = parse_aggregate(mx.profiler.dumps(reset=True))
        return set(agg.loc[agg["section"] == "operator", "name"])

    step_names()  # the CachedOp is built
    assert any(SEGMENT.fullmatch(n) for n in step_names())
    graphs = StaticGraphs(owner=None)
    assert "1 hybridized Gluon block(s) (1 with static_shape)" in graphs.unbulk()["switched"]
    assert graphs.rebuilds == 1
    unbulked = step_names()
    assert not any(SEGMENT.fullmatch(n) for n in unbulked)
    assert {"Convolution", "_backward_Convolution", "FullyConnected"} <= unbulked
    graphs.restore()
    assert net._flags == own_flags and graphs.settle_after == 1
    assert any(SEGMENT.fullmatch(n) for n in step_names())


@pytest.mark.slow
def test_module_loop_in_a_parameter_server_job(tmp_path: Path) -> None:
    """``forward_backward`` + ``update`` with a ``dist_sync`` kvstore, started by the DMLC
    launch script: both workers profiled by kvstore rank, communication in every step, the
    server updating the weights, and every process ends (none aborts at exit)."""
    import os
    import subprocess
    import sys

    from opprof.collectors.supervisor import free_port

    env = {**os.environ, "DMLC_PS_ROOT_PORT": str(free_port()), "PYTHON": sys.executable,
           "MXNET_SCRIPT": "mxnet_module_loop.py"}
    res = subprocess.run([sys.executable, "-m", "opprof", "run", "--warmup", "1",
                          "--timing-steps", "1", "--steps", "3", "--timeout", "300",
                          "-o", "ps.trace", "--format", "json", "--", "sh",
                          str(SCRIPTS / "mxnet_ps.sh"), "--steps", "9"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "terminate called" not in res.stderr
    report = json.loads(res.stdout)
    assert sorted({s["rank"] for s in report["steps"]}) == [0, 1]
    assert len(report["steps"]) == 6
    for s in report["steps"]:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"]
        for phase in ("forward", "backward", "comm"):
            assert s["phases"][phase] > 0, (phase, s)
    m = report["meta"]
    assert (m["mode"], m["kvstore"], m["workers"], m["servers"]) == ("ps-sync", "dist_sync", 2, 1)
    assert "Module executor" in m["graphs"]
    trace = load(tmp_path / "ps.trace")
    server = trace.events[trace.events["role"] == "server"]
    assert set(server["rank"]) == {2} and (server["op"] == "weights_update").any()


@pytest.mark.slow
@pytest.mark.parametrize("hybridize", [False, True], ids=["imperative", "hybridized"])
def test_a_gradient_made_of_forward_operators_is_backward(tmp_path: Path,
                                                          hybridize: bool) -> None:
    """``batch_dot``'s gradient is two ``batch_dot``s: in a user's job (no phase markers)
    they are ``attention_backward`` in the backward phase, not forward attention."""
    import sys

    res = run_cli("run", "--steps", str(STEPS), "--warmup", "2", "-o", "x.trace", "--format",
                  "json", "--", sys.executable, str(SCRIPTS / "mxnet_attention.py"),
                  *(["--hybridize"] if hybridize else []), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    for s in json.loads(res.stdout)["steps"]:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"], s
    ev = load(tmp_path / "x.trace").events
    dots = ev[(ev["name"] == "batch_dot") & ev["counted"] & (ev["step"] >= 0)]
    per_step = dots.groupby(["op", "phase"], observed=True).size() / STEPS
    assert per_step.to_dict() == {("attention", "forward"): 2,
                                  ("attention_backward", "backward"): 4}, per_step
