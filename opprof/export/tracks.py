"""The tracks the trace exporters draw: memory rows as counter tracks (one per rank, series and
device, over the time the rank's events span) and a lane number per host thread. Shared by
the exporters; the registry (``opprof.export``) is not imported by them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def split_memory(events: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
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


def lanes(events: pd.DataFrame) -> pd.DataFrame:
    """Events with a ``lane`` number per (rank, pid, tid), for exporters that need tracks."""
    ev = events.copy()
    ev["lane"] = ev.groupby(["rank", "pid", "tid"], sort=True, observed=True).ngroup()
    return ev
