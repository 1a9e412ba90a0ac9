"""`opprof diff`: which phases and operators explain the step-time gap between two traces."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.commands import (
    check_output,
    engine_options,
    output_option,
    report_format_option,
    top_option,
    write_output,
)


@click.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--whatif", is_flag=True,
              help="Also rank, per operator, how much A's step would shrink if that operator "
                   "ran at B's speed (re-simulated: hidden and overlapped time counted once).")
@top_option
@report_format_option
@output_option
@engine_options
def command(a: Path, b: Path, whatif: bool, top: int | None, fmt: str, output: Path | None,
            scheduler: str | None, jobs: int | None) -> None:
    """Compare trace A with trace B (ratio = A/B), operator by operator.

    \b
    Example:
      opprof diff tf.trace mxnet.trace
      opprof diff tf.trace mxnet.trace --whatif
      opprof diff lenet5-torch.trace resnet18-torch.trace --format json
      opprof diff tf.trace mxnet.trace --format html -o diff.html
    """
    from opprof.pipeline.diff import DiffOptions, diff
    from opprof.render import page_renderer

    check_output(fmt, output)
    render = page_renderer(fmt)
    d = diff(DiffOptions(a, b, whatif, scheduler, jobs))
    write_output(render.diff(d, top=top if top is not None else 15), fmt, output)
