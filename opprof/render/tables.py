"""The tables each `--by` view shows, shared by the csv and markdown renderers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report

if TYPE_CHECKING:
    from opprof.advice.base import AdviseResult, Verification


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


def advice_table(result: AdviseResult) -> pd.DataFrame:
    """One row per piece of advice (ranked, then the minor findings): rank, rule, kind,
    saving_ns, saving_share, confidence, finding, action, model, knob; with --verify, the
    applied action's predicted and achieved saving beside it."""
    a = result.advisory
    checked = {(v.rule, v.knob.text): v for v in (result.verification.actions
                                                  if result.verification else [])}
    rows = []
    for i, x in enumerate([*a.advice, *a.minor], 1):
        knob = x.knob.text if x.knob else ""
        v = checked.get((x.rule, knob))
        rows.append({"rank": i, "rule": x.rule, "kind": x.kind, "saving_ns": x.saving_ns,
                     "saving_share": x.saving_share, "confidence": x.confidence,
                     "finding": x.finding, "action": x.action, "model": x.model, "knob": knob,
                     **({"achieved_saving_ns": v.achieved_ns,
                         "achieved_saving_share": v.achieved_share}
                        if result.verification is not None and v is not None else {})})
    cols = ["rank", "rule", "kind", "saving_ns", "saving_share", "confidence", "finding",
            "action", "model", "knob"]
    return pd.DataFrame(rows, columns=[*cols, *(["achieved_saving_ns", "achieved_saving_share"]
                                               if result.verification is not None else [])])


def verification_table(v: Verification) -> pd.DataFrame:
    """Each applied action: predicted and achieved saving (ns and share), the error."""
    return pd.DataFrame([{"rule": r.rule, "knob": r.knob.text,
                          "predicted_saving_ns": r.predicted_ns,
                          "predicted_saving_share": r.predicted_share,
                          "base_step_ns": r.base_step_ns, "new_step_ns": r.new_step_ns,
                          "achieved_saving_ns": r.achieved_ns,
                          "achieved_saving_share": r.achieved_share, "error_share": r.error}
                         for r in v.actions])
