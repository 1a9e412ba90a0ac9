"""`opprof advise`: what to change in a run, ranked by the time it saves; with ``--verify``, a
recorded run's actions applied and their savings measured (the work:
:mod:`opprof.pipeline.advise`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from opprof.commands import echo_output, format_option, output_option, write_output
from opprof.errors import OpprofError

if TYPE_CHECKING:
    from opprof.collectors.config import RecordConfig


@click.command("advise")
@click.argument("trace", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--verify", is_flag=True,
              help="For a run `opprof record` made: record it again with the first actions "
                   "it can apply itself (--loader-workers, --bucket-mb, --batch-size, "
                   "--servers), beside the baseline recorded again, and print the predicted "
                   "and the achieved saving of each.")
@click.option("--actions", "limit", type=click.IntRange(min=1), default=3, show_default=True,
              help="With --verify: how many actions to apply (one run each).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --verify: rounds of the baseline and every action, one after "
                   "another (a busy machine's load then falls on each alike); medians.")
@click.option("--verify-dir", type=click.Path(path_type=Path), default=None,
              help="With --verify: where the new runs go [default: TRACE-STEM.verify/].")
@format_option
@output_option
def command(trace: tuple[Path, ...], verify: bool, limit: int, repeat: int,
            verify_dir: Path | None, fmt: str, output: Path | None) -> None:
    """Advice on TRACE, ranked by the time each action saves: what the trace shows, what to
    change, and the saving the model or the replay predicts for it.

    \b
    Example:
      opprof advise mine.trace
      opprof advise ddp.trace --format json
      opprof advise lenet5-torch.trace --verify
    """
    from opprof.advice.base import AdviseResult
    from opprof.pipeline.advise import advise_trace
    from opprof.render import renderer

    render = renderer(fmt)
    trace_, _, advisory = advise_trace(list(trace))
    verification = None
    if verify:
        from opprof.pipeline.advise import verify as check

        options = recorded_options(trace_.meta.get("command"), trace[0])
        folder = verify_dir or trace[0].with_name(trace[0].name.removesuffix(".trace")
                                                  + ".verify")
        verification = check(advisory, options, folder, limit, repeat,
                             say=lambda line: click.echo(f"opprof: {line}", err=True))
    text = render.advice(AdviseResult(advisory, verification))
    if output is None:
        echo_output(text, fmt)
    else:
        write_output(text, fmt, output)


def recorded_options(command: object, path: Path) -> RecordConfig:
    """The `opprof record` options a trace was recorded with (its ``command``), typed; one
    clear error for a trace `opprof record` did not make."""
    from opprof.collectors.config import RecordConfig
    from opprof.commands.record import command as record_command

    words = shlex.split(command) if isinstance(command, str) else []
    if words[:2] != ["opprof", "record"]:
        made = f"`{command}`" if command else "no recorded command"
        raise OpprofError(f"{path}: advise --verify reruns `opprof record` runs; this trace "
                          f"holds {made}: apply the actions yourself and compare the runs "
                          "with `opprof diff BASE NEW --fail-above 5%`")
    try:
        ctx = record_command.make_context("record", words[2:])
    except click.ClickException as exc:
        raise OpprofError(f"{path}: its recording command cannot be run again by this "
                          f"opprof ({exc.format_message()})") from None
    params = {k: v for k, v in ctx.params.items() if k not in ("top", "fmt", "output")}
    return RecordConfig.from_options(params, command=str(command))
