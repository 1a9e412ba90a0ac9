"""MXNet's kvstore pushes one key per parameter array (a layer's weight and bias apart), which
its trace does not name: the gradient profile and the parameter-server plan take the arrays
`opprof record` writes (``meta.param_arrays``), and of the worker's update only the
optimizer's own operators move to the servers (docs/model.md, section 3)."""

from __future__ import annotations

import numpy as np
import pytest

from opprof.kinds import Collective
from opprof.loader import load
from opprof.model.commmodel import assumed
from opprof.model.gradients import FLOAT_BYTES, profile
from opprof.model.predict import baseline, plan
from opprof.trace import Trace
from tests.conftest import FIXTURES

PS_SYNC = FIXTURES / "mxnet" / "lenet5-ps-sync"
SINGLE = FIXTURES / "mxnet" / "lenet5-single"


@pytest.fixture(scope="module")
def arrays() -> list[list]:
    """The real lenet5's trainable arrays, as `opprof record --fw mxnet` writes them."""
    from opprof.collectors.mxnet import param_facts
    from opprof.collectors.mxnet_lib import import_mxnet
    from opprof.collectors.mxnet_models import build, initializer

    mx = import_mxnet()
    net = build("lenet5", 10)
    net.initialize(initializer(), ctx=mx.cpu())
    return param_facts(net.collect_params())["param_arrays"]


def _with(trace: Trace, **meta: object) -> Trace:
    return Trace(trace.events, {**trace.meta, **meta})


def test_the_recorder_lists_every_trained_array_by_layer(arrays: list[list]) -> None:
    assert [layer for layer, _ in arrays] == [
        "lenet5_conv0", "lenet5_conv0", "lenet5_conv1", "lenet5_conv1", "lenet5_dense0",
        "lenet5_dense0", "lenet5_dense1", "lenet5_dense1", "lenet5_dense2", "lenet5_dense2"]
    assert sum(n for _, n in arrays) == 62006  # the meta's params of the fixtures


def test_one_gradient_per_key_the_kvstore_pushed(arrays: list[list]) -> None:
    trace = load(PS_SYNC)
    ev = trace.events
    calls = ev[(ev["name"].astype(str) == "KVStoreDistDefaultStoragePushPull")
               & (ev["step"] >= 0) & (ev["role"].astype(str) == "worker")]
    per_step = calls.groupby(["rank", "step"], observed=True).size()
    assert len(per_step) and (per_step == len(arrays)).all()  # 10 keys a step

    before = profile(trace)  # the fixture predates param_arrays: one per layer
    assert len(before.layers) == 5
    g = profile(_with(trace, param_arrays=arrays))
    assert len(g.layers) == len(arrays)
    assert "param_arrays" in g.bytes_source
    assert int(g.layers["bytes"].sum()) == 62006 * FLOAT_BYTES == g.total_bytes
    # backward order: the last layer's arrays first, each ready with its layer
    assert list(g.layers["bytes"][:2]) == [840 * 4, 10 * 4]
    assert list(g.layers["bytes"][-2:]) == [450 * 4, 6 * 4]
    assert np.array_equal(g.layers["ready_frac"].to_numpy()[::2],
                          before.layers["ready_frac"].to_numpy())
    # the layer's own backward work stays whole, on its first array
    assert g.layers["backward_ns"].sum() == pytest.approx(before.layers["backward_ns"].sum())


def test_arrays_that_do_not_fit_the_trace_are_not_used(arrays: list[list]) -> None:
    trace = load(PS_SYNC)
    g = profile(_with(trace, param_arrays=arrays[:6]))  # three layers for five
    assert len(g.layers) == 5 and "split evenly" in g.bytes_source
    g = profile(_with(trace, param_arrays="conv0"))
    assert len(g.layers) == 5


def test_the_servers_take_the_optimizer_and_the_worker_keeps_the_rest(
        arrays: list[list]) -> None:
    base = baseline(_with(load(SINGLE), param_arrays=arrays))
    update = base.phases["update"]
    assert 0 < base.optimizer_ns < update
    net = assumed(Collective.PS)
    p, _ = plan(base, 2, "ps-sync", 1, net)
    assert len(p.grad_bytes) == len(arrays) and int(p.grad_bytes.sum()) == 62006 * 4
    assert p.server_update_ns == pytest.approx(base.optimizer_ns)
    assert p.phases["update"] == pytest.approx(update - base.optimizer_ns)
    p2, _ = plan(base, 2, "ps-sync", 2, net)
    assert p2.server_update_ns == pytest.approx(base.optimizer_ns / 2)
    # the optimizer's operators: weights_update in the update phase, counted
    ev = load(SINGLE).events
    opt = ev[(ev["op"].astype(str) == "weights_update") & ev["counted"].astype(bool)
             & (ev["phase"].astype(str) == "update") & (ev["step"] >= 0)]
    steps = ev.loc[ev["step"] >= 0, "step"].nunique()
    assert float(opt["dur"].max()) <= base.optimizer_ns * steps <= float(opt["dur"].sum())
