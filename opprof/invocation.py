"""The command line this process runs as: what the `.trace` files it writes are stamped with
(``opprof_command``, :func:`opprof.meta.stamp`). Standard library only: the CLI sets it
before anything else is imported."""

from __future__ import annotations

import shlex
import sys

_LINE: list[str] = []


def set_invocation(line: str) -> None:
    """Stamp the `.trace` files this process writes with ``line`` (the CLI: ``opprof ARGS…``;
    a `bench` run's subprocess: the bench's name for the run)."""
    _LINE[:] = [line]


def invocation() -> str:
    """The line set, else this Python process's own (``python ARGV…``: a script calling
    ``opprof.profile()`` or ``opprof.save``)."""
    return _LINE[0] if _LINE else shlex.join([sys.executable, *sys.argv])
