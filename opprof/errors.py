"""The one error type opprof raises for anything a user did or gave wrong."""


class OpprofError(Exception):
    """An error whose message is shown to the user as one line (exit code 2)."""

    exit_code = 2


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), for the
    one-line errors users see."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
