"""`opprof diff`: which phases and operators explain the step-time gap between two traces."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.analysis.diff import diff
from opprof.commands import echo_output, format_option, top_option
from opprof.loader import load
from opprof.render import renderer


@click.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--whatif", is_flag=True,
              help="Also rank, per operator, how much A's step would shrink if that operator "
                   "ran at B's speed (re-simulated: hidden and overlapped time counted once).")
@top_option
@format_option
def command(a: Path, b: Path, whatif: bool, top: int | None, fmt: str) -> None:
    """Compare trace A with trace B (ratio = A/B), operator by operator.

    \b
    Example:
      opprof diff tf.trace mxnet.trace
      opprof diff tf.trace mxnet.trace --whatif
      opprof diff lenet5-torch.trace resnet18-torch.trace --format json
    """
    ta, tb = load(a), load(b)
    d = diff(ta, tb, a.name, b.name)
    if whatif:
        from opprof.analysis.whatif import context, op_swaps

        d.whatif = op_swaps(context(ta, d.a_label), context(tb, d.b_label))
    echo_output(renderer(fmt).diff(d, top=top if top is not None else 15), fmt)
