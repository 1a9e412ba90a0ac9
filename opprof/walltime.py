"""Which phase wins each instant of a step: the tiers of the wall-time breakdown
(:mod:`opprof.analysis.breakdown`'s docstring defines them), the blocked comm calls, and
:func:`phase_at`, the phase of any instant.

In the core because the normalizers place each memory sample in the phase of its instant
when they read it (:mod:`opprof.normalizers.memory_rows`); the breakdown sums the same tiers over
every step.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from opprof.filters import counted, markers, names_where, on_device, on_host, workers
from opprof.intervals import Sweep, containing, lane_ids
from opprof.taxonomy import PHASES
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array

#: The phases that win an instant, highest first (then ``other``).
PRIORITY = ("forward", "backward", "update", "comm", "h2d", "load")
COMPUTE = ("forward", "backward", "update")
#: Highest first: operators, then markers — but a load operator on a thread that holds no
#: forward, backward or update marker (a ``tf.data`` thread prefetching the next batch) only
#: below the markers: the thread that runs the step is past its load then, the input hidden
#: behind it (:mod:`opprof.analysis.breakdown`).
_TIERS = ([(p, "op") for p in PRIORITY] + [(p, "marker") for p in PRIORITY[:-1]]
          + [("load", "background"), ("load", "marker")])
COMPUTE_CODES = [PHASES.index(p) for p in COMPUTE]
COMM_CODE = PHASES.index("comm")


#: A functional collective's wait (DTensor's, hand-written ``funcol``'s), run by the first
#: operator on the collective's result before that operator does anything else (the reader's
#: ``opprof.wait`` is not one: a synchronous call inside an operator may follow its work).
_WAIT_CALL = re.compile(r"::wait_tensor\w*$")


def functional_waits(ev: pd.DataFrame) -> pd.Series:
    """Per event: whether it is a functional collective's wait (:data:`_WAIT_CALL`)."""
    return names_where(ev, lambda name: _WAIT_CALL.search(name) is not None)


#: A functional collective's call that issues it (``_c10d_functional::all_reduce``), not its wait.
_ISSUE_CALL = re.compile(r"^_c10d_functional::(?!wait_tensor)\w+$")


def functional_issues(ev: pd.DataFrame) -> pd.Series:
    """Per event: whether it issues a functional collective (:data:`_ISSUE_CALL`)."""
    return names_where(ev, lambda name: _ISSUE_CALL.match(name) is not None)


def blocked_in_comm(ops: pd.DataFrame, waits: pd.Series) -> pd.DataFrame:
    """Host comm calls issued inside a compute operator on the same thread (DDP's all-reduce
    from a backward hook), with ``phase`` set to that operator's phase: while such a call
    runs, its operator is waiting, not computing (``waits``: :func:`functional_waits` of the
    events, for :func:`blocked_spans`)."""
    host = ops[on_host(ops)]
    return blocked_spans(host[host["phase"] == "comm"],
                         host[host["phase"].isin(COMPUTE)], waits)


def blocked_spans(comm: pd.DataFrame, compute: pd.DataFrame,
                  waits: pd.Series, issues: pd.Series | None = None) -> pd.DataFrame:
    """The rows of ``comm`` (host calls) that lie inside a ``compute`` operator of the same
    lane, with that operator's ``phase`` where ``compute`` has one: the spans in which the
    operator is blocked. A functional collective's wait (``waits``: :func:`functional_waits`
    of the events, by index) blocks its operator from the operator's start: the operator
    consumes the collective's result, so what it does before the wait is its dispatch (on a
    loaded host, also the time its thread was not scheduled: 8 of a TP all-reduce's 8.2 ms in
    one step), not work beside the collective. With ``issues`` (:func:`functional_issues`, by
    index), a call that issues a functional collective blocks its operator to the operator's
    end: what DTensor's ``Redistribute`` does after queuing the all-reduce is that collective's
    own dispatch (0.1–0.5 ms a call), not work beside it — for the hidden share of a collective
    (:mod:`opprof.analysis.collectives`), not the phases."""
    pos = container(comm, compute)
    keep = pos >= 0
    at = pos[keep]
    out = comm[keep].copy()
    if "phase" in compute:
        out["phase"] = compute["phase"].to_numpy()[at]
    if out.empty:
        return out
    wait = waits.reindex(out.index, fill_value=False).to_numpy(bool)
    ts = out["ts"].to_numpy(np.int64)
    end = ts + out["dur"].to_numpy(np.int64)
    start = np.where(wait, compute["ts"].to_numpy(np.int64)[at], ts)  # the operator holds it
    if issues is not None:
        issue = issues.reindex(out.index, fill_value=False).to_numpy(bool)
        op_end = (compute["ts"].to_numpy(np.int64) + compute["dur"].to_numpy(np.int64))[at]
        end = np.where(issue, np.maximum(op_end, end), end)
    out["ts"] = start
    out["dur"] = end - start
    return out


class RankArrays(NamedTuple):
    """One rank's intervals as arrays: its steps, its ops then markers (with their phase and
    which are ops), and its blocked calls."""

    s_start: Array
    s_end: Array
    starts: Array
    ends: Array
    phase: Array
    is_op: Array
    on_device: Array
    k_start: Array
    k_end: Array
    k_phase: Array
    #: load operators on a thread without compute markers (``_TIERS``' ``background``)
    background: Array

    @classmethod
    def of(cls, b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame,
           blk: pd.DataFrame) -> RankArrays:
        starts = np.concatenate([o["ts"].to_numpy(np.int64), m["ts"].to_numpy(np.int64)])
        durs = np.concatenate([o["dur"].to_numpy(np.int64), m["dur"].to_numpy(np.int64)])
        k_start = blk["ts"].to_numpy(np.int64)
        device = np.concatenate([on_device(o).to_numpy(bool), np.zeros(len(m), bool)])
        phase = np.concatenate([phase_codes(o), phase_codes(m)])
        return cls(b["start"].to_numpy(np.int64), b["end"].to_numpy(np.int64), starts,
                   starts + durs, phase, np.repeat([True, False], [len(o), len(m)]), device,
                   k_start, k_start + blk["dur"].to_numpy(np.int64), phase_codes(blk),
                   np.concatenate([background_load(o, m), np.zeros(len(m), bool)]))

    def cover(self, sweep: Sweep, mask: Array,
              minus: Array | None = None) -> Array:
        """The segments of ``sweep`` covered by the masked intervals, less the ``minus``
        blocked calls."""
        if not mask.any():
            return np.zeros(len(sweep.length), bool)
        blocked = None if minus is None else (self.k_start[minus], self.k_end[minus])
        return sweep.covered(self.starts[mask], self.ends[mask], blocked)

    def winners(self, sweep: Sweep) -> Array:
        """Per segment of ``sweep``: the phase code that wins it (the tiers of the module
        docstring, highest first; ``other`` where nothing covers it)."""
        winner = np.full(len(sweep.length), len(PHASES) - 1)  # "other"
        kinds = {"op": self.is_op & ~self.background, "background": self.background,
                 "marker": ~self.is_op}
        for tier in reversed(range(len(_TIERS))):
            p, src = _TIERS[tier]
            code = PHASES.index(p)
            mine = (self.phase == code) & kinds[src]
            cov = self.cover(sweep, mine, (self.k_phase == code) if src != "marker" else None)
            winner[cov] = code
        exposed = self.device_comm_exposed(sweep)
        if exposed is not None:
            winner[exposed] = COMM_CODE
        return winner

    @property
    def device_comm(self) -> Array:
        """Which intervals are device communication kernels."""
        comm: Array = self.on_device & self.is_op & (self.phase == COMM_CODE)
        return comm

    def device_comm_exposed(self, sweep: Sweep) -> Array | None:
        """Per segment: a device comm kernel runs and no device compute kernel does (None on
        a rank without device communication)."""
        if not self.device_comm.any():
            return None
        compute = self.on_device & self.is_op & np.isin(self.phase, COMPUTE_CODES)
        return self.cover(sweep, self.device_comm) & ~self.cover(sweep, compute)


def phase_at(trace: Trace, rank: Array, ts: Array) -> Array:
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
    worker = workers(ev)
    ops = ev[worker & counted(ev) & ev["phase"].isin(PRIORITY)]
    marks = ev[worker & markers(ev) & ev["phase"].isin(PRIORITY)]
    worker_ranks = set(ev.loc[worker, "rank"].unique().tolist())
    blocked = blocked_in_comm(ops, functional_waits(ev))
    for r in np.unique(rank):
        b = bounds[bounds["rank"] == r].sort_values("start")
        if r not in worker_ranks or b.empty:
            continue
        sel = np.flatnonzero(rank == r)
        out[sel] = _rank_phase_at(b, ops[ops["rank"] == r], marks[marks["rank"] == r],
                                  blocked[blocked["rank"] == r], ts[sel])
    return out


def _rank_phase_at(b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame, blk: pd.DataFrame,
                   t: Array) -> Array:
    """:func:`phase_at` for the instants ``t`` of one rank (its step bounds ``b`` sorted)."""
    a = RankArrays.of(b, o, m, blk)
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


def background_load(o: pd.DataFrame, m: pd.DataFrame) -> Array:
    """Per operator of ``o``: a load operator on a host thread (pid, tid) that holds no
    forward, backward or update marker of ``m`` — not the thread that runs the step's
    phases (all False where ``m`` does not say its threads)."""
    load = (phase_codes(o) == PHASES.index("load")) & ~on_device(o).to_numpy(bool)
    if not load.any() or not {"pid", "tid"} <= set(m.columns) or not len(m):
        return np.zeros(len(o), bool)
    m = m[np.isin(phase_codes(m), COMPUTE_CODES)]
    both = [np.concatenate([o[c].to_numpy(np.int64), m[c].to_numpy(np.int64)])
            for c in ("rank", "pid", "tid")]
    lane = lane_ids(*both)
    background: Array = load & ~np.isin(lane[:len(o)], lane[len(o):])
    return background


def phase_codes(df: pd.DataFrame) -> Array:
    """Phase of each event as its index in PHASES (-1 for none)."""
    col = df["phase"]
    if isinstance(col.dtype, pd.CategoricalDtype) and tuple(col.cat.categories) == PHASES:
        return np.asarray(col.cat.codes, np.int64)
    return np.asarray(pd.Categorical(col.astype(object), categories=PHASES).codes, np.int64)


def container(inner: pd.DataFrame, outer: pd.DataFrame) -> Array:
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
