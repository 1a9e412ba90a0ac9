"""Exporters: write a Trace to other tools' formats. Each module is an :class:`Exporter`
(``write(trace, path)``, and the file type it writes); :func:`exporter` returns it for a
``--to`` value.

Memory rows (kind ``memory``) are no slices: the trace viewers get them as counter tracks, one
per (rank, series, device), over the time the rank's events span (samples from before and
after the profile — start-up, the profiler writing its trace — are left out of the view).
The CSV export is the table itself, memory rows included."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from opprof.trace import Trace

TARGETS = ("perfetto", "chrome", "csv")


class Exporter(Protocol):
    """One other tool's format."""

    EXTENSION: str

    def write(self, trace: Trace, path: Path) -> Path:
        """Write ``trace`` to ``path`` (atomically); the path written."""
        ...


def exporter(target: str) -> Exporter:
    """The exporter of a ``--to`` value."""
    if target == "perfetto":
        from opprof.export import perfetto

        return perfetto
    if target == "chrome":
        from opprof.export import chrome

        return chrome
    if target == "csv":
        from opprof.export import csv

        return csv
    from opprof.errors import OpprofError

    raise OpprofError(f"--to {target}: choose from {', '.join(TARGETS)}")


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
