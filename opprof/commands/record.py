"""`opprof record`: train a model under a framework's native profiler, write a `.trace`,
print the report (the work: :mod:`opprof.pipeline.record`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from opprof.collectors.config import MODELS
from opprof.commands import echo_output, format_option, memory_options, top_option
from opprof.kinds import FRAMEWORKS, MODES, Device


@click.command("record")
@click.option("--fw", type=click.Choice(FRAMEWORKS), required=True, help="Framework to run.")
@click.option("--model", type=click.Choice(MODELS), required=True, help="Built-in model.")
@click.option("--dataset", default="synthetic-cifar10", show_default=True,
              help="synthetic-cifar10, cifar10, cifar100 (local python batches) or a PATH.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Profiled steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Unprofiled warm-up steps.")
@click.option("--timing-steps", type=click.IntRange(min=1), default=3, show_default=True,
              help="Unprofiled timed steps (the profiler's overhead is measured against them).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parameter servers (ps modes).")
@click.option("--mode", type=click.Choice(MODES), default=None,
              help="Distributed mode (default: single for 1 worker, else the framework's usual).")
@click.option("--device", type=click.Choice(Device.values()), default=Device.CPU.value,
              show_default=True)
@click.option("--nsys", is_flag=True,
              help="Also record under NVIDIA Nsight Systems (needs nsys on PATH).")
@memory_options
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Compute threads per worker (torch/OpenMP threads, TF intra- and inter-op "
                   "threads, MXNet's OpenMP). Default: one worker, the framework's (every "
                   "CPU); several, every framework the same: the host's CPUs split among the "
                   "processes that compute on it (MXNet's servers count). Give the same "
                   "number to a baseline that `opprof model` predicts from and to the runs it "
                   "checks against.")
@click.option("--loader-workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="DataLoader worker processes that load batches ahead of the step (torch, "
                   "MXNet; 0: in the training process).")
@click.option("--bucket-mb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="DistributedDataParallel's gradient bucket size in MiB (torch allreduce "
                   "and zero; default DDP's 25, its first bucket 1).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--converge", type=click.IntRange(min=0), default=0, show_default=True,
              help="Train STEPS steps in all (the profiled ones among them), keeping each "
                   "step's loss and time: the convergence table beside the breakdown.")
@click.option("--eval-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --converge: train and test accuracy every K steps (0: at the end).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds before a hung run is stopped.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The .trace to write (default MODEL-FW.trace).")
@click.option("--nnodes", type=click.IntRange(min=1), default=None,
              help="Hosts in a multi-host job (run the same command on each).")
@click.option("--node-rank", type=click.IntRange(min=0), default=None,
              help="This host's index in a multi-host job.")
@click.option("--master-addr", default=None, help="Rendezvous host (default 127.0.0.1).")
@click.option("--master-port", type=click.IntRange(0, 65535), default=None,
              help="Rendezvous port (default: a free one; needed with --nnodes > 1).")
@click.option("--cluster", default=None,
              help="Every worker's HOST:PORT, comma-separated (TensorFlow on several hosts; "
                   "--node-rank is this host's task index).")
@top_option
@format_option
def command(top: int | None, fmt: str, **options: Any) -> None:
    """Train MODEL with framework FW under its native profiler and report it.

    Native traces are kept in OUTPUT's folder as OUTPUT-STEM.native/.

    \b
    Example:
      opprof record --fw torch --model resnet18
      opprof record --fw mxnet --model resnet18 --workers 3 --mode ps-sync
      opprof record --fw torch --model resnet18 --workers 2 --mode fsdp
    """
    from opprof.analysis.report import build_report
    from opprof.pipeline.record import RecordOptions, record
    from opprof.render import renderer

    o = RecordOptions(command=shlex.join(["opprof", *sys.argv[1:]]), **options)
    with _progress() as progress:
        tasks: dict[str, TaskID] = {}

        def report_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(f"{o.fw} {o.model}: {stage}", total=total)
            progress.update(tasks[stage], completed=done, total=total)

        trace = record(o, report_progress)
    click.echo(f"wrote {o.path} ({len(trace.events):,} events; native traces in "
               f"{trace.meta['native_dir']})", err=True)
    echo_output(renderer(fmt).report(build_report(trace), by="phase", top=top), fmt)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)
