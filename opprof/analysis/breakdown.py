"""Per-step wall-time phase breakdown, busy time per phase and comm/compute overlap.

Every instant of a step goes to exactly one phase, so the phases sum to the step time.
Who wins an instant, highest first:

1. operator events (counted events: host operators and device kernels/copies) of
   forward, backward, update; then comm; then h2d; then load;
2. phase markers (``opprof.forward``, ``## backward ##``, …) in the same order — but a load
   operator on a host thread that holds no forward, backward or update marker (``tf.data``'s
   threads prefetching the next batch while the step's thread computes) comes after the
   compute, comm and h2d markers, just before the load markers: the step is past its load
   then, the input hidden behind it;
3. ``other`` for time nothing covers.

Tier 1 before tier 2 refines DESIGN.md's "forward/backward/update > comm > h2d > load >
other": a blocking all-reduce inside a backward marker, with no compute operator running
beside it, is communication, not backward. Likewise a compute operator does not count as
running while it is blocked in a comm call it issued on its own thread (DDP's all-reduce
from a backward hook; ``_c10d_functional::wait_tensor`` inside the operator that first uses a
DTensor collective's result — from that operator's start: it consumes the result, so what it
does before the wait is dispatch; the reader's ``opprof.wait`` where a synchronous call waited
for its collective inside an operator: docs/parallelism.md): that time is comm unless other
compute runs beside it. ``comm`` is
thus the communication not hidden behind compute. Busy time per phase is the union of that
phase's events and markers (phases may overlap there), and ``comm_overlap_ns`` is comm
operator time during which a compute (forward/backward/update) operator also ran on the
same rank.

**On the device where there is one.** On a rank whose communication runs as device kernels
(NCCL), hidden and exposed communication come from the device timeline, as Holistic Trace
Analysis' ``get_comm_comp_overlap`` defines them: ``comm_time_ns`` is the union of the comm
kernels the step launched (whole, wherever they run: a kernel belongs to the step of the host
call that launched it), ``comm_overlap_ns`` the part of it during which a compute kernel the
step launched ran on the rank's devices, and the overlap ratio leaves out each such rank's
last step (its device work may be cut off where the profiler stopped: HTA's "complete
steps"). An instant where a comm kernel runs and no compute kernel does is ``comm`` in the
wall-time breakdown even while the host runs compute operators (it launches work the device
runs only after the collective). A rank without device comm (CPU training) keeps the host
view: ``comm_time_ns`` is the union of its comm operators and ``comm_overlap_ns`` the part of
it during which a compute operator ran.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.devices import launch_times
from opprof.filters import communication, counted, kernels, markers, workers
from opprof.intervals import Sweep
from opprof.taxonomy import PHASES
from opprof.trace import Trace
from opprof.walltime import COMM_CODE, COMPUTE_CODES, RankArrays, blocked_in_comm, functional_waits

# re-exported: the tiers live in the core (opprof.walltime), where the normalizers use them too
from opprof.walltime import COMPUTE as COMPUTE
from opprof.walltime import PRIORITY as PRIORITY
from opprof.walltime import container as container
from opprof.walltime import phase_at as phase_at

if TYPE_CHECKING:
    from opprof.arrays import Array


def step_breakdown(trace: Trace) -> pd.DataFrame:
    """One row per (rank, step): start, end, dur_ns, wall ns per phase (summing to dur_ns),
    ``busy_<phase>`` ns, ``comm_time_ns`` and ``comm_overlap_ns`` (the device's where comm
    runs on one: ``comm_on_device``)."""
    bounds = trace.step_bounds()
    ev = trace.events
    worker = workers(ev)
    # Steps are a worker notion: servers and schedulers serve them and get no rows.
    bounds = bounds[bounds["rank"].isin(ev.loc[worker, "rank"].unique())]
    phased = ev["phase"].isin(PRIORITY)
    # only the columns read below are copied (a filter copies every column it takes)
    ops = ev.loc[worker & counted(ev) & phased,
                 ["rank", "pid", "tid", "ts", "dur", "device", "phase"]]
    marks = ev.loc[worker & markers(ev) & phased, ["rank", "pid", "tid", "ts", "dur", "phase"]]
    blocked = blocked_in_comm(ops, functional_waits(ev))
    kernel_rows = ev.loc[worker & kernels(ev),
                         ["rank", "ts", "dur", "op", *(["link"] if "link" in ev else [])]]
    launched = launch_times(ev, kernel_rows)
    kernel_rows = kernel_rows.assign(launched=np.where(launched >= 0, launched,
                                                       kernel_rows["ts"].to_numpy(np.int64)))
    rows = []
    for rank, b in bounds.groupby("rank", sort=True):
        b = b.sort_values("start")
        o = ops[ops["rank"] == rank]
        m = marks[marks["rank"] == rank]
        out = _rank_breakdown(rank, b, o, m, blocked[blocked["rank"] == rank])
        k = kernel_rows[kernel_rows["rank"] == rank]
        if out["comm_on_device"].any():
            out["comm_time_ns"], out["comm_overlap_ns"] = device_overlap(b, k)
        rows.append(out)
    cols = ["rank", "step", "start", "end", "dur_ns", *PHASES,
            *(f"busy_{p}" for p in PRIORITY), "comm_time_ns", "comm_overlap_ns",
            "comm_on_device"]
    if not rows:
        return pd.DataFrame(columns=cols)
    return pd.concat(rows, ignore_index=True)[cols]


def _rank_breakdown(rank: int, b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame,
                    blk: pd.DataFrame) -> pd.DataFrame:
    a = RankArrays.of(b, o, m, blk)
    sweep = Sweep(a.starts, a.ends, a.s_start, a.s_end)
    n_steps = len(b)
    step_i = sweep.bins(a.s_start, a.s_end)
    cover = partial(a.cover, sweep)

    wall = np.bincount(step_i * len(PHASES) + a.winners(sweep), weights=sweep.length,
                       minlength=(n_steps + 1) * len(PHASES))
    wall = np.rint(wall).astype(np.int64).reshape(n_steps + 1, len(PHASES))[:n_steps]

    out = pd.DataFrame({"rank": rank, "step": b["step"].to_numpy(), "start": a.s_start,
                        "end": a.s_end, "dur_ns": a.s_end - a.s_start})
    for j, p in enumerate(PHASES):
        out[p] = wall[:, j]
    for p in PRIORITY:
        out[f"busy_{p}"] = sweep.total(cover(a.phase == PHASES.index(p)), step_i, n_steps)
    compute = np.isin(a.phase, COMPUTE_CODES)
    comm_ops = cover((a.phase == COMM_CODE) & a.is_op)
    compute_ops = cover(compute & a.is_op, np.isin(a.k_phase, COMPUTE_CODES))
    out["comm_time_ns"] = sweep.total(comm_ops, step_i, n_steps)
    out["comm_overlap_ns"] = sweep.total(comm_ops & compute_ops, step_i, n_steps)
    out["comm_on_device"] = bool(a.device_comm.any())  # then device_overlap's figures
    return out


def device_overlap(b: pd.DataFrame, kernels: pd.DataFrame) -> tuple[Array, Array]:
    """Per step of one rank (``b`` sorted): the union of the comm kernels it launched, and
    the part of it during which a compute kernel it launched ran (``kernels``: the rank's,
    with ``launched``, the start of the host call that launched each)."""
    n = len(b)
    step = np.searchsorted(b["start"].to_numpy(np.int64), kernels["launched"].to_numpy(np.int64),
                           side="right") - 1
    inside = (step >= 0) & (kernels["launched"].to_numpy(np.int64)
                            < b["end"].to_numpy(np.int64)[np.maximum(step, 0)])
    k = kernels[inside]
    step = step[inside]
    if k.empty:
        return np.zeros(n, np.int64), np.zeros(n, np.int64)
    ts = k["ts"].to_numpy(np.int64)
    end = ts + k["dur"].to_numpy(np.int64)
    # each step on a lane of its own: one sweep answers every step
    t0, width = int(ts.min()), int(end.max() - ts.min()) + 2
    ks, ke = step * width + (ts - t0), step * width + (end - t0)
    sweep = Sweep(ks, ke)
    comm = communication(k).to_numpy()
    compute = ~comm  # every other kernel computes, whatever its phase (as HTA)
    c_cov = sweep.covered(ks[comm], ke[comm])
    p_cov = sweep.covered(ks[compute], ke[compute])
    seg_step = sweep.start // width
    return (sweep.total(c_cov, seg_step, n), sweep.total(c_cov & p_cov, seg_step, n))


def phase_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Per phase over all (rank, step) rows: wall ns per step, share of step time, busy ns per
    step (compute phases and comm only have busy time)."""
    n = max(len(steps), 1)
    total = max(int(steps["dur_ns"].sum()), 1) if len(steps) else 1
    rows = []
    for p in PHASES:
        wall = int(steps[p].sum()) if len(steps) else 0
        busy_col = f"busy_{p}"
        busy = int(steps[busy_col].sum()) if busy_col in steps and len(steps) else None
        rows.append({"phase": p, "ns_per_step": wall / n, "share": wall / total,
                     "busy_ns_per_step": None if busy is None else busy / n})
    return pd.DataFrame(rows).set_index("phase")


def comm_overlap_ratio(steps: pd.DataFrame) -> float | None:
    """Share of communication time hidden behind compute, over all steps (None: no comm):
    on the device timeline where communication runs on one (module docstring)."""
    if "comm_on_device" in steps and steps["comm_on_device"].any():
        # HTA's complete steps: not the last one of a GPU rank that has several
        last = steps.groupby("rank")["step"].transform("max") == steps["step"]
        several = steps.groupby("rank")["step"].transform("size") > 1
        steps = steps[~(steps["comm_on_device"] & last & several)]
    col = "comm_time_ns" if "comm_time_ns" in steps else "busy_comm"  # older tables
    comm = int(steps[col].sum()) if len(steps) else 0
    return None if comm == 0 else float(steps["comm_overlap_ns"].sum()) / comm

