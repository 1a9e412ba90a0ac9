"""`opprof import`: normalize native traces (one per rank, or folders) into one `.trace`."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.loader import load
from opprof.trace import save


@click.command("import")
@click.argument("native", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The .trace file to write.")
def command(native: tuple[Path, ...], output: Path) -> None:
    """Normalize NATIVE traces (files or folders, any supported format) into an opprof trace.

    \b
    Example:
      opprof import ../shared/traces/kineto-gpu/nccl-2rank-rank0.json.gz -o nccl.trace
      opprof import rank0.json rank1.json -o job.trace
    """
    trace = load(list(native))
    save(trace, output)
    ev = trace.events
    click.echo(f"wrote {output}: {len(ev):,} events, {ev['rank'].nunique()} rank(s), "
               f"{len(trace.meta.get('step_bounds', []))} step(s), "
               f"formats {', '.join(trace.meta.get('source_formats', []))}")
