"""Everything `opprof report` shows, computed once from a Trace."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from opprof.analysis.breakdown import comm_overlap_ratio, phase_summary, step_breakdown
from opprof.analysis.devices import device_breakdown
from opprof.analysis.ops import op_table
from opprof.analysis.ranks import rank_analysis
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
    devices: pd.DataFrame = field(default_factory=pd.DataFrame)
    stragglers: pd.DataFrame = field(default_factory=pd.DataFrame)


def build_report(trace: Trace) -> Report:
    """Analyze a trace for `opprof report`."""
    steps = step_breakdown(trace)
    n = len(steps)
    ranks = rank_analysis(trace, steps)
    return Report(
        meta=trace.meta,
        steps=steps,
        phases=phase_summary(steps),
        ops=op_table(trace, "host", n_steps=n),
        device_ops=op_table(trace, "device", n_steps=n),
        ranks=ranks.ranks,
        comm_overlap=comm_overlap_ratio(steps),
        devices=device_breakdown(trace),
        stragglers=ranks.stragglers,
    )
