"""Where per-rank work runs: in this process, a local process pool, or a Dask cluster.

:func:`choose` picks the engine: a Dask distributed scheduler when an address is given
(``--scheduler ADDRESS`` or ``$DASK_SCHEDULER_ADDRESS``) — the engine NVIDIA's Nsight Systems
recipes use for multi-node reports; else a pool of local processes, one per usable core; and
serially when there is one core, one task, or too little input to pay for starting
processes. :func:`run_ordered` then maps a top-level function over the tasks and yields the
results in task order, with at most a few tasks in flight per worker, so memory holds a few
ranks at a time whatever the number of ranks.

Workers must see the same files as this process (on a cluster: a shared file system) and
have opprof installed at the same version.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from opprof.errors import OpprofError, first_line

if TYPE_CHECKING:  # imported when a pool starts: a serial report never needs it
    import multiprocessing.context

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
JOBS_ENV = "OPPROF_JOBS"
#: Below this much input (bytes, gzip counted at 10x) the pool's start-up (a second or so:
#: each worker imports pandas and pyarrow) costs more than it saves.
TINY_INPUT = 64 << 20
#: Tasks queued per worker beyond the one it runs.
AHEAD = 1

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Engine:
    """How tasks run: ``serial``, ``local`` (``workers`` processes) or ``dask`` (at
    ``address``)."""

    kind: str
    workers: int = 1
    address: str | None = None

    def describe(self) -> str:
        """A few words for progress messages."""
        if self.kind == "dask":
            return f"Dask cluster at {self.address}"
        if self.kind == "local":
            return f"{self.workers} local processes"
        return "this process"


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose(tasks: int, input_bytes: int = 0, *, scheduler: str | None = None,
           jobs: int | None = None) -> Engine:
    """The engine for ``tasks`` independent tasks over ``input_bytes`` of input."""
    address = scheduler or os.environ.get(SCHEDULER_ENV) or None
    if address:
        return Engine("dask", address=address)
    if jobs is None and os.environ.get(JOBS_ENV, "").strip():
        try:
            jobs = int(os.environ[JOBS_ENV])
        except ValueError:
            raise OpprofError(f"${JOBS_ENV} must be a number of processes, not "
                              f"{os.environ[JOBS_ENV]!r}") from None
    workers = min(jobs if jobs is not None else usable_cores(), tasks)
    if workers <= 1 or (jobs is None and input_bytes < TINY_INPUT):
        return Engine("serial")
    return Engine("local", workers=workers)


def run_ordered(engine: Engine, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
    """``fn(task)`` for every task, results in task order. ``fn`` must be a module-level
    function (it is sent to other processes by name). An error in a task is raised here."""
    if engine.kind == "serial":
        for t in tasks:
            yield fn(t)
    elif engine.kind == "local":
        yield from _local(engine.workers, fn, tasks)
    elif engine.kind == "dask":
        yield from _dask(engine.address or "", fn, tasks)
    else:
        raise ValueError(f"unknown engine {engine.kind!r}")


def _context() -> multiprocessing.context.BaseContext:
    """forkserver where there is one (workers start from a clean, preloaded process; plain
    fork would copy this process's threads and memory), else spawn."""
    import multiprocessing

    try:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["opprof.job", "opprof.analysis.report",
                                    "opprof.normalizers.kineto"])
        return ctx
    except ValueError:
        return multiprocessing.get_context("spawn")


@contextmanager
def _main_hidden() -> Iterator[None]:
    """Start workers without re-running the caller's main module in them (what spawn and
    forkserver do, and what breaks a script without an ``if __name__ == "__main__"`` guard):
    the tasks are opprof's own functions and need nothing from it."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__spec__", "__file__") if hasattr(main, k)}
    try:
        if main is not None:
            main.__spec__ = None
            if "__file__" in saved:
                del main.__file__
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def _local(workers: int, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pending: deque[Any] = deque()
    it = iter(tasks)
    with ProcessPoolExecutor(max_workers=workers, mp_context=_context()) as pool:
        try:
            for t in it:
                with _main_hidden():  # a submit may start a worker
                    pending.append(pool.submit(fn, t))
                if len(pending) >= workers * (1 + AHEAD):
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool as exc:
            raise OpprofError(f"a worker process died ({first_line(exc)}); out of memory? "
                              f"try fewer processes with ${JOBS_ENV}") from None
        finally:
            for f in pending:
                f.cancel()


def _dask(address: str, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
    try:
        from distributed import Client
    except ImportError:
        raise OpprofError("a Dask scheduler was given but dask.distributed is not installed "
                          "(pip install 'opprof[cluster]')") from None
    try:
        client = Client(address, timeout="20s",  # type: ignore[no-untyped-call]  # (dask's)
                        set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise OpprofError(f"cannot reach the Dask scheduler at {address} "
                          f"({first_line(exc)})") from None
    try:
        workers = max(1, len(client.nthreads()))  # type: ignore[no-untyped-call]
        pending: deque[Any] = deque()
        for t in tasks:
            pending.append(client.submit(fn, t, pure=False))
            if len(pending) >= workers * (1 + AHEAD):
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())
    finally:
        client.close()  # type: ignore[no-untyped-call]


def _result(future: Any) -> Any:
    """A Dask future's result; the task's own OpprofError stays one line."""
    try:
        return future.result()
    finally:
        future.release()
