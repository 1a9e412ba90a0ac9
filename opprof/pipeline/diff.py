"""The diff pipeline: two jobs, each read once, compared phase by phase and operator by
operator (with ``--whatif``, each operator re-simulated at the other run's speed; with
``--fail-above`` / ``--fail-on``, the regression gate of B against A), one immutable
:class:`~opprof.analysis.diff.Diff` that every renderer only draws (:func:`diff`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opprof.pipeline.sources import same_file

if TYPE_CHECKING:
    from opprof.analysis.diff import Diff
    from opprof.analysis.gate import Threshold
    from opprof.flops.peaks import PeakOptions


@dataclass(frozen=True)
class DiffOptions:
    """What `opprof diff` is asked for: runs A (BASE) and B (NEW), whether to re-simulate
    each operator at B's speed, where the per-rank work runs, and the regression gate's
    thresholds as given (``--fail-above X%``, ``--fail-above-ms MS``, ``--fail-on
    TARGET:+X%``) with its significance level."""

    a: Path
    b: Path
    whatif: bool = False
    scheduler: str | None = None
    jobs: int | None = None
    fail_above: str | None = None
    fail_above_ms: float | None = None
    fail_on: tuple[str, ...] = ()
    alpha: float = 0.05
    #: the machine's peak as the user gave it (``--peak-flops`` …; opprof.flops.peaks)
    peak: PeakOptions | None = None

    def thresholds(self) -> list[Threshold]:
        """The gate's thresholds (a bad one: one clear error)."""
        from opprof.analysis.gate import Threshold, parse_amount, parse_fail_on
        from opprof.errors import OpprofError

        out = []
        if self.fail_above is not None:
            t = parse_amount(self.fail_above.strip())
            if t.relative is None:
                raise OpprofError(f"--fail-above {self.fail_above}: give a percentage (5%); "
                                  "--fail-above-ms takes milliseconds")
            out.append(t)
        if self.fail_above_ms is not None:
            out.append(Threshold("step", absolute_ns=self.fail_above_ms * 1e6))
        out.extend(parse_fail_on(spec) for spec in self.fail_on)
        return out


def diff(o: DiffOptions) -> Diff:
    """A compared with B, each read once (the same file given twice: once in all).

    Each side is reported rank by rank (:func:`opprof.job.report`) unless the events
    themselves are needed — the what-if re-simulates A's step, an operator's gate counts its
    time per step — then each side is read whole and its report, what-if context and
    operator times are all made from that one read."""
    from dataclasses import replace

    from opprof.analysis.diff import diff_reports

    thresholds = o.thresholds()
    ta = tb = None
    if o.whatif or any(not _by_report(t) for t in thresholds):
        from opprof.analysis.report import build_report
        from opprof.loader import load

        ta = load(o.a)
        tb = ta if same_file(o.a, o.b) else load(o.b)
        ra = build_report(ta, peak=o.peak)
        rb = ra if tb is ta else build_report(tb, peak=o.peak)
    else:
        from opprof.job import report

        ra = report([o.a], scheduler=o.scheduler, jobs=o.jobs, peak=o.peak)
        rb = ra if same_file(o.a, o.b) else report([o.b], scheduler=o.scheduler, jobs=o.jobs,
                                                   peak=o.peak)
    d = diff_reports(ra, rb, o.a.name, o.b.name)
    if thresholds:
        from opprof.analysis.gate import gate

        d = replace(d, gate=gate(ra, rb, thresholds, o.alpha, ta, tb))
    if o.whatif:
        from opprof.model.whatif import context, op_swaps

        assert ta is not None and tb is not None  # read whole above
        d = replace(d, whatif=op_swaps(context(ta, d.a_label), context(tb, d.b_label)))
    return d


def _by_report(t: Threshold) -> bool:
    """Whether a gate's threshold is checked from the reports (the step, a phase), not the
    events (an operator)."""
    from opprof.taxonomy import PHASES

    return t.target in ("step", *PHASES)
