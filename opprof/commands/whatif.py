"""`opprof whatif`: re-simulate a trace's step with operators, communication, I/O or the worker
count changed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from opprof.model.whatif import Context

from opprof.commands import echo_output, format_option
from opprof.commands.model import mode_option, network_option, servers_option
from opprof.errors import OpprofError


def parse_op(spec: str, others: dict[str, Context]) -> tuple[str, float | Context, str]:
    """``OP=FACTOR`` or ``OP=OTHER.trace`` → (op, factor or the other trace, its label)."""
    from opprof.loader import load
    from opprof.model.whatif import context

    op, sep, value = spec.partition("=")
    if not sep or not op.strip() or not value.strip():
        raise OpprofError(f"--op {spec}: give OP=FACTOR or OP=OTHER.trace")
    op, value = op.strip(), value.strip()
    try:
        return op, float(value), value
    except ValueError:
        pass
    path = Path(value)
    if not path.exists():
        raise OpprofError(f"--op {spec}: {value} is neither a number nor an existing trace")
    if value not in others:
        others[value] = context(load(path), path.name)
    return op, others[value], path.name


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
    from opprof.loader import load
    from opprof.model.whatif import context, whatif
    from opprof.pipeline.calibrate import read_network
    from opprof.render import renderer

    comm_value: str | float | None = None
    if comm is not None:
        if comm == "hidden":
            comm_value = "hidden"
        else:
            try:
                comm_value = float(comm)
            except ValueError:
                raise OpprofError(f"--comm {comm}: give hidden or a factor") from None
            if comm_value < 0:
                raise OpprofError(f"--comm {comm}: the factor must be ≥ 0")
    net = read_network(network)
    ctx = context(load(list(trace)), trace[0].name)
    others: dict[str, Context] = {}
    changes: dict[str, float | Context] = {}
    labels: dict[str, str] = {}
    for spec in ops:
        op, value, label = parse_op(spec, others)
        changes[op] = value
        labels[op] = label
    w = whatif(ctx, changes, comm_value, io == "hidden", workers, mode, servers, net, labels)
    echo_output(renderer(fmt).whatif(w), fmt)
