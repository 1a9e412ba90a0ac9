"""`opprof bench`: record a matrix of frameworks × models × workers × modes and compare them
(the work: :mod:`opprof.pipeline.bench`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from opprof.collectors.config import MODELS
from opprof.kinds import FRAMEWORKS, MODES, Mode

#: A comma-separated option's callback: its integers or its words.
Parse = Callable[[click.Context, click.Parameter, str], "list[int] | list[str]"]


def _csv(kind: str, choices: tuple[str, ...] = (), none: bool = False) -> Parse:
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> list[int] | list[str]:
        if value is None and none:
            return []
        items = [v.strip() for v in value.split(",") if v.strip()]
        if not items:
            raise click.BadParameter("give at least one value")
        if kind == "int":
            try:
                out = [int(v) for v in items]
            except ValueError:
                raise click.BadParameter(f"{value!r}: comma-separated integers") from None
            if min(out) < 1:
                raise click.BadParameter("each value must be at least 1")
            return list(dict.fromkeys(out))
        bad = [v for v in items if choices and v not in choices]
        if bad:
            raise click.BadParameter(f"{', '.join(bad)}: choose from {', '.join(choices)}")
        return list(dict.fromkeys(items))
    return parse


@click.command("bench")
@click.option("--fw", "fws", default="torch,tf,mxnet", show_default=True,
              callback=_csv("str", FRAMEWORKS), help="Frameworks, comma-separated.")
@click.option("--model", "models", default="lenet5", show_default=True,
              callback=_csv("str", MODELS), help="Models, comma-separated.")
@click.option("--workers", "workers", default="1", show_default=True, callback=_csv("int"),
              help="Worker counts, comma-separated (1 = single mode).")
@click.option("--mode", "modes", default="allreduce,ps-sync,ps-async", show_default=True,
              callback=_csv("str", tuple(m for m in MODES if m != Mode.SINGLE)),
              help="Distributed modes for worker counts above 1, comma-separated.")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--batch-size", "batch_sizes", default="32", show_default=True,
              callback=_csv("int"),
              help="Batch sizes, comma-separated: more than one is a sweep (time per "
                   "mini-batch and samples/s against the batch size).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--timing-steps", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parameter servers (ps modes).")
@click.option("--dataset", default="synthetic-cifar10", show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds each recording may take.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("bench"),
              show_default=True,
              help="Folder for the traces, bench.md/.csv/.json, bench.html and figures/.")
@click.option("--resume", is_flag=True,
              help="Keep runs whose .trace already exists, loads and is complete; record "
                   "the rest (an interrupted run included).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Record each combination K times; report the median and the spread.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Rows of the cross-framework operator table.")
@click.option("--threads", "thread_counts", default=None, callback=_csv("int", none=True),
              help="Compute threads per worker in every run (as `opprof record --threads`); "
                   "the same number everywhere lets the model predict the multi-worker runs "
                   "from the 1-worker ones. Several, comma-separated, are a sweep (time per "
                   "mini-batch against the threads, and where each framework stops scaling).")
@click.option("--converge", type=click.IntRange(min=0), default=0, show_default=True,
              help="Train STEPS steps per run, keeping loss and accuracy (`record "
                   "--converge`): final loss, best test accuracy and time to 50/70/90%.")
@click.option("--eval-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --converge: train and test accuracy every K steps.")
@click.option("--network", type=click.Path(path_type=Path), default=None,
              help="α–β from `opprof calibrate` for the predictions (default: fitted to each "
                   "measured run's own collectives).")
def command(fws: list[str], models: list[str], workers: list[int], modes: list[str],
            batch_sizes: list[int], thread_counts: list[int], **options: Any) -> None:
    """Record every valid combination and compare them (samples/s, phases, scaling and the
    model's predicted scaling, the operators with the largest cross-framework ratios).

    \b
    Example:
      opprof bench --fw torch,tf,mxnet --model lenet5,resnet18 --workers 1,3 --steps 20
      opprof bench --fw torch,mxnet --model lenet5 --workers 1,2 --steps 3 -o bench --resume
      opprof bench --fw torch,tf,mxnet,jax,chainer --model lenet5 --threads 1,2 \
                   --batch-size 16,64 --steps 3 -o sweep
    """
    from opprof.pipeline.bench import BenchOptions, bench

    o = BenchOptions(tuple(fws), tuple(models), tuple(workers), tuple(modes),
                     batch_size=batch_sizes[0], threads=thread_counts[0] if thread_counts
                     else None, batch_sizes=tuple(batch_sizes),
                     thread_counts=tuple(thread_counts), **options)
    bench(o, say=lambda line: click.echo(line, err=True), show=click.echo)
