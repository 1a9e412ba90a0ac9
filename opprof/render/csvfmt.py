"""CSV output: the table of the chosen `--by` view."""

from __future__ import annotations

import pandas as pd

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.render.tables import diff_table, report_table


def report(rep: Report, by: str = "phase", top: int | None = None) -> str:
    """One CSV table."""
    return report_table(rep, by, top).to_csv(index=False)


def diff(d: Diff, top: int | None = None) -> str:
    """Phases, ops and memory of the diff as one CSV table (``level`` phase / op / memory;
    times in the ``*_ns`` columns, memory in the ``*_bytes`` ones)."""
    table = diff_table(d, top)
    if len(d.memory):
        mem = d.memory.rename(columns={"metric": "name"}).assign(level="memory")
        table = pd.concat([table, mem], ignore_index=True)
    return table.to_csv(index=False)
