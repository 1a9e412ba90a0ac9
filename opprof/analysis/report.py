"""Everything `opprof report` shows, computed once from a Trace."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from opprof.analysis.breakdown import comm_overlap_ratio, phase_summary, step_breakdown
from opprof.analysis.ops import op_table
from opprof.taxonomy import PHASES
from opprof.trace import Trace


@dataclass
class Report:
    """The analysis of one trace: per-step breakdown, phase summary, operator tables."""

    meta: dict
    steps: pd.DataFrame
    phases: pd.DataFrame
    ops: pd.DataFrame
    device_ops: pd.DataFrame
    ranks: pd.DataFrame
    comm_overlap: float | None


def rank_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank: steps, mean step time and mean wall ns per phase."""
    if steps.empty:
        return pd.DataFrame(columns=["rank", "steps", "dur_ns", *PHASES])
    g = steps.groupby("rank")
    out = g[["dur_ns", *PHASES]].mean()
    out.insert(0, "steps", g.size())
    return out.reset_index()


def build_report(trace: Trace) -> Report:
    """Analyze a trace for `opprof report`."""
    steps = step_breakdown(trace)
    n = len(steps)
    return Report(
        meta=trace.meta,
        steps=steps,
        phases=phase_summary(steps),
        ops=op_table(trace, "host", n_steps=n),
        device_ops=op_table(trace, "device", n_steps=n),
        ranks=rank_table(steps),
        comm_overlap=comm_overlap_ratio(steps),
    )
