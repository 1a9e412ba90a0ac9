"""A parameter-server job whose worker dies, or hangs, ends with one clear OpprofError within
its time limit, keeps the traces already written and leaves no process behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from tests.procs import needs  # (before the imports it guards)

needs("mxnet")

from opprof.collectors import RecordConfig, channel, record, supervisor  # noqa: E402
from opprof.collectors.runner import FAULT_PAUSE_S  # noqa: E402
from opprof.errors import OpprofError  # noqa: E402
from tests.faults import Fault, injected  # noqa: E402


def job_processes(workdir: Path) -> list[tuple[int, str]]:
    """(pid, DMLC role) of every live process of the job run in ``workdir`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = [c.decode(errors="replace") for c in (d / "cmdline").read_bytes().split(b"\0")]
            if "opprof.collectors.worker" not in args or os.readlink(d / "cwd") != str(workdir):
                continue
            if (d / "stat").read_text().rsplit(") ", 1)[-1].startswith("Z"):
                continue  # exited, not yet reaped
            env = dict(v.split(b"=", 1) for v in (d / "environ").read_bytes().split(b"\0")
                       if b"=" in v)
        except OSError:
            continue
        out.append((int(d.name), env.get(b"DMLC_ROLE", b"").decode()))
    return out


def run_in_thread(workdir: Path, timeout_s: float,
                  fault: Fault | None = None) -> tuple[threading.Thread, dict]:
    config = RecordConfig(fw="mxnet", model="lenet5", batch_size=8, steps=2, warmup=1,
                          timing_steps=1, workers=2, mode="ps-sync", timeout_s=timeout_s)
    out: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            with injected(fault):
                record(config, workdir)
        except OpprofError as exc:
            out["error"] = str(exc)
        out["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def wait_for(predicate, limit: float = 60.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def test_a_dead_worker_ends_the_job_at_once(tmp_path: Path) -> None:
    thread, out = run_in_thread(tmp_path, timeout_s=120)
    workers = wait_for(lambda: [p for p, role in job_processes(tmp_path) if role == "worker"])
    os.kill(workers[0], signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive()
    assert "mxnet ps-sync: worker " in out["error"] and "was killed by SIGKILL" in out["error"]
    assert str(tmp_path) in out["error"]
    assert out["seconds"] < 60
    assert job_processes(tmp_path) == []


def test_a_frozen_scheduler_is_named_before_the_time_limit(tmp_path: Path) -> None:
    limit_s = 120.0
    # Worker 1 pauses FAULT_PAUSE_S seconds after its first profiled step, so the job cannot
    # end before the test acts, however fast or loaded the machine (freezing the scheduler
    # right after a progress report raced the end of a short job). Once a worker has started
    # its profile the scheduler is frozen: the workers then wait for it (at the latest at the
    # job's final barrier); the supervisor names it once it has been stopped (state T) for
    # STOPPED_S seconds, well before the run's time limit and before the pause ends, and says
    # what was recorded. The "profile" progress entry stays once set (no poll can miss it).
    assert supervisor.STOPPED_S + 10 < FAULT_PAUSE_S < supervisor.HANG_MIN_S
    thread, out = run_in_thread(tmp_path, timeout_s=limit_s,
                                fault=Fault("worker 1", "profile", "pause"))

    def profiling() -> bool:
        return any("profile" in s.extra.get("progress", {}) for s in channel.read_all(tmp_path))

    wait_for(profiling, limit=limit_s)
    scheduler = [p for p, role in job_processes(tmp_path) if role == "scheduler"]
    assert len(scheduler) == 1
    stopped_at = time.monotonic()
    os.kill(scheduler[0], signal.SIGSTOP)
    thread.join(limit_s)
    assert not thread.is_alive()
    assert (f"mxnet ps-sync: scheduler stopped running (process state T, SIGSTOP or a debugger) "
            f"for {supervisor.STOPPED_S:g} s; stopped all processes; ") in out["error"], out
    assert str(tmp_path) in out["error"]
    assert out["seconds"] < limit_s
    # named by the stopped-process watch, not by the time limit: soon after the freeze
    assert time.monotonic() - stopped_at < supervisor.STOPPED_S + 30
    assert job_processes(tmp_path) == []
