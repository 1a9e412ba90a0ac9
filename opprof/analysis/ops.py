"""Operator table: per canonical op and phase, count, total, mean, p50, p95, share of phase."""

from __future__ import annotations

import pandas as pd

from opprof.taxonomy import DEVICE_KINDS
from opprof.trace import Trace


def op_events(trace: Trace, where: str = "host") -> pd.DataFrame:
    """The events operator totals sum: counted, in a step, on worker ranks; ``where`` is
    ``host`` (CPU operators, runtime calls, comm, io) or ``device`` (GPU kernels, copies)."""
    ev = trace.events
    sel = ev["counted"] & (ev["step"] >= 0) & (ev["role"] == "worker")
    on_device = ev["kind"].isin(DEVICE_KINDS) & (ev["device"] != "cpu")
    sel &= on_device if where == "device" else ~on_device
    return ev[sel]


def op_table(trace: Trace, where: str = "host", n_steps: int | None = None) -> pd.DataFrame:
    """One row per (op, phase), largest total first. ``ns_per_step`` divides the total by
    ``n_steps`` (the number of worker (rank, step) pairs; taken from the trace if None)."""
    ev = op_events(trace, where)
    cols = ["op", "phase", "count", "total_ns", "mean_ns", "p50_ns", "p95_ns",
            "share_of_phase", "ns_per_step"]
    if ev.empty:
        return pd.DataFrame(columns=cols)
    if n_steps is None:
        n_steps = steps_count(trace)
    g = ev.groupby(["op", "phase"], observed=True)["dur"]
    t = g.agg(count="size", total_ns="sum", mean_ns="mean")
    q = g.quantile([0.5, 0.95]).unstack()
    t["p50_ns"] = q[0.5]
    t["p95_ns"] = q[0.95]
    t = t.reset_index()
    t["share_of_phase"] = t["total_ns"] / t.groupby("phase", observed=True)["total_ns"].transform(
        "sum")
    t["ns_per_step"] = t["total_ns"] / max(n_steps, 1)
    t["op"] = t["op"].astype(str)
    t["phase"] = t["phase"].astype(str)
    return t.sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)[cols]


def steps_count(trace: Trace) -> int:
    """Number of (worker rank, step) pairs in the trace."""
    b = trace.step_bounds()
    workers = set(trace.ranks)
    return int(b["rank"].isin(workers).sum()) if workers else len(b)


def native_totals(trace: Trace) -> pd.DataFrame:
    """Per native name: count and total duration of every event (for checks against the
    framework's own aggregate)."""
    g = trace.events.groupby("name", observed=True)["dur"]
    return g.agg(count="size", total_ns="sum")
