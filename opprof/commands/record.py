"""`opprof record`: train a model under a framework's native profiler, write a `.trace`,
print the report (the work: :mod:`opprof.pipeline.record`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from opprof.collectors.config import RecordConfig
from opprof.commands import config_options, echo_output, format_option, top_option


@click.command("record")
@config_options(RecordConfig)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The .trace to write (default MODEL-FW.trace).")
@top_option
@format_option
def command(output: Path | None, top: int | None, fmt: str, **options: Any) -> None:
    """Train MODEL with framework FW under its native profiler and report it.

    Native traces are kept in OUTPUT's folder as OUTPUT-STEM.native/.

    \b
    Example:
      opprof record --fw torch --model resnet18
      opprof record --fw mxnet --model resnet18 --workers 3 --mode ps-sync
      opprof record --fw torch --model resnet18 --workers 2 --mode fsdp
    """
    from opprof.analysis.report import build_report
    from opprof.pipeline.record import default_output, record
    from opprof.render import renderer

    config = RecordConfig.from_options(options, command=shlex.join(["opprof", *sys.argv[1:]]))
    path = output or default_output(config)
    with _progress() as progress:
        tasks: dict[str, TaskID] = {}

        def report_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(f"{config.fw} {config.model}: {stage}",
                                                 total=total)
            progress.update(tasks[stage], completed=done, total=total)

        trace = record(config, path, report_progress)
    click.echo(f"wrote {path} ({len(trace.events):,} events; native traces in "
               f"{trace.meta['native_dir']})", err=True)
    echo_output(renderer(fmt).report(build_report(trace), by="phase", top=top), fmt)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)
