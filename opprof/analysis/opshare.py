"""How much of the step's wall time each canonical operator holds: the part of each phase's
wall time (:func:`step_breakdown`) that an operator's events cover, instants shared by
concurrent operators split evenly among them.

Definition, per rank and step. The wall-time breakdown gives every instant to one phase; an
instant that *operator events* win (tier 1 of the breakdown: forward/backward/update > comm >
h2d > load among counted operator events and device kernels/copies) is split evenly among the
counted events of the winning phase that cover it (a load operator of a thread without
compute markers, as in the breakdown, only where no compute, comm or h2d marker is open);
instants only markers cover (Python
between operators, waits) stay ``unattributed`` in their phase. A compute operator blocked in
a communication call it issued (DDP's hook) holds nothing while it waits, as in the breakdown.
So for each (rank, step, phase)::

    sum over ops of wall_ns(op, phase) + unattributed_ns(phase) == the breakdown's phase ns

and on a serial lane (one operator at a time, as in a single-threaded CPU run) an operator's
wall time is exactly its total time. Scaling an operator by a factor f changes the step by
(f − 1) × its wall time: the what-if's rule for compute operators.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import COMPUTE, PRIORITY, container, step_breakdown
from opprof.filters import counted, markers, on_host, workers
from opprof.taxonomy import PHASES
from opprof.trace import Trace
from opprof.walltime import background_load

COLUMNS = ["rank", "step", "op", "phase", "wall_ns"]


def op_wall(trace: Trace, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, step, op, phase) with the operator's wall ns (float), plus rows
    with op ``(unattributed)`` for marker-only time of each phase."""
    steps = step_breakdown(trace) if steps is None else steps
    ev = trace.events
    ops = ev[workers(ev) & counted(ev) & ev["phase"].isin(PRIORITY)]
    host = ops[on_host(ops)]
    comm = host[host["phase"] == "comm"]
    compute = host[host["phase"].isin(COMPUTE)]
    pos = container(comm, compute)
    blocked = comm[pos >= 0].assign(owner=compute.index.to_numpy()[pos[pos >= 0]])
    marks = ev.loc[workers(ev) & markers(ev) & ev["phase"].isin(PRIORITY),
                   ["rank", "pid", "tid", "ts", "dur", "phase"]]
    frames = []
    for rank, b in steps.groupby("rank", sort=True):
        o = ops[ops["rank"] == rank]
        frames.append(_rank_wall(int(rank), b.sort_values("start"), o,
                                 blocked[blocked["rank"] == rank], marks[marks["rank"] == rank]))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    attributed = out.groupby(["rank", "step", "phase"])["wall_ns"].sum()
    rest = []
    for p in PRIORITY:
        if p not in steps:
            continue
        got = attributed.xs(p, level="phase") if p in attributed.index.get_level_values(
            "phase") else pd.Series(dtype=float)
        key = pd.MultiIndex.from_frame(steps[["rank", "step"]])
        left = steps[p].to_numpy(np.float64) - got.reindex(key).fillna(0.0).to_numpy()
        rest.append(pd.DataFrame({"rank": steps["rank"].to_numpy(),
                                  "step": steps["step"].to_numpy(), "op": "(unattributed)",
                                  "phase": p, "wall_ns": left}))
    rest.append(pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["step"]
                              .to_numpy(), "op": "(unattributed)", "phase": "other",
                              "wall_ns": steps["other"].to_numpy(np.float64)}))
    out = pd.concat([out, *rest], ignore_index=True)
    return out[out["wall_ns"] != 0].reset_index(drop=True)[COLUMNS]


def _rank_wall(rank: int, b: pd.DataFrame, o: pd.DataFrame, blk: pd.DataFrame,
               marks: pd.DataFrame) -> pd.DataFrame:
    s_start = b["start"].to_numpy(np.int64)
    s_end = b["end"].to_numpy(np.int64)
    if o.empty:
        return pd.DataFrame(columns=COLUMNS)
    start = o["ts"].to_numpy(np.int64)
    end = start + o["dur"].to_numpy(np.int64)
    phase = o["phase"].astype(str).to_numpy()
    # a load operator of a thread without compute markers (the breakdown's ``background``)
    # holds only what no compute, comm or h2d marker does
    background = background_load(o, marks)
    held = marks[marks["phase"].astype(str) != "load"]
    h_start = held["ts"].to_numpy(np.int64)
    h_end = h_start + held["dur"].to_numpy(np.int64)
    k_start = blk["ts"].to_numpy(np.int64)
    k_end = k_start + blk["dur"].to_numpy(np.int64)
    owner = o.index.get_indexer(blk["owner"].to_numpy()) if len(blk) else np.zeros(0, np.int64)
    pts = np.unique(np.concatenate([start, end, s_start, s_end, k_start, k_end, h_start,
                                    h_end]))
    seg = np.diff(pts).astype(np.float64)
    idx = np.searchsorted(s_start, pts[:-1], side="right") - 1
    in_step = (idx >= 0) & (pts[:-1] < s_end[np.maximum(idx, 0)])
    seg = np.where(in_step, seg, 0.0)
    a = np.searchsorted(pts, start)
    z = np.searchsorted(pts, end)
    ka = np.searchsorted(pts, k_start)
    kz = np.searchsorted(pts, k_end)
    k_phase = phase[owner] if len(owner) else np.zeros(0, dtype=object)

    counts = {}
    taken = np.zeros(len(seg), bool)
    marked = np.cumsum(np.bincount(np.searchsorted(pts, h_start), minlength=len(pts))
                       - np.bincount(np.searchsorted(pts, h_end), minlength=len(pts)))[:-1] > 0
    for p in PRIORITY:
        m = (phase == p) & ~background
        delta = (np.bincount(a[m], minlength=len(pts)) - np.bincount(z[m], minlength=len(pts)))
        if p in COMPUTE and len(ka):
            mk = (k_phase == p) & (owner >= 0)
            delta = delta - np.bincount(ka[mk], minlength=len(pts)) \
                + np.bincount(kz[mk], minlength=len(pts))
        counts[p] = np.cumsum(delta)[:-1]
    bg = np.cumsum(np.bincount(a[background], minlength=len(pts))
                   - np.bincount(z[background], minlength=len(pts)))[:-1]
    counts["load"] = counts["load"] + np.where(marked, 0, bg)
    # An event may run across a step boundary: cut it into one piece per step it covers.
    sa = np.searchsorted(pts, s_start)
    sz = np.searchsorted(pts, s_end)
    first = np.searchsorted(s_start, start, side="right") - 1
    last = np.searchsorted(s_start, np.maximum(end - 1, start), side="right") - 1
    first = np.maximum(first, 0)
    last = np.maximum(last, first)
    reps = last - first + 1
    ev_i = np.repeat(np.arange(len(o)), reps)
    st_i = first[ev_i] + (np.arange(len(ev_i)) - np.repeat(np.cumsum(reps) - reps, reps))
    pa = np.maximum(a[ev_i], sa[st_i])
    pz = np.minimum(z[ev_i], sz[st_i])
    pz = np.maximum(pz, pa)
    share = np.zeros(len(ev_i), np.float64)
    piece_phase = phase[ev_i]
    # the blocked comm calls, cut the same way (they lie inside their owner)
    if len(ka):
        k_first = np.maximum(np.searchsorted(s_start, k_start, side="right") - 1, 0)
        k_last = np.maximum(np.searchsorted(s_start, np.maximum(k_end - 1, k_start),
                                            side="right") - 1, k_first)
        k_reps = k_last - k_first + 1
        kk = np.repeat(np.arange(len(ka)), k_reps)
        k_st = k_first[kk] + (np.arange(len(kk)) - np.repeat(np.cumsum(k_reps) - k_reps,
                                                            k_reps))
        kpa = np.maximum(ka[kk], sa[k_st])
        kpz = np.maximum(np.minimum(kz[kk], sz[k_st]), kpa)
        # each call's piece: its owner's piece in the same step (keys event × steps +
        # step rise strictly along the pieces: one sorted lookup, no per-call loop)
        n_st = len(s_start)
        keys = ev_i.astype(np.int64) * n_st + st_i
        want = owner[kk].astype(np.int64) * n_st + k_st
        k_piece = np.full(len(want), -1, np.int64)
        if len(keys):
            at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
            k_piece = np.where(keys[at] == want, at, -1).astype(np.int64)
    for p in PRIORITY:
        win = (counts[p] > 0) & ~taken
        taken |= win
        per = np.where(win, seg / np.maximum(counts[p], 1), 0.0)
        cum = np.concatenate([[0.0], np.cumsum(per)])
        m = (piece_phase == p) & ~background[ev_i]
        share[m] = cum[pz[m]] - cum[pa[m]]
        if p == "load":
            cum = np.concatenate([[0.0], np.cumsum(np.where(marked, 0.0, per))])
            m = background[ev_i]
            share[m] = cum[pz[m]] - cum[pa[m]]
        if p in COMPUTE and len(ka):
            mk = (k_phase[kk] == p) & (k_piece >= 0)
            np.subtract.at(share, k_piece[mk], cum[kpz[mk]] - cum[kpa[mk]])
    step_of = b["step"].to_numpy()
    df = pd.DataFrame({"rank": rank, "step": step_of[st_i],
                       "op": o["op"].astype(str).to_numpy()[ev_i], "phase": piece_phase,
                       "wall_ns": share})
    return df.groupby(["rank", "step", "op", "phase"], as_index=False, sort=False)["wall_ns"].sum()


def phase_totals(wall: pd.DataFrame) -> pd.DataFrame:
    """Sum of wall_ns per (rank, step, phase) (for checks against the breakdown)."""
    t = wall.groupby(["rank", "step", "phase"])["wall_ns"].sum().unstack("phase", fill_value=0.0)
    return t.reindex(columns=list(PHASES), fill_value=0.0).reset_index()
