"""Helpers for tests that send real signals to real runs: start the CLI as a user does, wait
for a process of the run to reach a point (its status in the run folder), find every process
a run left (from /proc), send signals."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def needs(*modules: str) -> None:
    """Fail the calling test (or module) when one of ``modules`` is not installed: every
    package a test imports is declared in pyproject.toml's extras, so a missing one is a
    broken install, never a reason to skip."""
    import pytest

    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.fail(f"needs {m}, which pyproject.toml declares: "
                        "pip install -e '.[all]' -c constraints.txt", pytrace=False)


#: How long every process of an interrupted run may take to be gone (the issue's bound).
GONE_WITHIN_S = 5.0


@dataclass
class Cli:
    """A running `opprof` command line, its output going to files."""

    popen: subprocess.Popen
    cwd: Path
    out: Path
    err: Path

    def wait(self, timeout: float = 600) -> int:
        return self.popen.wait(timeout=timeout)

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def lines(self) -> list[str]:
        """opprof's own lines on stderr (not the frameworks' or torchrun's)."""
        return [ln for ln in self.stderr.splitlines() if ln.startswith("opprof:")]

    def signal(self, sig: int) -> float:
        """Send ``sig`` to opprof; when it was sent (monotonic)."""
        os.kill(self.popen.pid, sig)
        return time.monotonic()


def start_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Cli:
    """``python -m opprof ARGS`` in ``cwd``, in a session of its own (a signal the test sends
    reaches opprof alone, as `kill` or a scheduler would)."""
    out, err = cwd / "opprof.out", cwd / "opprof.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        popen = subprocess.Popen([sys.executable, "-m", "opprof", *args], cwd=cwd, stdout=o,
                                 stderr=e, stdin=subprocess.DEVNULL, start_new_session=True,
                                 env={**os.environ, **(env or {})})
    return Cli(popen, cwd, out, err)


def statuses(folder: Path) -> list[dict]:
    """Every status in a run folder (or below it: bench cells), as dicts."""
    out = []
    for path in Path(folder).rglob("procs/*.status"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def wait_for(test: Callable[[], object], limit: float, what: str, cli: Cli | None = None):
    """Poll ``test`` until it returns something true (returned); fail after ``limit`` s or
    when ``cli`` ended first."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        got = test()
        if got:
            return got
        if cli is not None and cli.popen.poll() is not None:
            raise AssertionError(f"opprof ended (code {cli.popen.returncode}) before {what}:\n"
                                 f"{cli.stderr[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def reached(folder: Path, label: str | None = None, profiled: int | None = None,
            stage: str | None = None) -> Callable[[], dict | None]:
    """A test for :func:`wait_for`: a process (labelled ``label``, any when None) whose status
    shows ``profiled`` steps profiled or is at ``stage``."""
    def test() -> dict | None:
        for s in statuses(folder):
            if label is not None and s.get("label") != label:
                continue
            if profiled is not None and s.get("profiled_steps", 0) < profiled:
                continue
            if stage is not None and s.get("stage") != stage:
                continue
            return s
        return None
    return test


def run_processes(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line or working directory
    holds ``marker`` (a test's own folder: parallel tests never see each other's)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
            stat = Path(entry.path, "stat").read_text()
            cwd = os.readlink(Path(entry.path, "cwd"))
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue  # exited, not yet reaped by its parent
        if marker in cmd or cwd.startswith(marker):
            out.append((int(entry.name), cmd))
    return out


def pids_of(folder: Path, label: str | None = None, role: str | None = None) -> list[int]:
    """The pids that reported in a run folder (of one label or role)."""
    return [s["pid"] for s in statuses(folder)
            if (label is None or s.get("label") == label)
            and (role is None or s.get("role") == role)]


def load_factor() -> float:
    """How much slower than an idle machine a process runs now: the 1-minute load average per
    core, at least 1 (a bound of the issue's holds on a machine that is not busier than its
    cores; on a busier one every process gets that much less of a core)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def assert_all_gone(marker: str, since: float, within: float = GONE_WITHIN_S) -> float:
    """Every process of the run (``marker``: its folder) is gone within ``within`` s of
    ``since`` (stretched by :func:`load_factor` on a machine busier than its cores); how long
    it took."""
    within = within * load_factor()
    end = since + within
    while True:
        left = run_processes(marker)
        if not left:
            return time.monotonic() - since
        if time.monotonic() > end:
            for pid, _ in left:  # leave nothing behind for the next test
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"processes still alive {within} s after the signal: {left}")
        time.sleep(0.05)


def free_leftovers(marker: str) -> None:
    """Kill what a failed test left (only processes of this test's own folder)."""
    for pid, _ in run_processes(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
