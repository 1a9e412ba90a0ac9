"""`opprof whatif`: re-simulate a trace's step with operators, communication, I/O or the worker
count changed."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.commands import echo_output, format_option
from opprof.commands.model import mode_option, network_option, servers_option


@click.command("whatif")
@click.argument("trace", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--op", "ops", multiple=True, metavar="OP=FACTOR|OP=OTHER.trace",
              help="Scale a canonical operator by FACTOR, or give it its time in another trace "
                   "(any framework). Repeat for several.")
@click.option("--comm", default=None, metavar="hidden|FACTOR",
              help="hidden: all communication behind compute; FACTOR: every collective × it.")
@click.option("--io", type=click.Choice(["hidden"]), default=None,
              help="hidden: loading fully prefetched.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Re-simulate on N workers (as `opprof model`).")
@mode_option
@servers_option
@network_option
@format_option
def command(trace: tuple[Path, ...], ops: tuple[str, ...], comm: str | None, io: str | None,
            workers: int | None, mode: str | None, servers: int | None,
            network: Path | None, fmt: str) -> None:
    """What if an operator, the communication or the I/O of TRACE were faster or slower?
    Prints the new step, its breakdown and the delta of each change.

    \b
    Example:
      opprof whatif resnet18-tf.trace --op convolution_backward=resnet18-mxnet.trace
      opprof whatif resnet18-torch.trace --op batch_norm=0.5 --comm hidden --io hidden
      opprof whatif ddp2.trace --comm 0.5 --workers 8
    """
    from opprof.pipeline.whatif import WhatIfOptions, whatif
    from opprof.render import renderer

    w = whatif(WhatIfOptions(trace, ops, comm, io == "hidden", workers, mode, servers, network))
    echo_output(renderer(fmt).whatif(w), fmt)
