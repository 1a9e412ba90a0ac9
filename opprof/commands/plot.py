"""`opprof plot`: one paper figure (SVG, PNG or PDF) from a bench folder or from traces."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.commands import engine_options
from opprof.errors import ErrorKind, OpprofError

FIGURE_NAMES = ("phases", "ops", "scaling", "memory", "steps", "ranks", "devices",
                "convergence", "threads", "batch", "roofline")


@click.command("plot")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--figure", "name", type=click.Choice(FIGURE_NAMES), default="phases",
              show_default=True,
              help="phases: stacked wall-time phases per run or trace; ops: cross-framework "
                   "operator ratios (bench) or the largest operators side by side; scaling: "
                   "speed-up vs workers, measured and predicted (bench); memory: per run or "
                   "rank; steps: phases of every step (one trace); ranks: rank × step heatmap "
                   "with stragglers, wait vs transfer (one trace); devices: GPU compute/comm/"
                   "memcpy/idle (one trace); convergence: loss and test accuracy against time and "
                   "step (bench or traces recorded with --converge); roofline: each operator's "
                   "intensity and FLOP/s under the machine's ceilings (traces).")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The figure file: .svg, .png or .pdf.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Operators shown by --figure ops.")
@engine_options
def command(inputs: tuple[Path, ...], name: str, output: Path, top: int,
            scheduler: str | None, jobs: int | None) -> None:
    """Draw one figure from a bench folder (written by `opprof bench`) or from traces (each an
    opprof .trace or native traces, normalized on the fly).

    \b
    Example:
      opprof plot bench/ --figure phases -o phases.pdf
      opprof plot bench/ --figure scaling -o scaling.svg
      opprof plot sweep/ --figure threads -o threads.svg     # bench --threads 1,2,4
      opprof plot resnet18-mxnet.trace resnet18-torch.trace --figure ops -o ops.png
      opprof plot ddp.trace --figure ranks -o ranks.svg
      opprof plot llama.json.gz --figure roofline -o roofline.svg
    """
    try:
        from opprof.render import figures
    except ImportError as exc:
        raise OpprofError(f"opprof plot needs matplotlib ({exc}): pip install "
                          "'opprof[plot]' -c constraints.txt") from None
    if output.suffix.lower() not in figures.SUFFIXES:
        raise OpprofError("a figure is written as .svg, .png or .pdf",
                          path=output, kind=ErrorKind.USAGE)
    from opprof.pipeline.plot import PlotOptions, sources

    fig = figures.make(name, sources(PlotOptions(inputs, scheduler, jobs)), top=top)
    figures.save(fig, output)
    click.echo(f"wrote {output}", err=True)
