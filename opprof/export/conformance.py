"""For the type checker only: every exporter :mod:`opprof.export` lists is an
:class:`~opprof.export.Exporter` (mypy checks the assignments below). The registry imports its
exporters by name, so it cannot be checked there; nothing imports this module at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opprof.export import Exporter, chrome, csv, perfetto

    PERFETTO: Exporter = perfetto
    CHROME: Exporter = chrome
    CSV: Exporter = csv
