"""The plot pipeline's reading half: what a figure is drawn from — a bench folder's results,
or one report per trace, each trace read once and labelled (:func:`sources`); the figure
itself is the renderer's (:mod:`opprof.render.figures`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opprof.errors import OpprofError
from opprof.pipeline.sources import same_file

if TYPE_CHECKING:
    from opprof.analysis.matrix import Bench
    from opprof.analysis.report import Report


@dataclass(frozen=True)
class PlotOptions:
    """What `opprof plot` draws from: one bench folder, or traces; where per-rank work runs."""

    inputs: tuple[Path, ...]
    scheduler: str | None = None
    jobs: int | None = None


def sources(o: PlotOptions) -> Bench | list[tuple[str, Report]]:
    """The bench's results, or (label, report) per trace (framework and model, with the
    file's name where two would read the same), each read once."""
    from opprof.pipeline.bench import is_bench, read_bench

    benches = [p for p in o.inputs if is_bench(p)]
    if benches:
        if len(o.inputs) > 1:
            raise OpprofError("give one bench folder, or traces, not both")
        return read_bench(benches[0])
    from opprof.analysis.diff import label
    from opprof.job import report

    source = []
    read: list[tuple[Path, Report]] = []  # a trace given twice is read once
    for p in o.inputs:
        rep = next((r for q, r in read if same_file(p, q)), None)
        if rep is None:
            rep = report([p], scheduler=o.scheduler, jobs=o.jobs)
            read.append((p, rep))
        source.append((label(rep, p.name), rep))
    names = [lab for lab, _ in source]
    if len(set(names)) < len(names):  # two traces of the same framework and model
        source = [(f"{lab} ({p.name})", rep)
                  for (lab, rep), p in zip(source, o.inputs, strict=True)]
    return source
