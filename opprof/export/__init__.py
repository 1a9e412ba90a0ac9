"""Exporters: write a Trace to other tools' formats. Each module offers ``write(trace, path)``.

Memory rows (kind ``memory``) are no slices: the trace viewers get them as counter tracks, one
per (rank, series, device), over the time the rank's events span (samples from before and
after the profile — start-up, the profiler writing its trace — are left out of the view).
The CSV export is the table itself, memory rows included."""

from __future__ import annotations

import importlib
from typing import Any

TARGETS = ("perfetto", "chrome", "csv")


def exporter(target: str) -> Any:
    """The exporter module for a --to value."""
    return importlib.import_module(f"opprof.export.{target}")


def split_memory(events: Any) -> tuple[Any, Any]:
    """(the events without memory rows, the memory rows inside their rank's event span, with
    a ``track`` name: ``memory <series> <device>``)."""
    mem = events["kind"] == "memory"
    if not mem.any():
        return events, events.iloc[0:0].assign(track="")
    ev, m = events[~mem], events[mem]
    span = ev.assign(end=ev["ts"] + ev["dur"]).groupby("rank", observed=True).agg(
        lo=("ts", "min"), hi=("end", "max"))
    lo = m["rank"].map(span["lo"])
    hi = m["rank"].map(span["hi"])
    m = m[(m["ts"] >= lo) & (m["ts"] <= hi)]
    track = "memory " + m["name"].astype(str) + " " + m["device"].astype(str)
    return ev, m.assign(track=track.to_numpy())


def lanes(events: Any) -> Any:
    """Events with a ``lane`` number per (rank, pid, tid), for exporters that need tracks."""
    ev = events.copy()
    ev["lane"] = ev.groupby(["rank", "pid", "tid"], sort=True, observed=True).ngroup()
    return ev
