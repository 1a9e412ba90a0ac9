"""The one error type opprof raises for anything a user did or gave wrong, and the one
exception for a run stopped by a signal (Ctrl-C, a scheduler's SIGTERM)."""

from __future__ import annotations

import signal


class OpprofError(Exception):
    """An error whose message is shown to the user as one line (exit code 2)."""

    exit_code = 2


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
