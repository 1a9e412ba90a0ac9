"""Run one measurement in a fresh process: wall time and peak memory of it and its children.

Peak memory is the largest sum, over the process and every descendant alive at the same time
(so a pool's workers count together), of each one's proportional set size (PSS: its private
memory plus its share of pages it shares with others — forked workers share their parent's
imported libraries, which a plain sum of RSS would count once per process), sampled every
20 ms with psutil. Where PSS cannot be read, RSS is used.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass


@dataclass
class Measured:
    """One run: wall seconds, peak bytes (tree), exit status, the output's last line, and
    the CPU seconds (user + system) it and its waited-for children spent: on a loaded
    machine the wall time mostly says how busy the machine was, the CPU time what the
    program costs."""

    wall_s: float
    peak_bytes: int
    rc: int
    out: str
    cpu_s: float = float("nan")
    #: the largest resident set of the process itself (not its children), sampled as the
    #: tree's PSS is: PSS shares library pages with every other process that maps them
    #: (other programs running the same pandas lower it), RSS counts them whole
    rss_bytes: int = 0
    #: the most processes seen at once in its tree (a second process, a pool's workers)
    procs: int = 1


def _tree_rss(proc) -> tuple[int, int, int]:  # noqa: ANN001 (psutil.Process)
    """(PSS of the process and its descendants, RSS of the process itself, processes)."""
    import psutil

    total = own = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0, 0, 0
    for p in procs:
        try:
            info = p.memory_full_info()
            total += info.pss
            own = info.rss if p is proc else own
        except (psutil.Error, AttributeError):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
    return total, own, len(procs)


def run(cmd: list[str], env: dict | None = None, cwd: str | None = None,
        timeout: float | None = None, memory: bool = True) -> Measured:
    """Run ``cmd``; time it and watch its memory (``memory=False``: time it only — the
    watcher reads every process's smaps every 20 ms, a share of a core that a command using
    both cores loses)."""
    import resource

    import psutil

    peak = peak_own = most = 0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})}, cwd=cwd)
    ps = psutil.Process(p.pid)
    done = threading.Event()

    def watch() -> None:
        nonlocal peak, peak_own, most
        while not done.is_set():
            tree, own, n = _tree_rss(ps)
            peak, peak_own, most = max(peak, tree), max(peak_own, own), max(most, n)
            done.wait(0.02)

    t = threading.Thread(target=watch, daemon=True)
    if memory:
        t.start()
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        done.set()
        if memory:
            t.join()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        sys.stderr.write(err[-2000:])
    lines = out.strip().splitlines()
    return Measured(wall, peak, p.returncode, lines[-1] if lines else "", cpu, peak_own,
                    most)


def load_line() -> str:
    """The machine's load averages and cores, to print beside timings."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"
