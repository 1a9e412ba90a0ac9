"""The trace document ``opprof report FILE``'s second process reads (:mod:`opprof.readahead`),
waiting to be taken: the one handle of that process, which the Kineto reader asks for the
file it is about to stream (:func:`taken`).

It lives apart from :mod:`opprof.readahead`, which imports the Kineto reader to read in the
second process, so that the reader and the read-ahead import each other no more. Standard
library only at import: the CLI imports it first thing.
"""

from __future__ import annotations

import os
from typing import Any

from opprof.gunzip import FileIdentity, file_identity

#: What :func:`taken` gives when the child found the file is none the streaming reader
#: takes (the caller reads it whole at once, without trying to stream it again).
NOT_STREAMED = "not streamed"


class Child:
    """The child started for this process: what it reads, its pid, and what it has sent so
    far, drained from the pipe by a thread as it comes (so that the child ends as soon as it
    has read the file, instead of holding the columns until they are taken)."""

    def __init__(self, ident: FileIdentity, detail: bool, pid: int,
                 fd: int) -> None:
        import threading

        self.ident, self.detail, self.pid, self.fd = ident, detail, pid, fd
        self.data = bytearray()
        self.thread = threading.Thread(target=self._drain, name="opprof-readahead",
                                       daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        try:
            while piece := os.read(self.fd, 1 << 20):  # (no GIL held while it waits)
                self.data += piece
        except OSError:
            self.data = bytearray()
        finally:
            os.close(self.fd)
            _reap(self.pid)


_held: Child | None = None


def hold(child: Child) -> None:
    """Keep ``child``'s handle until the reader takes its document (:func:`taken`); at exit,
    a child whose document nobody took is ended."""
    global _held
    _held = child
    import atexit

    atexit.register(_stop)


def running() -> Child | None:
    """The child held now (None when none was started, or its document was taken)."""
    return _held


def taken(path: str | os.PathLike[str], detail: bool) -> Any:
    """The document the child read of ``path`` when one was started on it, the file is
    unchanged since and ``detail`` is what it read with (waiting for it), or
    :data:`NOT_STREAMED`; None otherwise (then the caller reads the file itself). Handed out
    once."""
    global _held
    child = _held
    if child is None or file_identity(str(path)) != child.ident or detail != child.detail:
        return None
    _held = None
    import pickle

    child.thread.join()
    try:
        status, doc = pickle.loads(child.data)
    except Exception:  # noqa: BLE001 (the child failed or was killed: read it here)
        status, doc = "failed", None
    del child.data
    return doc if status == "read" and file_identity(str(path)) == child.ident else None


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass


def _stop() -> None:
    """At exit: end a child whose document nobody took (the report stopped before)."""
    global _held
    child, _held = _held, None
    if child is None or not child.thread.is_alive():
        return
    import signal

    try:
        os.kill(child.pid, signal.SIGKILL)  # the thread then reads the end and reaps it
    except OSError:
        pass
    child.thread.join(5)
