"""`opprof report`: the phase breakdown and operator tables of one trace."""

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
    warn_damaged,
    warn_read,
    write_output,
)
from opprof.render import page_renderer


@click.command("report")
@click.argument("trace", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--by", type=click.Choice(["phase", "op", "rank", "step", "device", "memory",
                                         "comm", "critical", "pipeline", "experts",
                                         "roofline"]),
              default="phase", show_default=True,
              help="Which view to show (comm: per collective, bytes and bus bandwidth; "
                   "critical: what bound each step, from its dependency graph; pipeline: per "
                   "stage, micro-batches and the bubble; experts: all-to-all bytes per peer; "
                   "roofline: FLOPs, bytes, intensity and what bound each operator).")
@top_option
@report_format_option
@output_option
@click.option("--device-span", type=click.Choice(["steps", "trace"]), default="steps",
              show_default=True,
              help="--by device over the complete profiled steps (work launched before the "
                   "last step began, as Holistic Trace Analysis) or the whole trace.")
@click.option("--advice/--no-advice", default=True, show_default=True,
              help="The advice section (`opprof advise`'s top three) first, on the default "
                   "view and the HTML page.")
@peak_options
@engine_options
def command(trace: tuple[Path, ...], by: str, top: int | None, fmt: str, output: Path | None,
            device_span: str, advice: bool, peak_flops: float | None,
            peak_bandwidth: float | None, peak_file: Path | None, scheduler: str | None,
            jobs: int | None) -> None:
    """Report a TRACE (an opprof .trace, or native traces/folders, normalized on the fly).

    \b
    Example:
      opprof report resnet18-torch.trace --by op --top 15
      opprof report resnet18-torch.trace --by memory
      opprof report rank*.pt.trace.json.gz --by comm
      opprof report rank*.pt.trace.json.gz --by critical
      opprof report pp.trace --by pipeline
      opprof report trace.json.gz --format json > report.json
      opprof report rank*.json.gz --by rank --scheduler tcp://10.0.0.1:8786
      opprof report resnet18-torch.trace --format html -o resnet18.html
      opprof report llama.pt.trace.json.gz --by roofline --peak-flops 989T
    """
    check_output(fmt, output)
    from opprof import readahead
    from opprof.pipeline.report import ReportOptions

    options = ReportOptions(trace, by, fmt, device_span, scheduler, jobs, advice,
                            peak_from(peak_flops, peak_bandwidth, peak_file))
    # the one file read ahead (a second process, or its gzip text inflating on a thread)
    # while this process imports pandas and the analyses below; the handle goes to the reader
    ahead = readahead.start(trace, detail=options.whole)
    from opprof.pipeline.report import damaged_to_say, report

    render = page_renderer(fmt)
    result = report(options, ahead)
    rep = result.report
    warn_damaged(damaged_to_say(options, rep))
    warn_read(rep.meta)
    write_output(render.report(rep, by=by, top=top, advice=result.advice), fmt, output)
