"""The one error type opprof raises for anything a user did or gave wrong, and the one
exception for a run stopped by a signal (Ctrl-C, a scheduler's SIGTERM).

An error about a file carries the file (:attr:`OpprofError.path`), what is wrong with it
(:attr:`~OpprofError.problem`) and a :class:`ErrorKind`; its message is ``PATH: PROBLEM``. Code
that must tell errors apart (a damaged file found in a folder is skipped, a missing one named
by the user is not) reads those, never the message's text.
"""

from __future__ import annotations

import os
import signal
from enum import Enum
from typing import Any


class ErrorKind(str, Enum):
    """What kind of thing went wrong (a closed set; the text is its value)."""

    USAGE = "usage"  # an option, argument or setting that cannot work
    MISSING = "missing"  # no such file or folder
    UNREADABLE = "unreadable"  # there, but not readable as a file (a folder, a FIFO, no right)
    EMPTY = "empty"  # a file with nothing in it
    NOT_A_TRACE = "not-a-trace"  # a file of no format opprof reads (or not the one expected)
    DAMAGED = "damaged"  # a file of a known format that cannot be read as one
    NO_EVENTS = "no-events"  # read, but nothing usable in it
    TOO_LARGE = "too-large"  # more than memory allows (or a decompression bomb)
    NEWER = "newer"  # written by a newer opprof
    UNWRITABLE = "unwritable"  # an output that cannot be written
    RUN = "run"  # a recording, a job or a tool opprof ran failed

    def __str__(self) -> str:
        return str(self.value)


class OpprofError(Exception):
    """An error whose message is shown to the user as one line (exit code 2): ``PATH:
    PROBLEM`` when it is about a file (``path``), else the problem itself."""

    exit_code = 2

    def __init__(self, problem: str, *, path: str | os.PathLike[str] | None = None,
                 kind: ErrorKind = ErrorKind.USAGE) -> None:
        super().__init__(problem if path is None else f"{path}: {problem}")
        self.problem = problem
        self.path = path
        self.kind = kind

    def about(self, path: str | os.PathLike[str]) -> bool:
        """Whether the error is about the file ``path``."""
        return self.path is not None and os.fspath(self.path) == os.fspath(path)

    def __reduce__(self) -> tuple[Any, ...]:  # path and kind survive a worker process
        return (_rebuilt, (self.problem, self.path, self.kind))


def _rebuilt(problem: str, path: str | os.PathLike[str] | None, kind: ErrorKind) -> OpprofError:
    return OpprofError(problem, path=path, kind=kind)


class Interrupted(BaseException):
    """A run stopped by a signal (SIGINT, SIGTERM, SIGHUP): one line saying what was stopped
    and what was kept, and the exit code a shell gives a process ended by that signal
    (128 + N: 130 for SIGINT, 143 for SIGTERM). Not an Exception, so that no ``except
    Exception`` swallows it on its way out (as KeyboardInterrupt)."""

    def __init__(self, sig: int, message: str = "", folder: object = None) -> None:
        super().__init__(message)
        self.sig = int(sig)
        self.message = message
        self.folder = folder  # where what was recorded is kept, named at the end of the line

    @property
    def exit_code(self) -> int:
        return 128 + self.sig

    @property
    def name(self) -> str:
        return signal_name(self.sig)

    def __str__(self) -> str:
        text = self.message or f"interrupted by {self.name}"
        return text + (f"; native traces and logs in {self.folder}" if self.folder else "")


def signal_name(sig: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for what has no name."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), for the
    one-line errors users see."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def raise_on_signals(sigs: tuple[int, ...] = ()) -> None:
    """Make SIGTERM and SIGHUP (and ``sigs``) raise :class:`Interrupted` in the main thread,
    so that opprof stopped by a scheduler cleans up (atomic writes remove their temporary
    files) and says so in one line, as Ctrl-C does."""

    def handler(sig: int, frame: object) -> None:
        raise Interrupted(sig)

    for sig in (signal.SIGTERM, signal.SIGHUP, *sigs):
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError):  # not the main thread, or not settable here
            pass
