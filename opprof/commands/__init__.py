"""One module per CLI command; each defines ``command`` (a click command)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from opprof.errors import OpprofError
from opprof.files import write_atomic
from opprof.render import FORMATS, REPORT_FORMATS

if TYPE_CHECKING:
    from opprof.meta import MetaMapping

#: A command's function, as click's decorators take and give it.
F = TypeVar("F", bound=Callable[..., Any])

format_option = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="rich", show_default=True,
    help="rich tables for people; json, csv or md for machines.",
)
report_format_option = click.option(
    "--format", "fmt", type=click.Choice(REPORT_FORMATS), default="rich", show_default=True,
    help="rich tables for people; json, csv or md for machines; html: one self-contained page "
         "of charts and sortable tables (with -o).",
)
output_option = click.option(
    "-o", "--output", type=click.Path(path_type=Path), default=None,
    help="Write the output to this file (atomically) instead of the terminal; needed by "
         "--format html.",
)
top_option = click.option("--top", type=click.IntRange(min=1), default=None,
                          help="Show only the N largest operators.")


def echo_output(text: str, fmt: str) -> None:
    """Print rendered output (rich output is already laid out)."""
    click.echo(text.rstrip("\n"))


def check_output(fmt: str, output: Path | None) -> None:
    """Refuse --format html without -o before any work is done (a page of several MB is no
    terminal output)."""
    if fmt == "html" and output is None:
        raise OpprofError("--format html writes a file: give -o FILE.html")


def write_output(text: str, fmt: str, output: Path | None) -> None:
    """Print the rendered output, or write it to ``output`` atomically and say so."""
    if output is None:
        echo_output(text, fmt)
        return
    write_atomic(output, text if text.endswith("\n") else text + "\n")
    from opprof.render.units import size

    click.echo(f"wrote {output} ({size(output.stat().st_size)})", err=True)


def config_options(cls: type, only: tuple[str, ...] | None = None) -> Callable[[F], F]:
    """The click options of a configuration dataclass's fields (``only``: these fields),
    made from what each field declares (:func:`opprof.collectors.config.option`: its help,
    bounds, choices; its type and default), in the fields' order: a field added there is an
    option here, with nothing else to edit."""
    import typing

    from opprof.collectors.config import options_of

    declared = [d for d in options_of(cls) if only is None or d[0] in only]
    hints = {}
    for klass in (cls, *{f.metadata["options"] for f in _fields(cls)
                         if "options" in f.metadata}):
        hints.update(typing.get_type_hints(klass))

    def apply(f: F) -> F:
        for name, default, how in reversed(declared):
            f = _click_option(name, default, how, hints[name])(f)
        return f

    return apply


def _fields(cls: type) -> tuple[Any, ...]:
    import dataclasses

    return dataclasses.fields(cls)


def _click_option(name: str, default: Any, how: Any, hint: Any) -> Callable[[F], F]:
    """One field's click option (see :func:`config_options`): a switch for a bool, a choice
    for an enum or listed values, a bounded number, else text; required without a default;
    None as the command line's default where the option is ``unset``."""
    import dataclasses
    import enum
    import typing

    flag = how.flag or "--" + name.replace("_", "-")
    required = default is dataclasses.MISSING
    if isinstance(default, enum.Enum):
        default = default.value
    given = None if required or how.unset else default  # the command line's default
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    shown = how.show_default and given is not None
    if base is bool:  # on by default: --name/--no-name; else a flag
        if given is False:
            return click.option(flag, name, is_flag=True, default=False,
                                help=how.help or None)
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=given,
                            show_default=shown, help=how.help or None)
    kind: Any = str
    bounded = how.minimum is not None or how.maximum is not None
    if how.choices is not None:
        kind = click.Choice(how.choices)
    elif isinstance(base, type) and issubclass(base, enum.Enum):
        kind = click.Choice([e.value for e in base])
    elif base is int:
        kind = click.IntRange(min=how.minimum, max=how.maximum) if bounded else int
    elif base is float:
        kind = click.FloatRange(min=how.minimum, max=how.maximum,
                                min_open=how.min_open) if bounded else float
    return click.option(flag, name, type=kind, required=required, default=given,
                        show_default=shown, help=how.help or None)


def memory_options(f: F) -> F:
    """``--profile-memory/--no-profile-memory`` and ``--memory-interval`` (record and run),
    as :class:`~opprof.collectors.config.RecordConfig` declares them."""
    from opprof.collectors.config import RecordConfig

    return config_options(RecordConfig, ("profile_memory", "memory_interval_s"))(f)


def engine_options(f: F) -> F:
    """``--scheduler`` and ``--jobs``: where the per-rank work runs (opprof.parallel)."""
    f = click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
                     help="Local worker processes for per-rank work [default: one per core; "
                          "this process alone for small inputs].")(f)
    return click.option("--scheduler", metavar="ADDRESS", envvar="DASK_SCHEDULER_ADDRESS",
                        default=None,
                        help="Run per-rank work on this Dask distributed scheduler "
                             "(tcp://host:8786; or $DASK_SCHEDULER_ADDRESS). Workers must see "
                             "the same files.")(f)


def warn_damaged(damaged: list[dict[str, str]]) -> None:
    """One line on stderr naming the damaged files a folder held that were left out."""
    if not damaged:
        return
    shown = "; ".join(f"{d['path']} ({d['problem']})" for d in damaged[:3])
    more = f"; and {len(damaged) - 3} more" if len(damaged) > 3 else ""
    click.echo(f"opprof: skipped {len(damaged)} damaged file(s), read the rest: {shown}{more}",
               err=True)


def warn_read(meta: MetaMapping) -> None:
    """One ⚠ line on stderr per kind of event the reader dropped or repaired
    (``meta["read_warnings"]``), so that no number changed without a word."""
    from opprof.drops import KEY, lines

    for line in lines(meta.get(KEY)):
        click.echo(f"opprof: {line}", err=True)


def _rate(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from opprof.flops.peaks import parse_rate

    try:
        return parse_rate(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def peak_options(f: F) -> F:
    """``--peak-flops``, ``--peak-bandwidth`` and ``--peak-file``: the machine's peak where the
    trace's device is not in the peak table or the user knows better (opprof.flops.peaks)."""
    f = click.option("--peak-file", type=click.Path(path_type=Path), default=None,
                     help="A CPU peak measured by `opprof calibrate --peak -o FILE` "
                          "[default: the one it keeps for this host, if any].")(f)
    f = click.option("--peak-bandwidth", callback=_rate, default=None, metavar="BYTES/S",
                     help="The memory bandwidth to measure against (3.35T, 2e12).")(f)
    return click.option("--peak-flops", callback=_rate, default=None, metavar="FLOP/S",
                        help="The peak FLOP/s to measure MFU against (989T, 1.2e14) instead "
                             "of the device's from the peak table.")(f)


def peak_from(flops: float | None, bandwidth: float | None, file: Path | None) -> Any:
    """The :class:`~opprof.flops.peaks.PeakOptions` of the peak options: a ``--peak-file`` that
    is not a peak calibration is one clear error; without one, the calibration `opprof
    calibrate --peak` keeps for this host, when there is one."""
    from opprof.errors import ErrorKind
    from opprof.flops.peaks import PeakOptions, calibration_path, read_calibration

    if file is not None:
        if not file.is_file():
            raise OpprofError("no such file", path=file, kind=ErrorKind.MISSING)
        if read_calibration(file) is None:
            raise OpprofError("not a peak calibration (write one with opprof calibrate "
                              "--peak -o FILE)", path=file, kind=ErrorKind.NOT_A_TRACE)
    else:
        default = calibration_path()
        file = default if read_calibration(default) is not None else None
    return PeakOptions(flops, bandwidth, file)
