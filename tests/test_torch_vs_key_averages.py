"""A real torch recording normalized by opprof agrees with torch's own outputs: the exported
trace (exactly) and `key_averages()` (within 1% wherever torch's two outputs agree)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from tests.procs import needs  # (before the imports it guards)

needs("torch")

from opprof.analysis.breakdown import step_breakdown  # noqa: E402
from opprof.analysis.ops import native_totals, op_table  # noqa: E402
from opprof.collectors import RecordConfig, record  # noqa: E402
from opprof.normalizers import normalize  # noqa: E402
from opprof.taxonomy import PHASES  # noqa: E402
from tests.conftest import FIXTURES, native_x_events  # noqa: E402


@pytest.fixture(scope="module", params=["fixture", "lenet5", "resnet18"])
def run(request, tmp_path_factory):
    """(trace, native complete events, key_averages rows by name) of a committed fixture
    recording, or of a fresh real recording."""
    if request.param == "fixture":
        native_path = FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"
        kavg_path = FIXTURES / "torch" / "lenet5-cpu-2steps.key_averages.json"
        trace = normalize([native_path], {"model": "lenet5"})
    else:
        workdir = tmp_path_factory.mktemp(f"kavg-{request.param}")
        cfg = RecordConfig(fw="torch", model=request.param, batch_size=4, steps=2, warmup=1,
                           timing_steps=1)
        rec = record(cfg, workdir, lambda *a: None)
        trace = normalize(rec.native, rec.meta)
        native_path, kavg_path = rec.native[0], workdir / "rank0.key_averages.json"
    native = native_x_events(native_path)
    kavg = {r["name"]: r for r in json.loads(kavg_path.read_text())}
    return trace, native, kavg


def test_every_trace_event_is_in_the_table_once(run) -> None:
    trace, native, _ = run
    counts, durs = Counter(), defaultdict(float)
    for e in native:
        counts[e["name"]] += 1
        durs[e["name"]] += e["dur"]
    got = native_totals(trace)
    assert dict(got["count"]) == dict(counts)
    for name, us in durs.items():
        assert got.loc[name, "total_ns"] == pytest.approx(us * 1000, abs=counts[name])


def test_totals_match_key_averages_where_torch_agrees_with_itself(run) -> None:
    trace, native, kavg = run
    counts = Counter(e["name"] for e in native)
    got = native_totals(trace)
    compared, disagree = 0, []
    for name, row in kavg.items():
        if counts.get(name) != row["count"]:
            # torch's two outputs differ (ProfilerStep* merged into one row; a same-named
            # only child dropped from key_averages, e.g. aten::div_ in aten::div_).
            disagree.append(name)
            continue
        assert got.loc[name, "count"] == row["count"], name
        total_us = got.loc[name, "total_ns"] / 1000
        assert total_us == pytest.approx(row["cpu_time_total_us"], rel=0.01, abs=1.0), name
        compared += 1
    assert compared >= 0.9 * len(kavg)
    assert all(n.startswith(("ProfilerStep", "aten::div")) for n in disagree), disagree


def test_phases_sum_to_step_time_and_ops_are_classified(run) -> None:
    trace, _, _ = run
    steps = step_breakdown(trace)
    assert len(steps) == 2
    assert (steps[list(PHASES)].sum(axis=1) == steps["dur_ns"]).all()
    for p in ("load", "forward", "backward", "update"):
        assert (steps[p] > 0).all(), p
    ops = op_table(trace).set_index(["op", "phase"])
    for key in [("convolution", "forward"), ("convolution_backward", "backward"),
                ("weights_update", "update"), ("data_load", "load"),
                ("fully_connected", "forward"), ("loss", "forward")]:
        assert key in ops.index, key
        assert ops.loc[key, "count"] % 2 == 0, key  # the same work in each of the 2 steps
    assert ops.loc[("weights_update", "update"), "count"] == 2  # one Optimizer.step per step


def test_operator_totals_count_nested_events_once(run) -> None:
    trace, _, _ = run
    ev = trace.events
    counted = ev[ev["counted"] & (ev["step"] >= 0)]
    # Counted events on one lane never overlap: nothing is summed twice.
    for _, lane in counted.groupby(["rank", "pid", "tid"], observed=True):
        lane = lane.sort_values("ts")
        ends = (lane["ts"] + lane["dur"]).to_numpy()
        assert (lane["ts"].to_numpy()[1:] >= ends[:-1]).all()
    inner = ev[ev["name"].isin(["aten::convolution", "aten::_convolution",
                                "aten::mkldnn_convolution"])]
    assert len(inner) and not inner["counted"].any()
    assert (inner["op"] == "convolution").all()
    adds = ev[(ev["name"] == "aten::add_") & (ev["phase"] == "update")]
    assert len(adds) and (adds["op"] == "weights_update").all() and not adds["counted"].any()
