"""The one progress channel between profiled processes and the supervisor: files in the run
folder, so it works for any process tree (torchrun's ranks, DMLC roles, TF tasks, a user's
command) without pipes or sockets.

* ``procs/<pid>.status``: each profiled process rewrites its :class:`~.config.Facts` (JSON,
  in place, ~0.1 ms: cheap enough for every step boundary) until it is done; the supervisor
  reads them all to show progress, to name a process that died or hung, and at the end to
  build the metadata (a status read while it is being rewritten does not parse and is
  skipped for that poll);
* ``procs/<role><rank>.claim``: a process claims its rank before writing its trace, so two
  processes that both think they are rank 0 never overwrite each other's files;
* ``procs/<pid>.fault``: where Python's :mod:`faulthandler` writes the traceback of a
  process killed by a fatal signal (SIGABRT, SIGSEGV, SIGBUS …), so that a process that
  vanished without a word (a `run` command's ranks have no log of their own) is named with
  what killed it and where (:func:`fault_of`);
* ``control``: one word the supervisor or a lead process writes for the others to read (the
  TensorFlow parameter-server job's ``start`` / ``stop`` of the servers' profilers).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from opprof.collectors.config import Facts, Role
from opprof.errors import OpprofError
from opprof.files import write_atomic

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from opprof.collectors.config import FactsUpdate

STATUS_DIR = "procs"
_SUFFIX = ".status"
_POLL_S = 0.05


def status_dir(folder: Path) -> Path:
    """Where the processes of the run in ``folder`` write their status."""
    return Path(folder) / STATUS_DIR


class Reporter:
    """One process's side of the channel: its current facts, rewritten on every change."""

    def __init__(self, folder: Path, facts: Facts) -> None:
        self.folder = status_dir(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.facts = facts
        self._written = b""
        self._fd: int | None = None

    def update(self, **changes: Unpack[FactsUpdate]) -> None:
        """Change some facts and rewrite the status file if anything changed."""
        self.facts = replace(self.facts, **changes)
        data = self.facts.to_json().encode()
        if data == self._written:
            return
        if self._fd is None:
            self._fd = os.open(self.folder / f"{self.facts.pid}{_SUFFIX}",
                               os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(self._fd, data, 0)
        if len(data) < len(self._written):
            os.ftruncate(self._fd, len(data))
        self._written = data

    def claim(self, role: Role, rank: int) -> int:
        """``rank`` if no other process of this run has claimed it for ``role``, else the
        next free one (so files named by rank are never overwritten)."""
        while True:
            try:
                fd = os.open(self.folder / f"{role}{rank}.claim",
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                rank += 1
                continue
            os.write(fd, str(self.facts.pid).encode())
            os.close(fd)
            return rank


_FAULT_SUFFIX = ".fault"
_fault_file: list[tuple[int, TextIO]] = []  # (pid, file) kept open for faulthandler


def watch_faults(folder: Path) -> None:
    """Have this process's fatal-signal traceback written to ``procs/<pid>.fault`` (unless
    faulthandler is already on: the user's own choice stays)."""
    if faulthandler.is_enabled() or any(f[0] == os.getpid() for f in _fault_file):
        return
    try:
        path = status_dir(folder) / f"{os.getpid()}{_FAULT_SUFFIX}"
        out = open(path, "w")  # noqa: SIM115 - open for the life of the process
        faulthandler.enable(file=out, all_threads=False)
        _fault_file.append((os.getpid(), out))
    except (OSError, ValueError, RuntimeError):
        pass


def fault_of(folder: Path, pid: int) -> str:
    """``Fatal Python error: Aborted, in FILE:LINE (FUNCTION)``: what faulthandler wrote for
    process ``pid`` (empty when it did not die of a fatal signal)."""
    try:
        lines = (status_dir(folder) / f"{pid}{_FAULT_SUFFIX}").read_text(
            errors="replace").splitlines()
    except OSError:
        return ""
    head = next((ln.strip() for ln in lines if ln.startswith("Fatal Python error")), "")
    if not head:
        return ""
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    where = f", in {frames[0].removeprefix('File ')}" if frames else ""
    return f"{head}{where}"[:300]


def read_all(folder: Path) -> list[Facts]:
    """The status of every process that reported in ``folder`` (ordered by pid)."""
    out = []
    for path in sorted(status_dir(folder).glob(f"*{_SUFFIX}")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            out.append(Facts.from_json(path.read_text()))
    return sorted(out, key=lambda f: f.pid)


def send(folder: Path, command: str) -> None:
    """Write ``command`` for the other processes of the run."""
    write_atomic(Path(folder) / "control", command)


def received(folder: Path) -> str:
    """The last command written to the run (empty if none)."""
    try:
        return (Path(folder) / "control").read_text().strip()
    except OSError:
        return ""


def wait_until(test: Callable[[list[Facts]], bool], folder: Path, deadline: float | None,
               what: str) -> None:
    """Poll the statuses until ``test`` holds; an OpprofError naming ``what`` at the deadline."""
    while not test(read_all(folder)):
        if deadline is not None and time.monotonic() > deadline:
            raise OpprofError(f"timed out waiting for {what}")
        time.sleep(_POLL_S)


def report_error(folder: Path, facts: Facts, message: str) -> None:
    """Put this process's one-line error into its status (``facts``: who it is, used when it
    failed before writing any status)."""
    path = status_dir(folder) / f"{facts.pid}{_SUFFIX}"
    try:
        facts = Facts.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        pass
    reporter = Reporter(folder, facts)
    reporter.update(error=message, ended=message)
