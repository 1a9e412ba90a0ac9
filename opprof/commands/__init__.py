"""One module per CLI command; each defines ``command`` (a click command)."""

from __future__ import annotations

import click

from opprof.render import FORMATS

format_option = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="rich", show_default=True,
    help="rich tables for people; json, csv or md for machines.",
)
top_option = click.option("--top", type=click.IntRange(min=1), default=None,
                          help="Show only the N largest operators.")


def echo_output(text: str, fmt: str) -> None:
    """Print rendered output (rich output is already laid out)."""
    click.echo(text.rstrip("\n"))


def engine_options(f):  # noqa: ANN001, ANN201 (a click decorator)
    """``--scheduler`` and ``--jobs``: where the per-rank work runs (opprof.parallel)."""
    f = click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
                     help="Local worker processes for per-rank work [default: one per core; "
                          "this process alone for small inputs].")(f)
    return click.option("--scheduler", metavar="ADDRESS", envvar="DASK_SCHEDULER_ADDRESS",
                        default=None,
                        help="Run per-rank work on this Dask distributed scheduler "
                             "(tcp://host:8786; or $DASK_SCHEDULER_ADDRESS). Workers must see "
                             "the same files.")(f)


def warn_damaged(damaged: list[dict]) -> None:
    """One line on stderr naming the damaged files a folder held that were left out."""
    if not damaged:
        return
    shown = "; ".join(f"{d['path']} ({d['problem']})" for d in damaged[:3])
    more = f"; and {len(damaged) - 3} more" if len(damaged) > 3 else ""
    click.echo(f"opprof: skipped {len(damaged)} damaged file(s), read the rest: {shown}{more}",
               err=True)
