"""The one trace file ``opprof report FILE`` reads, read ahead while this process imports
pandas and the analyses.

The report command calls :func:`start` with the paths it parsed, before it imports anything
heavy. Where a core is idle (:func:`core_free`) it forks a child that imports only the Kineto
reader's reading half (msgspec and numpy, no pandas), streams the file into columns
(``kineto.stream``) and sends them back through a pipe; meanwhile this process imports the
report's modules (about 0.3 s of CPU). Else a gzip file starts inflating on a second thread
(:func:`opprof.gunzip.prefetch`). Either way :func:`start` returns the handle
(:class:`opprof.preread.Ahead`), which the command passes to its pipeline and the pipeline
down to the reader: where the reader would stream the file, it takes the child's columns
instead (on two cores the read costs little wall time). Anything unexpected — the child fails
or is killed, the file is no trace the streaming reader takes, the file changed since — and
the reader reads the file itself, as it always does (and says what is wrong with it). On a
busy machine the second process costs CPU (about 0.1 s of a 134k-event trace) for a gain that
depends on what else runs, so it is left out. ``OPPROF_READAHEAD=0`` turns it off, ``=1`` on
whatever the load.

Standard library only at import: the report command imports this module first thing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opprof import preread
from opprof.gunzip import FileIdentity, file_identity, prefetch


def report_file(paths: Sequence[str | os.PathLike[str]]) -> str | None:
    """The one trace file a report reads: its only path when that is a regular file of JSON
    or gzip; None for several paths, a folder, a `.trace` or anything else."""
    if len(paths) != 1 or file_identity(paths[0]) is None:
        return None  # (a FIFO or a device is never opened here)
    path = os.fspath(paths[0])
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    return path if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"\xef") \
        else None


def core_free(looks: int = 3) -> bool:
    """Whether a core is idle for the child now: fewer threads ready to run on the machine
    (``/proc/loadavg``'s count, this process included) than cores this process may use, in
    any of ``looks`` readings a millisecond apart (a thread that runs for a moment — a
    monitor polling, a process ending — is not a busy machine; one that keeps running is).
    A second process surely gains wall time where a core would otherwise idle; on a busy
    machine it costs CPU (the fork, the pages copied after it, the columns' transfer) for a
    gain that depends on what else runs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    for look in range(looks):
        if look:
            time.sleep(0.001)
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            try:
                running = round(os.getloadavg()[0]) + 1
            except OSError:
                return cores > 1
        if running < cores:
            return True
    return False


def start(paths: Sequence[str | os.PathLike[str]],
          detail: bool = False) -> preread.Ahead | None:
    """Start reading the one trace file of ``paths`` ahead (see the module docstring): a
    child when a core is free for it (:func:`core_free`; ``OPPROF_READAHEAD=1``: whatever
    the load, ``0``: never), else a gzip file's inflating thread; the handle to pass to the
    reader, or None when nothing was started. ``detail``: the report reads the events'
    ``detail`` text (it reads the job whole), the child reads it too."""
    path = report_file(paths)
    if path is None:
        return None
    ident = file_identity(path)
    if ident is None:
        return None
    setting = os.environ.get("OPPROF_READAHEAD", "")
    if setting == "0" or not hasattr(os, "fork") or (setting != "1" and not core_free()):
        text = prefetch(path)
        return None if text is None else preread.Ahead(ident, text=text)
    child = _fork(path, ident, detail)
    if child is None:
        text = prefetch(path)
        return None if text is None else preread.Ahead(ident, text=text)
    return preread.Ahead(ident, child=child)


def _fork(path: str, ident: FileIdentity, detail: bool) -> preread.Child | None:
    """The child reading ``path`` (see :func:`_read_and_send`); None when none could start."""
    import msgspec  # noqa: F401 (both processes need them: imported once, before the fork)
    import numpy  # noqa: F401

    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:  # a larger pipe: the columns come in a few pieces, not hundreds (Linux)
        import fcntl

        fcntl.fcntl(r, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (OSError, ImportError):
        pass
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: read, send, end (never returns)
        os.close(r)
        _read_and_send(path, w, detail)
    os.close(w)
    return preread.Child(ident, detail, pid, r)


def _read_and_send(path: str, fd: int, detail: bool = False) -> None:
    """In the child: the streamed document (:data:`preread.NOT_STREAMED` for a file the streaming
    reader does not take, a failure for anything else) pickled into ``fd``; then exit at
    once (no exit handlers, no flushing of the parent's buffers)."""
    import signal
    import warnings

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)  # stopped with the parent, quietly
    warnings.simplefilter("ignore")  # the parent's stderr is not the child's to write
    try:
        doc = _read(Path(path), detail)
        result: tuple[str, Any] = ("read", preread.NOT_STREAMED if doc is None else doc)
    except BaseException:  # noqa: BLE001 (anything: the parent reads the file itself)
        result = ("failed", None)
    try:
        import pickle

        with os.fdopen(fd, "wb") as out:
            pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # noqa: BLE001 (the parent is gone or stopped reading)
        pass
    os._exit(0)


def _read(path: Path, detail: bool = False) -> Any:
    """The document ``kineto.stream`` makes of the file, the Kineto reader imported alone:
    not through the package ``opprof.normalizers``, whose other formats import pandas."""
    import importlib.util
    import types

    if "opprof.normalizers" not in sys.modules:
        spec = importlib.util.find_spec("opprof.normalizers")
        if spec is None or not spec.submodule_search_locations:
            return None
        package = types.ModuleType("opprof.normalizers")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["opprof.normalizers"] = package
    from opprof.normalizers import kineto

    with open(path, "rb") as f:
        head = f.read(64)
    return kineto.stream(path, head, detail)
