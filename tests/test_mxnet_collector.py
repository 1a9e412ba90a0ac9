"""A real one-worker MXNet recording: files, markers, MXNet's own aggregate, meta, and the
`opprof record --fw mxnet` command line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.procs import needs  # (before the imports it guards)

needs("mxnet")

from opprof.analysis.breakdown import step_breakdown  # noqa: E402
from opprof.collectors import RecordConfig, record  # noqa: E402
from opprof.errors import OpprofError  # noqa: E402
from opprof.normalizers import normalize  # noqa: E402
from opprof.trace import read_parquet  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.test_mxnet_normalizer import PHASE_TASKS, aggregate_mismatches  # noqa: E402

TINY = dict(model="lenet5", batch_size=8, steps=2, warmup=1, timing_steps=1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("mxnet-rec")
    config = RecordConfig(fw="mxnet", command="opprof record --fw mxnet --model lenet5", **TINY)
    seen: list[tuple[str, int, int]] = []
    rec = record(config, workdir, lambda *a: seen.append(a))
    return workdir, rec, seen


def test_writes_trace_aggregate_and_facts(recorded) -> None:
    workdir, rec, _ = recorded
    assert rec.native == [workdir / "rank0_worker.json"]
    names = {p.name for p in workdir.iterdir()}
    assert {"rank0_worker.json", "rank0_worker.dumps.txt", "rank0_worker.meta"} <= names
    assert not {n for n in names if n.endswith(".json")} - {"rank0_worker.json"}
    facts = json.loads((workdir / "rank0_worker.meta").read_text())
    assert facts["rank"] == 0 and facts["params"] == 62_006


def test_markers_cover_only_the_profiled_steps(recorded) -> None:
    _, rec, _ = recorded
    events = json.loads(rec.native[0].read_text())["traceEvents"]
    begins = Counter(e["name"] for e in events if e.get("ph") in ("b", "("))
    assert begins["opprof.step#0"] == begins["opprof.step#1"] == 1
    for task in PHASE_TASKS:
        assert begins[task] == 2, task
    ops = Counter(e["name"] for e in events if e.get("ph") == "B" and e.get("cat") == "operator")
    assert ops["Convolution"] == ops["_backward_Convolution"] == 2 * 2  # 2 convs, 2 steps
    assert ops["multi_sgd_mom_update"] > 0


def test_trace_agrees_with_mxnets_aggregate_and_phases_sum(recorded) -> None:
    workdir, rec, _ = recorded
    trace = normalize(rec.native, rec.meta)
    assert aggregate_mismatches(trace, workdir) == []
    steps = step_breakdown(trace)
    assert list(steps["step"]) == [0, 1]
    phases = ["load", "h2d", "forward", "backward", "update", "comm", "other"]
    assert (steps[phases].sum(axis=1) == steps["dur_ns"]).all()
    assert (steps["comm"] == 0).all() and (steps["forward"] > 0).all()


def test_meta_and_progress(recorded) -> None:
    _, rec, seen = recorded
    m = rec.meta
    assert m["framework"] == "mxnet" and m["framework_version"].startswith("1.")
    assert (m["model"], m["dataset"], m["batch_size"]) == ("lenet5", "synthetic-cifar10", 8)
    assert (m["workers"], m["servers"], m["mode"], m["device"]) == (1, 0, "single", "cpu")
    assert (m["warmup_steps"], m["timing_steps"], m["profiled_steps"]) == (1, 1, 2)
    assert m["params"] == 62_006 and m["layers"] == {"conv": 2, "fc": 3, "batchnorm": 0}
    assert m["unprofiled_step_ns"] > 0 and m["profiled_wall_ns"] > 0
    assert m["samples_per_s"] == pytest.approx(8 / (m["unprofiled_step_ns"] / 1e9))
    assert ("profile", 2, 2) in seen and ("warmup", 1, 1) in seen


@pytest.mark.parametrize(("change", "message"), [
    ({"mode": "allreduce", "workers": 2}, "no --mode allreduce"),
    ({"device": "cuda"}, "CPU training only"),
    ({"steps": 0}, "steps must be at least 1"),
])
def test_unsupported_settings_are_one_clear_error(tmp_path: Path, change: dict,
                                                   message: str) -> None:
    config = RecordConfig(fw="mxnet", **{**TINY, **change})
    with pytest.raises(OpprofError, match=message):
        record(config, tmp_path)


def test_record_command_as_a_user_runs_it(tmp_path: Path) -> None:
    res = run_cli("record", "--fw", "mxnet", "--model", "lenet5", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "--timing-steps", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "lenet5-mxnet.trace" in res.stderr and "forward" in res.stdout
    trace = read_parquet(tmp_path / "lenet5-mxnet.trace")
    assert trace.meta["framework"] == "mxnet" and trace.meta["source_formats"] == ["mxnet"]
    assert (tmp_path / "lenet5-mxnet.native" / "rank0_worker.dumps.txt").is_file()


def test_opprof_runs_loss_hook_keeps_a_list_of_losses_too() -> None:
    """`opprof run`'s loss of a Gluon step: the mean of the array ``backward()`` ran on, and of
    the arrays ``autograd.backward([...])`` ran on (a loss per device, or one in a list)."""
    from opprof.collectors.mxnet import hook_loss
    from opprof.collectors.mxnet_lib import import_mxnet

    mx = import_mxnet()
    from mxnet import autograd, gluon

    saved = mx.nd.NDArray.backward, mx.autograd.backward
    try:
        log = hook_loss()
        net = gluon.nn.Dense(1)
        net.initialize()
        x = mx.nd.random.normal(shape=(6, 3))
        with autograd.record():
            halves = [(net(x[:2]) ** 2).reshape((-1,)), (net(x[2:]) ** 2).reshape((-1,))]
        mx.autograd.backward(halves)
        log.step_end(False)
        with autograd.record():
            whole = (net(x) ** 2).reshape((-1,))
        whole.backward()
        log.step_end(False)
        rows = log.rows()
    finally:
        mx.nd.NDArray.backward, mx.autograd.backward = saved
    expected = float((net(x) ** 2).mean().asscalar())  # the same six values both times
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["loss"] for r in rows] == pytest.approx([expected, expected], rel=1e-5)
