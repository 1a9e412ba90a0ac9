"""Run a job's processes locally: free loopback ports, children that die with the launcher,
stopping process groups, and one-line descriptions of how a process ended."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

LOOPBACK = "127.0.0.1"
_POLL_S = 0.05

try:  # loaded here, not in the forked child, where taking the import lock could deadlock
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (ImportError, OSError, AttributeError):  # not Linux
    _PRCTL = None


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct TCP ports nobody listens on right now (bound, read, released together)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now."""
    return free_ports(1, host)[0]


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """``preexec_fn``: on Linux the child gets SIGKILL when the launching process dies, so a
    killed launcher leaves no processes behind."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pid``; nothing if it is gone or not ours."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(procs: Iterable[subprocess.Popen], grace_s: float = 0.0) -> None:
    """Stop every process still running with its whole process group (each started with
    ``start_new_session``): SIGTERM and up to ``grace_s`` to exit when ``grace_s`` > 0, then
    SIGKILL; reap them all and kill what they left in their groups."""
    procs = list(procs)
    # A leader that has not been reaped keeps its pid, so its group id is still ours.
    alive = [p for p in procs if p.poll() is None]
    if grace_s > 0:
        for p in alive:
            signal_group(p.pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while alive and time.monotonic() < end:
            time.sleep(_POLL_S)
            alive = [p for p in alive if p.poll() is None]
    for p in alive:
        signal_group(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
        signal_group(p.pid, signal.SIGKILL)  # its own children (none normally) share its group


def describe_exit(code: int) -> str:
    """``exited with code N`` or ``was killed by SIGX``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def last_line(log: Path, skip: tuple[str, ...] = ("USDT:",)) -> str:
    """The last non-blank line of ``log`` not starting with one of ``skip`` (at most 300
    characters); empty if there is none or the log cannot be read."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    rest = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(skip)]
    return rest[-1][:300] if rest else ""
