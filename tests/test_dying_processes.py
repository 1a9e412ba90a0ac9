"""A rank, a server or the scheduler of a real run killed (SIGKILL, SIGABRT), frozen (SIGSTOP),
hung, or killed half-way through writing its trace — before the first step, mid-profile,
while writing: the run ends within its time limit with one line naming who and how, every
process is gone, and `opprof import` of the kept folder reads what is complete."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from opprof.collectors import RecordConfig, record, supervisor
from opprof.errors import OpprofError
from tests.conftest import REPO, run_cli
from tests.faults import Fault, injected
from tests.procs import (
    assert_all_gone,
    needs,
    pids_of,
    reached,
    start_cli,
    statuses,
    wait_for,
)

SMALL = ["--batch-size", "4", "--warmup", "1", "--timing-steps", "1", "--timeout", "300"]
#: A failed run stops its processes with a grace of a few seconds (Supervisor.stop).
ENDS_WITHIN_S = 30.0


def kill_during(tmp: Path, sig: int, who: str, fw: str, model: str, *more: str,
                profiled: int | None = 1, steps: int = 12) -> tuple[str, Path]:
    """Record, and send ``sig`` to the process labelled ``who`` once some process has
    ``profiled`` profiled steps (None: as soon as ``who`` has started); (opprof's error line,
    the native folder)."""
    out = tmp / f"{model}-{fw}.trace"
    cli = start_cli("record", "--fw", fw, "--model", model, "--steps", str(steps), *SMALL,
                    *more, "-o", str(out), cwd=tmp)
    if profiled is not None:
        wait_for(reached(tmp, profiled=profiled), 400, f"{profiled} profiled step(s)", cli)
    pid = wait_for(lambda: pids_of(tmp, label=who), 400, f"{who} to start", cli)[0]
    os.kill(pid, sig)
    sent = time.monotonic()
    code = cli.wait(400)
    assert_all_gone(str(tmp), sent, within=ENDS_WITHIN_S)
    assert code == 2, cli.stderr[-3000:]
    lines = cli.lines()
    assert len(lines) == 1 and lines[0].startswith("opprof: error: "), cli.stderr[-3000:]
    assert "Traceback" not in cli.stderr
    return lines[0], tmp / f"{model}-{fw}.native"


def import_kept(native: Path, tmp: Path) -> str:
    """`opprof import` of the kept folder works; its output."""
    res = run_cli("import", str(native), "-o", str(tmp / "kept.trace"))
    assert res.returncode == 0, res.stderr
    assert run_cli("report", str(tmp / "kept.trace")).returncode == 0
    return res.stdout + res.stderr


# ------------------------------------------------------------------ killed


@pytest.mark.slow
def test_a_rank_killed_mid_profile(folder: Path) -> None:
    needs("torch")
    line, native = kill_during(folder, signal.SIGKILL, "rank 1", "torch", "resnet18",
                               "--workers", "2", "--mode", "allreduce")
    assert "torch allreduce: rank 1 was killed by SIGKILL during profile (" in line, line
    assert str(native) in line
    # rank 0 lost its peer in a collective: it keeps the steps it completed
    if list(native.glob("rank0.pt.trace.json")):
        assert "rank(s)" in import_kept(native, folder)


@pytest.mark.slow
def test_a_parameter_server_killed_mid_profile(folder: Path) -> None:
    needs("mxnet")
    line, _ = kill_during(folder, signal.SIGKILL, "server 0", "mxnet", "resnet18", "--workers",
                          "2", "--mode", "ps-sync")
    assert "mxnet ps-sync: server 0 was killed by SIGKILL" in line, line


@pytest.mark.slow
def test_the_scheduler_killed_before_the_first_step(folder: Path) -> None:
    needs("mxnet")
    line, _ = kill_during(folder, signal.SIGKILL, "scheduler", "mxnet", "lenet5", "--workers",
                          "2", "--mode", "ps-sync", profiled=None)
    assert "mxnet ps-sync: scheduler was killed by SIGKILL during start-up" in line, line
    assert "no profile was recorded" in line


@pytest.mark.slow
def test_a_tf_worker_killed_mid_profile(folder: Path) -> None:
    needs("tensorflow", "xprof")
    line, _ = kill_during(folder, signal.SIGKILL, "worker 1", "tf", "resnet18", "--workers",
                          "2", "--mode", "allreduce", steps=8)
    assert "tf allreduce: worker 1 was killed by SIGKILL during profile (" in line, line


@pytest.mark.slow
def test_a_tf_parameter_server_killed_mid_profile(folder: Path) -> None:
    needs("tensorflow", "xprof")
    line, _ = kill_during(folder, signal.SIGKILL, "ps 0", "tf", "lenet5", "--workers", "2",
                          "--mode", "ps-async", steps=60)
    assert "tf ps-async: ps 0 was killed by SIGKILL" in line, line


# ------------------------------------------------------------------ frozen and hung


@pytest.mark.slow
def test_a_frozen_rank_is_named_before_the_time_limit(folder: Path) -> None:
    needs("torch")
    t0 = time.monotonic()
    line, _ = kill_during(folder, signal.SIGSTOP, "rank 1", "torch", "resnet18", "--workers",
                          "2", "--mode", "allreduce")
    assert "torch allreduce: rank 1 stopped running (process state T, SIGSTOP or a debugger) " \
           f"for {supervisor.STOPPED_S:g} s" in line, line
    assert time.monotonic() - t0 < 300  # well before --timeout


@pytest.mark.slow
def test_a_hung_rank_is_named_when_its_progress_stops(monkeypatch: pytest.MonkeyPatch,
                                                      folder: Path) -> None:
    needs("torch")
    monkeypatch.setattr(supervisor, "HANG_MIN_S", 5.0)
    config = RecordConfig(fw="torch", model="lenet5", batch_size=4, steps=4, warmup=1,
                          timing_steps=1, timeout_s=300)
    t0 = time.monotonic()
    with pytest.raises(OpprofError) as err, injected(Fault("rank 0", "profile", "hang")):
        record(config, folder)
    assert time.monotonic() - t0 < 120
    assert "torch single: rank 0 made no progress for " in str(err.value)
    assert "in profile (0/4 steps done)" in str(err.value)  # hung as the profile began
    assert str(err.value).endswith("the live processes' Python stacks are at the end of "
                                   "their logs")
    assert_all_gone(str(folder), time.monotonic())
    # The rank's log ends with where each of its threads was: the hang itself on the main one.
    log = next(folder.rglob("rank0.log")).read_text()
    dump = log[log.rindex("Current thread"):]
    assert "in fault_point" in dump and "most recent call first" in dump


# ------------------------------------------------------------------ killed while writing


@pytest.mark.slow
def test_a_worker_killed_while_writing_its_trace(tmp_path: Path) -> None:
    """The kernel kills worker 1 half-way through writing its trace (a real file size limit,
    SIGXFSZ): the run names it, and the kept folder imports without the half-written file."""
    needs("mxnet")
    config = RecordConfig(fw="mxnet", model="lenet5", batch_size=8, steps=3, warmup=1,
                          timing_steps=1, workers=2, mode="ps-sync", timeout_s=300)
    with pytest.raises(OpprofError) as err, injected(Fault("worker 1", "write", "fsize")):
        record(config, tmp_path)
    line = str(err.value)
    assert "mxnet ps-sync: worker 1 was killed by SIGXFSZ during writing its trace" in line
    assert_all_gone(str(tmp_path), time.monotonic())
    half = [s for s in statuses(tmp_path) if s["label"] == "worker 1"][0]
    trace = tmp_path / f"rank{half['rank']}_worker.json"
    assert trace.exists() and trace.stat().st_size <= 64 * 1024  # cut at the limit
    out = import_kept(tmp_path, tmp_path)
    assert f"skipped 1 damaged file(s), read the rest: {trace}" in out
    assert "truncated JSON" in out


# ------------------------------------------------------------------ `opprof run`


@pytest.mark.slow
def test_a_rank_of_a_user_command_dying_of_sigabrt_is_named(folder: Path) -> None:
    """A torchrun rank aborting (a C++ exception in a library, gloo's "connection reset"):
    the rank has no log of its own under `opprof run`; its fatal-signal traceback names it."""
    needs("torch")
    cli = start_cli("run", "--warmup", "1", "--timing-steps", "1", "--steps", "30", "-o",
                    str(folder / "ddp.trace"), "--", sys.executable, "-m",
                    "torch.distributed.run", "--nproc-per-node", "2",
                    str(REPO / "tests" / "scripts" / "torch_ddp.py"), "--steps", "500",
                    cwd=folder)
    wait_for(reached(folder, label="rank 1", profiled=1), 300, "a profiled step", cli)
    os.kill(pids_of(folder, label="rank 1")[0], signal.SIGABRT)
    code = cli.wait(300)
    assert code != 0
    lines = cli.lines()
    died = [ln for ln in lines if ln.startswith("opprof: rank 1 (pid ")]
    assert died and "died (Fatal Python error: Aborted" in died[0], cli.stderr[-3000:]
    assert "the command exited with code 1" in cli.stderr


#: torchrun's failure summary from a real run (a rank's os._exit(3) in warmup; its time, host
#: and error_file lines left out): it named the rank it stopped, whose own gloo error was cut
#: short by its SIGTERM, as the root cause.
TORCHRUN_SUMMARY = """\
opprof.collectors.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 17202)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 17201)
"""


RESET = "RuntimeError: Read error [127.0.0.1]:29901: Connection reset by peer"


@pytest.mark.parametrize("rank0_ended, rank0_error, rank0_log", [
    ("Interrupted: terminated by SIGTERM", None, ""),  # stopped before saying why it failed
    # Stopped in the instant it began to fail: no status, only the traceback (the CI failure).
    (None, None, "[rank0]: opprof.errors.Interrupted: terminated by SIGTERM\n"),
    (RESET, RESET, f"[rank0]: {RESET}\n"),  # it lost its peer
])
def test_torchrun_root_cause_is_the_rank_that_died(tmp_path: Path, rank0_ended: str | None,
                                                   rank0_error: str | None,
                                                   rank0_log: str) -> None:
    from opprof.collectors.config import Facts
    from opprof.collectors.launch import torchrun_root_cause

    log = tmp_path / "torchrun.log"
    log.write_text(TORCHRUN_SUMMARY)
    (tmp_path / supervisor.log_name("rank 0")).write_text(rank0_log)
    child = supervisor.Child("torchrun", popen=None, log=log, own_group=False)  # type: ignore[arg-type]
    rank0 = Facts(pid=17201, host="localhost", label="rank 0", rank=0, ended=rank0_ended,
                  error=rank0_error)
    rank1 = Facts(pid=17202, host="localhost", label="rank 1", rank=1)
    assert torchrun_root_cause(child, 1, [rank0, rank1]) == ("rank 1", "exited with code 3")
