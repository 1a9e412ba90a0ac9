"""CSV export: the whole events table, one row per event."""

from __future__ import annotations

from pathlib import Path

from opprof.files import write_atomic
from opprof.trace import Trace

#: The suffix of a file this exporter writes.
EXTENSION = ".csv"


def write(trace: Trace, path: Path) -> Path:
    """Write every event as a CSV row (timestamps and durations in ns)."""
    return write_atomic(path, lambda tmp: trace.events.to_csv(tmp, index=False))
