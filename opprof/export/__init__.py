"""Exporters: write a Trace to other tools' formats. Each module is an :class:`Exporter`
(``write(trace, path)``, and the file type it writes); :func:`exporter` returns it for a
``--to`` value: this registry names the modules in a table (:data:`MODULES`) and imports
the one asked for by name; the exporters share :mod:`opprof.export.tracks`, never this module
(``opprof.export.conformance`` has mypy check each against :class:`Exporter`).

Memory rows (kind ``memory``) are no slices: the trace viewers get them as counter tracks, one
per (rank, series, device), over the time the rank's events span (samples from before and
after the profile — start-up, the profiler writing its trace — are left out of the view).
The CSV export is the table itself, memory rows included."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from opprof.trace import Trace

#: ``--to`` → the module that writes it.
MODULES = {"perfetto": "opprof.export.perfetto", "chrome": "opprof.export.chrome",
           "csv": "opprof.export.csv"}
TARGETS = tuple(MODULES)


class Exporter(Protocol):
    """One other tool's format."""

    EXTENSION: str

    def write(self, trace: Trace, path: Path) -> Path:
        """Write ``trace`` to ``path`` (atomically); the path written."""
        ...


def exporter(target: str) -> Exporter:
    """The exporter of a ``--to`` value."""
    if target not in MODULES:
        from opprof.errors import OpprofError

        raise OpprofError(f"--to {target}: choose from {', '.join(TARGETS)}")
    return cast(Exporter, importlib.import_module(MODULES[target]))
