"""The diff pipeline: two jobs, each read once, compared phase by phase and operator by
operator (with ``--whatif``, each operator re-simulated at the other run's speed), one
immutable :class:`~opprof.analysis.diff.Diff` that every renderer only draws (:func:`diff`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opprof.pipeline.sources import same_file

if TYPE_CHECKING:
    from opprof.analysis.diff import Diff


@dataclass(frozen=True)
class DiffOptions:
    """What `opprof diff` is asked for: runs A and B, whether to re-simulate each operator
    at B's speed, and where the per-rank work runs."""

    a: Path
    b: Path
    whatif: bool = False
    scheduler: str | None = None
    jobs: int | None = None


def diff(o: DiffOptions) -> Diff:
    """A compared with B, each read once (the same file given twice: once in all).

    Without ``whatif`` each side is reported rank by rank (:func:`opprof.job.report`); the
    what-if re-simulates A's step, which needs A's and B's events, so then each side is read
    whole and its report and what-if context are both made from that one read."""
    from opprof.analysis.diff import diff_reports, with_whatif

    if not o.whatif:
        from opprof.job import report

        ra = report([o.a], scheduler=o.scheduler, jobs=o.jobs)
        rb = ra if same_file(o.a, o.b) else report([o.b], scheduler=o.scheduler, jobs=o.jobs)
        return diff_reports(ra, rb, o.a.name, o.b.name)
    from opprof.analysis.report import build_report
    from opprof.loader import load
    from opprof.model.whatif import context, op_swaps

    ta = load(o.a)
    tb = ta if same_file(o.a, o.b) else load(o.b)
    ra = build_report(ta)
    d = diff_reports(ra, ra if tb is ta else build_report(tb), o.a.name, o.b.name)
    return with_whatif(d, op_swaps(context(ta, d.a_label), context(tb, d.b_label)))
