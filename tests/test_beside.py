"""Work run beside the process (opprof.beside): a function computed in a forked child gives
what it gives here — its result, or its error — and anything wrong with the child (it fails,
it is killed, its result is not wanted) falls back to computing it here; the report pipeline
that uses it gives the same report, critical path and advice with and without the child."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from opprof import beside
from opprof.errors import OpprofError
from opprof.pipeline.report import ReportOptions, report
from opprof.render.jsonfmt import report as report_json
from tests.conftest import FIXTURES

HERE = os.getpid()


@pytest.fixture
def child(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child whatever the machine's load."""
    monkeypatch.setenv(beside.ENV, "1")


def _pid() -> int:
    return os.getpid()


def test_the_result_comes_from_a_child(child: None) -> None:
    pending = beside.start(_pid)
    pid = pending.pid
    assert pid is not None
    assert pending.result() == pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ended and reaped


def test_without_a_child_it_is_computed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(beside.ENV, "0")
    pending = beside.start(_pid)
    assert pending.pid is None
    assert pending.result() == os.getpid()


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


@pytest.mark.parametrize("fn", [_fails_in_the_child, _killed_in_the_child],
                         ids=["fails", "killed"])
def test_a_child_that_fails_or_dies_is_replaced_by_computing_here(child: None, fn) -> None:
    assert fn() == "here"  # (HERE is this process: the test runs in it)
    pending = beside.start(fn)
    assert pending.pid is not None
    assert pending.result() == "here"


def test_a_result_that_does_not_pickle_is_computed_here(child: None) -> None:
    pending = beside.start(_unpicklable)
    assert pending.pid is not None
    assert callable(pending.result())


def _bad_input() -> None:
    raise OpprofError("the file is truncated", path=Path("x.json"))


def test_an_error_is_the_same_as_computed_here(child: None) -> None:
    pending = beside.start(_bad_input)
    with pytest.raises(OpprofError, match="truncated"):
        pending.result()


def test_a_result_not_wanted_ends_the_child(child: None) -> None:
    pending = beside.start(lambda: threading.Event().wait(60))
    pid = pending.pid
    assert pid is not None
    pending.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ended and reaped


def test_no_child_while_a_thread_runs(child: None) -> None:
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


@pytest.mark.parametrize("path", [FIXTURES / "shared" / "kineto-gpu" / "nccl-2rank-rank0.json.gz",
                                  FIXTURES / "torch-parallel" / "fsdp-tp",
                                  FIXTURES / "gpu" / "compiled-cudagraphs.pt.trace.json.gz"],
                         ids=lambda p: p.name)
def test_the_html_reports_analysis_is_the_same_with_and_without_the_child(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's report (every view's JSON, its critical path) and advice, computed with
    the baseline and tables in a child and all here."""
    started = []
    start = beside.start

    def recorded(fn):  # type: ignore[no-untyped-def]
        pending = start(fn)
        started.append(pending.pid is not None)
        return pending

    monkeypatch.setattr(beside, "start", recorded)
    got = {}
    for setting in ("1", "0"):
        monkeypatch.setenv(beside.ENV, setting)
        r = report(ReportOptions((path,), fmt="html"))
        assert r.advice is not None
        got[setting] = ({by: report_json(r.report, by) for by in ("phase", "op", "comm",
                                                                  "critical", "rank")},
                        r.advice.to_dict())
    assert started == [True, False]
    assert got["1"] == got["0"]
    assert got["1"][0]["critical"]  # the page's critical path is there
