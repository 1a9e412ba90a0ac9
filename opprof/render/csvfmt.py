"""CSV output: the table of the chosen `--by` view."""

from __future__ import annotations

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.render.tables import diff_table, report_table


def report(rep: Report, by: str = "phase", top: int | None = None) -> str:
    """One CSV table."""
    return report_table(rep, by, top).to_csv(index=False)


def diff(d: Diff, top: int | None = None) -> str:
    """Phases and ops of the diff as one CSV table."""
    return diff_table(d, top).to_csv(index=False)
