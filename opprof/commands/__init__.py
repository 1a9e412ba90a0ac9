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
