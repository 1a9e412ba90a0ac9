"""The gzip reader's second thread (opprof.gunzip.prefetch), handed to the reader in an
opprof.preread.Ahead: the reader gets the same text, only for the file it was started on and
unchanged since, and damage still reads as one line."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from opprof import gunzip
from opprof.normalizers import chrome
from opprof.preread import Ahead
from tests.conftest import run_cli, shared_trace


def _read(path: Path, ahead: Ahead | None = None) -> bytes:
    return bytes(chrome.read_bytes(path, path.read_bytes()[:64], ahead))


def _ahead(path: Path) -> Ahead:
    text = gunzip.prefetch(path)
    ident = gunzip.file_identity(path)
    assert text is not None and ident is not None
    return Ahead(ident, text=text)


def test_prefetched_text_is_the_readers_and_taken_once(tmp_path: Path) -> None:
    src = shared_trace("alexnet-1gpu.json.gz")
    want = gzip.decompress(src.read_bytes())
    ahead = _ahead(src)
    assert _read(src, ahead) == want
    assert ahead.text(src) is None  # handed out once; the reader read it above
    assert _read(src, ahead) == want  # and without a prefetch, the same


def test_a_file_changed_after_the_prefetch_is_read_again(tmp_path: Path) -> None:
    f = tmp_path / "t.json.gz"
    f.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    ahead = _ahead(f)
    f.write_bytes(gzip.compress(b'{"traceEvents": [], "schemaVersion": 1}'))
    os.utime(f, ns=(1, 1))
    assert ahead.text(f) is None
    assert _read(f, ahead) == b'{"traceEvents": [], "schemaVersion": 1}'
    ahead.close()


def test_the_prefetch_is_only_for_the_file_it_was_started_on(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    a.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    b.write_bytes(gzip.compress(b'{"traceEvents": [], "schemaVersion": 1}'))
    ahead = _ahead(a)
    assert _read(b, ahead) == b'{"traceEvents": [], "schemaVersion": 1}'
    assert _read(a, ahead) == b'{"traceEvents": []}' and ahead.text(a) is None


def test_only_regular_gzip_files_are_prefetched(tmp_path: Path) -> None:
    plain = tmp_path / "t.json"
    plain.write_bytes(b"{}")
    fifo = tmp_path / "f.json.gz"
    os.mkfifo(fifo)
    assert gunzip.prefetch(plain) is None
    assert gunzip.prefetch(fifo) is None  # never opened: a FIFO would block
    assert gunzip.prefetch(tmp_path / "missing.json.gz") is None
    assert gunzip.prefetch(tmp_path) is None


def test_damaged_gzip_is_one_line_with_the_prefetch(tmp_path: Path) -> None:
    f = tmp_path / "cut.json.gz"
    f.write_bytes(shared_trace("alexnet-1gpu.json.gz").read_bytes()[:5000])
    r = run_cli("report", str(f), "--format", "json")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "truncated or damaged gzip data" in r.stderr
    assert str(f) in r.stderr and "Traceback" not in r.stderr
