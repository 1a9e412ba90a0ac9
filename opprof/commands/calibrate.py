"""`opprof calibrate`: measure the gradient collective on this host (or cluster) over message
sizes and save its α–β fit as a network file for `opprof model` and `opprof whatif` (the
work: :mod:`opprof.pipeline.calibrate`); with ``--peak``, this CPU's peak FLOP/s and memory
bandwidth per thread count, the peak a CPU trace's MFU is measured against
(:mod:`opprof.pipeline.peak`)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from opprof.commands import echo_output, format_option
from opprof.kinds import FRAMEWORKS, Mode

SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...]:
    """``4K,1M,64M`` → bytes (K, M, G are powers of 1024)."""
    from opprof.collectors.netbench import DEFAULT_SIZES

    if value is None:
        return DEFAULT_SIZES
    out = []
    for item in (v.strip().upper() for v in value.split(",") if v.strip()):
        scale = SUFFIXES.get(item[-1], 1)
        try:
            n = int(float(item[:-1] if item[-1] in SUFFIXES else item) * scale)
        except ValueError:
            raise click.BadParameter(f"{item!r}: sizes like 4K, 1M, 64M") from None
        if n < 4:
            raise click.BadParameter(f"{item!r}: at least 4 bytes (one float32)")
        out.append(n)
    if not out:
        raise click.BadParameter("give at least one size")
    return tuple(sorted(set(out)))


@click.command("calibrate")
@click.option("--peak", is_flag=True,
              help="Measure this CPU's peak instead: a GEMM's FLOP/s and a memory-bandwidth "
                   "loop's bytes/s at 1, 2, 4 … threads (--threads: only that count), kept "
                   "where `opprof report` finds it (or -o FILE, then --peak-file FILE).")
@click.option("--fw", type=click.Choice(FRAMEWORKS), default=None,
              help="Whose collective: torch (gloo all_reduce), tf (CollectiveReduce, ring), "
                   "mxnet (kvstore push/pull).")
@click.option("--workers", type=click.IntRange(min=1), default=None)
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parameter servers (mxnet).")
@click.option("--mode", type=click.Choice([Mode.ALLREDUCE.value, Mode.FSDP.value]),
              default=Mode.ALLREDUCE.value,
              show_default=True,
              help="fsdp (torch): FSDP's all-gather and reduce-scatter (each its own α–β), "
                   "with FSDP's copies, after compute as in training, instead of DDP's "
                   "all-reduce.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads per worker (default: the host's CPUs split among the processes, "
                   "as `opprof record` does).")
@click.option("--sizes", callback=parse_sizes, default=None,
              help="Message sizes, comma-separated (default 4K,16K,…,64M).")
@click.option("--units", default=None, metavar="MODEL|TRACE",
              help="--mode fsdp: time the FSDP units of a built-in model (resnet18, …, as "
                   "`record --mode fsdp` shards it) or of a recorded .trace, instead of --sizes.")
@click.option("--model", default=None, metavar="MODEL|TRACE",
              help="Co-location: the built-in model (or a recorded .trace's model and batch) "
                   "whose training step is timed on one worker alone and on 2 … N workers at "
                   "once (default lenet5; give the model you train).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Co-location: the per-worker batch (default 32, or the .trace's).")
@click.option("--colocation-rounds", type=click.IntRange(min=0), default=8, show_default=True,
              help="Co-location: interleaved rounds (one worker alone, then 2 … N at once); "
                   "0 leaves it out.")
@click.option("--repeat", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed calls per size (after one warm-up call).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The network file to write (JSON); with --peak, the peak file [default: "
                   "~/.cache/opprof/peak.json, where `opprof report` looks].")
@format_option
def command(peak: bool, fw: str | None, workers: int | None, servers: int, mode: str,
            threads: int | None, sizes: tuple[int, ...], units: str | None, model: str | None,
            batch_size: int | None, colocation_rounds: int, repeat: int, timeout_s: float,
            output: Path | None, fmt: str) -> None:
    """Time FW's gradient collective among WORKERS processes on this host over message sizes
    and fit α (latency) and β (time per byte). For torch's all-reduce, also time a compute loop
    and the collective alone and beside each other: the model's interference term; and
    tensor parallel's all-reduce and a pipeline's send/recv after bursts of compute, as a
    model-parallel step calls them (its in-step cost). With 2 or
    more workers, also time FW's own training step of a small model on one worker alone and on
    2 … N workers at once, in interleaved rounds: the model's co-location term.

    \b
    Example:
      opprof calibrate --fw torch --workers 2 -o net.json
      opprof calibrate --fw torch --workers 2 --model base.trace -o net.json
      opprof calibrate --fw torch --workers 2 --mode fsdp --units resnet18 -o fsdp-net.json
      opprof calibrate --fw mxnet --workers 2 --servers 1 --sizes 64K,1M,16M -o ps.json
      opprof calibrate --peak
    """
    if peak:
        _peak(threads, repeat, output, fmt)
        return
    if fw is None or workers is None or output is None:
        raise click.UsageError("give --fw, --workers and -o (or --peak)")
    from opprof.pipeline.calibrate import (
        DEFAULT_COLOCATION_MODEL,
        CalibrateOptions,
        calibrate,
        status_line,
        write_network,
    )
    from opprof.render import renderer

    o = CalibrateOptions(fw, workers, sizes, servers, mode, threads, repeat, timeout_s, units,
                         model or DEFAULT_COLOCATION_MODEL, batch_size, colocation_rounds)
    with Console(stderr=True).status(status_line(o)):
        net = calibrate(o)
    write_network(net, output)
    echo_output(renderer(fmt).calibration(net), fmt)
    click.echo(f"wrote {output}", err=True)


def _peak(threads: int | None, repeat: int, output: Path | None, fmt: str) -> None:
    """`calibrate --peak`: measure, write, show."""
    from opprof.flops.peaks import calibration_path
    from opprof.pipeline.peak import PeakCalibrateOptions, measure, write
    from opprof.render.efficiency import calibration_text

    o = PeakCalibrateOptions(threads=(threads,) if threads else None, repeat=repeat)
    with Console(stderr=True).status("measuring this CPU's peak: a GEMM and a bandwidth loop "
                                     "per thread count"):
        doc = measure(o)
    path = output or calibration_path()
    write(doc, path)
    echo_output(calibration_text(doc, fmt), fmt)
    click.echo(f"wrote {path}", err=True)
