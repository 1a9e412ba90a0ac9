"""Work run beside the process (opprof.beside): a function computed in a forked child gives
what it gives here — its result, or its error — and anything wrong with the child (it fails,
it is killed, its result is not wanted) falls back to computing it here; the report pipeline
that uses it gives the same report, critical path and advice with and without the child.

The checks that need a child run in a new interpreter (``fresh``): a process forks only
while no other thread runs in it, and the test process may hold threads other tests left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from opprof import beside
from opprof.errors import OpprofError

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
#: The process the checks run in (a child's pid differs).
HERE = os.getpid()


def fresh(check: str, *args: str) -> None:
    """Run ``check(*args)`` of this module in a new interpreter with a child whatever the
    load (``$OPPROF_BESIDE=1``), failing with its error."""
    code = f"from tests.test_beside import {check}; {check}(*{list(args)!r})"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, env={**os.environ, beside.ENV: "1"}, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]


def _ended(pid: int) -> None:
    """The child ``pid`` ended and was reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"the child {pid} still runs or was not reaped")


def _pid() -> int:
    return os.getpid()


def _fails_in_the_child() -> str:
    if os.getpid() != HERE:
        raise RuntimeError("only in the child")
    return "here"


def _killed_in_the_child() -> str:
    if os.getpid() != HERE:
        os.kill(os.getpid(), signal.SIGKILL)
    return "here"


def _unpicklable() -> object:
    return lambda: None  # (a lambda does not pickle: the child sends a failure)


def _bad_input() -> None:
    raise OpprofError("the file is truncated", path=Path("x.json"))


def check_the_result_comes_from_a_child() -> None:
    pending = beside.start(_pid)
    pid = pending.pid
    assert pid is not None
    assert pending.result() == pid != os.getpid()
    _ended(pid)


def check_a_failing_child_is_replaced_by_computing_here() -> None:
    for fn in (_fails_in_the_child, _killed_in_the_child):
        assert fn() == "here"  # (HERE is this process)
        pending = beside.start(fn)
        assert pending.pid is not None
        assert pending.result() == "here", fn
    pending = beside.start(_unpicklable)
    assert pending.pid is not None
    assert callable(pending.result())


def check_an_error_is_the_same_as_computed_here() -> None:
    pending = beside.start(_bad_input)
    assert pending.pid is not None
    try:
        pending.result()
        raise AssertionError("no error")
    except OpprofError as exc:
        assert "truncated" in str(exc)


def check_a_result_not_wanted_ends_the_child() -> None:
    pending = beside.start(lambda: threading.Event().wait(60))
    pid = pending.pid
    assert pid is not None
    pending.close()
    _ended(pid)


def _stuck_in_the_child() -> str:
    if os.getpid() != HERE:
        threading.Event().wait()  # (as a child stuck on a lock would)
    return "here"


def check_a_stuck_child_is_ended_and_computed_here() -> None:
    beside.MIN_WAIT_S, beside.WAIT_FACTOR = 0.5, 1.0
    pending = beside.start(_stuck_in_the_child)
    pid = pending.pid
    assert pid is not None
    assert pending.result() == "here"
    _ended(pid)


def check_no_child_while_a_thread_runs() -> None:
    assert beside.wanted()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not beside.wanted()
        assert beside.start(_pid).pid is None
    finally:
        stop.set()
        t.join()
    assert beside.wanted()


def check_the_html_reports_analysis_is_the_same_with_and_without_the_child(
        path: str) -> None:
    """The page's report (every view's JSON, its critical path) and advice, computed with
    the baseline and tables in a child and all here."""
    from opprof.pipeline.report import ReportOptions, report
    from opprof.render.jsonfmt import report as report_json

    started = []
    start = beside.start

    def recorded(fn):  # type: ignore[no-untyped-def]
        pending = start(fn)
        started.append(pending.pid is not None)
        return pending

    beside.start = recorded  # type: ignore[assignment]
    got = {}
    for setting in ("1", "0"):
        os.environ[beside.ENV] = setting
        r = report(ReportOptions((Path(path),), fmt="html"))
        assert r.advice is not None
        got[setting] = ({by: report_json(r.report, by) for by in ("phase", "op", "comm",
                                                                  "critical", "rank")},
                        r.advice.to_dict())
    assert started == [True, False], started
    assert got["1"] == got["0"]
    assert got["1"][0]["critical"]  # the page's critical path is there


@pytest.mark.parametrize("check", ["check_the_result_comes_from_a_child",
                                   "check_a_failing_child_is_replaced_by_computing_here",
                                   "check_an_error_is_the_same_as_computed_here",
                                   "check_a_result_not_wanted_ends_the_child",
                                   "check_a_stuck_child_is_ended_and_computed_here",
                                   "check_no_child_while_a_thread_runs"])
def test_work_beside(check: str) -> None:
    fresh(check)


def test_without_a_child_it_is_computed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(beside.ENV, "0")
    pending = beside.start(_pid)
    assert pending.pid is None
    assert pending.result() == os.getpid()


@pytest.mark.parametrize("path", [FIXTURES / "shared" / "kineto-gpu" / "nccl-2rank-rank0.json.gz",
                                  FIXTURES / "torch-parallel" / "fsdp-tp",
                                  FIXTURES / "gpu" / "compiled-cudagraphs.pt.trace.json.gz"],
                         ids=lambda p: p.name)
def test_the_html_reports_analysis_is_the_same_with_and_without_the_child(path: Path) -> None:
    fresh("check_the_html_reports_analysis_is_the_same_with_and_without_the_child", str(path))
