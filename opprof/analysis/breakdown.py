"""Per-step wall-time phase breakdown, busy time per phase and comm/compute overlap.

Every instant of a step goes to exactly one phase, so the phases sum to the step time.
Who wins an instant, highest first:

1. operator events (counted events: host operators and device kernels/copies) of
   forward, backward, update; then comm; then h2d; then load;
2. phase markers (``opprof.forward``, ``## backward ##``, …) in the same order;
3. ``other`` for time nothing covers.

Tier 1 before tier 2 refines DESIGN.md's "forward/backward/update > comm > h2d > load >
other": a blocking all-reduce inside a backward marker, with no compute operator running
beside it, is communication, not backward. Likewise a compute operator does not count as
running while it is blocked in a comm call it issued on its own thread (DDP's all-reduce
from a backward hook): that time is comm unless other compute runs beside it. ``comm`` is
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
from typing import NamedTuple

import numpy as np
import pandas as pd

from opprof.analysis.devices import launch_times
from opprof.events import lane_ids
from opprof.intervals import Sweep, containing
from opprof.taxonomy import COMM_OPS, PHASES
from opprof.trace import Trace

PRIORITY = ("forward", "backward", "update", "comm", "h2d", "load")
COMPUTE = ("forward", "backward", "update")
_TIERS = [(p, "op") for p in PRIORITY] + [(p, "marker") for p in PRIORITY]
_COMPUTE_CODES = [PHASES.index(p) for p in COMPUTE]
_COMM_CODE = PHASES.index("comm")


def step_breakdown(trace: Trace) -> pd.DataFrame:
    """One row per (rank, step): start, end, dur_ns, wall ns per phase (summing to dur_ns),
    ``busy_<phase>`` ns, ``comm_time_ns`` and ``comm_overlap_ns`` (the device's where comm
    runs on one: ``comm_on_device``)."""
    bounds = trace.step_bounds()
    ev = trace.events
    workers = (ev["role"] == "worker").to_numpy(bool)
    # Steps are a worker notion: servers and schedulers serve them and get no rows.
    bounds = bounds[bounds["rank"].isin(ev.loc[workers, "rank"].unique())]
    on_cpu = (ev["device"] == "cpu").to_numpy(bool)
    phased = ev["phase"].isin(PRIORITY).to_numpy(bool)
    kind = ev["kind"]
    # only the columns read below are copied (a filter copies every column it takes)
    ops = ev.loc[workers & ev["counted"].to_numpy(bool) & phased,
                 ["rank", "pid", "tid", "ts", "dur", "device", "phase"]]
    markers = ev.loc[workers & (kind == "marker").to_numpy(bool) & on_cpu & phased,
                     ["rank", "ts", "dur", "phase"]]
    blocked = blocked_in_comm(ops)
    kernels = ev.loc[workers & (kind == "kernel").to_numpy(bool) & ~on_cpu,
                     ["rank", "ts", "dur", "op", *(["link"] if "link" in ev else [])]]
    launched = launch_times(ev, kernels)
    kernels = kernels.assign(launched=np.where(launched >= 0, launched,
                                               kernels["ts"].to_numpy(np.int64)))
    rows = []
    for rank, b in bounds.groupby("rank", sort=True):
        b = b.sort_values("start")
        o = ops[ops["rank"] == rank]
        m = markers[markers["rank"] == rank]
        out = _rank_breakdown(rank, b, o, m, blocked[blocked["rank"] == rank])
        k = kernels[kernels["rank"] == rank]
        if out["comm_on_device"].any():
            out["comm_time_ns"], out["comm_overlap_ns"] = device_overlap(b, k)
        rows.append(out)
    cols = ["rank", "step", "start", "end", "dur_ns", *PHASES,
            *(f"busy_{p}" for p in PRIORITY), "comm_time_ns", "comm_overlap_ns",
            "comm_on_device"]
    if not rows:
        return pd.DataFrame(columns=cols)
    return pd.concat(rows, ignore_index=True)[cols]


def blocked_in_comm(ops: pd.DataFrame) -> pd.DataFrame:
    """Host comm calls issued inside a compute operator on the same thread (DDP's all-reduce
    from a backward hook), with ``phase`` set to that operator's phase: while such a call
    runs, its operator is waiting, not computing."""
    host = ops[ops["device"] == "cpu"]
    comm = host[host["phase"] == "comm"]
    compute = host[host["phase"].isin(COMPUTE)]
    pos = container(comm, compute)
    inside = comm[pos >= 0]
    return inside.assign(phase=compute["phase"].to_numpy()[pos[pos >= 0]])


class _RankArrays(NamedTuple):
    """One rank's intervals as arrays: its steps, its ops then markers (with their phase and
    which are ops), and its blocked calls."""

    s_start: np.ndarray
    s_end: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    phase: np.ndarray
    is_op: np.ndarray
    on_device: np.ndarray
    k_start: np.ndarray
    k_end: np.ndarray
    k_phase: np.ndarray

    @classmethod
    def of(cls, b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame,
           blk: pd.DataFrame) -> _RankArrays:
        starts = np.concatenate([o["ts"].to_numpy(np.int64), m["ts"].to_numpy(np.int64)])
        durs = np.concatenate([o["dur"].to_numpy(np.int64), m["dur"].to_numpy(np.int64)])
        k_start = blk["ts"].to_numpy(np.int64)
        on_device = np.concatenate([(o["device"] != "cpu").to_numpy(bool),
                                    np.zeros(len(m), bool)])
        return cls(b["start"].to_numpy(np.int64), b["end"].to_numpy(np.int64), starts,
                   starts + durs, np.concatenate([_phase_codes(o), _phase_codes(m)]),
                   np.repeat([True, False], [len(o), len(m)]), on_device, k_start,
                   k_start + blk["dur"].to_numpy(np.int64), _phase_codes(blk))

    def cover(self, sweep: Sweep, mask: np.ndarray,
              minus: np.ndarray | None = None) -> np.ndarray:
        """The segments of ``sweep`` covered by the masked intervals, less the ``minus``
        blocked calls."""
        if not mask.any():
            return np.zeros(len(sweep.length), bool)
        blocked = None if minus is None else (self.k_start[minus], self.k_end[minus])
        return sweep.covered(self.starts[mask], self.ends[mask], blocked)

    def winners(self, sweep: Sweep) -> np.ndarray:
        """Per segment of ``sweep``: the phase code that wins it (the tiers of the module
        docstring, highest first; ``other`` where nothing covers it)."""
        winner = np.full(len(sweep.length), len(PHASES) - 1)  # "other"
        for tier in reversed(range(len(_TIERS))):
            p, src = _TIERS[tier]
            code = PHASES.index(p)
            mine = (self.phase == code) & (self.is_op if src == "op" else ~self.is_op)
            cov = self.cover(sweep, mine, (self.k_phase == code) if src == "op" else None)
            winner[cov] = code
        exposed = self.device_comm_exposed(sweep)
        if exposed is not None:
            winner[exposed] = _COMM_CODE
        return winner

    @property
    def device_comm(self) -> np.ndarray:
        """Which intervals are device communication kernels."""
        return self.on_device & self.is_op & (self.phase == _COMM_CODE)

    def device_comm_exposed(self, sweep: Sweep) -> np.ndarray | None:
        """Per segment: a device comm kernel runs and no device compute kernel does (None on
        a rank without device communication)."""
        if not self.device_comm.any():
            return None
        compute = self.on_device & self.is_op & np.isin(self.phase, _COMPUTE_CODES)
        return self.cover(sweep, self.device_comm) & ~self.cover(sweep, compute)


def _rank_breakdown(rank: int, b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame,
                    blk: pd.DataFrame) -> pd.DataFrame:
    a = _RankArrays.of(b, o, m, blk)
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
    compute = np.isin(a.phase, _COMPUTE_CODES)
    comm_ops = cover((a.phase == _COMM_CODE) & a.is_op)
    compute_ops = cover(compute & a.is_op, np.isin(a.k_phase, _COMPUTE_CODES))
    out["comm_time_ns"] = sweep.total(comm_ops, step_i, n_steps)
    out["comm_overlap_ns"] = sweep.total(comm_ops & compute_ops, step_i, n_steps)
    out["comm_on_device"] = bool(a.device_comm.any())  # then device_overlap's figures
    return out


def device_overlap(b: pd.DataFrame, kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
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
    comm = k["op"].isin(COMM_OPS).to_numpy()
    compute = ~comm  # every other kernel computes, whatever its phase (as HTA)
    c_cov = sweep.covered(ks[comm], ke[comm])
    p_cov = sweep.covered(ks[compute], ke[compute])
    seg_step = sweep.start // width
    return (sweep.total(c_cov, seg_step, n), sweep.total(c_cov & p_cov, seg_step, n))


def phase_at(trace: Trace, rank: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Per instant (rank, ts): the code (index in PHASES) of the phase that the wall-time
    breakdown gives that instant — the same tiers that make the phases sum to the step —
    or -1 when the instant is in no step of that worker rank (servers and schedulers have no
    steps). An instant ``t`` belongs to the segment ``[a, b)`` with ``a <= t < b``."""
    rank = np.asarray(rank, np.int64)
    ts = np.asarray(ts, np.int64)
    out = np.full(len(ts), -1, np.int64)
    if not len(ts):
        return out
    bounds = trace.step_bounds()
    ev = trace.events
    workers = ev["role"] == "worker"
    ops = ev[workers & ev["counted"] & ev["phase"].isin(PRIORITY)]
    markers = ev[workers & (ev["kind"] == "marker") & (ev["device"] == "cpu")
                 & ev["phase"].isin(PRIORITY)]
    worker_ranks = set(ev.loc[workers, "rank"].unique().tolist())
    blocked = blocked_in_comm(ops)
    for r in np.unique(rank):
        b = bounds[bounds["rank"] == r].sort_values("start")
        if r not in worker_ranks or b.empty:
            continue
        sel = np.flatnonzero(rank == r)
        out[sel] = _rank_phase_at(b, ops[ops["rank"] == r], markers[markers["rank"] == r],
                                  blocked[blocked["rank"] == r], ts[sel])
    return out


def _rank_phase_at(b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame, blk: pd.DataFrame,
                   t: np.ndarray) -> np.ndarray:
    """:func:`phase_at` for the instants ``t`` of one rank (its step bounds ``b`` sorted)."""
    a = _RankArrays.of(b, o, m, blk)
    sweep = Sweep(a.starts, a.ends, a.s_start, a.s_end, a.k_start, a.k_end, t)
    winner = a.winners(sweep)
    seg = np.searchsorted(sweep.points, t, side="right") - 1
    in_step = sweep.bins(a.s_start, a.s_end)
    ok = (seg >= 0) & (seg < len(sweep.length))
    out = np.full(len(t), -1, np.int64)
    good = np.flatnonzero(ok)
    good = good[in_step[seg[good]] < len(a.s_start)]
    out[good] = winner[seg[good]]
    return out


def _phase_codes(df: pd.DataFrame) -> np.ndarray:
    """Phase of each event as its index in PHASES (-1 for none)."""
    col = df["phase"]
    if isinstance(col.dtype, pd.CategoricalDtype) and tuple(col.cat.categories) == PHASES:
        return col.cat.codes.to_numpy(np.int64)
    return pd.Categorical(col.astype(object), categories=PHASES).codes.astype(np.int64)


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


def container(inner: pd.DataFrame, outer: pd.DataFrame) -> np.ndarray:
    """Per ``inner`` event: the position in ``outer`` of the event of the same lane (rank,
    pid, tid) that contains it, or -1. Outer events of one lane must not overlap (counted,
    outermost operators do not)."""
    if inner.empty or outer.empty:
        return np.full(len(inner), -1, np.int64)
    cols = [np.concatenate([inner[c].to_numpy(np.int64), outer[c].to_numpy(np.int64)])
            for c in ("rank", "pid", "tid")]
    lane = lane_ids(*cols)
    li, lo = lane[:len(inner)], lane[len(inner):]
    i_ts, o_ts = inner["ts"].to_numpy(np.int64), outer["ts"].to_numpy(np.int64)
    return containing(li, i_ts, i_ts + inner["dur"].to_numpy(np.int64),
                      lo, o_ts, o_ts + outer["dur"].to_numpy(np.int64))
