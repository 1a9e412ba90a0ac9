"""`opprof report FILE`'s second process (opprof.readahead): it reads the trace without
importing pandas while the report's modules are imported, and the report is the same as
without it, byte for byte — for a Kineto trace it streams, a trace of another format, a
damaged file; a child whose document nobody takes does not outlive the command."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opprof import readahead
from tests.conftest import FIXTURES, run_cli, shared_trace

KINETO = FIXTURES / "torch-ddp" / "lenet5-gloo-2steps-rank0.pt.trace.json.gz"
MXNET = FIXTURES / "mxnet" / "lenet5-single" / "rank0_worker.json.gz"


def _report(path: Path, *args: str, readahead_on: bool) -> subprocess.CompletedProcess:
    return run_cli("report", str(path), *args,
                   env={"OPPROF_READAHEAD": "1" if readahead_on else "0"})


@pytest.mark.parametrize("args", [("--format", "json"), ("--by", "comm", "--format", "md"),
                                  ()])
def test_the_report_is_the_same_with_the_second_process(args: tuple[str, ...]) -> None:
    for path in (KINETO, MXNET):
        on, off = (_report(path, *args, readahead_on=x) for x in (True, False))
        assert on.returncode == off.returncode == 0, on.stderr
        assert on.stdout == off.stdout and on.stderr == off.stderr


def test_a_damaged_file_is_the_same_one_line(tmp_path: Path) -> None:
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(KINETO.read_bytes()[:4000])
    bad = tmp_path / "bad.json"
    bad.write_bytes(gzip.decompress(KINETO.read_bytes())[:-200])
    for path in (cut, bad):
        on, off = (_report(path, "--format", "json", readahead_on=x) for x in (True, False))
        assert on.returncode == off.returncode == 2
        assert on.stderr == off.stderr and on.stderr.count("\n") == 1, on.stderr


def test_the_child_reads_without_pandas() -> None:
    src = shared_trace("alexnet-1gpu.json.gz")
    code = ("import sys; from opprof import readahead; "
            f"doc = readahead._read(__import__('pathlib').Path({str(src)!r})); "
            "assert doc is not None and doc.streamed is not None, doc; "
            "assert 'pandas' not in sys.modules and 'pyarrow' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('pandas', 'pyarrow')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_only_one_json_file_is_read_ahead(tmp_path: Path) -> None:
    """What the report command parsed decides, not the command line re-read: one path, a
    regular file of JSON or gzip."""
    plain = tmp_path / "t.json"
    plain.write_bytes(b'{"traceEvents": []}')
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    assert readahead.report_file([KINETO]) == str(KINETO)
    assert readahead.report_file([str(plain)]) == str(plain)
    assert readahead.report_file([KINETO, plain]) is None  # a job: its workers read the files
    assert readahead.report_file([fifo]) is None  # never opened
    assert readahead.report_file([tmp_path]) is None
    assert readahead.report_file([FIXTURES / "README.md"]) is None
    assert readahead.report_file([]) is None


def test_the_handle_is_taken_once_and_only_for_its_file(tmp_path: Path) -> None:
    other = tmp_path / "other.json.gz"
    other.write_bytes(KINETO.read_bytes())
    ahead = readahead.start([KINETO])
    assert ahead is not None
    try:
        assert ahead.document(other, False) is None and ahead.text(other) is None
        assert ahead.document(KINETO, True) is None  # read without the detail column
        got = ahead.document(KINETO, False) if ahead.child else ahead.text(KINETO)
        assert got is not None
        assert ahead.document(KINETO, False) is None and ahead.text(KINETO) is None
    finally:
        ahead.close()


def test_a_child_nobody_takes_ends_with_the_command() -> None:
    code = ("from opprof import readahead; "
            f"ahead = readahead.start([{str(KINETO)!r}]); "
            "print(ahead.child.pid, flush=True)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "OPPROF_READAHEAD": "1"})
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"the read-ahead child {pid} outlived its command")


def test_the_setting_turns_it_off_or_on_whatever_the_load(monkeypatch) -> None:
    monkeypatch.setenv("OPPROF_READAHEAD", "0")
    ahead = readahead.start([KINETO])  # no second process: the gzip text inflating
    assert ahead is not None and ahead.child is None and ahead.text(KINETO) is not None
    ahead.close()
    monkeypatch.setenv("OPPROF_READAHEAD", "1")
    ahead = readahead.start([KINETO])
    assert ahead is not None and ahead.child is not None
    ahead.close()
    assert isinstance(readahead.core_free(), bool)
