"""The export pipeline: a job read once and written in another tool's format
(:func:`export`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ExportOptions:
    """What `opprof export` is asked for: the job, the target format, the file to write."""

    paths: tuple[Path, ...]
    target: str
    output: Path


@dataclass(frozen=True)
class Exported:
    """What `opprof export` wrote."""

    path: Path
    events: int
    target: str


def export(o: ExportOptions) -> Exported:
    """Read the job once and write it with the target's exporter."""
    from opprof.export import exporter
    from opprof.loader import load

    tr = load(list(o.paths))
    exporter(o.target).write(tr, o.output)
    return Exported(o.output, len(tr.events), o.target)
