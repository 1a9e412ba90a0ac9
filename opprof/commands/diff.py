"""`opprof diff`: which phases and operators explain the step-time gap between two traces."""

from __future__ import annotations

import sys
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
@click.option("--fail-above", metavar="X%", default=None,
              help="Regression gate: exit 1 when B's step (its unprofiled steps) is slower "
                   "than A's by more than X% and beyond both runs' noise (a one-sided "
                   "Mann-Whitney U test at --alpha); 0 otherwise.")
@click.option("--fail-above-ms", metavar="MS", type=click.FloatRange(min=0), default=None,
              help="Regression gate: the same with a threshold in milliseconds per step.")
@click.option("--fail-on", "fail_on", multiple=True, metavar="TARGET:+X%",
              help="Regression gate on a phase or a canonical operator, per profiled step "
                   "(comm:+10%, convolution_backward:+20%, update:+2ms). Repeat for several.")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.05, show_default=True,
              help="The gate's significance level: a slowdown must be this unlikely to come "
                   "from the runs' noise.")
@top_option
@report_format_option
@output_option
@peak_options
@engine_options
def command(a: Path, b: Path, whatif: bool, fail_above: str | None,
            fail_above_ms: float | None, fail_on: tuple[str, ...], alpha: float,
            top: int | None, fmt: str, output: Path | None, peak_flops: float | None,
            peak_bandwidth: float | None, peak_file: Path | None, scheduler: str | None,
            jobs: int | None) -> None:
    """Compare trace A with trace B (ratio = A/B), operator by operator. With --fail-above
    (or --fail-above-ms, --fail-on) a regression gate of B (NEW) against A (BASE): exit 1
    when B is slower beyond the threshold and the noise, 0 when not, 2 on bad input.

    \b
    Example:
      opprof diff tf.trace mxnet.trace
      opprof diff tf.trace mxnet.trace --whatif
      opprof diff lenet5-torch.trace resnet18-torch.trace --format json
      opprof diff tf.trace mxnet.trace --format html -o diff.html
      opprof diff base.trace new.trace --fail-above 5%
      opprof diff base.trace new.trace --fail-above 5% --fail-on comm:+10%
    """
    from opprof.pipeline.diff import DiffOptions, diff
    from opprof.render import page_renderer

    check_output(fmt, output)
    options = DiffOptions(a, b, whatif, scheduler, jobs, fail_above, fail_above_ms, fail_on,
                          alpha, peak_from(peak_flops, peak_bandwidth, peak_file))
    options.thresholds()  # a bad threshold: one clear error before anything is read
    render = page_renderer(fmt)
    d = diff(options)
    write_output(render.diff(d, top=top if top is not None else 15), fmt, output)
    if d.gate is not None:
        if fmt != "rich" or output is not None:  # the verdict where CI logs show it
            from opprof.render.console import gate_line

            click.echo(gate_line(d.gate), err=True)
        if d.gate.verdict == "fail":
            sys.exit(1)
