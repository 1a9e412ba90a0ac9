"""The one error type opprof raises for anything a user did or gave wrong."""


class OpprofError(Exception):
    """An error whose message is shown to the user as one line (exit code 2)."""

    exit_code = 2
