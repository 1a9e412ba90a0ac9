"""TensorFlow's distributed dataset: MultiWorkerMirroredStrategy workers draw every batch
through the strategy's iterator, which a one-worker base never did. `opprof calibrate --fw tf`
times the co-location loop's step fed that way and fed by the plain dataset
(``info.distributed_input``, tests/test_model_runs.py runs it); the data-parallel model adds
the difference to each step's input, where no prefetch hides it (docs/model.md, section 3).
On real recordings of issue #36's check (fixtures/colocation)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from opprof.loader import load
from opprof.model.commmodel import Network
from opprof.model.predict import baseline, distributed_input_ns, plan, predict
from opprof.model.simulate import simulate
from tests.conftest import FIXTURES

COLOC = FIXTURES / "colocation"


@pytest.fixture(scope="module")
def net() -> Network:
    return Network.from_dict(json.loads((COLOC / "tf-net.json").read_text()))


def _without(net: Network) -> Network:
    return replace(net, info={k: v for k, v in net.info.items() if k != "distributed_input"})


def test_the_calibration_fed_the_step_both_ways(net: Network) -> None:
    feed = net.info["distributed_input"]
    assert feed["distributed_ns"] > 0 and feed["plain_ns"] > 0 and len(feed["rounds_ns"]) == 4
    assert feed["ns"] == pytest.approx(max(0.0, sorted(feed["rounds_ns"])[1] / 2
                                            + sorted(feed["rounds_ns"])[2] / 2))


def test_workers_of_a_one_worker_base_pay_it_once_a_step(net: Network) -> None:
    base = baseline(load(COLOC / "tf-lenet5-base.trace"))
    extra = net.info["distributed_input"]["ns"]
    assert extra > 0 and distributed_input_ns(base, net, "allreduce", 2) == extra
    with_it = predict(load(COLOC / "tf-lenet5-base.trace"), [2], mode="allreduce", network=net)
    without = predict(load(COLOC / "tf-lenet5-base.trace"), [2], mode="allreduce",
                      network=_without(net))
    p, q = with_it.predictions[0], without.predictions[0]
    # the base prefetches (its input pipeline is busier than its exposed load), yet the
    # distributed dataset's cost is not hidden: the step and its load grow by exactly it
    assert base.terms.extra()["io_busy_ns"] > base.phases["load"]
    assert p.step_ns - q.step_ns == pytest.approx(extra, rel=1e-9)
    assert p.phases["load"] - q.phases["load"] == pytest.approx(extra, rel=1e-9)
    assert sum(p.terms().values()) == pytest.approx(p.step_ns, rel=1e-12)
    assert any("distributed dataset" in n for n in with_it.notes)
    # one worker iterates its own dataset: nothing; the load hidden: nothing either
    one = predict(load(COLOC / "tf-lenet5-base.trace"), [1], mode="allreduce", network=net)
    assert one.predictions[0].step_ns == pytest.approx(base.step_ns)
    hidden, _ = plan(base, 2, "allreduce", 0, net, io_hidden=True)
    assert hidden.input_ns == 0 and simulate(hidden).phases["load"] == 0


def test_a_base_that_ran_the_strategy_already_holds_it(net: Network) -> None:
    two = baseline(load(COLOC / "tf-lenet5-mwms2.trace"))
    assert two.collective == "allreduce"
    assert distributed_input_ns(two, net, "allreduce", 4) == 0


def test_other_frameworks_and_networks_add_nothing(net: Network) -> None:
    torch = baseline(load(COLOC / "torch-lenet5-base.trace"))
    assert distributed_input_ns(torch, net, "allreduce", 2) == 0
    tf = baseline(load(COLOC / "tf-lenet5-base.trace"))
    assert distributed_input_ns(tf, _without(net), "allreduce", 2) == 0
    assert distributed_input_ns(tf, replace(net, framework="torch"), "allreduce", 2) == 0


def test_calibrate_prints_it(net: Network) -> None:
    from opprof.render.console import calibration

    text = " ".join(calibration(net).split())
    ns = net.info["distributed_input"]["ns"]
    assert "Distributed dataset: the step fed through the strategy's" in text
    assert f"+{ns / 1e3:,.1f} µs a step" in text
