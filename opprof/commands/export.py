"""`opprof export`: write a trace for other tools (Perfetto UI, chrome://tracing, CSV)."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.export import TARGETS


@click.command("export")
@click.argument("trace", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--to", "target", type=click.Choice(TARGETS), required=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True)
def command(trace: tuple[Path, ...], target: str, output: Path) -> None:
    """Export a TRACE (opprof .trace or native traces) to another tool's format.

    \b
    Example:
      opprof export resnet18-torch.trace --to perfetto -o resnet18.pftrace
      opprof export resnet18-torch.trace --to csv -o events.csv
    """
    from opprof.pipeline.export import ExportOptions, export

    out = export(ExportOptions(trace, target, output))
    click.echo(f"wrote {out.path} ({out.events:,} events, {out.target})")
