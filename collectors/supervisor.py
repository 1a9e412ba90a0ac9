"""The one supervisor: starts, watches and stops every process of a recording — a `record` job's
workers, servers, scheduler or torchrun, and the user's command of `run` — and names, in one
line, a process that died or hung.

What it watches: its own children (exit codes, logs) and the progress channel
(:mod:`.channel`), where every profiled process, however deep in the process tree (torchrun's
ranks), reports its stage and steps. Progress shown to the user comes from one lead process
(the lowest-ranked worker that reports progress). A child that fails ends the run at once (for
`record`; `run` waits for its command, whose exit code is its own); a run that passes its time
limit is stopped, naming the process that made the least progress.

Stopping: SIGTERM to each child's process group (own session) or to the child and its
descendants (a command kept in opprof's foreground group), a grace period, then SIGKILL to
all of them and to every process that reported on the channel, so that nothing the run started
is left behind, grandchildren included.

Interrupts (:meth:`Supervisor.interrupt`): while it watches, a first SIGINT, SIGTERM or SIGHUP
stops the run in order — the processes that report progress (they hold a profile to write)
get SIGTERM first (a command of `run` first gets the SIGINT itself, as from a terminal), then,
once they have ended or most of :data:`GRACE_S` has passed, everything else opprof started;
what is left is killed, so every process is gone within about five seconds. It then raises
:class:`~opprof.errors.Interrupted` with one line naming what was stopped and how far each
process got. A second signal kills everything at once.

Hangs (``watch_progress``, `record`'s built-in models, which never pause): a process that has
been stopped (SIGSTOP, state T) for :data:`STOPPED_S`, or whose progress has not moved for
:data:`HANG_FACTOR` times its slowest step (at least :data:`HANG_MIN_S`), ends the run with a
line naming it, before the time limit. Before a hung run is stopped, each of its live processes
writes the Python stacks of all its threads to the end of its log (:meth:`dump_stacks`), so a
deadlock inside a framework can be read afterwards.

Extension points, kept in one place: :meth:`Supervisor.every` registers a function called at
a fixed interval while the run is watched (sampling the resident memory of every supervised
process from outside); ``forward`` passes signals the supervisor receives on to its children
(`run`: a scheduler's SIGTERM reaches the user's command).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opprof.collectors import channel
from opprof.collectors.config import Facts
from opprof.errors import Interrupted, OpprofError, signal_name

LOOPBACK = "127.0.0.1"
POLL_S = 0.05
_STAGE_ORDER = ("start", "setup", "warmup", "timing", "clock", "profile", "write", "done")
#: Signals that interrupt a watched run (a scheduler's preemption, Ctrl-C, a closed terminal).
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds an interrupted run's processes get to write what they profiled before the rest is
#: stopped and everything left is killed (the whole stop stays within about 5 s).
GRACE_S = 4.0
#: A `run` command interrupted by SIGINT first gets this long to end on its own.
SIGINT_GRACE_S = 1.5
#: A process stopped (state T) this long ends a `record` run.
STOPPED_S = 10.0
#: A `record` process whose progress has not moved for HANG_FACTOR times its slowest step so
#: far (and at least HANG_MIN_S seconds) is hung.
HANG_FACTOR = 10.0
HANG_MIN_S = 60.0
#: Sent to the processes of a hung `record` run before it is stopped: each writes its threads'
#: Python stacks to its log (faulthandler, registered by the record worker).
STACKS_SIGNAL = signal.SIGUSR1
STACKS_WAIT_S = 0.5

#: progress(stage, done, total): called as the run advances ("warmup", "timing", "profile").
Progress = Callable[[str, int, int], None]


def no_progress(stage: str, done: int, total: int) -> None:
    """A Progress that shows nothing."""


try:  # loaded here, not in the forked child, where taking the import lock could deadlock
    import ctypes

    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (ImportError, OSError, AttributeError):  # not Linux
    _PRCTL = None


def die_with_parent() -> None:
    """In this process (or as a ``preexec_fn``): on Linux, get SIGKILL when the parent dies,
    so a killed supervisor leaves nothing behind."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct TCP ports nobody listens on right now (bound, read, released together)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                              socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now."""
    return free_ports(1, host)[0]


def describe_exit(code: int) -> str:
    """``exited with code N`` or ``was killed by SIGX``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def shell_code(code: int) -> int:
    """A child's return code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


@contextlib.contextmanager
def _handling(sigs: Iterable[int], handler: Callable[[int, object], None]) -> Iterator[None]:
    """Within the block, ``handler`` handles ``sigs``; then the old handlers again. Off the
    main thread nothing changes (the caller's own thread handles them)."""
    saved = {}
    with contextlib.suppress(ValueError):
        for sig in sigs:
            saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def last_line(log: Path | None, skip: tuple[str, ...] = ("USDT:", "W0000", "I0000",
                                                          "WARNING: All log")) -> str:
    """The last non-blank line of ``log`` not starting with one of ``skip`` (at most 300
    characters); empty if there is none or the log cannot be read."""
    if log is None:
        return ""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    rest = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(skip)]
    return rest[-1][:300] if rest else ""


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren …), from /proc."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(entry.path, "stat").read_text()
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.extend(kids)
        todo.extend(kids)
    return out


def _state(pid: int) -> str:
    """The process's state letter (R, S, T, Z …); '' when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("", "Z")


def _kill(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass
class Child:
    """A process the supervisor started."""

    label: str
    popen: subprocess.Popen
    log: Path | None
    own_group: bool
    #: Who really failed and how, when this child is a launcher of others (torchrun).
    explain: Callable[[Child, int, list[Facts]], tuple[str, str]] | None = None
    expected_exit: bool = False
    #: When it exited (time.monotonic(), noted by a waiter thread as the kernel reports it):
    #: of several processes found dead in one poll, the first to die is named.
    exited_at: float | None = None

    def watch_exit(self) -> None:
        """Note ``exited_at`` from a daemon thread that waits for the exit without reaping
        it (``WNOWAIT``: ``popen.poll`` still reaps and reads the code)."""
        def wait() -> None:
            with contextlib.suppress(OSError):  # reaped by poll first: the time is now
                os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOWAIT)
            self.exited_at = time.monotonic()

        threading.Thread(target=wait, name=f"opprof-wait-{self.popen.pid}", daemon=True).start()

    @property
    def code(self) -> int | None:
        return self.popen.poll()


@dataclass
class Supervisor:
    """Starts, watches and stops the processes of one run (see the module docstring)."""

    folder: Path
    what: str  # how messages name the run: "torch allreduce", "your command"
    timeout_s: float | None = None
    progress: Progress = no_progress
    forward: tuple[int, ...] = ()
    #: Stop the run when a process froze or stopped making progress (see the module docstring).
    watch_progress: bool = False
    children: list[Child] = field(default_factory=list)
    _ticks: list[tuple[float, Callable[[], None], list[float]]] = field(default_factory=list)
    _shown: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + self.timeout_s if self.timeout_s else None
        self._signals: list[int] = []  # interrupts received while watching
        self._beats: dict[int, tuple[tuple, float, float]] = {}  # pid → (progress, since, slowest)
        self._frozen: dict[int, float] = {}  # pid → since when it is in state T

    # -- starting

    def start(self, label: str, argv: list[str], *, env: dict[str, str] | None = None,
              cwd: Path | None = None, log: Path | None = None, own_group: bool = True,
              stdin: int | None = subprocess.DEVNULL, stdout: int | None = None,
              explain: Callable[[Child, int, list[Facts]], tuple[str, str]] | None = None,
              ) -> Child:
        """Start one process: its output to ``log`` (else inherited), in a process group of
        its own (``own_group``) that dies with the supervisor, or in the caller's.
        Without a log, ``stdout`` redirects its standard output (a file descriptor)."""
        out = open(log, "ab") if log is not None else None  # noqa: SIM115 - kept by the child
        try:
            popen = subprocess.Popen(
                argv, env=env, cwd=cwd, stdin=stdin, stdout=out if out is not None else stdout,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=own_group,
                preexec_fn=die_with_parent if own_group else None)
        except OSError as exc:
            raise OpprofError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        finally:
            if out is not None:
                out.close()
        child = Child(label, popen, log, own_group, explain)
        child.watch_exit()
        self.children.append(child)
        return child

    def every(self, seconds: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` about every ``seconds`` while the run is watched."""
        self._ticks.append((seconds, fn, [0.0]))

    # -- watching

    def statuses(self) -> list[Facts]:
        return channel.read_all(self.folder)

    def wait(self, done: Callable[[Supervisor], bool] | None = None, *,
             fail_fast: bool = True) -> dict[str, int]:
        """Watch until every child has exited (or ``done(self)`` holds); the exit codes by
        label. With ``fail_fast`` a child that fails stops the run with one OpprofError line;
        at the time limit the run is stopped with one line naming who hung."""
        with self._forwarding(), self._interruptible():
            while True:
                if self._signals:
                    self.interrupt(self._signals[0])
                self._relay()
                self._tick()
                codes = {c.label: c.code for c in self.children}
                failed = [c for c in self.children
                          if c.code not in (None, 0) and not c.expected_exit]
                if failed and fail_fast:
                    line = self.failure(self.first_to_die(failed))
                    self.stop()
                    raise OpprofError(line)
                if all(code is not None for code in codes.values()) or (done and done(self)):
                    self._relay()
                    return {k: v for k, v in codes.items() if v is not None}
                if self.deadline is not None and time.monotonic() > self.deadline:
                    line = self.timeout_line() + self.dump_stacks()
                    self.stop()
                    raise OpprofError(line)
                hung = self.hang_line() if self.watch_progress else None
                if hung:
                    hung += self.dump_stacks()
                    self.stop()
                    raise OpprofError(hung)
                time.sleep(POLL_S)

    @staticmethod
    def first_to_die(failed: list[Child]) -> Child:
        """Of the failed children, the one that exited first (a peer's death often makes the
        others fail within milliseconds: on a loaded machine one poll can find them all dead).
        Their waiter threads get a moment to note the times."""
        end = time.monotonic() + 0.5
        while any(c.exited_at is None for c in failed) and time.monotonic() < end:
            time.sleep(0.005)
        return min(failed, key=lambda c: (c.exited_at is None, c.exited_at or 0.0))

    @contextlib.contextmanager
    def _forwarding(self) -> Iterator[None]:
        """While watching, pass the signals in ``forward`` on to the children."""
        def handler(sig: int, frame: object) -> None:
            for c in self.children:
                if c.code is None:
                    _kill([c.popen.pid], sig)

        with _handling(self.forward, handler):
            yield

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        """While watching, note the interrupts (the watch loop acts on them); a second one
        kills every process at once."""
        def handler(sig: int, frame: object) -> None:
            self._signals.append(sig)
            if len(self._signals) > 1:
                self.kill_all()

        with _handling([s for s in INTERRUPTS if s not in self.forward], handler):
            yield

    def interrupt(self, sig: int) -> None:
        """Stop the run because of signal ``sig`` (see the module docstring) and raise
        :class:`Interrupted` with one line: what was stopped, how far each process got,
        where its files are."""
        t0 = time.monotonic()
        tree = self._tree()
        statuses = [s for s in self.statuses() if s.pid != os.getpid() and _alive(s.pid)]
        # Processes inside the protocol hold a profile to write; servers, schedulers and
        # processes still starting up do not.
        writers = [s.pid for s in statuses if s.stage not in ("start", "ready", "serving")]
        others = [s.pid for s in statuses if s.pid not in writers]
        end = t0 + GRACE_S
        if sig == signal.SIGINT and any(not c.own_group for c in self.children):
            # A command in opprof's own process group got the terminal's Ctrl-C with opprof;
            # from elsewhere (kill -INT), it gets it now. Either way it may end on its own.
            if not _from_terminal():
                _kill([c.popen.pid for c in self.children if c.code is None], signal.SIGINT)
            self._settle(writers + others, t0 + SIGINT_GRACE_S, children=True)
        # First the processes with a profile to write, then the rest (MXNet's servers answer
        # a worker's last pull; torchrun would only stop its ranks again), all within GRACE_S.
        _kill([p for p in writers if _alive(p)], signal.SIGTERM)
        self._settle(writers, end - 0.5)
        for c in self.children:
            if c.code is None:
                self._signal(c, signal.SIGTERM, tree.get(c.popen.pid, []))
        _kill([p for p in others if _alive(p)], signal.SIGTERM)
        self._settle(writers + others, end, children=True)
        self.kill_all(tree)
        took = time.monotonic() - t0
        for c in self.children:
            c.expected_exit = True
        names = ", ".join(c.label for c in self.children)
        raise Interrupted(sig, f"{self.what}: interrupted by {signal_name(sig)}; stopped "
                               f"{names or 'nothing'} in {took:.1f} s; "
                               f"{progress_summary(self.statuses())}", self.folder)

    def _tree(self) -> dict[int, list[int]]:
        return {c.popen.pid: descendants(c.popen.pid) for c in self.children if c.code is None}

    def _settle(self, pids: list[int], until: float, children: bool = False) -> None:
        """Wait until ``pids`` (and, with ``children``, every child) have ended, or
        ``until``; a second interrupt ends the wait (everything is then killed)."""
        while time.monotonic() < until and len(self._signals) < 2:
            if not any(_alive(p) for p in pids) and (
                    not children or all(c.code is not None for c in self.children)):
                return
            time.sleep(POLL_S)

    def kill_all(self, tree: dict[int, list[int]] | None = None) -> None:
        """SIGKILL every child, everything below it and every process that reported."""
        tree = self._tree() if tree is None else tree
        for c in self.children:
            self._signal(c, signal.SIGKILL, tree.get(c.popen.pid, []))
        _kill([s.pid for s in self.statuses() if s.pid != os.getpid() and _alive(s.pid)],
              signal.SIGKILL)
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(timeout=5)

    def hang_line(self) -> str | None:
        """One line when a process has frozen or stopped making progress (see the module
        docstring); None while every process moves."""
        now = time.monotonic()
        frozen = []
        for pid, label in self._watched():
            if _state(pid) in ("T", "t"):
                since = self._frozen.setdefault(pid, now)
                if now - since >= STOPPED_S:
                    frozen.append(label)
            else:
                self._frozen.pop(pid, None)
        if frozen:
            return (f"{self.what}: {' and '.join(frozen)} stopped running (process state T, "
                    f"SIGSTOP or a debugger) for {STOPPED_S:g} s; stopped all processes; "
                    f"{self.recorded()}")
        hung = []
        for s in self.statuses():
            key = (s.stage, s.done, s.steps_seen)
            beat = self._beats.get(s.pid)
            if beat is None or beat[0] != key:
                slowest = beat[2] if beat else 0.0
                if beat is not None and s.steps_seen > beat[0][2]:
                    slowest = max(slowest, (now - beat[1]) / (s.steps_seen - beat[0][2]))
                self._beats[s.pid] = (key, now, slowest)
                continue
            if (s.stage not in ("warmup", "timing", "profile") or s.steps_seen < 1 or s.ended
                    or not _alive(s.pid)):
                continue
            limit = max(HANG_MIN_S, HANG_FACTOR * beat[2])
            if now - beat[1] > limit:
                hung.append((s, now - beat[1], beat[2]))
        if not hung:
            return None
        low = min(_order(s) for s, _, _ in hung)
        first = [(s, idle, slow) for s, idle, slow in hung if _order(s) == low]
        names = " and ".join(s.label for s, _, _ in first)
        s, idle, slow = first[0]
        return (f"{self.what}: {names} made no progress for {idle:.0f} s in {s.where} (its "
                f"slowest step took {slow:.1f} s); stopped all processes; {self.recorded()}")

    def _watched(self) -> list[tuple[int, str]]:
        """(pid, label) of every live child and process that reported."""
        out = {c.popen.pid: c.label for c in self.children if c.code is None}
        for s in self.statuses():
            if s.pid != os.getpid() and _alive(s.pid):
                out.setdefault(s.pid, s.label)
        return list(out.items())

    def _tick(self) -> None:
        now = time.monotonic()
        for interval, fn, last in self._ticks:
            if now - last[0] >= interval:
                last[0] = now
                fn()

    def _relay(self) -> None:
        """Show the lead process's progress (each stage once per change)."""
        lead = lead_of(self.statuses())
        if lead is None:
            return
        for stage in ("warmup", "timing", "profile"):
            value = lead.extra.get("progress", {}).get(stage)
            if value and self._shown.get(stage) != value:
                self._shown[stage] = value
                self.progress(stage, int(value[0]), int(value[1]))
        if lead.converge and self._shown.get("converge") != lead.converge:  # --converge
            self._shown["converge"] = lead.converge
            self.progress("converge", int(lead.converge[0]), int(lead.converge[1]))

    # -- one-line explanations

    def dump_stacks(self) -> str:
        """Before a hung `record` run is stopped: every live process that reported writes the
        Python stacks of all its threads to the end of its log (the record worker's
        ``faulthandler`` on :data:`STACKS_SIGNAL`); what to add to the line ("" for `run`,
        whose processes are the user's)."""
        if not self.watch_progress:
            return ""
        live = [s.pid for s in self.statuses() if s.pid != os.getpid() and _alive(s.pid)
                and _state(s.pid) not in ("T", "t")]
        if not live:
            return ""
        _kill(live, STACKS_SIGNAL)
        time.sleep(STACKS_WAIT_S)
        return "; the live processes' Python stacks are at the end of their logs"

    def recorded(self) -> str:
        """What the run has written so far, in words."""
        files = [f for s in self.statuses() for f in s.native]
        return (f"{len(files)} native trace(s) recorded so far are kept in {self.folder}"
                if files else f"no profile was recorded; logs are in {self.folder}")

    def failure(self, child: Child) -> str:
        """One line: which process failed first, how, at what point, and its own error."""
        code = child.code or 0
        statuses = self.statuses()
        who, how = (child.explain or _plain)(child, code, statuses)
        status = next((s for s in statuses if s.pid == child.popen.pid), None) or _status_of(
            statuses, who)
        where = f" during {status.where}" if status else ""
        if status and str(status.role) != "worker" and status.stage == "start" and any(
                s.steps_seen for s in statuses):  # a server or scheduler never steps
            where = " while the workers trained"
        why = (status.error if status and status.error else "") or last_line(
            self.folder / log_name(status.label) if status else child.log) or (
            channel.fault_of(self.folder, status.pid) if status else "")
        return (f"{self.what}: {who} {how}{where}" + (f": {why}" if why else "")
                + disk_full(self.folder) + f"; stopped the other processes; {self.recorded()}")

    def timeout_line(self) -> str:
        """One line naming the process that made the least progress before the time limit."""
        running = [c for c in self.children if c.code is None]
        live = [s for s in self.statuses() if s.stage != "done" and s.ended is None
                and _alive(s.pid)]
        limit = f"the run passed its {self.timeout_s:g}s limit (--timeout)"
        stopped = [c.label for c in running if _state(c.popen.pid) in ("T", "t")]
        if stopped:  # frozen (SIGSTOP, a debugger): the others are only waiting for it
            return (f"{self.what}: {' and '.join(stopped)} stopped running (process state T) "
                    f"and {limit}; stopped all processes; {self.recorded()}")
        if live:
            low = min(_order(s) for s in live)
            hung = [s for s in live if _order(s) == low]
            others = [s for s in live if _order(s) != low]
            rest = "; ".join(f"{s.label} in {s.where}" for s in others)
            names = " and ".join(s.label for s in hung)
            return (f"{self.what}: {names} hung in {hung[0].where} and {limit}; stopped all "
                    f"processes" + (f" ({rest})" if rest else "") + f"; {self.recorded()}")
        names = ", ".join(c.label for c in running) or "nothing"
        return (f"{self.what}: {limit} with {names} still running; stopped all processes; "
                f"{self.recorded()}")

    # -- stopping

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop every child and everything below it (see the module docstring)."""
        tree = {c.popen.pid: descendants(c.popen.pid) for c in self.children
                if c.code is None}
        reported = [s.pid for s in self.statuses() if s.pid != os.getpid()]
        alive = [c for c in self.children if c.code is None]
        if grace_s > 0 and alive:
            for c in alive:
                self._signal(c, signal.SIGTERM, tree.get(c.popen.pid, []))
            end = time.monotonic() + grace_s
            while alive and time.monotonic() < end:
                time.sleep(POLL_S)
                alive = [c for c in alive if c.code is None]
        for c in self.children:
            self._signal(c, signal.SIGKILL, tree.get(c.popen.pid, []))
        _kill([p for p in reported if _alive(p)], signal.SIGKILL)
        for c in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(timeout=10)

    @staticmethod
    def _signal(child: Child, sig: int, below: list[int]) -> None:
        if child.own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.popen.pid, sig)
        elif child.code is None:
            _kill([child.popen.pid], sig)
        _kill([p for p in below if _alive(p)], sig)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace_s=0 if exc[0] is None else 3.0)


#: Free space below which a failure is blamed, in its line, on a full disk.
DISK_FULL_BYTES = 1 << 20


def disk_full(folder: Path) -> str:
    """``; the disk of FOLDER is full (12 KiB free)`` when it nearly is, else empty: a
    process that dies writing its trace on a full disk may say nothing itself (Kineto
    crashes)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    return (f" (the disk of {folder} is full: {free // 1024} KiB free)"
            if free < DISK_FULL_BYTES else "")


def _from_terminal() -> bool:
    """Whether opprof runs in the foreground of a terminal (a Ctrl-C there reaches its whole
    process group)."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
    return False


def progress_summary(statuses: list[Facts]) -> str:
    """``rank 0 kept 3 of 5 profiled steps; rank 1 …``: how far each process that reported
    got before the run ended, and whether its trace was written."""
    parts = []
    for s in sorted(statuses, key=lambda f: (str(f.role) != "worker", f.rank is None,
                                             f.rank or 0, f.pid)):
        if s.stage in ("start", "ready", "serving") and not s.native:
            continue  # a server, scheduler or process that never reached a step
        if s.native or s.stage in ("profile", "write", "done"):
            of = f"{s.profiled_steps} of {s.profiled_target} profiled steps"
            if s.native and not s.profiled_target:  # a server: no steps of its own
                parts.append(f"{s.label} kept its trace")
            elif s.native:
                parts.append(f"{s.label} kept {of}")
            elif s.stage == "write":
                parts.append(f"{s.label} was killed writing its trace ({of} lost)")
            elif s.ended and not s.profiled_steps:
                parts.append(f"{s.label} had completed 0 of {s.profiled_target} profiled steps")
            else:
                parts.append(f"{s.label} completed {of} but wrote no trace (killed)")
        else:
            parts.append(f"{s.label} had not started profiling ({s.where})")
    return "; ".join(parts) if parts else "no process reached a training step"


def _plain(child: Child, code: int, statuses: list[Facts]) -> tuple[str, str]:
    return child.label, describe_exit(code)


def _order(s: Facts) -> tuple[int, int]:
    return (_STAGE_ORDER.index(s.stage) if s.stage in _STAGE_ORDER else 0, s.done)


def _status_of(statuses: list[Facts], label: str) -> Facts | None:
    return next((s for s in statuses if s.label == label), None)


def lead_of(statuses: list[Facts]) -> Facts | None:
    """The process whose progress is shown: the lowest-ranked one that reports progress."""
    with_progress = [s for s in statuses if s.extra.get("progress")]
    if not with_progress:
        return None
    return min(with_progress, key=lambda s: (str(s.role) != "worker", s.rank is None,
                                             s.rank or 0, s.pid))


def log_name(label: str) -> str:
    """The log file of a process labelled ``label``: ``rank 1`` → ``rank1.log``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "", label.replace(" ", "")) + ".log"
