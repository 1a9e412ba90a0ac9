"""The Kineto normalizer on the real shared GPU/CPU traces: nothing lost, nothing duplicated,
ranks, devices, comm and h2d classification, nesting counted once."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from opprof import load
from opprof.normalizers.events import INFERRED_TID
from opprof.taxonomy import COMM_OPS
from tests.conftest import native_x_events, shared_trace

SHARED = [
    "nccl-2rank-rank0.json.gz",
    "sampled-128rank-rank0.json.gz",
    "sampled-128rank-rank1.json.gz",
    "alexnet-1gpu.json.gz",
    "amd-mi250-toy-train.json.gz",
    "cpu-only-gloo-rank34.json.gz",
]


@pytest.mark.parametrize("name", SHARED)
def test_every_native_event_is_kept_once(name: str) -> None:
    path = shared_trace(name)
    native = defaultdict(lambda: [0, 0.0])
    for e in native_x_events(path):
        native[e["name"]][0] += 1
        native[e["name"]][1] += float(e.get("dur", 0))
    ev = load(path).events
    ev = ev[ev["tid"] != INFERRED_TID]  # the phase spans opprof infers are no native event
    got = ev.groupby("name", observed=True)["dur"].agg(["size", "sum"])
    assert set(got.index) == set(native)
    for nm, (count, dur_us) in native.items():
        assert got.loc[nm, "size"] == count, nm
        assert got.loc[nm, "sum"] == pytest.approx(dur_us * 1000, rel=1e-6, abs=count), nm


def test_rank_comes_from_distributed_info() -> None:
    tr = load(shared_trace("cpu-only-gloo-rank34.json.gz"))
    assert tr.ranks == [34]
    assert tr.meta["distributed"]["34"]["backend"] == "gloo"


def test_two_ranks_of_one_job_import_together() -> None:
    tr = load([shared_trace("sampled-128rank-rank0.json.gz"),
               shared_trace("sampled-128rank-rank1.json.gz")])
    assert tr.ranks == [0, 1]
    assert tr.meta["workers"] == 2
    steps = tr.step_bounds()
    assert set(steps["rank"]) == {0, 1}
    assert (steps.groupby("rank").size() == 2).all()


def test_nccl_kernels_are_comm_and_htod_copies_are_h2d() -> None:
    ev = load(shared_trace("nccl-2rank-rank0.json.gz")).events
    nccl = ev[ev["name"].astype(str).str.contains("nccl", case=False) & (ev["kind"] == "kernel")]
    assert len(nccl) > 0
    named = nccl["name"].astype(str).str.extract(r"Kernel_(AllReduce|Broadcast)_")[0]
    assert (nccl["op"].astype(str) == named.map({"AllReduce": "all_reduce",
                                                  "Broadcast": "broadcast"})).all()
    assert (nccl["phase"] == "comm").all()
    for name in ("alexnet-1gpu.json.gz", "sampled-128rank-rank0.json.gz"):
        ev = load(shared_trace(name)).events
        htod = ev[ev["name"].astype(str).str.startswith("Memcpy HtoD")]
        assert len(htod) > 0
        assert (htod["op"] == "h2d").all() and (htod["phase"] == "h2d").all()
        assert (htod["kind"] == "memcpy").all() and (htod["bytes"] > 0).all()
    ev = load(shared_trace("nccl-2rank-rank0.json.gz")).events
    assert (ev.loc[ev["kind"] == "kernel", "device"].astype(str) == "cuda:0").all()


def test_nested_aten_chain_is_one_convolution() -> None:
    ev = load(shared_trace("nccl-2rank-rank0.json.gz")).events
    conv = ev[ev["name"] == "aten::conv2d"]
    inner = ev[ev["name"].isin(["aten::convolution", "aten::_convolution",
                                "aten::cudnn_convolution"])]
    assert len(conv) > 0 and len(inner) > 0
    assert conv["counted"].all() and (conv["op"] == "convolution").all()
    assert not inner["counted"].any()
    assert (inner["op"] == "convolution").all()
    assert (inner["depth"] > conv["depth"].min()).all()


def test_backward_node_is_one_convolution_backward() -> None:
    ev = load(shared_trace("nccl-2rank-rank0.json.gz")).events
    node = ev[ev["name"] == "autograd::engine::evaluate_function: ConvolutionBackward0"]
    assert len(node) > 0
    assert node["counted"].all() and (node["op"] == "convolution_backward").all()
    inside = ev[ev["name"] == "aten::convolution_backward"]
    assert (inside["op"] == "convolution_backward").all()
    assert not inside["counted"].any()


def test_kernels_take_the_op_of_the_operator_that_launched_them() -> None:
    ev = load(shared_trace("nccl-2rank-rank0.json.gz")).events
    kernels = ev[ev["kind"] == "kernel"]
    assert (kernels["op"] != "other").mean() > 0.95
    cudnn_bn = kernels[kernels["name"].astype(str).str.contains("bn_bw")]
    assert (cudnn_bn["op"] == "batch_norm_backward").all()


def test_optimizer_step_ops_are_weights_update() -> None:
    ev = load(shared_trace("amd-mi250-toy-train.json.gz")).events
    step = ev[ev["name"].astype(str).str.startswith("Optimizer.step#")]
    assert len(step) > 0 and (step["op"] == "weights_update").all()
    t0, t1 = int(step["ts"].iloc[0]), int(step["ts"].iloc[0] + step["dur"].iloc[0])
    host = ev[(ev["device"] == "cpu") & (ev["ts"] > t0) & (ev["ts"] < t1)
              & (ev["pid"] == step["pid"].iloc[0]) & (ev["tid"] == step["tid"].iloc[0])]
    assert len(host) > 0
    assert (host.loc[host["kind"] != "marker", "op"] == "weights_update").all()
    assert not host["counted"].any()


def test_events_are_stepped_and_timestamps_are_ns_since_epoch() -> None:
    tr = load(shared_trace("nccl-2rank-rank0.json.gz"))
    ev = tr.events
    assert ev["ts"].min() > 1_600_000_000 * 10**9
    assert sorted(tr.step_bounds()["step"]) == [4, 5, 6]
    assert (ev["step"] >= 0).mean() > 0.9
    assert np.issubdtype(ev["ts"].dtype, np.int64)


def test_allreduce_issued_inside_a_backward_hook_stays_comm() -> None:
    ev = load(shared_trace("nccl-2rank-rank0.json.gz")).events
    ar = ev[(ev["name"] == "c10d::allreduce_")]
    assert len(ar) > 0 and (ar["depth"] > 0).all()
    assert (ar["op"] == "all_reduce").all() and (ar["phase"] == "comm").all()
    assert ar["counted"].all()
    inner = ev[(ev["name"] == "record_param_comms") & (ev["device"] == "cpu")]
    assert inner["op"].isin(COMM_OPS).all()
    assert set(inner.loc[~inner["counted"], "op"].astype(str)) == {"all_reduce", "broadcast"}
