"""Resident memory of every process of a run, sampled from outside: the same measurement for
every framework, taken by the supervising process (`record`, `run`), never inside training.

Every ``interval_s`` (20 ms by default) a thread of the supervising process reads
``/proc/PID/status`` of each watched process — ``VmRSS`` (the resident set) and ``VmHWM``
(the kernel's high-water mark of it) — through a file descriptor kept open per process
(one ``pread``: about 20 µs a process; psutil's ``memory_info`` takes about 50 µs and has
no high-water mark; ``benchmarks/bench_memory.py`` measures both), and stamps it with
``time.time_ns()`` (CLOCK_REALTIME, the clock the trace formats use: Kineto's
``baseTimeNanoseconds`` epoch, MXNet's epoch microseconds, the epoch time of the TF
collector's ``opprof.clock`` marker). (The kernel keeps VmHWM lazily — it raises it when
mappings are torn down — so it can trail by a little a resident set that shrank otherwise;
each read's VmHWM is at least that read's VmRSS.) The watched processes are the supervisor's
children and all their descendants (torchrun's ranks, a user's command and everything it starts) and
every process that reports on the run's channel, found again every ``discover_s``.

When the run ends (or fails), each process's samples go to ``memory/<pid>.memory.csv`` in
the run folder, a header line naming the process as the channel knows it (pid, host, label,
role, rank), then ``ts_ns,rss_bytes,hwm_bytes`` rows (:mod:`opprof.normalizers.sampled`
reads them; ``opprof import`` of the folder finds them). Processes that never reported on
the channel (torchrun's agent, a shell) are written with role ``null`` and are not part of
the `.trace`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from opprof.collectors.config import Facts
from opprof.files import write_atomic

MEMORY_DIR = "memory"
SUFFIX = ".memory.csv"
HEADER = "# opprof memory samples "
COLUMNS_LINE = "ts_ns,rss_bytes,hwm_bytes"
DEFAULT_INTERVAL_S = 0.02
DISCOVER_S = 0.5


def read_status(fd: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in bytes from an open ``/proc/PID/status``; None when the process is
    gone (or a zombie, which has no resident set)."""
    try:
        data = os.pread(fd, 4096, 0)
    except OSError:
        return None
    try:
        i = data.index(b"VmHWM:")
        j = data.index(b"VmRSS:")
        hwm = int(data[i + 6:data.index(b"kB", i)])
        rss = int(data[j + 6:data.index(b"kB", j)])
    except ValueError:
        return None
    return rss * 1024, hwm * 1024


@dataclass
class _Process:
    pid: int
    fd: int
    ts: list[int] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    hwm: list[int] = field(default_factory=list)


class Sampler:
    """Samples the processes ``roots()`` names and their descendants (see the module
    docstring) on a thread of this process; :meth:`write` puts the samples into the run
    folder. Use as a context manager around the supervisor's watch."""

    def __init__(self, folder: Path, roots: Callable[[], list[int]],
                 facts: Callable[[], list[Facts]], interval_s: float = DEFAULT_INTERVAL_S,
                 discover_s: float = DISCOVER_S) -> None:
        self.folder = Path(folder)
        self.roots, self.facts = roots, facts
        self.interval_s, self.discover_s = float(interval_s), float(discover_s)
        self.procs: dict[int, _Process] = {}
        self.done: list[_Process] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0
        self.late = 0  # ticks that started more than one interval late

    # -- the thread

    def start(self) -> None:
        """Start sampling (nothing when the interval is 0)."""
        if self.interval_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="opprof-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (one last sample of every process first)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        for p in self.procs.values():
            os.close(p.fd)
        self.done.extend(self.procs.values())
        self.procs = {}

    def _loop(self) -> None:
        next_discover = 0.0
        due = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_discover:
                self._discover()
                next_discover = now + self.discover_s
            self.sample()
            if self._stop.is_set():
                return
            due += self.interval_s
            wait = due - time.monotonic()
            if wait < -self.interval_s:
                self.late += 1
                due = time.monotonic()  # fell behind (a loaded machine): do not burst
                wait = 0.0
            if self._stop.wait(max(wait, 0.0)):
                self._discover()  # processes that appeared since: sample them once more
                self.sample()
                return

    def _discover(self) -> None:
        """Open the processes not yet watched."""
        from opprof.collectors.supervisor import descendants

        me = os.getpid()
        pids: set[int] = set()
        with contextlib.suppress(Exception):
            pids.update(f.pid for f in self.facts())
        for root in self.roots():
            pids.add(root)
            pids.update(descendants(root))
        for pid in sorted(pids - set(self.procs) - {me}):
            try:
                fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)
            except OSError:
                continue
            self.procs[pid] = _Process(pid, fd)

    def sample(self) -> None:
        """One sample of every watched process; processes that ended are retired."""
        self.ticks += 1
        gone = []
        for pid, p in self.procs.items():
            value = read_status(p.fd)
            t = time.time_ns()
            if value is None:
                gone.append(pid)
                continue
            p.ts.append(t)
            p.rss.append(value[0])
            p.hwm.append(value[1])
        for pid in gone:
            p = self.procs.pop(pid)
            os.close(p.fd)
            self.done.append(p)

    # -- the files

    def write(self) -> list[Path]:
        """Write one file per sampled process (see the module docstring); their paths."""
        facts = {}
        with contextlib.suppress(Exception):
            facts = {f.pid: f for f in self.facts()}
        out = []
        folder = self.folder / MEMORY_DIR
        for p in sorted(self.done + list(self.procs.values()), key=lambda q: q.pid):
            if not p.ts:
                continue
            f = facts.get(p.pid)
            head = {"pid": p.pid, "host": f.host if f else socket.gethostname(),
                    "label": f.label if f else None, "role": str(f.role) if f else None,
                    "rank": f.rank if f else None, "interval_s": self.interval_s,
                    "clock": "time.time_ns (CLOCK_REALTIME)", "source": "sampled"}
            lines = [HEADER + json.dumps(head), COLUMNS_LINE]
            lines += [f"{t},{r},{h}" for t, r, h in zip(p.ts, p.rss, p.hwm, strict=True)]
            folder.mkdir(parents=True, exist_ok=True)
            out.append(write_atomic(folder / f"{p.pid}{SUFFIX}", "\n".join(lines) + "\n"))
        return out

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.write()


@contextlib.contextmanager
def sampling(sup: object, interval_s: float = DEFAULT_INTERVAL_S) -> Iterator[Sampler]:
    """Sample the processes of supervisor ``sup`` (its children, their descendants and every
    process on its channel) while the block runs; the files are written when it ends,
    whatever ends it."""
    sampler = Sampler(sup.folder, lambda: [c.popen.pid for c in sup.children],  # type: ignore[attr-defined]
                      sup.statuses, interval_s)  # type: ignore[attr-defined]
    with sampler:
        yield sampler


def memory_files(folder: Path) -> list[Path]:
    """The sample files of the run in ``folder``."""
    return sorted((Path(folder) / MEMORY_DIR).glob(f"*{SUFFIX}"))
