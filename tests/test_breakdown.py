"""The wall-time phase breakdown: phases sum to each step exactly; busy time and overlap."""

from __future__ import annotations

import numpy as np
import pytest

from opprof import load
from opprof.analysis.breakdown import PRIORITY, comm_overlap_ratio, phase_summary, step_breakdown
from opprof.taxonomy import PHASES
from tests.conftest import FIXTURES, shared_trace
from tests.test_kineto import SHARED


@pytest.mark.parametrize("name", SHARED)
def test_phases_sum_to_step_time_exactly(name: str) -> None:
    steps = step_breakdown(load(shared_trace(name)))
    assert len(steps) > 0
    assert (steps[list(PHASES)].sum(axis=1) == steps["dur_ns"]).all()
    assert (steps[list(PHASES)] >= 0).all().all()


@pytest.mark.parametrize("name", SHARED)
def test_wall_time_never_exceeds_busy_time(name: str) -> None:
    steps = step_breakdown(load(shared_trace(name)))
    for p in PRIORITY:
        assert (steps[p] <= steps[f"busy_{p}"]).all(), p
        assert (steps[f"busy_{p}"] <= steps["dur_ns"]).all(), p
    assert (steps["comm_overlap_ns"] <= steps["comm_time_ns"]).all()


def test_ddp_trace_has_forward_backward_update_and_mostly_exposed_device_comm() -> None:
    """On the GPU the NCCL kernels overlap compute kernels for a small part of their time
    (HTA: 14.31%; the host view said 79%): the overlap is the device's."""
    steps = step_breakdown(load(shared_trace("nccl-2rank-rank0.json.gz")))
    s = phase_summary(steps)
    assert s.loc["forward", "share"] > 0.2 and s.loc["backward", "share"] > 0.2
    assert s.loc["update", "ns_per_step"] > 0
    assert s.loc["comm", "busy_ns_per_step"] > s.loc["comm", "ns_per_step"] > 0
    assert steps["comm_on_device"].all()
    ratio = comm_overlap_ratio(steps)
    assert ratio is not None and 0.05 < ratio < 0.3
    assert s["share"].sum() == pytest.approx(1.0)


def test_cpu_gloo_trace_is_all_communication() -> None:
    steps = step_breakdown(load(shared_trace("cpu-only-gloo-rank34.json.gz")))
    assert steps["comm"].sum() > 0.5 * steps["dur_ns"].sum()
    assert comm_overlap_ratio(steps) == 0.0


def test_allreduce_blocking_a_backward_hook_is_not_compute() -> None:
    from opprof.analysis.breakdown import blocked_in_comm
    from opprof.walltime import functional_waits

    tr = load(shared_trace("nccl-2rank-rank0.json.gz"))
    ev = tr.events
    ops = ev[(ev["role"] == "worker") & ev["counted"] & ev["phase"].isin(PRIORITY)]
    blocked = blocked_in_comm(ops, functional_waits(ev))
    assert set(blocked["name"].astype(str)) == {"c10d::allreduce_"}
    assert (blocked["phase"] == "backward").all()
    steps = step_breakdown(tr)
    assert (steps[list(PHASES)].sum(axis=1) == steps["dur_ns"]).all()


@pytest.mark.parametrize("name", ["tf-lenet5-base.trace", "tf-lenet5-mwms2.trace"])
def test_input_prefetched_beside_the_step_is_not_load(name: str) -> None:
    """tf.data prefetches the next batch on threads of its own while the step's thread
    computes (a MultiWorkerMirroredStrategy worker's ``Iterator::Generator`` for most of
    its step): those instants are the compute marker's, and ``load`` is the step's own
    wait for its batch — the main thread's load operators — plus instants no marker holds."""
    from opprof.filters import markers
    from opprof.walltime import COMPUTE, phase_at

    trace = load(FIXTURES / "colocation" / name)
    ev = trace.events
    steps = step_breakdown(trace)
    assert (steps[list(PHASES)].sum(axis=1) == steps["dur_ns"]).all()
    marks = ev[markers(ev) & ev["phase"].isin(COMPUTE) & (ev["step"] >= 0)]
    main = set(zip(marks["pid"], marks["tid"], strict=True))
    loads = ev[ev["counted"] & (ev["phase"] == "load") & (ev["step"] >= 0)]
    on_main = [(p, t) in main for p, t in zip(loads["pid"], loads["tid"], strict=True)]
    fore, back = loads[on_main], loads[[not x for x in on_main]]
    assert len(fore) and len(back)
    # every 50 µs of every compute marker: no instant is load unless the marker's own
    # thread runs a load operator then — yet the background threads load at many of them
    hits = 0
    for _, m in marks.iterrows():
        ts = np.arange(m["ts"], m["ts"] + m["dur"], 50_000)
        waits = ((fore["ts"].to_numpy()[None, :] <= ts[:, None])
                 & (ts[:, None] < (fore["ts"] + fore["dur"]).to_numpy()[None, :])).any(axis=1)
        busy = ((back["ts"].to_numpy()[None, :] <= ts[:, None])
                & (ts[:, None] < (back["ts"] + back["dur"]).to_numpy()[None, :])).any(axis=1)
        at = phase_at(trace, np.full(len(ts), m["rank"]), ts)
        assert not ((at == PHASES.index("load")) & ~waits).any(), m["name"]
        hits += int((busy & ~waits).sum())
    assert hits > 0
    # the load phase is then about the main thread's own wait (its `opprof.load`; where an
    # operator of a higher phase runs beside it, less), not the background threads' busy time
    own = ev[ev["name"] == "opprof.load"]["dur"].sum()
    assert steps["load"].sum() < 1.5 * own < steps["busy_load"].sum()
