"""Work run beside this process: a function computed in a forked child while this process
goes on with other work, its result sent back pickled through a pipe (:func:`start`,
:meth:`Pending.result`).

The report pipeline of one job read whole (`opprof report --format html`, the default view
with its advice) has two halves that need only the job: the dependency graph and its
critical path, and the model's baseline and the report's tables. On two cores they run at
once; the child sees the job's events as they are in memory (copy-on-write, nothing sent),
and sends back only its result (a few hundred KiB). The child is started only where it
surely gains: on Linux, with this process's Python threads all ended, and a core idle
(:func:`opprof.readahead.core_free`); ``OPPROF_BESIDE=1`` starts it whatever the load,
``=0`` never. Anything unexpected — the child fails, is killed, its result does not
unpickle, it sends nothing for far longer than this process took for its own half (a child
stuck, say on a lock a native thread held at the fork: :data:`MIN_WAIT_S`, :data:`WAIT_FACTOR`)
— and the function runs here instead, as it would without a child: the result, and an error
the function raises, are the same either way.
"""

from __future__ import annotations

import os
import pickle
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar, cast

T = TypeVar("T")

ENV = "OPPROF_BESIDE"
#: How long :meth:`Pending.result` waits for a child that has sent nothing: at least
#: ``MIN_WAIT_S`` seconds, and ``WAIT_FACTOR`` times as long as the child had already run when
#: the result was asked for (its work is about this process's own half); then the child is
#: ended and the function computed here — a stuck child costs time, never a hang.
MIN_WAIT_S = 60.0
WAIT_FACTOR = 4.0


class Pending(Generic[T]):
    """A function's result, being computed by a child (``pid``, its pipe ``fd``) or not yet
    at all (``pid`` None: :meth:`result` computes it here)."""

    def __init__(self, fn: Callable[[], T], pid: int | None = None, fd: int = -1) -> None:
        self._fn, self.pid, self._fd = fn, pid, fd
        self._started = time.monotonic()

    def result(self) -> T:
        """The function's result: the child's (waiting for it), or computed here."""
        sent = self._collect()
        if sent is not None:
            status, value = sent
            if status == "done":
                return cast(T, value)
        return self._fn()

    def _collect(self) -> tuple[str, object] | None:
        """What the child sent (None: there was no child, or it sent nothing whole)."""
        if self.pid is None:
            return None
        data = bytearray()
        patience = max(MIN_WAIT_S, WAIT_FACTOR * (time.monotonic() - self._started))
        try:
            while True:
                ready, _, _ = select.select([self._fd], [], [], patience)
                if not ready:  # nothing for that long: stuck; computed here instead
                    data = bytearray()
                    break
                piece = os.read(self._fd, 1 << 20)
                if not piece:
                    break
                data += piece
        except OSError:
            data = bytearray()
        finally:
            self.close()
        try:
            sent: tuple[str, object] = pickle.loads(data)
        except Exception:  # noqa: BLE001 (killed midway, or it failed to pickle: run it here)
            return None
        return sent

    def close(self) -> None:
        """End the child if it still runs (its result is no longer wanted) and reap it."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        import signal

        os.close(self._fd)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass


def wanted() -> bool:
    """Whether a child is started now: ``$OPPROF_BESIDE`` (``1`` always, ``0`` never), else
    when a core is idle for it; never where fork is unsafe or missing (not Linux, or a
    Python thread of this process still runs: a forked child would inherit its locks)."""
    setting = os.environ.get(ENV, "")
    if setting == "0" or not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return False
    if threading.active_count() > 1:
        return False
    if setting == "1":
        return True
    from opprof.readahead import core_free

    return core_free()


def start(fn: Callable[[], T]) -> Pending[T]:
    """``fn()`` started in a forked child when :func:`wanted`; its :class:`Pending` result
    (computed here on :meth:`Pending.result` when no child started). The caller calls
    :meth:`Pending.result` or :meth:`Pending.close` (``try``/``finally``)."""
    if not wanted():
        return Pending(fn)
    try:
        r, w = os.pipe()
    except OSError:
        return Pending(fn)
    try:
        import warnings

        with warnings.catch_warnings():  # (3.12: "multi-threaded": native threads only)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return Pending(fn)
    if pid == 0:  # the child: compute, send, end (never returns)
        os.close(r)
        _compute_and_send(fn, w)
    os.close(w)
    return Pending(fn, pid, r)


def _compute_and_send(fn: Callable[[], object], fd: int) -> None:
    """In the child: ``("done", fn())`` pickled into ``fd`` (``("failed", None)`` when it
    raised: the parent runs it itself and raises what it raises); then exit at once (no
    exit handlers, no flushing of the parent's buffers)."""
    import signal
    import warnings

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)  # stopped with the parent, quietly
    warnings.simplefilter("ignore")  # the parent says what is wrong, once
    try:
        sent: tuple[str, object] = ("done", fn())
        data = pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # noqa: BLE001 (anything: the parent computes it itself)
        data = pickle.dumps(("failed", None))
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:  # noqa: BLE001 (the parent is gone or stopped reading)
        pass
    os._exit(0)
