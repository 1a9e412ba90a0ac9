"""`opprof import`: normalize native traces (one per rank, or folders) into one `.trace`, or
merge the `.trace` files of one job's hosts (the work: :mod:`opprof.pipeline.imports`)."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.commands import engine_options, warn_damaged, warn_read


@click.command("import")
@click.argument("native", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The .trace file to write.")
@engine_options
def command(native: tuple[Path, ...], output: Path, scheduler: str | None,
            jobs: int | None) -> None:
    """Normalize NATIVE traces (files or folders, any supported format) into an opprof trace,
    or merge the `.trace` files of one job's hosts (ranks kept, one clock).

    \b
    Example:
      opprof import examples/traces/nccl-2rank-rank0.json.gz -o nccl.trace
      opprof import rank0.json rank1.json -o job.trace
      opprof import node0.trace node1.trace -o job.trace
      opprof import traces/ -o job.trace --scheduler tcp://10.0.0.1:8786
    """
    from opprof.pipeline.imports import import_

    done = import_(list(native), output, scheduler=scheduler, jobs=jobs)
    warn_damaged(done.damaged)
    warn_read({"read_warnings": done.read_warnings})
    click.echo(f"wrote {output}: {done.events:,} events, {done.ranks} rank(s), "
               f"{done.steps} step(s), formats {', '.join(done.formats)}")
