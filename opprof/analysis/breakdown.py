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

import numpy as np
import pandas as pd

from opprof.taxonomy import PHASES
from opprof.trace import Trace

PRIORITY = ("forward", "backward", "update", "comm", "h2d", "load")
COMPUTE = ("forward", "backward", "update")
_TIERS = [(p, "op") for p in PRIORITY] + [(p, "marker") for p in PRIORITY]


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


def _rank_breakdown(rank: int, b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame,
                    blk: pd.DataFrame) -> pd.DataFrame:
    s_start = b["start"].to_numpy(np.int64)
    s_end = b["end"].to_numpy(np.int64)
    starts = np.concatenate([o["ts"].to_numpy(np.int64), m["ts"].to_numpy(np.int64)])
    ends = starts + np.concatenate([o["dur"].to_numpy(np.int64), m["dur"].to_numpy(np.int64)])
    phase = np.concatenate([o["phase"].astype(str).to_numpy(), m["phase"].astype(str).to_numpy()])
    source = np.repeat(["op", "marker"], [len(o), len(m)])

    pts = np.unique(np.concatenate([starts, ends, s_start, s_end]))
    seg_len = np.diff(pts)
    seg_start = pts[:-1]
    idx = np.searchsorted(s_start, seg_start, side="right") - 1
    in_step = (idx >= 0) & (seg_start < s_end[np.maximum(idx, 0)])

    k_start = blk["ts"].to_numpy(np.int64)
    k_end = k_start + blk["dur"].to_numpy(np.int64)
    k_phase = blk["phase"].astype(str).to_numpy()

    def cover(mask: np.ndarray, minus: np.ndarray | None = None) -> np.ndarray:
        """Segments covered by the masked intervals, less the ``minus`` blocked calls."""
        if not mask.any():
            return np.zeros(len(seg_len), bool)
        delta = (np.bincount(np.searchsorted(pts, starts[mask]), minlength=len(pts))
                 - np.bincount(np.searchsorted(pts, ends[mask]), minlength=len(pts)))
        if minus is not None and minus.any():
            delta -= np.bincount(np.searchsorted(pts, k_start[minus]), minlength=len(pts))
            delta += np.bincount(np.searchsorted(pts, k_end[minus]), minlength=len(pts))
        return np.cumsum(delta)[:-1] > 0

    winner = np.full(len(seg_len), len(PHASES) - 1)  # "other"
    for tier in reversed(range(len(_TIERS))):
        p, src = _TIERS[tier]
        cov = cover((phase == p) & (source == src), (k_phase == p) if src == "op" else None)
        winner[cov] = PHASES.index(p)
    n_steps = len(b)
    step_i = np.where(in_step, idx, n_steps)
    wall = np.bincount(step_i * len(PHASES) + winner, weights=seg_len,
                       minlength=(n_steps + 1) * len(PHASES))
    wall = np.rint(wall).astype(np.int64).reshape(n_steps + 1, len(PHASES))[:n_steps]

    out = pd.DataFrame({"rank": rank, "step": b["step"].to_numpy(), "start": s_start,
                        "end": s_end, "dur_ns": s_end - s_start})
    for j, p in enumerate(PHASES):
        out[p] = wall[:, j]
    covered = {}
    for p in PRIORITY:
        covered[p] = cover(phase == p)
        out[f"busy_{p}"] = _per_step(covered[p], seg_len, step_i, n_steps)
    comm_ops = cover((phase == "comm") & (source == "op"))
    compute_ops = cover(np.isin(phase, COMPUTE) & (source == "op"), np.isin(k_phase, COMPUTE))
    out["comm_overlap_ns"] = _per_step(comm_ops & compute_ops, seg_len, step_i, n_steps)
    return out


def _per_step(mask: np.ndarray, seg_len: np.ndarray, step_i: np.ndarray, n: int) -> np.ndarray:
    tot = np.bincount(step_i[mask], weights=seg_len[mask], minlength=n + 1)[:n]
    return np.rint(tot).astype(np.int64)


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
    lanes = pd.concat([inner[["rank", "pid", "tid"]], outer[["rank", "pid", "tid"]]])
    lane_id = lanes.groupby(["rank", "pid", "tid"], sort=False).ngroup().to_numpy()
    li, lo = lane_id[:len(inner)], lane_id[len(inner):]
    i_ts, o_ts = inner["ts"].to_numpy(np.int64), outer["ts"].to_numpy(np.int64)
    i_end = i_ts + inner["dur"].to_numpy(np.int64)
    o_end = o_ts + outer["dur"].to_numpy(np.int64)
    t0 = min(i_ts.min(), o_ts.min())
    width = int(max(i_end.max(), o_end.max()) - t0) + 2
    ko = lo.astype(np.int64) * width + (o_ts - t0)
    order = np.argsort(ko, kind="stable")
    pos = np.searchsorted(ko[order], li.astype(np.int64) * width + (i_ts - t0),
                          side="right") - 1
    cand = order[np.maximum(pos, 0)]
    inside = (pos >= 0) & (lo[cand] == li) & (o_end[cand] >= i_end)
    return np.where(inside, cand, -1)
