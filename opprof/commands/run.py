"""`opprof run`: profile any training command, unchanged, then print the report of what its
processes recorded (the work: :mod:`opprof.pipeline.run`).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from opprof.commands import echo_output, format_option, memory_options, top_option
from opprof.kinds import FRAMEWORKS


@click.command("run", context_settings={"ignore_unknown_options": True,
                                        "allow_interspersed_args": False})
@click.option("--fw", type=click.Choice(["auto", *FRAMEWORKS]), default="auto",
              show_default=True, help="Framework whose steps are counted (auto: any).")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Profiled steps per process.")
@click.option("--warmup", type=click.IntRange(min=1), default=2, show_default=True,
              help="Unprofiled steps first (at least 1: a step's start is seen when the "
                   "one before it ends).")
@click.option("--timing-steps", type=click.IntRange(min=0), default=3, show_default=True,
              help="Unprofiled timed steps after the warm-up (the profiler's overhead is "
                   "measured against them).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The .trace to write (default: SCRIPT.trace, after the command's script).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Seconds before the command is stopped (default: none).")
@memory_options
@top_option
@format_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def command(fw: str, steps: int, warmup: int, timing_steps: int, output: Path | None,
            timeout_s: float | None, profile_memory: bool, memory_interval_s: float,
            top: int | None, fmt: str, command: tuple[str, ...]) -> None:
    """Run COMMAND unchanged and profile the training steps of every Python process it
    starts (torch, TensorFlow/Keras or MXNet; detected when imported).

    Each process skips --warmup steps, times --timing-steps, profiles --steps with its
    framework's profiler and writes its native trace (named by its rank) into OUTPUT-STEM.native/.
    When COMMAND ends, they are merged into OUTPUT and reported. COMMAND's exit code is
    opprof's; what a failing command recorded is kept and reported.

    \b
    Example:
      opprof run -o mine.trace -- python train.py --epochs 1
      opprof run --steps 10 --warmup 3 -- torchrun --nproc-per-node 2 train_ddp.py
      opprof run --fw tf -- python keras_fit.py
    """
    from opprof.analysis.report import build_report
    from opprof.pipeline.run import RunOptions, run
    from opprof.render import renderer

    o = RunOptions(command, fw, steps, warmup, timing_steps, output, timeout_s, profile_memory,
                   memory_interval_s, stdout_to_stderr=fmt != "rich")
    click.echo(f"opprof: running {shlex.join(command)}; each training process: {warmup} "
               f"warm-up and {timing_steps} timed steps, then {steps} profiled (traces in "
               f"{o.native}/)", err=True)
    ran = run(o, lambda line: click.echo(f"opprof: {line}", err=True))
    for note in ran.notes:
        click.echo(f"opprof: {note}", err=True)
    if ran.trace is None:
        click.echo(f"opprof: error: {ran.nothing}", err=True)
        sys.exit(ran.exit_code)
    click.echo(f"wrote {o.path} ({len(ran.trace.events):,} events; native traces in "
               f"{o.native})", err=True)
    echo_output(renderer(fmt).report(build_report(ran.trace), by="phase", top=top), fmt)
    if ran.exit_code:
        sys.exit(ran.exit_code)
