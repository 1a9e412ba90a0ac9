"""The report pipeline: a job read once, rank by rank, everything the report's options ask for
computed from that one read (the critical path too, for ``--by critical`` and the HTML page),
and one immutable :class:`~opprof.analysis.report.Report` that every renderer only draws
(:func:`report`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opprof.analysis.report import Report
    from opprof.preread import Ahead

#: The views (``--by``) and formats whose output shows the critical path.
CRITICAL_VIEWS = frozenset({"critical"})
CRITICAL_FORMATS = frozenset({"html"})


@dataclass(frozen=True)
class ReportOptions:
    """What `opprof report` is asked for: the job, which view in which format, and where the
    per-rank work runs."""

    paths: tuple[Path, ...]
    by: str = "phase"
    fmt: str = "rich"
    device_span: str = "steps"
    scheduler: str | None = None
    jobs: int | None = None

    @property
    def critical(self) -> bool:
        """Whether the output shows the critical path (``--by critical``; the HTML page has
        its section)."""
        return self.by in CRITICAL_VIEWS or self.fmt in CRITICAL_FORMATS


def report(o: ReportOptions, ahead: Ahead | None = None) -> Report:
    """The report of ``o.paths``, each file read once (``ahead``: what the command started
    reading before it imported this, :func:`opprof.readahead.start`)."""
    from opprof.job import report as job_report

    return job_report(list(o.paths), device_span=o.device_span, scheduler=o.scheduler,
                      jobs=o.jobs, critical=o.critical, ahead=ahead)


def damaged_to_say(o: ReportOptions, rep: Report) -> list[dict[str, str]]:
    """The damaged files a folder held that were left out, to say beside the report (none
    for one `.trace`: its import said them)."""
    from opprof.loader import is_opprof_trace

    if len(o.paths) == 1 and is_opprof_trace(o.paths[0]):
        return []
    damaged: list[dict[str, str]] = rep.meta.get("damaged_files", [])
    return damaged
