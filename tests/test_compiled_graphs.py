"""torch.compile's graphs: containers whose operators keep their own op, ``fused`` /
``fused_backward`` for the rest, the graphs in their phases on GPU traces without markers,
Dynamo's guard and compilation as their own ops, a step that compiles flagged; Keras 3 on the
torch backend under ``opprof run``. Real traces: the shared Kineto GPU trace of a compiled
model, and `opprof run` of tests/scripts/torch_compile.py and keras_torch_fit.py."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from opprof.loader import load
from opprof.taxonomy import PHASES, mapping_table
from tests.conftest import REPO, run_cli, shared_trace
from tests.procs import needs

SCRIPTS = REPO / "tests" / "scripts"
#: warm-up 1, timing 1, 3 profiled (torch needs one more step for its profiler to settle)
PROTOCOL = ["--warmup", "1", "--timing-steps", "1", "--steps", "3"]
CONTAINERS = ("Torch-Compiled Region: 0/0", "CompiledFunction", "CompiledFunctionBackward",
              "autograd::engine::evaluate_function: CompiledFunctionBackward",
              "## Call CompiledFxGraph fkqfutuvqwpc3nhku3vh52orqktunf4mndmxl4ztnjlghlcuhqqd ##")


def test_compiled_graph_rows_are_containers_and_kernels_are_not() -> None:
    table = mapping_table("kineto")
    for name in CONTAINERS:
        assert table.lookup(name).container, name
    for name in ("graph_0_cpp_fused_gelu_2", "cpp_fused_native_layer_norm_0",
                 "triton_poi_fused_add_relu_1", "TorchDynamo Cache Lookup", "aten::addmm"):
        assert not table.lookup(name).container, name
    got = table.classify(["graph_0_cpp_fused_gelu_2", "triton_red_fused_sum_3",
                          "TorchDynamo Cache Lookup", "_compile.compile_inner (dynamo_timed)"])
    assert got["op"].tolist() == ["fused", "fused", "guard", "compile"]


def _counted_inside(ev: pd.DataFrame, c: pd.Series) -> int:
    """The counted host time on a container's lane within its span."""
    inside = (ev["counted"] & (ev["pid"] == c["pid"]) & (ev["tid"] == c["tid"])
              & (ev["device"] == "cpu") & (ev["ts"] >= c["ts"])
              & (ev["ts"] + ev["dur"] <= c["ts"] + c["dur"]))
    return int(ev.loc[inside, "dur"].sum())


def check_graphs_counted_once(ev: pd.DataFrame) -> None:
    """A graph's span is its operators and its own time, each counted once: the counted
    host events inside each container add up to its duration exactly; no container counts."""
    containers = ev[ev["name"].astype(str).isin(["CompiledFunction", "CompiledFunctionBackward"])]
    assert len(containers)
    assert not containers["counted"].any()
    for _, c in containers.iterrows():
        assert _counted_inside(ev, c) == c["dur"], c["name"]


# ------------------------------------------------------------------ GPU traces


def test_real_gpu_trace_of_a_compiled_model_maps_triton_kernels() -> None:
    trace = load(shared_trace("compiled-triton-1gpu.json.gz"))
    ev = trace.events
    kernel = ev[(ev["kind"] == "kernel") & ev["name"].astype(str).str.startswith("triton_")]
    assert len(kernel) == 1
    assert (kernel["op"] == "fused").all() and (kernel["phase"] == "forward").all()
    host = ev[(ev["device"] == "cpu") & ev["counted"]]
    by_name = host.groupby(host["name"].astype(str))["op"].first().astype(str)
    assert by_name["triton_poi_fused_add_cos_sin_0"] == "fused"
    assert by_name["TorchDynamo Cache Lookup"] == "guard"
    region = ev[ev["name"] == "Torch-Compiled Region: 0/0"].iloc[0]
    assert not region["counted"] and _counted_inside(ev, region) == region["dur"]


def _kineto_training_trace(path: Path) -> Path:
    """Two steps of a compiled model's training on a GPU, written in the Kineto trace schema
    (complete events: cpu_op, user_annotation, cuda_runtime, kernel with ``correlation``), with
    no step or phase markers: the forward and backward graphs launch Triton kernels and a GEMM
    (``aten::mm``), then ``Optimizer.step`` closes the step."""
    events: list[dict] = []
    corr = [0]

    def host(name: str, ts: float, dur: float, cat: str = "cpu_op") -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts,
                       "dur": dur, "args": {}})

    def launch(name: str, kernel: str, ts: float, dur: float) -> None:
        corr[0] += 1
        host(name, ts, dur)
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cuLaunchKernel", "pid": 1,
                       "tid": 1, "ts": ts + 1, "dur": dur - 2,
                       "args": {"correlation": corr[0]}})
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7,
                       "ts": ts + dur, "dur": 5, "args": {"correlation": corr[0], "device": 0,
                                                           "stream": 7}})

    for t0 in (1000.0, 2000.0):
        host("TorchDynamo Cache Lookup", t0, 5)
        host("Torch-Compiled Region: 0/0", t0 + 10, 100)
        host("CompiledFunction", t0 + 20, 80)
        host("## Call CompiledFxGraph fw3ojtmz2s7dtbkhdktd ##", t0 + 25, 70, "user_annotation")
        launch("triton_poi_fused_add_relu_0", "triton_poi_fused_add_relu_0", t0 + 30, 10)
        launch("aten::mm", "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", t0 + 50, 20)
        host("autograd::engine::evaluate_function: CompiledFunctionBackward", t0 + 200, 300)
        host("CompiledFunctionBackward", t0 + 205, 290)
        host("## Call CompiledFxGraph bwhv5ms2a7cr3c6l2qyx ##", t0 + 210, 280, "user_annotation")
        launch("triton_poi_fused_threshold_backward_1", "triton_poi_fused_threshold_backward_1",
               t0 + 220, 20)
        launch("aten::mm", "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n", t0 + 300, 50)
        host("Optimizer.step#SGD.step", t0 + 600, 100, "user_annotation")
        host("aten::add_", t0 + 610, 50)
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
           "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def test_gpu_trace_without_markers_puts_compiled_graphs_in_their_phases(tmp_path: Path) -> None:
    trace = load(_kineto_training_trace(tmp_path / "compiled-training.pt.trace.json.gz"))
    ev = trace.events
    assert trace.meta.get("inferred_phases") == [0]
    kernels = ev[ev["kind"] == "kernel"].sort_values("ts")
    got = list(zip(kernels["op"].astype(str), kernels["phase"].astype(str), strict=True))
    assert got == [("fused", "forward"), ("fully_connected", "forward"),
                   ("fused_backward", "backward"), ("fully_connected_backward", "backward")] * 2
    host = ev[(ev["device"] == "cpu") & ev["counted"]]
    assert not (host["op"] == "other").any(), host[host["op"] == "other"]["name"].tolist()
    check_graphs_counted_once(ev)
    from opprof.analysis.report import build_report

    rep = build_report(trace)
    assert len(rep.steps) == 2
    for _, s in rep.steps.iterrows():
        assert sum(int(s[p]) for p in PHASES) == s["dur_ns"]
        assert s["forward"] > 0 and s["backward"] > 0 and s["update"] > 0
    fused = rep.fused_kernels
    assert {"triton_poi_fused_add_relu_0", "triton_poi_fused_threshold_backward_1"} <= set(
        fused["name"])


# ------------------------------------------------------------------ opprof run, CPU


def _run(tmp: Path, *command: str) -> tuple[object, dict | None]:
    res = run_cli("run", *PROTOCOL, "-o", str(tmp / "run.trace"), "--format", "json", "--",
                  *command, cwd=tmp, timeout=900)
    return res, (json.loads(res.stdout) if res.stdout.strip() else None)


def _check_figures(report: dict) -> None:
    """3 steps; phases sum to each step; forward, backward, update non-empty; phase and op
    ``other`` at most 10% of the step."""
    assert len(report["steps"]) == 3
    for s in report["steps"]:
        assert sum(s["phases"][p] for p in PHASES) == s["dur_ns"], s
        for p in ("forward", "backward", "update"):
            assert s["phases"][p] > 0, (p, s)
    total = sum(s["dur_ns"] for s in report["steps"])
    assert report["phases"]["other"]["share"] <= 0.10
    other_ops = sum(o["total_ns"] for o in report["ops"] if o["op"] == "other")
    assert other_ops <= 0.10 * total, other_ops / total


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory: pytest.TempPathFactory):
    """torch.compile (inductor, CPU) under `opprof run`; the batch grows at script step 4, the
    second profiled step, so that one profiled step recompiles."""
    needs("torch")
    tmp = tmp_path_factory.mktemp("run-compiled")
    return tmp, *_run(tmp, sys.executable, str(SCRIPTS / "torch_compile.py"), "--steps", "8",
                      "--reshape-at", "4")


@pytest.mark.slow
def test_torch_compile_run_figures(compiled_run) -> None:
    tmp, res, report = compiled_run
    assert res.returncode == 0, res.stderr[-3000:]
    _check_figures(report)
    ops = {(o["op"], o["phase"]) for o in report["ops"]}
    assert {("fused", "forward"), ("fused_backward", "backward"), ("guard", "forward"),
            ("fully_connected", "forward"), ("convolution_backward", "backward")} <= ops


@pytest.mark.slow
def test_torch_compile_keeps_the_operators_inside_its_graphs(compiled_run) -> None:
    tmp, res, report = compiled_run
    ev = load(tmp / "run.trace").events
    names = ev["name"].astype(str)
    counted = ev["counted"] & (ev["step"] >= 0)
    # inductor's C++ kernels are recorded (opprof run asks for them) and are fused
    cpp = counted & names.str.contains("cpp_fused_")
    assert cpp.any()
    assert set(ev.loc[cpp, "op"].astype(str)) == {"fused", "fused_backward"}
    addmm = counted & (names == "aten::addmm")
    assert addmm.any() and (ev.loc[addmm, "op"] == "fully_connected").all()
    check_graphs_counted_once(ev[ev["step"] >= 0])
    kernels = pd.DataFrame(report["fused_kernels"])
    assert kernels["name"].str.contains("cpp_fused_").any()


@pytest.mark.slow
def test_a_profiled_step_that_recompiles_is_flagged(compiled_run) -> None:
    tmp, res, report = compiled_run
    compiling = report["compile_steps"]
    assert len(compiling) == 1 and compiling[0]["compile_ns"] > 0
    step = compiling[0]["step"]
    ev = load(tmp / "run.trace").events
    compile_ev = ev[(ev["op"] == "compile") & ev["counted"]]
    assert set(compile_ev["step"]) == {step}
    assert "Torch-Compiled Region: 0/1" in set(ev["name"].astype(str))  # the recompiled frame
    text = run_cli("report", str(tmp / "run.trace"))
    warnings = [ln for ln in text.stdout.splitlines() if ln.startswith("⚠ compilation")]
    assert len(warnings) == 1 and f"step {step} " in warnings[0], text.stdout


@pytest.mark.slow
def test_a_whole_compiled_step_keeps_its_update_and_the_users_graphs(tmp_path: Path) -> None:
    """forward, backward() and the optimizer's step in one compiled function: opprof's hooks
    are never traced by Dynamo (no warning, no graph break of theirs), and the optimizer's
    compiled graph is the update (``Optimizer.step#…``, whose range torch drops when traced)."""
    needs("torch")
    res, report = _run(tmp_path, sys.executable, str(SCRIPTS / "torch_compile_step.py"),
                       "--steps", "8")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Dynamo does not know" not in res.stderr and "Traceback" not in res.stderr
    _check_figures(report)
    ev = load(tmp_path / "run.trace").events
    ev = ev[ev["step"] >= 0]
    step = ev[ev["name"].astype(str) == "Optimizer.step#AdamW.step"]
    assert len(step) == 3 and (step["op"] == "weights_update").all()
    assert (step["phase"] == "update").all()
    kernels = ev[ev["name"].astype(str).str.contains("cpp_fused_.*addcdiv")]  # AdamW's graph
    assert len(kernels) == 3 and (kernels["op"] == "weights_update").all()
    assert len(report["convergence"]) == 8  # the loss backward() ran on, every step


# ------------------------------------------------------------------ Keras 3 on torch


@pytest.fixture(scope="module")
def keras_torch_fit(tmp_path_factory: pytest.TempPathFactory):
    needs("keras")
    tmp = tmp_path_factory.mktemp("run-keras-torch")
    return tmp, *_run(tmp, sys.executable, str(SCRIPTS / "keras_torch_fit.py"), "--steps", "8")


@pytest.mark.slow
def test_keras_on_torch_fit_steps_at_the_optimizer_apply(keras_torch_fit) -> None:
    tmp, res, report = keras_torch_fit
    assert res.returncode == 0, res.stderr[-3000:]
    assert report["meta"]["framework"] == "torch"
    _check_figures(report)
    ev = load(tmp / "run.trace").events
    apply = ev[ev["name"].astype(str) == "keras.optimizer.apply#SGD"]
    assert len(apply[apply["step"] >= 0]) == 3
    assert (apply["op"] == "weights_update").all() and (apply["phase"] == "update").all()
    # the step ends at the apply: no forward operator of a step starts after its apply
    fwd = ev[ev["counted"] & (ev["phase"] == "forward") & (ev["step"] >= 0)]
    last_fwd = fwd.groupby("step")["ts"].max()
    for _, a in apply[apply["step"] >= 0].iterrows():
        assert last_fwd[a["step"]] < a["ts"]


@pytest.mark.slow
def test_a_compiled_ddp_model_keeps_its_collectives_named(tmp_path: Path) -> None:
    """``torch.compile(DistributedDataParallel(model))`` under torchrun: the trace holds
    compiled graphs and DDP's all-reduces; each all-reduce stays an ``all_reduce`` (a trace
    with compiled graphs once turned every collective into a nameless ``comm``)."""
    needs("torch")
    res, report = _run(tmp_path, sys.executable, "-m", "torch.distributed.run",
                       "--nproc-per-node", "2", str(SCRIPTS / "torch_compile.py"), "--steps",
                       "8", "--ddp")
    assert res.returncode == 0, res.stderr[-3000:]
    ev = load(tmp_path / "run.trace").events
    containers = ev["name"].astype(str).str.contains("CompiledFunction|Torch-Compiled Region")
    assert containers.any()
    comm = ev[(ev["kind"] == "comm") & ev["counted"] & (ev["step"] >= 0)]
    assert "all_reduce" in set(comm["op"].astype(str))
    assert {c["op"] for c in report["collectives"]} == {"all_reduce"}
    assert all(c["dim"] == "dp" for c in report["collectives"])
