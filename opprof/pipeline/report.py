"""The report pipeline: a job read once, everything the report's options ask for computed
from that one read — the critical path for ``--by critical`` and the HTML page, the advice
for the default view and the HTML page — and one immutable :class:`ReportResult` that every
renderer only draws (:func:`report`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opprof.advice.base import Advisory
    from opprof.analysis.report import Report
    from opprof.flops.peaks import PeakOptions
    from opprof.preread import Ahead

#: The views (``--by``) and formats whose output shows the critical path.
CRITICAL_VIEWS = frozenset({"critical"})
CRITICAL_FORMATS = frozenset({"html"})
#: A job of more files than this, or more bytes on disk, gets its advice from `opprof advise`,
#: not inside the report: the advice reads the job whole (its model and the dependency graph
#: across ranks: memory that grows with the ranks), the report rank by rank in flat memory
#: (benchmarks/bench_scale.py --critical: 64 ranks' HTML page 9.6x the plain report's peak
#: with the advice inside).
ADVICE_INLINE_FILES = 8
ADVICE_INLINE_BYTES = 256 << 20


@dataclass(frozen=True)
class ReportOptions:
    """What `opprof report` is asked for: the job, which view in which format, whether the
    advice comes first, and where the per-rank work runs."""

    paths: tuple[Path, ...]
    by: str = "phase"
    fmt: str = "rich"
    device_span: str = "steps"
    scheduler: str | None = None
    jobs: int | None = None
    advice: bool = True
    #: the machine's peak as the user gave it (``--peak-flops`` …; opprof.flops.peaks)
    peak: PeakOptions | None = None

    @property
    def critical(self) -> bool:
        """Whether the output shows the critical path (``--by critical``; the HTML page has
        its section)."""
        return self.by in CRITICAL_VIEWS or self.fmt in CRITICAL_FORMATS

    @property
    def wants_advice(self) -> bool:
        """Whether the output has an advice section (`opprof advise`'s top three): on the
        default view for people and on the HTML page, unless ``--no-advice``."""
        return self.advice and ((self.by == "phase" and self.fmt == "rich")
                                or self.fmt == "html")

    @cached_property
    def too_large(self) -> str | None:
        """Why the job is left to `opprof advise` (:func:`too_large_to_advise`; looked up
        once: the command and the pipeline both ask)."""
        return too_large_to_advise(self.paths) if self.wants_advice else None

    @property
    def advised(self) -> bool:
        """Whether the advice is computed here: wanted, and the job small enough."""
        return self.wants_advice and self.too_large is None

    @property
    def whole(self) -> bool:
        """Whether the job's events are needed whole (the advice reads the model and the
        critical path's graph, which joins the ranks): then it is read whole, once, with
        every event's detail, and reported from that read (the critical path from the
        advice's graph); else rank by rank (the critical path, when asked, walked in the
        worker that reads each rank)."""
        return self.advised


@dataclass(frozen=True)
class ReportResult:
    """What `opprof report` draws: the report and, where asked, the advice on it."""

    report: Report
    advice: Advisory | None = None


def report(o: ReportOptions, ahead: Ahead | None = None) -> ReportResult:
    """The report of ``o.paths``, each file read once (``ahead``: what the command started
    reading before it imported this, :func:`opprof.readahead.start`)."""
    if not o.whole:
        from opprof.job import report as job_report

        rep = job_report(list(o.paths), device_span=o.device_span, scheduler=o.scheduler,
                         jobs=o.jobs, critical=o.critical, peak=o.peak, ahead=ahead)
        why = o.too_large
        if why is None:
            return ReportResult(rep)
        from opprof.advice.base import Advisory

        label = o.paths[0].name if o.paths else ""
        return ReportResult(rep, Advisory(label, 0.0, [], not_checked={"advice": why}))
    return _whole(o, ahead)


def _whole(o: ReportOptions, ahead: Ahead | None) -> ReportResult:
    """The report of a job read whole, with its advice (and critical path): the graph and
    its critical path here, the model's baseline and the report's tables beside them in a
    second process where a core is idle (:mod:`opprof.beside`; the same results either
    way)."""
    from dataclasses import replace

    from opprof import beside
    from opprof.advice import advise
    from opprof.analysis.breakdown import step_breakdown
    from opprof.analysis.critpath import critical_path, graph_of
    from opprof.analysis.report import build_report
    from opprof.loader import load
    from opprof.model.predict import baseline
    from opprof.model.whatif import Context

    trace = load(list(o.paths), ahead)
    label = o.paths[0].name if o.paths else ""
    steps = step_breakdown(trace)
    tables = beside.start(lambda: (baseline(trace, label, steps),
                                   build_report(trace, o.device_span, peak=o.peak,
                                                steps=steps)))
    try:  # the advice's what-if graph is the critical path's too
        graph = graph_of(trace, steps)
        critical = None
        if o.critical:
            g, order = graph or (None, None)
            critical = critical_path(trace, graph=g, order=order)
        base, rep = tables.result()
    finally:
        tables.close()
    if critical is not None:
        rep = replace(rep, critical=critical)
    return ReportResult(rep, advise(trace, rep, label, Context(base, trace, steps, graph)))


def too_large_to_advise(paths: tuple[Path, ...]) -> str | None:
    """Why the report leaves the advice of the job at ``paths`` to `opprof advise` (None: it
    advises): more than :data:`ADVICE_INLINE_FILES` files or :data:`ADVICE_INLINE_BYTES`
    on disk. Only the files' names and sizes are looked at, none is read."""
    from opprof.errors import OpprofError

    try:
        if any(p.is_dir() for p in paths):
            from opprof.normalizers import expand  # (imports pandas: folders only)

            files = [f for f, _ in expand(list(paths))]
        else:  # files stand for themselves (as expand leaves them)
            files = list(paths)
        size = sum(f.stat().st_size for f in files)
    except (OSError, OpprofError):  # the reader says what is wrong with them
        return None
    if len(files) <= ADVICE_INLINE_FILES and size <= ADVICE_INLINE_BYTES:
        return None
    return (f"the job is {len(files):,} files, {size / (1 << 20):,.0f} MiB: its advice reads it "
            "whole, the report rank by rank — run opprof advise on it")


def damaged_to_say(o: ReportOptions, rep: Report) -> list[dict[str, str]]:
    """The damaged files a folder held that were left out, to say beside the report (none
    for one `.trace`: its import said them)."""
    from opprof.loader import is_opprof_trace

    if len(o.paths) == 1 and is_opprof_trace(o.paths[0]):
        return []
    damaged: list[dict[str, str]] = rep.meta.get("damaged_files", [])
    return damaged
