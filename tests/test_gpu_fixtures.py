"""Real GPU recordings (fixtures/gpu/, an NVIDIA H200, torch 2.11 + CUDA 13): torch.compile'd
training profiled by the script itself — the model compiled, CUDA graphs (mode
reduce-overhead), the whole training step compiled — and `opprof record --device cuda` of
ResNet-18. Totals against torch's own key_averages, phases summing to the step, every
compiled graph in its phase (forward, backward, the optimizer's update), the GPU table's
fused rows holding GPU kernels."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from opprof.analysis.ops import native_totals
from opprof.analysis.report import build_report
from opprof.loader import load
from opprof.normalizers.events import INFERRED_PREFIX
from opprof.normalizers.graphs import OWN_TIME, WAITING
from opprof.taxonomy import PHASES
from opprof.trace import convergence_frame
from tests.conftest import FIXTURES, native_x_events

GPU = FIXTURES / "gpu"
COMPILED = ["compiled-adamw", "compiled-cudagraphs", "compiled-whole-step"]


@pytest.fixture(scope="module", params=COMPILED)
def compiled(request):
    """(name, trace, report, the native complete events, torch's key_averages rows)."""
    path = GPU / f"{request.param}.pt.trace.json.gz"
    trace = load(path)
    kavg = json.loads((GPU / "key_averages.json").read_text())[request.param]
    return request.param, trace, build_report(trace), native_x_events(path), kavg


def test_every_event_once_and_totals_match_key_averages(compiled) -> None:
    _, trace, _, native, kavg = compiled
    got = native_totals(trace)
    # opprof's own events: a graph's own time and wait, the inferred phase spans
    made = got.index.str.endswith((OWN_TIME, WAITING)) | got.index.str.startswith(INFERRED_PREFIX)
    assert dict(got.loc[~made, "count"]) == dict(Counter(e["name"] for e in native))
    # torch's aggregate is of the host's events (a Triton kernel's launch range, not the
    # kernel of the same name on the GPU): compare the host's
    ev = trace.events
    host = ev[(ev["device"] == "cpu") & (ev["kind"] != "memory")]
    mine = host.groupby(host["name"].astype(str))["dur"].agg(count="size", total_ns="sum")
    compared = 0
    for row in kavg:
        name = row["name"]
        if row["cpu_time_total_us"] <= 0 or name not in mine.index \
                or mine.loc[name, "count"] != row["count"]:
            continue  # a device-side row, or torch's two outputs disagree (ProfilerStep*)
        assert mine.loc[name, "total_ns"] / 1000 == pytest.approx(
            row["cpu_time_total_us"], rel=0.01, abs=1.0), name
        compared += 1
    assert compared >= 0.9 * sum(r["cpu_time_total_us"] > 0 for r in kavg)


def test_phases_sum_and_each_graph_is_in_its_phase(compiled) -> None:
    name, trace, rep, _, _ = compiled
    assert len(rep.steps) == 3
    for _, s in rep.steps.iterrows():
        assert sum(int(s[p]) for p in PHASES) == s["dur_ns"]
        for p in ("forward", "backward", "update"):
            assert s[p] > 0.05 * s["dur_ns"], (name, p, s[p] / s["dur_ns"])
        assert s["other"] <= 0.001 * s["dur_ns"], (name, s["other"])
    ev = trace.events
    host = ev[(ev["device"] == "cpu") & ev["counted"]]
    for graph, phase in [("CompiledFunction (own time)", "forward"),
                         ("CompiledFunctionBackward (own time)", "backward")]:
        assert set(host.loc[host["name"] == graph, "phase"].astype(str)) == {phase}, graph
    ops = host.groupby(["op", "phase"], observed=True)["dur"].sum()
    assert ops.get(("fused", "forward"), 0) > 0 and ops.get(("fused_backward", "backward"), 0) > 0
    assert ("fused", "backward") not in ops.index  # the backward graph's is fused_backward
    assert host.loc[(host["op"] == "other") & (host["step"] >= 0), "dur"].sum() == 0


def test_a_whole_compiled_step_waits_for_backward_and_updates_in_its_own_graph() -> None:
    trace = load(GPU / "compiled-whole-step.pt.trace.json.gz")
    ev = trace.events
    name = ev["name"].astype(str)
    # the optimizer's graph (Dynamo drops its Optimizer.step range): foreach kernels, update
    foreach = ev[name.str.startswith("triton_for_fused") & (ev["device"] == "cpu")]
    assert len(foreach) == 6 and (foreach["phase"] == "update").all()
    assert (foreach["op"] == "fused").all()
    # the main thread blocked in loss.backward() inside the step's region: a backward marker
    waits = ev[name.str.endswith(WAITING)]
    assert len(waits) == 3 and (waits["phase"] == "backward").all()
    assert not waits["counted"].any() and (waits["kind"] == "marker").all()
    region = ev[(name == "Torch-Compiled Region: 1/0") & (ev["step"] == 2)].iloc[0]
    inside = ev[(ev["tid"] == region["tid"]) & (ev["ts"] >= region["ts"])
                & (ev["ts"] + ev["dur"] <= region["ts"] + region["dur"])]
    covered = inside.loc[inside["counted"] & (inside["depth"] >= 0), "dur"]
    outer = inside[(inside["counted"] | inside["name"].astype(str).str.endswith(WAITING))
                   & ~inside.index.isin([region.name])]
    assert covered.sum() <= region["dur"]
    # the region's span is its operators, its own time and its wait, nothing twice
    from opprof.intervals import merge

    s, e = merge(outer["ts"].to_numpy(), (outer["ts"] + outer["dur"]).to_numpy())
    assert int((e - s).sum()) == region["dur"]


def test_the_gpu_table_lists_gpu_kernels_under_fused_rows(compiled) -> None:
    name, trace, rep, _, _ = compiled
    kernels = rep.fused_kernels
    device = kernels[kernels["where"] == "device"]
    host = kernels[kernels["where"] == "host"]
    assert len(device) and len(host)
    ev = trace.events
    gpu_names = set(ev.loc[ev["device"] != "cpu", "name"].astype(str))
    assert set(device["name"]) <= gpu_names
    assert any(n.startswith("triton_") for n in device["name"])
    assert not any(n.endswith("(own time)") for n in device["name"])
    ops = rep.device_ops.set_index(["op", "phase"])
    for (op, phase), g in device.groupby(["op", "phase"]):
        assert g["total_ns"].sum() == ops.loc[(op, phase), "total_ns"], (name, op, phase)


def test_cuda_graph_replays_are_in_their_graphs_phases() -> None:
    trace = load(GPU / "compiled-cudagraphs.pt.trace.json.gz")
    ev = trace.events
    launches = ev[(ev["name"] == "cudaGraphLaunch")]
    assert len(launches) == 6
    kernels = ev[(ev["kind"] == "kernel")]
    replayed = kernels[kernels["link"].isin(launches["link"])]
    assert len(replayed) > 20
    phases = set(replayed["phase"].astype(str))
    assert phases == {"forward", "backward"}, phases
    assert set(replayed["op"].astype(str)) <= {
        "fused", "fused_backward", "convolution", "convolution_backward", "fully_connected",
        "fully_connected_backward", "batch_norm", "batch_norm_backward", "pooling",
        "pooling_backward", "activation", "activation_backward"}


def test_opprof_record_on_a_gpu() -> None:
    trace = load(GPU / "resnet18-cuda.trace")
    meta = trace.meta
    assert meta["device"] == "cuda" and meta["model"] == "resnet18"
    rep = build_report(trace)
    assert len(rep.steps) == 3
    for _, s in rep.steps.iterrows():
        assert sum(int(s[p]) for p in PHASES) == s["dur_ns"]
    dev = rep.device_ops.set_index(["op", "phase"])["total_ns"]
    for key in [("convolution", "forward"), ("convolution_backward", "backward"),
                ("batch_norm", "forward"), ("batch_norm_backward", "backward"),
                ("weights_update", "update")]:
        assert dev.get(key, 0) > 0, key
    assert dev.drop("other", level="op", errors="ignore").sum() >= 0.98 * dev.sum()
    assert isinstance(rep.devices, pd.DataFrame) and len(rep.devices)


@pytest.mark.parametrize("name", ["run-compiled", "run-whole-step"])
def test_opprof_run_of_a_compiled_gpu_script(name: str) -> None:
    """`opprof run` of fixtures/gpu/train_compiled.py on the GPU (the model compiled; the
    whole step compiled): opprof's markers, every phase, no op `other` beyond 1%, the loss
    of each of the script's 12 steps."""
    trace = load(GPU / f"{name}.trace")
    rep = build_report(trace)
    assert trace.meta["device"] == "cuda" and len(rep.steps) == 3
    for _, s in rep.steps.iterrows():
        assert sum(int(s[p]) for p in PHASES) == s["dur_ns"]
        for p in ("forward", "backward", "update"):
            assert s[p] > 0.05 * s["dur_ns"], (name, p)
        assert s["other"] <= 0.001 * s["dur_ns"], (name, s["other"])
    ops = rep.ops
    assert ops.loc[ops["op"] == "other", "total_ns"].sum() <= 0.01 * rep.steps["dur_ns"].sum()
    assert {("fused", "forward"), ("fused_backward", "backward")} <= set(
        zip(ops["op"], ops["phase"], strict=True))
    curve = convergence_frame(trace.meta)
    assert len(curve) == 12 and curve["loss"].notna().all()
