"""`opprof report`: the phase breakdown and operator tables of one trace."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.analysis.report import build_report
from opprof.commands import echo_output, format_option, top_option
from opprof.loader import load
from opprof.render import renderer


@click.command("report")
@click.argument("trace", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--by", type=click.Choice(["phase", "op", "rank", "step", "device"]),
              default="phase", show_default=True, help="Which view to show.")
@top_option
@format_option
def command(trace: tuple[Path, ...], by: str, top: int | None, fmt: str) -> None:
    """Report a TRACE (an opprof .trace, or native traces/folders, normalized on the fly).

    \b
    Example:
      opprof report resnet18-torch.trace --by op --top 15
      opprof report trace.json.gz --format json > report.json
    """
    rep = build_report(load(list(trace)))
    echo_output(renderer(fmt).report(rep, by=by, top=top), fmt)
