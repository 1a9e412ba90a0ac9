"""The gzip reader's second thread (opprof.gunzip.prefetch): the reader gets the same text,
only for the file it was started on and unchanged since, and damage still reads as one line."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from opprof import gunzip
from opprof.normalizers import chrome
from tests.conftest import run_cli, shared_trace


def _read(path: Path) -> bytes:
    return bytes(chrome.read_bytes(path, path.read_bytes()[:64]))


def test_prefetched_text_is_the_readers_and_taken_once(tmp_path: Path) -> None:
    src = shared_trace("alexnet-1gpu.json.gz")
    want = gzip.decompress(src.read_bytes())
    assert gunzip.prefetch(src)
    assert not gunzip.prefetch(src)  # one thread per file
    assert _read(src) == want
    assert gunzip.prefetched(src) is None  # handed out once; the reader read it above
    assert _read(src) == want  # and without a prefetch, the same


def test_a_file_changed_after_the_prefetch_is_read_again(tmp_path: Path) -> None:
    f = tmp_path / "t.json.gz"
    f.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert gunzip.prefetch(f)
    f.write_bytes(gzip.compress(b'{"traceEvents": [], "schemaVersion": 1}'))
    os.utime(f, ns=(1, 1))
    assert gunzip.prefetched(f) is None
    assert _read(f) == b'{"traceEvents": [], "schemaVersion": 1}'


def test_only_regular_gzip_files_are_prefetched(tmp_path: Path) -> None:
    plain = tmp_path / "t.json"
    plain.write_bytes(b"{}")
    fifo = tmp_path / "f.json.gz"
    os.mkfifo(fifo)
    assert not gunzip.prefetch(plain)
    assert not gunzip.prefetch(fifo)  # never opened: a FIFO would block
    assert not gunzip.prefetch(tmp_path / "missing.json.gz")
    assert not gunzip.prefetch(tmp_path)


def test_argv_names_one_report_trace(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    for f in (a, b):
        f.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    gunzip.prefetch_argv(["report", str(a), "-o", str(b)])
    assert gunzip.prefetched(b) is None and gunzip.prefetched(a) is not None
    gunzip.prefetch_argv(["report", str(a), str(b)])  # a job: its workers read the files
    gunzip.prefetch_argv(["diff", str(a)])
    assert gunzip.prefetched(a) is None


def test_damaged_gzip_is_one_line_with_the_prefetch(tmp_path: Path) -> None:
    f = tmp_path / "cut.json.gz"
    f.write_bytes(shared_trace("alexnet-1gpu.json.gz").read_bytes()[:5000])
    r = run_cli("report", str(f), "--format", "json")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "truncated or damaged gzip data" in r.stderr
    assert str(f) in r.stderr and "Traceback" not in r.stderr
