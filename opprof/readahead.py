"""The one trace file ``opprof report FILE`` reads, read by a second process while this one
imports pandas and the analyses.

The command line forks a child before it imports anything heavy (:func:`start`). The child
imports only the Kineto reader's reading half (msgspec and numpy, no pandas), streams the
file into columns (``kineto.stream``) and sends them back through a pipe; meanwhile this
process imports the report's modules (about 0.3 s of CPU). Where the reader would stream the
file, it takes the child's columns instead (:func:`opprof.preread.taken`: the child's handle
waits there, so that this module and the reader do not import each other): on two cores the
read costs little wall time. Anything unexpected — the child fails or is killed, the file is
no trace the streaming reader takes, the file changed since — and the reader reads the file
itself, as it always does (and says what is wrong with it). Only where a core is idle
(:func:`core_free`): on a busy machine the second process costs CPU (about 0.1 s of a
134k-event trace) for a gain that depends on what else runs. ``OPPROF_READAHEAD=0`` turns it
off, ``=1`` on whatever the load.

Standard library only at import: the CLI imports this module first thing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from opprof import preread
from opprof.gunzip import file_identity

#: What a report reads: events' ``detail`` text only for collectives (opprof.job).
_DETAIL = False


def report_file(argv: list[str]) -> str | None:
    """The one trace file a command line reports (``opprof report FILE ...``); None for
    other commands, several files or a file that is not JSON or gzip."""
    args = [a for i, a in enumerate(argv) if not a.startswith("-")
            and (i == 0 or argv[i - 1] not in ("-o", "--output", "--by", "--top", "--format",
                                                "--device-span", "--scheduler", "--jobs",
                                                "-j"))]
    if len(args) != 2 or args[0] != "report" or file_identity(args[1]) is None:
        return None  # (a FIFO or a device is never opened here)
    try:
        with open(args[1], "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    return args[1] if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"\xef") \
        else None


def core_free() -> bool:
    """Whether a core is idle for the child now: fewer threads ready to run on the machine
    (``/proc/loadavg``'s count, this process included) than cores this process may use. A
    second process surely gains wall time where a core would otherwise idle; on a busy
    machine it costs CPU (the fork, the pages copied after it, the columns' transfer) for a
    gain that depends on what else runs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        try:
            running = round(os.getloadavg()[0]) + 1
        except OSError:
            return cores > 1
    return running < cores


def start(argv: list[str]) -> bool:
    """Fork the child that reads the trace ``argv`` reports (see the module docstring) when
    a core is free for it (:func:`core_free`; ``OPPROF_READAHEAD=1``: whatever the load,
    ``0``: never); True when one was started."""
    path = report_file(argv)
    setting = os.environ.get("OPPROF_READAHEAD", "")
    if path is None or setting == "0" or not hasattr(os, "fork") or (
            setting != "1" and not core_free()):
        return False
    ident = file_identity(path)
    if ident is None:
        return False
    import msgspec  # noqa: F401 (both processes need them: imported once, before the fork)
    import numpy  # noqa: F401

    try:
        r, w = os.pipe()
    except OSError:
        return False
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
        return False
    if pid == 0:  # the child: read, send, end (never returns)
        os.close(r)
        _read_and_send(path, w)
    os.close(w)
    preread.hold(preread.Child(ident, _DETAIL, pid, r))
    return True


def _read_and_send(path: str, fd: int) -> None:
    """In the child: the streamed document (:data:`preread.NOT_STREAMED` for a file the streaming
    reader does not take, a failure for anything else) pickled into ``fd``; then exit at
    once (no exit handlers, no flushing of the parent's buffers)."""
    import signal
    import warnings

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)  # stopped with the parent, quietly
    warnings.simplefilter("ignore")  # the parent's stderr is not the child's to write
    try:
        doc = _read(Path(path))
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


def _read(path: Path) -> Any:
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
    return kineto.stream(path, head, _DETAIL)
