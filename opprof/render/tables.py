"""The tables each `--by` view shows, shared by the csv and markdown renderers."""

from __future__ import annotations

import pandas as pd

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report


def report_table(rep: Report, by: str, top: int | None) -> pd.DataFrame:
    """The one table a `--by` view exports."""
    if by == "op":
        return rep.ops if top is None else rep.ops.head(top)
    if by == "step":
        return rep.steps.drop(columns=["start", "end"])
    if by == "rank":
        return rep.ranks
    if by == "device":
        return rep.devices
    if by == "memory":
        return rep.memory.ranks
    if by == "comm":
        return rep.collectives
    if by == "roofline":
        from opprof.render.efficiency import roofline_table

        return roofline_table(rep, top)
    if by == "critical":  # the bound-by parts in ns, named so
        from opprof.analysis.critpath import BOUND_BY

        return rep.critical.rename(columns={k: f"{k}_ns" for k in BOUND_BY})
    return rep.phases.reset_index()


def diff_table(d: Diff, top: int | None) -> pd.DataFrame:
    """Phases then ops of a diff in one table, with a ``level`` column."""
    ph = d.phases.rename(columns={"phase": "name"}).assign(level="phase")
    ops = (d.ops if top is None else d.ops.head(top)).rename(columns={"op": "name"})
    ops = ops.assign(level="op")
    cols = ["level", "name", "a_ns_per_step", "b_ns_per_step", "ratio", "delta_ns",
            "share_of_gap"]
    return pd.concat([ph, ops], ignore_index=True)[cols]


def diff_memory_table(d: Diff) -> pd.DataFrame:
    """The memory of a diff (one row per metric: A and B bytes, ratio, delta)."""
    return d.memory
