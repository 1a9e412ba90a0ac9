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
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np
import pandas as pd

from opprof.events import lane_ids
from opprof.intervals import Sweep, containing
from opprof.taxonomy import PHASES
from opprof.trace import Trace

PRIORITY = ("forward", "backward", "update", "comm", "h2d", "load")
COMPUTE = ("forward", "backward", "update")
_TIERS = [(p, "op") for p in PRIORITY] + [(p, "marker") for p in PRIORITY]
_COMPUTE_CODES = [PHASES.index(p) for p in COMPUTE]


def step_breakdown(trace: Trace) -> pd.DataFrame:
    """One row per (rank, step): start, end, dur_ns, wall ns per phase (summing to dur_ns),
    ``busy_<phase>`` ns, ``comm_overlap_ns``."""
    bounds = trace.step_bounds()
    ev = trace.events
    workers = ev["role"] == "worker"
    # Steps are a worker notion: servers and schedulers serve them and get no rows.
    bounds = bounds[bounds["rank"].isin(ev.loc[workers, "rank"].unique())]
    ops = ev[workers & ev["counted"] & ev["phase"].isin(PRIORITY)]
    markers = ev[workers & (ev["kind"] == "marker") & (ev["device"] == "cpu")
                 & ev["phase"].isin(PRIORITY)]
    blocked = blocked_in_comm(ops)
    rows = []
    for rank, b in bounds.groupby("rank", sort=True):
        b = b.sort_values("start")
        o = ops[ops["rank"] == rank]
        m = markers[markers["rank"] == rank]
        rows.append(_rank_breakdown(rank, b, o, m, blocked[blocked["rank"] == rank]))
    cols = ["rank", "step", "start", "end", "dur_ns", *PHASES,
            *(f"busy_{p}" for p in PRIORITY), "comm_overlap_ns"]
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
    k_start: np.ndarray
    k_end: np.ndarray
    k_phase: np.ndarray

    @classmethod
    def of(cls, b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame,
           blk: pd.DataFrame) -> _RankArrays:
        starts = np.concatenate([o["ts"].to_numpy(np.int64), m["ts"].to_numpy(np.int64)])
        durs = np.concatenate([o["dur"].to_numpy(np.int64), m["dur"].to_numpy(np.int64)])
        k_start = blk["ts"].to_numpy(np.int64)
        return cls(b["start"].to_numpy(np.int64), b["end"].to_numpy(np.int64), starts,
                   starts + durs, np.concatenate([_phase_codes(o), _phase_codes(m)]),
                   np.repeat([True, False], [len(o), len(m)]), k_start,
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
        return winner


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
    comm_ops = cover((a.phase == PHASES.index("comm")) & a.is_op)
    compute_ops = cover(compute & a.is_op, np.isin(a.k_phase, _COMPUTE_CODES))
    out["comm_overlap_ns"] = sweep.total(comm_ops & compute_ops, step_i, n_steps)
    return out


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
    """Share of communication time hidden behind compute, over all steps (None: no comm)."""
    comm = int(steps["busy_comm"].sum()) if len(steps) else 0
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
