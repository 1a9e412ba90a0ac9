"""Operator table: per canonical op and phase, count, total, mean, p50, p95, share of phase."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.filters import counted, device_work, step_work
from opprof.intervals import Nesting
from opprof.taxonomy import CANONICAL_OPS, PHASES
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array


def op_events(trace: Trace, where: str = "host") -> pd.DataFrame:
    """The events operator totals sum: counted, in a step, on worker ranks; ``where`` is
    ``host`` (CPU operators, runtime calls, comm, io) or ``device`` (GPU kernels, copies)."""
    ev = trace.events
    return ev[op_mask(ev, where)]


def op_mask(ev: pd.DataFrame, where: str = "host") -> pd.Series:
    """Which events :func:`op_events` takes (a mask, so that a caller narrows it further
    before any rows are copied)."""
    sel = counted(ev) & step_work(ev)
    device = device_work(ev)
    return sel & (device if where == "device" else ~device)


OP_COLUMNS = ["op", "phase", "count", "total_ns", "mean_ns", "p50_ns", "p95_ns",
              "share_of_phase", "ns_per_step"]


def own_durations(ev: pd.DataFrame) -> Array:
    """Per counted event: its duration less that of the counted events directly inside it on
    its lane (rank, pid, tid). Communication is counted wherever it is issued (FSDP's
    all-gather in a pre-backward hook that runs inside a ``LayerNorm`` backward node, FSDP's
    copy-in inside that all-gather): the enclosing operator's total leaves it out, so an
    operator table counts each instant of a lane once."""
    dur = ev["dur"].to_numpy(np.int64)
    n = len(ev)
    own: Array = dur.copy()
    if n < 2:
        return own
    _, lane = np.unique(np.stack([ev[c].to_numpy(np.int64) for c in ("rank", "pid", "tid")],
                                 axis=1), axis=0, return_inverse=True)
    ts = ev["ts"].to_numpy(np.int64)
    nesting = Nesting(lane.reshape(-1), ts, ts + dur)
    idx = np.arange(n)
    left = np.ones(n, bool)
    _, outer = nesting.nest(left)  # each event's enclosing event of the level above
    level = outer == idx
    while True:
        left &= ~level
        if not left.any():
            return own
        _, anc = nesting.nest(left)
        level = left & (anc == idx)  # the outermost of those left: one level down
        if not level.any():  # events that overlap only in part, none enclosing any other
            level = left & (anc < 0)  # (a damaged trace): they end the loop
        parent = outer[level]
        np.subtract.at(own, parent[parent >= 0], dur[level][parent >= 0])
        outer = anc


def op_durations(trace: Trace, where: str = "host") -> pd.DataFrame:
    """What an operator table needs from a trace, compactly: one row per (op, phase,
    duration) with ``n``, how many events had it (op and phase as codes into the taxonomy,
    rows sorted); a host operator's duration is its own (:func:`own_durations`). Tables of
    several ranks merge exactly with :func:`merge_durations`."""
    ev = trace.events
    host = where == "host"  # (own durations read the lanes: rank, pid, tid, ts)
    ev = ev.loc[op_mask(ev, where), ["op", "phase", "dur",
                                     *(["rank", "pid", "tid", "ts"] if host else [])]]
    dur = own_durations(ev) if host else ev["dur"].to_numpy(np.int64)
    df = pd.DataFrame({"op": ev["op"].cat.codes.to_numpy(np.int64),
                       "phase": ev["phase"].cat.codes.to_numpy(np.int64),
                       "dur": dur})
    df = df[(df["op"] >= 0) & (df["phase"] >= 0)]
    return merge_durations([df.assign(n=np.int64(1))])


def merge_durations(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Several :func:`op_durations` tables as one (counts of equal durations added)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({c: np.zeros(0, np.int64) for c in ("op", "phase", "dur", "n")})
    df = pd.concat(parts, ignore_index=True)
    out = df.groupby(["op", "phase", "dur"], sort=True)["n"].sum().reset_index()
    return out.astype(np.int64)


def table_from_durations(d: pd.DataFrame, n_steps: int) -> pd.DataFrame:
    """The operator table (OP_COLUMNS) from an :func:`op_durations` table: exact counts,
    totals, means and p50/p95 (linear interpolation between order statistics, as pandas'
    ``quantile``)."""
    if d.empty:
        return pd.DataFrame(columns=OP_COLUMNS)
    key = d["op"].to_numpy() * len(PHASES) + d["phase"].to_numpy()
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    n = d["n"].to_numpy(np.int64)
    dur = d["dur"].to_numpy(np.int64)
    count = np.add.reduceat(n, starts)
    total = np.add.reduceat(dur * n, starts)
    cum = np.cumsum(n)
    before = cum[starts] - n[starts]  # events in earlier groups

    def order_stat(k: Array) -> Array:  # k-th smallest (0-based) in each group
        stat: Array = dur[np.searchsorted(cum, before + k, side="right")].astype(np.float64)
        return stat

    t = pd.DataFrame({"op": np.asarray(CANONICAL_OPS, dtype=object)[d["op"].to_numpy()[starts]],
                      "phase": np.asarray(PHASES, dtype=object)[d["phase"].to_numpy()[starts]],
                      "count": count, "total_ns": total,
                      "mean_ns": total.astype(np.float64) / count})
    for q, col in ((0.5, "p50_ns"), (0.95, "p95_ns")):
        pos = q * (count - 1).astype(np.float64)
        lo = pos.astype(np.int64)
        frac = pos % 1
        val = order_stat(lo)
        nxt = order_stat(np.minimum(lo + 1, count - 1))
        t[col] = np.where(frac == 0.0, val, val + (nxt - val) * frac)
    t["share_of_phase"] = t["total_ns"] / t.groupby("phase")["total_ns"].transform("sum")
    t["ns_per_step"] = t["total_ns"] / max(n_steps, 1)
    return t.sort_values("total_ns", ascending=False, kind="stable").reset_index(
        drop=True)[OP_COLUMNS]


def op_table(trace: Trace, where: str = "host", n_steps: int | None = None) -> pd.DataFrame:
    """One row per (op, phase), largest total first. ``ns_per_step`` divides the total by
    ``n_steps`` (the number of worker (rank, step) pairs; taken from the trace if None)."""
    if n_steps is None:
        n_steps = steps_count(trace)
    return table_from_durations(op_durations(trace, where), n_steps)


def steps_count(trace: Trace) -> int:
    """Number of (worker rank, step) pairs in the trace."""
    b = trace.step_bounds()
    workers = set(trace.ranks)
    return int(b["rank"].isin(workers).sum()) if workers else len(b)


def native_totals(trace: Trace) -> pd.DataFrame:
    """Per native name: count and total duration of every event (for checks against the
    framework's own aggregate); memory rows are samples, not events, and are left out."""
    ev = trace.events
    g = ev[ev["kind"] != "memory"].groupby("name", observed=True)["dur"]
    return g.agg(count="size", total_ns="sum")
