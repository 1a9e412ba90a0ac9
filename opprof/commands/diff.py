"""`opprof diff`: which phases and operators explain the step-time gap between two traces."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.analysis.diff import diff_reports
from opprof.commands import echo_output, engine_options, format_option, top_option
from opprof.job import report
from opprof.render import renderer


@click.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@top_option
@format_option
@engine_options
def command(a: Path, b: Path, top: int | None, fmt: str, scheduler: str | None,
            jobs: int | None) -> None:
    """Compare trace A with trace B (ratio = A/B), operator by operator.

    \b
    Example:
      opprof diff tf.trace mxnet.trace
      opprof diff lenet5-torch.trace resnet18-torch.trace --format json
    """
    d = diff_reports(report([a], scheduler=scheduler, jobs=jobs),
                     report([b], scheduler=scheduler, jobs=jobs), a.name, b.name)
    echo_output(renderer(fmt).diff(d, top=top if top is not None else 15), fmt)
