"""Exporters: write a Trace to other tools' formats. Each module offers ``write(trace, path)``."""

from __future__ import annotations

import importlib
from typing import Any

TARGETS = ("perfetto", "chrome", "csv")


def exporter(target: str) -> Any:
    """The exporter module for a --to value."""
    return importlib.import_module(f"opprof.export.{target}")


def lanes(events: Any) -> Any:
    """Events with a ``lane`` number per (rank, pid, tid), for exporters that need tracks."""
    ev = events.copy()
    ev["lane"] = ev.groupby(["rank", "pid", "tid"], sort=True, observed=True).ngroup()
    return ev
