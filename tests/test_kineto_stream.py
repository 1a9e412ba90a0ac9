"""The streaming Kineto reader (``kineto.stream``): it reads a trace as its text streams in,
never holding the text whole, and gives exactly what the whole-text reader gives — the same
events table and metadata, for every real trace, every piece and chunk size, every detail
setting — or hands the file to the whole-text reader (None) when it cannot be sure.
"""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

from opprof import gunzip
from opprof.errors import OpprofError
from opprof.normalizers import chrome, head_bytes, kineto
from tests.conftest import FIXTURES, KINETO_GPU, fixture_file
from tests.fuzzing import json_cases

SOURCES = [
    FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz",
    FIXTURES / "torch-ddp" / "lenet5-gloo-2steps-rank1.pt.trace.json.gz",
    FIXTURES / "torch-collectives" / "rank0.pt.trace.json.gz",
    FIXTURES / "memory" / "torch-lenet5" / "rank0.pt.trace.json.gz",  # allocator samples
    FIXTURES / "unmarked" / "torch-loop" / "rank0.pt.trace.json.gz",
    *(KINETO_GPU / n for n in ("alexnet-1gpu.json.gz", "amd-mi250-toy-train.json.gz",
                               "compiled-triton-1gpu.json.gz", "cpu-only-gloo-rank34.json.gz",
                               "sampled-128rank-rank0.json.gz")),  # one line, compact
]


def _whole(path: Path, detail: bool) -> tuple | str:
    """What the whole-text reader gives: (events, info) or its error line."""
    try:
        doc = kineto.decode(chrome.read_bytes(path, head_bytes(path)), path)
        if doc is None or not kineto.claims_json(doc):
            return "not kineto"
        return kineto.rank_trace(path, doc, kineto.declared_rank(doc, 0), {}, detail)
    except OpprofError as exc:
        return str(exc)


def _streamed(path: Path, detail: bool) -> tuple | str | None:
    doc = kineto.stream(path, head_bytes(path), detail)
    if doc is None:
        return None
    try:
        return kineto.rank_trace(path, doc, kineto.declared_rank(doc, 0), {}, detail)
    except OpprofError as exc:
        return str(exc)


def _assert_same(path: Path, detail: bool, must_stream: bool = True) -> bool:
    """The streamed read equals the whole-text one (True), or was handed over (False)."""
    got = _streamed(path, detail)
    if got is None:
        assert not must_stream, f"{path} was not streamed"
        return False
    want = _whole(path, detail)
    if isinstance(got, str) or isinstance(want, str):  # the same refusal, word for word
        assert got == want
        return True
    pd.testing.assert_frame_equal(got[0].events, want[0].events)
    assert got[0].meta == want[0].meta
    assert got[1] == want[1]
    return True


def _sources() -> list[Path]:
    return [fixture_file(s) for s in SOURCES]


@pytest.mark.parametrize("detail", [True, False])
def test_every_real_trace_streams_to_the_whole_text_readers_table(detail: bool) -> None:
    for src in _sources():
        _assert_same(src, detail)


def test_any_piece_and_chunk_size_gives_the_same_table(monkeypatch, tmp_path: Path) -> None:
    """Pieces cut anywhere (inside names, numbers, between events) and chunks of any size:
    the events are typed in the whole-text reader's chunks, so every column is the same."""
    plain = tmp_path / "alexnet.json"
    plain.write_bytes(gzip.decompress(fixture_file(KINETO_GPU / "alexnet-1gpu.json.gz")
                                      .read_bytes()))
    for piece, chunk in [(97, 5), (1000, 64), (4096, 4096), (1 << 16, 333)]:
        monkeypatch.setattr(gunzip, "STREAM_PIECE", piece)
        monkeypatch.setattr(gunzip, "AHEAD", 4 * piece)
        monkeypatch.setattr(kineto, "CHUNK", chunk)
        _assert_same(plain, detail=False)
        _assert_same(SOURCES[1], detail=True)


def _doc(src: Path) -> dict:
    return json.loads(gzip.decompress(src.read_bytes()))


def _layouts(tmp_path: Path) -> list[tuple[str, Path, bool]]:
    """(what, file, streamed) of the same trace written in ways JSON allows, and in ways
    the streaming reader hands to the whole-text one."""
    doc = _doc(SOURCES[2])
    events = doc.pop("traceEvents")
    out = []

    def put(name: str, text: bytes, streams: bool) -> None:
        p = tmp_path / f"{name}.json"
        p.write_bytes(text)
        out.append((name, p, streams))

    body = json.dumps(events).encode()
    head = json.dumps(doc).encode()[:-1]
    put("events last", head + b', "traceEvents": ' + body + b"}", True)
    # Kineto's fields after the events (a trace written again by another tool, as
    # TraceLens's are): streamed, its first events being Kineto's by their categories
    put("events first, fields after", b'{"traceEvents": ' + body + b", " + head[1:] + b"}",
        True)
    put("other fields, events, then Kineto's", b'{"metadata": {"a": [1, {"b": 2}]}, '
        b'"traceEvents": ' + body + b", " + head[1:] + b"}", True)
    foreign = [{**e, "cat": "operator"} for e in events]
    put("events first, none of Kineto's categories", b'{"traceEvents": '
        + json.dumps(foreign).encode() + b", " + head[1:] + b"}", False)  # read whole
    put("indented", json.dumps({**doc, "traceEvents": events}, indent=3).encode(), True)
    put("byte-order mark", b"\xef\xbb\xbf" + head + b',"traceEvents":' + body + b"}", True)
    nested = [{**e, "args": {**e.get("args", {}), "list": [{"a": 1}, {"b": [2, {}]}]}}
              for e in events]
    put("objects in lists in args", head + b', "traceEvents": '
        + json.dumps(nested).encode() + b"}", True)
    tricky = [{**e, "name": e["name"] + ' }, { "traceEvents": [ ] \u00e9\u4e2d'}
              if e.get("ph") == "X" else e for e in events]
    put("braces, brackets and UTF-8 in names", head + b', "traceEvents": '
        + json.dumps(tricky, ensure_ascii=False).encode() + b"}", True)
    put("a second event array after", head + b', "traceEvents": ' + body
        + b', "traceEvents": []}', False)
    put("not UTF-8 in a key", head + b', "traceEvents": ' + body.replace(
        b'"name"', b'"na\xffme"', 1) + b"}", False)
    put("trailing garbage", head + b', "traceEvents": ' + body + b"}x", False)
    put("truncated", (head + b', "traceEvents": ' + body)[:-300], False)
    put("no events", head + b', "traceEvents": []}', True)  # the same refusal
    return out


@pytest.mark.parametrize("piece", [1 << 20, 333])
def test_json_layouts_stream_or_are_read_whole(piece: int, monkeypatch,
                                               tmp_path: Path) -> None:
    """(Small pieces cut the text between nested objects too: the reader tries the cuts
    before them.)"""
    monkeypatch.setattr(gunzip, "STREAM_PIECE", piece)
    for name, path, streams in _layouts(tmp_path):
        assert _assert_same(path, True, must_stream=False) == streams, name


def test_mutated_traces_stream_only_as_the_whole_text_reader_reads_them(
        tmp_path: Path) -> None:
    """Value mutations (unusable durations, times, ids, ranks) stream with the same drops
    and warnings; damage (cuts, flipped bytes, zeroed runs) streams only where the
    whole-text reader reads the file the same, else it is handed over."""
    rng = random.Random(7)
    streamed = 0
    for src in _sources()[:3]:
        for case in json_cases(src, tmp_path, rng, n_values=12, n_bytes=12):
            streamed += _assert_same(case.paths[0], False, must_stream=False)
    assert streamed >= 30


def _peak(read) -> tuple[object, int]:  # noqa: ANN001 (a callable)
    tracemalloc.start()
    try:
        out = read()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_text_is_never_held_whole(monkeypatch) -> None:
    """Python's allocations while a trace streams in stay under the size of its text (the
    pieces in flight, one chunk of typed events, the columns so far) and under half of what
    the whole-text reader holds."""
    src = fixture_file(KINETO_GPU / "nccl-2rank-rank0.json.gz")
    text = len(gzip.decompress(src.read_bytes()))
    monkeypatch.setattr(gunzip, "STREAM_PIECE", 1 << 16)
    monkeypatch.setattr(gunzip, "AHEAD", 1 << 18)
    doc, streamed = _peak(lambda: kineto.stream(src, head_bytes(src), False))
    assert doc is not None and doc.streamed is not None
    _, whole = _peak(lambda: kineto.decode(chrome.read_bytes(src, head_bytes(src)), src))
    assert streamed < text and streamed < whole / 2, (streamed, whole, text)
