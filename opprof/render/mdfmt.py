"""Markdown output: a heading, the chosen table, and for diffs the summary sentence."""

from __future__ import annotations

import pandas as pd

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.render.console import partial_lines, quality_lines
from opprof.render.tables import diff_table, report_table


def md_table(df: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (no extra dependency)."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            if v != v:
                return ""
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
        if v is None:
            return ""
        return str(v)

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def report(rep: Report, by: str = "phase", top: int | None = None) -> str:
    """The chosen view as markdown."""
    title = " ".join(str(rep.meta.get(k, "")) for k in ("framework", "model")).strip()
    notes = "".join(f"> {line}\n\n" for line in quality_lines(rep.noise)
                    + partial_lines(rep.meta))
    return (f"## opprof report {title} — by {by}\n\n{notes}"
            f"{md_table(report_table(rep, by, top))}\n")


def diff(d: Diff, top: int | None = None) -> str:
    """The diff as markdown."""
    notes = "".join(f"> {side}: {line}\n\n" for side, noise in (("A", d.a_noise),
                                                                  ("B", d.b_noise))
                    for line in quality_lines(noise))
    return (f"## opprof diff: {d.a_label} vs {d.b_label}\n\n{d.summary}\n\n{notes}"
            f"{md_table(diff_table(d, top))}\n")
