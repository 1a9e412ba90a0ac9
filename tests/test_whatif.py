"""What-if on real traces of every framework: a what-if that changes nothing is the measured
step exactly; on a serial 1-worker CPU run an operator at another trace's time moves the step
by exactly that operator's delta; hiding communication or I/O removes exactly their exposed
time; `diff --whatif` ranks the operators."""

from __future__ import annotations

import json

import pytest

from opprof.errors import OpprofError
from opprof.loader import load
from opprof.model.predict import predict
from opprof.model.whatif import context, op_swaps, whatif
from opprof.taxonomy import COMM_OPS, PHASES
from tests.conftest import FIXTURES, run_cli
from tests.test_model import TORCH, TRACES

MXNET = FIXTURES / "mxnet" / "lenet5-single"


@pytest.fixture(scope="module")
def contexts() -> dict:
    return {k: context(load(v), k) for k, v in TRACES.items()}


@pytest.mark.parametrize("name", list(TRACES))
def test_a_what_if_that_changes_nothing_is_the_measured_step(contexts: dict, name: str) -> None:
    ctx = contexts[name]
    ops = {op: 1.0 for op in ctx.op_time.index}
    for w in (whatif(ctx), whatif(ctx, ops), whatif(ctx, {op: ctx for op in ctx.op_time.index}),
              whatif(ctx, comm=1.0), whatif(ctx, workers=ctx.base.workers)):
        assert w.step_ns == w.base_step_ns == ctx.base.step_ns
        assert w.phases == w.base_phases
        assert w.delta_ns == 0


def test_serial_run_moves_by_exactly_the_operator_delta(contexts: dict) -> None:
    a, b = contexts["torch"], contexts["mxnet"]
    assert a.base.workers == 1
    checked = 0
    for op, ta in a.op_time.items():
        tb = float(b.op_time.get(op, 0.0))
        if ta <= 0 or op in COMM_OPS:
            continue
        w = whatif(a, {op: b})
        assert w.delta_ns == pytest.approx(tb - ta, rel=1e-9, abs=1e-3), op
        assert sum(w.phases.values()) == pytest.approx(w.step_ns, rel=1e-12)
        checked += 1
    assert checked >= 8


def test_factor_scales_the_operator_wall_time(contexts: dict) -> None:
    a = contexts["torch"]
    conv = float(a.op_time["convolution_backward"])
    w = whatif(a, {"convolution_backward": 0.25})
    assert w.delta_ns == pytest.approx(-0.75 * conv, rel=1e-9)
    assert w.phases["backward"] == pytest.approx(w.base_phases["backward"] - 0.75 * conv)
    for p in PHASES:
        if p != "backward":
            assert w.phases[p] == w.base_phases[p]


@pytest.mark.parametrize("name", ["torch-ddp", "mxnet-ps", "tf-allreduce"])
def test_hiding_comm_and_io_removes_exactly_their_exposed_time(contexts: dict,
                                                                name: str) -> None:
    ctx = contexts[name]
    ph = ctx.base.phases
    assert ph["comm"] > 0
    w = whatif(ctx, comm="hidden")
    assert w.phases["comm"] == 0 and w.delta_ns == pytest.approx(-ph["comm"], rel=1e-12)
    w = whatif(ctx, io_hidden=True)
    assert w.phases["load"] == 0 and w.delta_ns == pytest.approx(-ph["load"], rel=1e-12)
    both = whatif(ctx, comm="hidden", io_hidden=True)
    assert both.delta_ns == pytest.approx(-ph["comm"] - ph["load"], rel=1e-12)
    assert [c.kind for c in both.scenario] == ["comm", "io"]


def test_slower_communication_costs_more(contexts: dict) -> None:
    ctx = contexts["torch-ddp"]
    steps = [whatif(ctx, comm=f).step_ns for f in (0.5, 1.0, 2.0, 4.0)]
    assert steps == sorted(steps) and steps[0] < steps[-1]


def test_more_workers_is_the_model_prediction(contexts: dict) -> None:
    ctx = contexts["torch"]
    w = whatif(ctx, workers=4, mode="allreduce")
    p = predict(None, [4], mode="allreduce", base=ctx.base).predictions[0]
    assert w.step_ns == pytest.approx(p.step_ns)
    assert w.phases["comm"] == pytest.approx(p.exposed_comm_ns)


def test_unknown_operator_is_refused(contexts: dict) -> None:
    with pytest.raises(OpprofError, match="not a canonical operator"):
        whatif(contexts["torch"], {"conv": 0.5})


def test_diff_whatif_ranks_operators_by_saving(contexts: dict) -> None:
    a, b = contexts["torch"], contexts["mxnet"]
    t = op_swaps(a, b)
    assert list(t["saving_ns"]) == sorted(t["saving_ns"], reverse=True)
    for r in t.to_dict("records"):
        assert r["saving_ns"] == pytest.approx(r["a_ns_per_step"] - r["b_ns_per_step"],
                                               rel=1e-9, abs=1e-3)
    same = op_swaps(a, a)
    assert (same["saving_ns"] == 0).all()


def test_whatif_cli_json_has_the_documented_shape() -> None:
    res = run_cli("whatif", str(TORCH), "--op", "batch_norm=0.5", "--op",
                  f"convolution_backward={MXNET}", "--comm", "hidden", "--io", "hidden",
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert {"base_step_ns", "step_ns", "delta_ns", "phases", "scenario"} <= set(doc)
    assert doc["delta_ns"] == pytest.approx(doc["step_ns"] - doc["base_step_ns"])
    assert sum(doc["phases"].values()) == pytest.approx(doc["step_ns"])
    assert [s["kind"] for s in doc["scenario"]] == ["op", "op", "comm", "io"]
    assert doc["scenario"][1]["value"] == MXNET.name
    for fmt in ("rich", "md", "csv"):
        out = run_cli("whatif", str(TORCH), "--op", "batch_norm=0.5", "--format", fmt)
        assert out.returncode == 0 and "batch_norm" in out.stdout or fmt == "csv", out.stderr


@pytest.mark.parametrize("args,msg", [
    (["--op", "batch_norm"], "give OP=FACTOR or OP=OTHER.trace"),
    (["--op", "batch_norm=nope.trace"], "neither a number nor an existing trace"),
    (["--op", "conv=0.5"], "not a canonical operator"),
    (["--op", "batch_norm=-1"], "factor must be"),
    (["--comm", "fast"], "give hidden or a factor"),
])
def test_whatif_bad_arguments_are_one_line(args: list[str], msg: str) -> None:
    res = run_cli("whatif", str(TORCH), *args)
    assert res.returncode == 2 and msg in res.stderr and "Traceback" not in res.stderr


def test_diff_whatif_cli() -> None:
    res = run_cli("diff", str(TORCH), str(MXNET), "--whatif", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["whatif"] and {"op", "saving_ns", "whatif_step_ns"} <= set(doc["whatif"][0])
    res = run_cli("diff", str(TORCH), str(MXNET), "--whatif")
    assert "What if A ran each operator at B's speed" in res.stdout
