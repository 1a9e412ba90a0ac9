"""`opprof model`: predict the step time and speed-up on N workers from a trace, and check the
prediction against a measured multi-worker trace."""

from __future__ import annotations

from pathlib import Path

import click

from opprof.commands import echo_output, format_option
from opprof.kinds import PS_MODES, Mode


def workers_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """``1,2,4`` → [1, 2, 4] (each ≥ 1)."""
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: comma-separated integers") from None
    if not out or min(out) < 1:
        raise click.BadParameter("give worker counts of at least 1")
    return list(dict.fromkeys(out))


network_option = click.option(
    "--network", type=click.Path(path_type=Path), default=None,
    help="α–β of the collective from `opprof calibrate -o net.json` (default: fitted to the "
         "trace's own collectives, else an assumed 10 Gb/s Ethernet).")
mode_option = click.option(
    "--mode", type=click.Choice([m.value for m in (Mode.ALLREDUCE, Mode.FSDP, *PS_MODES,
                                                   Mode.TP, Mode.PP, Mode.EP)]),
    default=None,
    help="Distributed mode (default: the trace's, or the framework's usual: torch and tf "
         "allreduce, mxnet ps-sync); fsdp: sharded data parallel (FSDP); tp, pp, ep: the "
         "trace's tensor, pipeline or expert parallel degree changed to each of --workers.")
servers_option = click.option("--servers", type=click.IntRange(min=1), default=None,
                              help="Parameter servers (ps modes; default the trace's, or 1).")


@click.command("model")
@click.argument("trace", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--workers", "workers", default="1,2,4,8", show_default=True,
              callback=workers_list, help="Worker counts to predict, comma-separated.")
@mode_option
@servers_option
@network_option
@click.option("--check", "measured", type=click.Path(path_type=Path), default=None,
              help="A measured multi-worker trace: the prediction for its worker count beside "
                   "its terms, with the error, an interval from the measured steps' spread and "
                   "a verdict (too noisy to judge / within the noise / off beyond it).")
@click.option("--workers-per-host", type=click.IntRange(min=1), default=None,
              help="Place the predicted workers this many to a host (default: on the base's "
                   "hosts — one host for a 1-worker trace); workers that share a host slow "
                   "each other's compute (the co-location term). --check uses the measured "
                   "run's hosts.")
@click.option("--straggler/--no-straggler", default=True, show_default=True,
              help="Add the expected wait for the slowest of N workers in each synchronous "
                   "step (σ of the base's per-step compute time × E[max of N normals]).")
@click.option("--microbatches", type=click.IntRange(min=1), default=None,
              help="--mode pp: the micro-batches of the predicted pipeline (default the "
                   "trace's; from a one-worker trace, record --mode pp's: 4 when the batch "
                   "divides by 4, else 2).")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b"]), default=None,
              help="--mode pp from a one-worker trace: the pipeline's schedule (default "
                   "gpipe, as record --mode pp; --check takes the measured run's).")
@format_option
def command(trace: tuple[Path, ...], workers: list[int], mode: str | None,
            servers: int | None, network: Path | None, measured: Path | None,
            workers_per_host: int | None, straggler: bool, microbatches: int | None,
            schedule: str | None, fmt: str) -> None:
    """Predict TRACE's step time and speed-up on N workers (terms, α–β communication,
    layer-wise pipeline), and optionally check it against a measured run.

    \b
    Example:
      opprof model resnet18-torch.trace --workers 1,2,4,8,16 --mode allreduce
      opprof model resnet18-torch.trace --workers 2 --check resnet18-ddp2.trace
      opprof model resnet18-torch.trace --workers 8 --workers-per-host 2 --network net.json
      opprof model resnet18-torch.trace --mode fsdp --check resnet18-fsdp2.trace
      opprof model resnet18-mxnet.trace --workers 4 --mode ps-sync --servers 2 --network net.json
      opprof model transformer.trace --mode tp --workers 2 --network net.json --check tp2.trace
      opprof model transformer.trace --mode pp --workers 2 --microbatches 4 --check pp2.trace
    """
    from opprof.pipeline.model import ModelOptions, from_single, model, parallel
    from opprof.render import renderer

    result = model(ModelOptions(trace, tuple(workers), mode, servers, network, measured,
                                workers_per_host, straggler, microbatches, schedule))
    if from_single(result):  # a one-worker trace split by --mode tp|pp (model.fromsingle)
        from opprof.render.paralleltables import split_model_text

        echo_output(split_model_text(result, fmt), fmt)
        return
    if parallel(result):  # a model-parallel job's model (opprof.model.parallel)
        from opprof.render.paralleltables import parallel_model_text

        echo_output(parallel_model_text(result, fmt), fmt)
        return
    echo_output(renderer(fmt).model(result), fmt)
