"""The TensorFlow collector records a real single-worker run: one XPlane logdir, the warm-up /
timing / profiled protocol, four phase markers per step, a real tf.data pipeline, and operator
totals that agree with xprof's own framework_op_stats."""

from __future__ import annotations

from pathlib import Path

import pytest

from opprof.analysis.breakdown import step_breakdown
from opprof.collectors import RecordConfig, record
from opprof.errors import OpprofError
from opprof.taxonomy import PHASES
from tests.procs import needs  # (before the imports it guards)
from tests.xprof_check import assert_totals_match_xprof

needs("tensorflow", "xprof")

CONFIG = {"fw": "tf", "model": "lenet5", "batch_size": 8, "steps": 2, "warmup": 1,
          "timing_steps": 1, "timeout_s": 300}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real recording (in this process), normalized; shared by every test here."""
    from opprof.normalizers import normalize

    workdir = tmp_path_factory.mktemp("tf-single")
    seen = []
    rec = record(RecordConfig(**CONFIG), workdir,
                              lambda stage, done, total: seen.append((stage, done, total)))
    trace = normalize(rec.native, rec.meta)
    return workdir, rec, trace, seen


def test_one_xplane_logdir_under_the_workdir(run) -> None:
    workdir, rec, _, _ = run
    assert len(rec.native) == 1
    path = rec.native[0]
    assert path.name.endswith(".xplane.pb") and path.stat().st_size > 0
    assert path.is_relative_to(workdir / "worker0" / "plugins" / "profile")


def test_protocol_and_metadata(run) -> None:
    _, rec, trace, seen = run
    m = rec.meta
    assert (m["framework"], m["model"], m["mode"], m["workers"]) == ("tf", "lenet5", "single", 1)
    assert (m["warmup_steps"], m["timing_steps"], m["profiled_steps"]) == (1, 1, 2)
    assert m["unprofiled_step_ns"] > 0 and m["samples_per_s"] > 0
    assert m["params"] == 62006
    assert m["layers"] == {"conv": 2, "fc": 3, "batchnorm": 0}
    assert m["framework_version"].startswith("2.")
    assert ("warmup", 1, 1) in seen and ("timing", 1, 1) in seen and ("profile", 2, 2) in seen
    assert trace.meta["clock"] == "epoch"


def test_two_steps_each_with_four_phase_markers(run) -> None:
    _, _, trace, _ = run
    bounds = trace.step_bounds()
    assert bounds["step"].tolist() == [0, 1]
    ev = trace.events
    for _, b in bounds.iterrows():
        inside = ev[(ev["ts"] >= b["start"]) & (ev["ts"] < b["end"])]
        names = inside["name"].astype(str)
        for marker in ("opprof.load", "opprof.forward", "opprof.backward", "opprof.update"):
            assert (names == marker).sum() == 1, marker
    steps = ev[ev["name"].astype(str).str.fullmatch(r"train \d")]
    assert sorted(steps["name"].astype(str)) == ["train 0", "train 1"]
    assert (steps["kind"] == "marker").all() and not steps["counted"].any()


def test_phases_sum_to_step_time_and_all_four_are_present(run) -> None:
    _, _, trace, _ = run
    sb = step_breakdown(trace)
    assert (sb[list(PHASES)].sum(axis=1) == sb["dur_ns"]).all()
    for phase in ("load", "forward", "backward", "update"):
        assert (sb[phase] > 0).all(), phase


def test_forward_backward_and_update_ops_land_in_their_phases(run) -> None:
    _, _, trace, _ = run
    ev = trace.events
    counted = ev[ev["counted"] & (ev["step"] >= 0)]
    by_op = {op: set(g["phase"].astype(str)) for op, g in counted.groupby("op", observed=True)}
    assert by_op["convolution"] == {"forward"}
    assert by_op["convolution_backward"] == {"backward"}
    assert by_op["fully_connected_backward"] == {"backward"}
    assert by_op["weights_update"] == {"update"}
    # MatMul in the gradient function is fully_connected_backward, not fully_connected.
    matmul = counted[counted["name"].astype(str).str.contains("MatMul")]
    grad = matmul["detail"].astype(str).str.startswith("gradients/")
    assert grad.any() and (~grad).any()
    assert (matmul.loc[grad, "op"] == "fully_connected_backward").all()
    assert (matmul.loc[~grad, "op"] == "fully_connected").all()


def test_the_tf_data_pipeline_is_real_work_in_load(run) -> None:
    _, _, trace, _ = run
    ev = trace.events
    names = ev["name"].astype(str)
    # .cache() really caches, and the per-sample map (normalize, flip) really runs.
    assert names.eq("Iterator::MemoryCache").any()
    flips = ev[names.eq("ReverseV2") | names.eq("RandomUniform")]
    assert len(flips) and (flips["op"] == "data_load").all() and (flips["phase"] == "load").all()
    assert int(ev.loc[ev["counted"] & (ev["op"] == "data_load"), "dur"].sum()) > 0


def test_op_totals_match_xprof_framework_op_stats(run) -> None:
    _, rec, trace, _ = run
    assert assert_totals_match_xprof(trace, rec.native[0]) > 50


@pytest.mark.parametrize(("change", "message"), [
    ({"mode": "ps-sync", "workers": 2}, "asynchronous by design"),
    ({"device": "cuda"}, "no GPU support"),
    ({"model": "vgg"}, "unknown model"),
    ({"steps": 0}, "steps must be at least 1"),
])
def test_bad_configs_are_one_clear_error(change: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(OpprofError, match=message):
        record(RecordConfig(**{**CONFIG, **change}), tmp_path)
