"""`opprof diff`: which phases and operators explain the step-time gap between two traces."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.commands import (
    check_output,
    engine_options,
    output_option,
    peak_from,
    peak_options,
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
@peak_options
@engine_options
def command(a: Path, b: Path, whatif: bool, top: int | None, fmt: str, output: Path | None,
            peak_flops: float | None, peak_bandwidth: float | None, peak_file: Path | None,
            scheduler: str | None, jobs: int | None) -> None:
    """Compare trace A with trace B (ratio = A/B), operator by operator.

    \b
    Example:
      opprof diff tf.trace mxnet.trace
      opprof diff tf.trace mxnet.trace --whatif
      opprof diff lenet5-torch.trace resnet18-torch.trace --format json
      opprof diff tf.trace mxnet.trace --format html -o diff.html
    """
    from opprof.analysis.diff import diff_reports
    from opprof.job import report
    from opprof.render import page_renderer

    check_output(fmt, output)
    render = page_renderer(fmt)
    peak = peak_from(peak_flops, peak_bandwidth, peak_file)
    d = diff_reports(report([a], scheduler=scheduler, jobs=jobs, peak=peak),
                     report([b], scheduler=scheduler, jobs=jobs, peak=peak), a.name, b.name)
    if whatif:  # re-simulation needs each side's events, not only their per-rank summaries
        from opprof.loader import load
        from opprof.model.whatif import context, op_swaps

        d.whatif = op_swaps(context(load(a), d.a_label), context(load(b), d.b_label))
    write_output(render.diff(d, top=top if top is not None else 15), fmt, output)
