"""Hostile files through every reader, as a user meets them: Kineto JSON (plain and gzip),
MXNet JSON, TensorFlow XPlane, nsys and nvprof SQLite, opprof's own `.trace` Parquet, folders
that mix them, names that are not UTF-8, a disk that fills and a file size limit while
writing. Each file is either read (odd but valid values coerced as pandas would) or refused
with exit code 2 and one line naming it and its problem — never a traceback, a hang, memory
without bound, or a half-written output."""

from __future__ import annotations

import gzip
import json
import os
import random
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opprof.trace import META_KEY
from tests.conftest import FIXTURES, run_cli

GOOD_EVENT = '{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, ' \
             '"ts": 10, "dur": 5}'
KINETO_FIXTURE = FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz"
MXNET_FIXTURE = FIXTURES / "mxnet" / "lenet5-single" / "rank0_worker.json.gz"
TIMEOUT_S = 120


def kineto(events: list[str], extra: str = "") -> str:
    return '{"schemaVersion": 1' + extra + ', "traceEvents": [' + ",".join(events) + "]}"


def event(**changes: str) -> str:
    """GOOD_EVENT with some fields' JSON text replaced (None: removed)."""
    fields = {"ph": '"X"', "cat": '"cpu_op"', "name": '"aten::add"', "pid": "1", "tid": "1",
              "ts": "10", "dur": "5", **changes}
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items() if v is not None) + "}"


def mxnet(events: list[tuple]) -> str:
    rows = [{"name": n, "cat": "operator", "ph": ph, "ts": ts, "pid": 0, "tid": 0}
            for n, ph, ts in events]
    return json.dumps({"traceEvents": rows, "displayTimeUnit": "ms"}).replace(
        '"__NAN__"', "NaN").replace('"__HUGE__"', "1e300")


def bomb(members: int = 1) -> bytes:
    """A small gzip file that inflates to 2 GiB of JSON text: one member compressing 2 GiB
    of spaces, or the same 16 MiB member repeated (``cat a.gz a.gz …``)."""
    head = gzip.compress(b'{"schemaVersion": 1, "traceEvents": [' + GOOD_EVENT.encode()
                         + b'], "pad": "')
    tail = gzip.compress(b'"}')
    if members > 1:
        return head + gzip.compress(b" " * (16 << 20), 9) * members + tail
    import zlib

    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = b"".join(z.compress(b" " * (16 << 20)) for _ in range(128)) + z.flush()
    return head + body + tail


# ------------------------------------------------------------------ one file each

#: case → (file name, content, what the one-line error must say)
REFUSED: dict[str, tuple[str, Callable[[], bytes | str], str]] = {
    # Kineto JSON: structure
    "deep nesting": ("deep.json.gz", lambda: kineto(
        [GOOD_EVENT], ', "x": ' + "[" * 200_000 + "]" * 200_000), "nested too deeply"),
    "deep nesting in args": ("deep_args.json.gz", lambda: kineto(
        ['{"ph": "X", "args": {"Input Dims": ' + "[" * 50_000 + "]" * 50_000 + "}}"]),
        "nested too deeply"),
    "deep nesting of objects": ("deep_obj.json", lambda: kineto(
        [GOOD_EVENT], ', "x": ' + '{"a":' * 100_000 + "1" + "}" * 100_000),
        "nested too deeply"),
    "events not a list": ("events5.json", lambda: '{"traceEvents": 5, "schemaVersion": 1}',
                          "not a valid"),
    "events null": ("events_null.json", lambda: '{"schemaVersion": 1, "traceEvents": null}',
                    "not a valid chrome trace"),
    "event not an object": ("ints.json", lambda: kineto(["1", "2"]), "not a valid"),
    "events all null": ("nulls.json", lambda: kineto(["null", "null"]), "not a valid"),
    "args not an object": ("args.json", lambda: kineto(
        ['{"ph": "X", "ts": 1, "args": [1]}']), "not a valid"),
    "top level a string": ("string.json", lambda: '"hello"', "top level is a JSON string"),
    "bare number": ("twelve.json", lambda: "12", "not a known trace format"),
    # Kineto JSON: numbers
    "NaN literal": ("nan.json", lambda: kineto([event(ts="NaN")]), "malformed JSON"),
    "Infinity literal": ("inf.json", lambda: kineto([event(ts="Infinity")]), "malformed JSON"),
    "number beyond float": ("e999.json", lambda: kineto([event(ts="1e999")]),
                            "Number out of range"),
    "timestamp an object": ("ts_obj.json", lambda: kineto([event(ts='{"a": 1}')]),
                            "no usable events (1 events skipped: timestamp missing"),
    "timestamp text": ("ts_text.json", lambda: kineto([event(ts='"ten"')]),
                       "no usable events (1 events skipped: timestamp missing"),
    "timestamp missing": ("no_ts.json", lambda: kineto([event(ts=None)]),
                          "no usable events (1 events skipped: timestamp missing"),
    "timestamp huge": ("ts_huge.json", lambda: kineto([event(ts="1e300")]),
                       "out of range"),
    "duration beyond int64": ("dur_big.json", lambda: kineto([event(
        dur="123456789012345678901234567890")]), "out of range"),
    "time near the end of int64": ("ts_edge.json", lambda: kineto([event(
        ts="9223372036854775", dur="9223372036854775")]), "out of range"),
    "base time out of range": ("base.json", lambda: kineto(
        [GOOD_EVENT], ', "baseTimeNanoseconds": 1e300'), "baseTimeNanoseconds out of range"),
    "clock offset out of range": ("clock.json", lambda: kineto(
        [GOOD_EVENT], ', "opprofClock": {"offset_ns": 1e300}'), "clock offset out of range"),
    "no complete events": ("no_x.json", lambda: kineto(['{"ph": "i", "ts": 1}']),
                           "no complete events"),
    "phase a number": ("ph7.json", lambda: kineto([event(ph="7")]), "no complete events"),
    # Kineto JSON: text and bytes
    "invalid utf-8": ("utf8.json", lambda: kineto([event(name='"\xff\xfe"')]).encode(
        "latin-1"), "JSON"),
    "lone surrogate": ("surrogate.json", lambda: kineto([event(name='"\\ud800x"')]),
                       "malformed JSON"),
    "utf-16 text": ("utf16.json", lambda: kineto([GOOD_EVENT]).encode("utf-16"),
                    "not JSON"),
    "binary garbage": ("garbage.json", lambda: random.Random(1).randbytes(5000), "not JSON"),
    "zero bytes": ("nul.json", lambda: b"\x00" * 4096, "not JSON"),
    "gzip garbage": ("garbage.json.gz", lambda: b"\x1f\x8b" + random.Random(2).randbytes(
        4000), "damaged gzip"),
    "gzip of nothing": ("nothing.json.gz", lambda: gzip.compress(b""), "file is empty"),
    "gzip bomb": ("bomb.json.gz", bomb, "decompression bomb"),
    "gzip bomb of many members": ("bombs.json.gz", lambda: bomb(members=128),
                                  "decompression bomb"),
    # MXNet JSON
    "mxnet without complete events": ("mx_b.json", lambda: mxnet(
        [("Convolution", "B", 1)]), "MXNet trace with no complete events"),
    "mxnet timestamp text": ("mx_ts.json", lambda: mxnet(
        [("Convolution", "B", "x"), ("Convolution", "E", 2)]),
        "1 events skipped: timestamp missing"),
    "mxnet times out of range": ("mx_huge.json", lambda: mxnet(
        [("Convolution", "B", "__HUGE__"), ("Convolution", "E", "__HUGE__")]),
        "MXNet trace with no usable events"),
    # TensorFlow XPlane
    "xplane garbage": ("host.xplane.pb", lambda: random.Random(3).randbytes(3000),
                       "not a readable XPlane"),
    "xplane empty": ("empty.xplane.pb", lambda: b"", "file is empty"),
    "xplane zeros": ("zeros.xplane.pb", lambda: b"\x00" * 100, "not a readable XPlane"),
    # SQLite
    "sqlite damaged": ("damaged.sqlite", lambda: b"SQLite format 3\x00" + random.Random(
        4).randbytes(5000), "a SQLite file but not an nsys or nvprof export"),
}

#: case → (file name, content): odd but valid files that are read.
READ: dict[str, tuple[str, Callable[[], bytes | str]]] = {
    "name a list, pid text, tid a float, huge pid": ("odd.json", lambda: kineto([
        GOOD_EVENT, event(name='["a", 1]', pid='"Spans"', tid="2.5", ts="20", dur="1"),
        event(cat='"kernel"', name='"k"', pid="1180591620717411303424", tid="7", ts="30",
              dur='2, "args": {"correlation": "x", "device": [0]}')])),
    "duplicate keys, base time text": ("dup.json", lambda: kineto(
        [GOOD_EVENT, GOOD_EVENT.replace('"ts": 10', '"ts": 10, "ts": 12')],
        ', "baseTimeNanoseconds": "soon", "distributedInfo": {"rank": "zero"}')),
    "a 5 MB operator name": ("long.json", lambda: kineto([event(name='"' + "a" * 5_000_000
                                                                + '"')])),
    "duration missing or text": ("dur.json", lambda: kineto([GOOD_EVENT, event(
        dur=None, ts="20"), event(dur='"five"', ts="30")])),
    # an event named by an object is skipped and counted (nothing to classify it by); the
    # file's other events are read
    "name an object, category a list": ("types.json", lambda: kineto([GOOD_EVENT, event(
        name='{"a": 1}', cat="[1, 2]")])),
    "rank text, negative or beyond int32": ("ranks.json", lambda: kineto(
        [GOOD_EVENT], ', "distributedInfo": {"rank": 99999999999999999999, "world_size": -3}')),
    "200k top-level keys": ("keys.json", lambda: '{"schemaVersion": 1, "traceEvents": ['
        + GOOD_EVENT + "], " + ", ".join(f'"k{i}": {i}' for i in range(200_000)) + "}"),
    "a UTF-8 byte-order mark": ("bom.json", lambda: b"\xef\xbb\xbf" + kineto(
        [GOOD_EVENT]).encode()),
}


def write(tmp: Path, name: str, content: bytes | str) -> Path:
    data = content.encode() if isinstance(content, str) else content
    path = tmp / name
    if name.endswith(".gz") and not data.startswith(b"\x1f\x8b"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def cli(*args: str, cwd: Path, limit: Callable[[], None] | None = None
        ) -> tuple[int, str, str]:
    """The real CLI in a process of its own, within TIMEOUT_S: (exit code, stdout, stderr).
    ``limit`` runs in the child before opprof starts (a resource limit)."""
    try:
        res = subprocess.run([sys.executable, "-m", "opprof", *args], cwd=cwd, text=True,
                             errors="replace", capture_output=True, preexec_fn=limit,
                             timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"opprof {' '.join(args)} hung past {TIMEOUT_S} s") from None
    return res.returncode, res.stdout, res.stderr


def assert_refused(code: int, err: str, path: Path | str, message: str, tmp: Path) -> None:
    """Exit 2, one line naming the file and the problem, no traceback, nothing written."""
    lines = err.strip().splitlines()
    assert code == 2, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"opprof: error: {path}"), lines[0]
    assert message in lines[0], lines[0]
    assert "Traceback" not in err
    assert not list(tmp.glob("out.trace*")) and not list(tmp.glob(".out.trace*"))


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_hostile_file_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    name, content, message = REFUSED[case]
    path = write(tmp_path, name, content())
    code, _, err = cli("import", path.name, "-o", "out.trace", cwd=tmp_path)
    assert_refused(code, err, path.name, message, tmp_path)


@pytest.mark.parametrize("case", sorted(READ))
def test_odd_but_valid_file_is_read(case: str, tmp_path: Path) -> None:
    name, content = READ[case]
    path = write(tmp_path, name, content())
    code, out, err = cli("import", path.name, "-o", "out.trace", cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert "wrote out.trace" in out and "Traceback" not in err


def test_a_gzip_bomb_is_stopped_with_little_memory(tmp_path: Path) -> None:
    path = write(tmp_path, "bomb.json.gz", bomb())  # 2 GiB of text in 2 MB
    code, _, err = cli("report", path.name, cwd=tmp_path,
                          limit=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                                           (2 << 30, 2 << 30)))
    # Under a 2 GiB address-space limit, inflating it whole would fail with MemoryError.
    assert_refused(code, err, path.name, "decompression bomb", tmp_path)


def test_a_file_larger_than_memory_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: 1 TiB that takes no disk
        f.truncate(1 << 40)
    code, _, err = cli("report", path.name, cwd=tmp_path)
    assert_refused(code, err, path.name, "is more than this machine can decode now", tmp_path)


# ------------------------------------------------------------------ SQLite exports


def _sqlite(path: Path, statements: list[str]) -> Path:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("case, statements, message", [
    ("nsys tables without their columns", [
        "create table StringIds(id text)", "create table CUPTI_ACTIVITY_KIND_KERNEL(a)",
        "insert into CUPTI_ACTIVITY_KIND_KERNEL values ('x')"], "damaged nsys export"),
    ("nvprof tables without their columns", [
        "create table StringTable(x)", "create table CUPTI_ACTIVITY_KIND_RUNTIME(a, b)",
        "insert into CUPTI_ACTIVITY_KIND_RUNTIME values ('x', 1e400)"],
        "damaged nvprof export"),
    ("another program's database", ["create table t(x)"],
     "a SQLite file but not an nsys or nvprof export (tables: t)"),
])
def test_foreign_or_damaged_sqlite(case: str, statements: list[str], message: str,
                                   tmp_path: Path) -> None:
    path = _sqlite(tmp_path / "a?b#c%d.sqlite", statements)  # URI characters in the name
    code, _, err = cli("import", path.name, "-o", "out.trace", cwd=tmp_path)
    assert_refused(code, err, path.name, message, tmp_path)


# ------------------------------------------------------------------ opprof's .trace


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("good") / "good.trace"
    res = run_cli("import", str(KINETO_FIXTURE), "-o", str(out))
    assert res.returncode == 0, res.stderr
    return out


def _variant(good: Path, tmp: Path, case: str) -> Path:
    table = pq.read_table(good)
    meta = json.loads(table.schema.metadata[META_KEY])
    path = tmp / f"{case.replace(' ', '_')}.trace"

    def write_table(t: pa.Table, md: dict | None = None) -> Path:
        pq.write_table(t.replace_schema_metadata(md if md is not None else t.schema.metadata),
                       path)
        return path

    def column(name: str, values: pa.Array) -> pa.Table:
        return table.set_column(table.schema.get_field_index(name), name, values)

    n, data = table.num_rows, good.read_bytes()
    if case == "metadata not JSON":
        return write_table(table, {META_KEY: b"{not json"})
    if case == "metadata a list":
        return write_table(table, {META_KEY: b"[1, 2]"})
    if case == "metadata nested too deeply":
        return write_table(table, {META_KEY: b"[" * 100_000 + b"]" * 100_000})
    if case == "a newer format":
        return write_table(table, {META_KEY: json.dumps({**meta, "format_version": 99})})
    if case == "step bounds not integers":
        return write_table(table, {META_KEY: json.dumps({**meta, "step_bounds": [["a"]]})})
    if case == "a column missing":
        return write_table(table.drop(["dur"]))
    if case == "a column of the wrong type":
        return write_table(column("ts", pa.array(["x"] * n)))
    if case == "a phase opprof does not know":
        return write_table(column("phase", pa.array(["bogus"] * n).dictionary_encode()))
    if case == "missing timestamps":
        return write_table(column("ts", pa.array([None] * n, pa.int64())))
    if case == "ranks beyond int32":
        return write_table(column("rank", pa.array([2**40] * n, pa.int64())))
    if case == "truncated footer":
        path.write_bytes(data[:-100])
    elif case == "cut in half":
        path.write_bytes(data[: len(data) // 2])
    elif case == "magic bytes only":
        path.write_bytes(b"PAR1")
    elif case == "footer length beyond the file":
        path.write_bytes(data[:-8] + (2**31 - 1).to_bytes(4, "little") + data[-4:])
    elif case == "corrupt pages":
        path.write_bytes(data[:200] + bytes(b ^ 0xFF for b in data[200:600]) + data[600:])
    return path


TRACE_CASES = {
    "metadata not JSON": "damaged opprof metadata",
    "metadata a list": "damaged opprof metadata (not a JSON object)",
    "metadata nested too deeply": "damaged opprof metadata (nested too deeply)",
    "a newer format": "is newer than this opprof reads",
    "step bounds not integers": "step_bounds is not a list",
    "a column missing": "lacks columns ['dur']",
    "a column of the wrong type": "column ts is string, not int64",
    "a phase opprof does not know": "column phase holds values opprof does not know: bogus",
    "missing timestamps": "column ts has",
    "ranks beyond int32": "column rank holds values beyond int32",
    "truncated footer": "unreadable Parquet file",
    "cut in half": "unreadable Parquet file",
    "magic bytes only": "unreadable Parquet file",
    "footer length beyond the file": "unreadable Parquet file",
    "corrupt pages": "damaged opprof trace",
}


@pytest.mark.parametrize("case", sorted(TRACE_CASES))
def test_damaged_trace_file_is_refused(case: str, good_trace: Path, tmp_path: Path) -> None:
    path = _variant(good_trace, tmp_path, case)
    for args in (["report", path.name], ["export", path.name, "--to", "chrome", "-o",
                                         "out.trace.json"]):
        code, _, err = cli(*args, cwd=tmp_path)
        assert_refused(code, err, path.name, TRACE_CASES[case], tmp_path)
        assert not list(tmp_path.glob("*out.trace.json*"))


def test_diff_names_the_damaged_side(good_trace: Path, tmp_path: Path) -> None:
    path = _variant(good_trace, tmp_path, "cut in half")
    code, _, err = cli("diff", str(good_trace), path.name, cwd=tmp_path)
    assert_refused(code, err, path.name, "unreadable Parquet file", tmp_path)


# ------------------------------------------------------------------ folders and names


def test_a_folder_with_a_half_written_rank_reads_the_rest(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    good = gzip.decompress(KINETO_FIXTURE.read_bytes())
    (run / "rank0.pt.trace.json").write_bytes(good)
    (run / "rank1.pt.trace.json").write_bytes(good[: len(good) // 3])  # killed writing it
    for cmd in (["import", "run", "-o", "out.trace"], ["report", "run"]):
        code, out, err = cli(*cmd, cwd=tmp_path)
        assert code == 0, err
        lines = [ln for ln in err.strip().splitlines() if ln.startswith("opprof:")]
        assert len(lines) == 1 and lines[0].startswith(
            "opprof: skipped 1 damaged file(s), read the rest: run/rank1.pt.trace.json "
            "(truncated JSON"), err
    trace = pq.read_table(tmp_path / "out.trace")
    assert set(trace.column("rank").to_pylist()) == {0}
    meta = json.loads(trace.schema.metadata[META_KEY])
    assert [d["path"] for d in meta["damaged_files"]] == ["run/rank1.pt.trace.json"]


def test_a_folder_of_damaged_files_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.pt.trace.json").write_text('{"traceEvents": [')
    (run / "rank1.pt.trace.json").write_bytes(b"")
    code, _, err = cli("import", "run", "-o", "out.trace", cwd=tmp_path)
    assert_refused(code, err, "run/rank", "(and 1 more damaged file(s))", tmp_path)


def test_duplicated_ranks_stay_apart(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    doc = kineto([GOOD_EVENT], ', "distributedInfo": {"rank": 3}')
    (run / "a.json").write_text(doc)
    (run / "b.json").write_text(doc)
    code, _, err = cli("import", "run", "-o", "out.trace", cwd=tmp_path)
    assert code == 0, err
    assert sorted(set(pq.read_table(tmp_path / "out.trace").column("rank").to_pylist())) == [3, 4]


@pytest.mark.parametrize("case, message", [
    ("kineto and mxnet", "mixed native formats in one import: kineto: a.json; mxnet: b.json.gz"),
    ("a .trace among native files", "cannot be mixed with native traces"),
    ("an xplane among JSON files", "cannot be mixed with other formats"),
    ("no trace files", "folder holds no trace files"),
])
def test_folders_mixing_formats(case: str, message: str, good_trace: Path,
                                tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if case != "no trace files":
        (run / "a.json").write_text(kineto([GOOD_EVENT]))
    else:
        (run / "notes.txt").write_text("hello")
    if case == "kineto and mxnet":
        (run / "b.json.gz").write_bytes(MXNET_FIXTURE.read_bytes())
    elif case == "a .trace among native files":
        shutil.copy(good_trace, run / "b.json")  # Parquet under a JSON name
    elif case == "an xplane among JSON files":
        (run / "host.xplane.pb").write_bytes(b"\x00" * 10)
    code, _, err = cli("import", "run", "-o", "out.trace", cwd=tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out.trace").exists()


def test_a_folder_holding_one_trace_is_that_trace(good_trace: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.json").write_text(kineto([GOOD_EVENT]))  # a native file beside it is left
    shutil.copy(good_trace, run / "mine.trace")
    code, out, err = cli("report", "run", "--format", "json", cwd=tmp_path)
    assert code == 0, err
    whole = cli("report", str(good_trace), "--format", "json", cwd=tmp_path)[1]
    assert json.loads(out)["meta"] == json.loads(whole)["meta"]
    shutil.copy(good_trace, run / "other.trace")
    code, _, err = cli("report", "run", cwd=tmp_path)
    assert code == 2 and "holds 2 opprof traces (mine.trace, other.trace)" in err


def test_symlink_loops_in_a_folder_are_not_followed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "deep").mkdir(parents=True)
    (run / "rank0.json").write_text(kineto([GOOD_EVENT]))
    (run / "deep" / "up").symlink_to("..")
    (run / "loop1").symlink_to("loop2")
    (run / "loop2").symlink_to("loop1")
    code, out, err = cli("import", "run", "-o", "out.trace", cwd=tmp_path)
    assert code == 0 and "1 rank(s)" in out, err


def test_names_that_are_not_utf8(tmp_path: Path) -> None:
    root = os.fsencode(tmp_path)
    good = root + b"/r\xff\xfe.json"
    bad = root + b"/bad\xff.json"
    with open(good, "w") as f:
        f.write(kineto([GOOD_EVENT]))
    with open(bad, "wb") as f:
        f.write(b"\x00garbage")
    out = os.fsdecode(root + b"/o\xff.trace")
    exported = os.fsdecode(root + b"/e\xff.json")
    code, _, err = cli("import", os.fsdecode(good), "-o", out, cwd=tmp_path)
    assert code == 0, err
    for args in (["report", out], ["export", out, "--to", "chrome", "-o", exported]):
        code, _, err = cli(*args, cwd=tmp_path)
        assert code == 0 and "Traceback" not in err, err
    code, _, err = cli("report", os.fsdecode(bad), cwd=tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not JSON" in err, err
    assert err.startswith(f"opprof: error: {tmp_path}/bad")  # the name, its odd byte escaped


# ------------------------------------------------------------------ writing: no room


def _fsize_limit(size: int) -> Callable[[], None]:
    """A real file size limit for the child: a write past it fails with EFBIG (SIGXFSZ
    ignored, as a shell with ``ulimit -f`` and a trap does)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return limit


@pytest.mark.parametrize("args", [
    ["import", str(KINETO_FIXTURE), "-o", "out.trace"],
    ["import", str(MXNET_FIXTURE.parent), "-o", "out.trace"],
    ["export", "GOOD", "--to", "chrome", "-o", "out.trace.json"],
    ["export", "GOOD", "--to", "perfetto", "-o", "out.trace.pftrace"],
    ["export", "GOOD", "--to", "csv", "-o", "out.trace.csv"],
], ids=["import kineto", "import mxnet", "export chrome", "export perfetto", "export csv"])
def test_a_file_size_limit_while_writing(args: list[str], good_trace: Path,
                                         tmp_path: Path) -> None:
    args = [str(good_trace) if a == "GOOD" else a for a in args]
    code, _, err = cli(*args, cwd=tmp_path, limit=_fsize_limit(4096))
    assert_refused(code, err, args[-1], "cannot be written (File too large", tmp_path)
    assert "nothing was written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _full_disk_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k none "
                            "/mnt 2>/dev/null || mount -t tmpfs -o size=64k none /tmp"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.parametrize("args", [
    ["import", str(KINETO_FIXTURE), "-o", "DISK/out.trace"],
    ["export", "GOOD", "--to", "chrome", "-o", "DISK/out.trace.json"],
], ids=["import", "export"])
def test_a_full_disk_while_writing(args: list[str], good_trace: Path, tmp_path: Path) -> None:
    """A real full file system: an 8 KiB tmpfs mounted in a user namespace (no root);
    skipped where unprivileged user namespaces are off."""
    if not _full_disk_works():
        pytest.skip("cannot mount a small tmpfs here (unprivileged user namespaces off)")
    disk = tmp_path / "disk"
    disk.mkdir()
    args = [str(good_trace) if a == "GOOD" else a.replace("DISK", str(disk)) for a in args]
    script = (f"mount -t tmpfs -o size=8k none {disk} || exit 99; {sys.executable} -m "
              "opprof " + " ".join(f"'{a}'" for a in args) + f" >/dev/null; code=$?; "
              f"ls -A {disk}; exit $code")
    res = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True,
                         text=True, timeout=TIMEOUT_S, cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert res.stdout.strip() == ""  # nothing left on the full disk, not even a temporary
    assert lines[0].startswith(f"opprof: error: {args[-1]}: cannot be written (No space "
                               "left on device"), lines[0]
    assert "Traceback" not in res.stderr


def test_a_duration_whose_end_is_past_int64_is_dropped_not_wrapped() -> None:
    """A damaged `.trace` can hold a duration so large that its end passes int64 and wraps
    round to a time before its start: such an event is outside the trace's span (dropped
    and counted), never placed on the timeline with its end before its start."""
    from opprof.drops import timeline_problems

    ts = np.array([10**18, 10**18 + 5, 10**18 + 9], np.int64)
    dur = np.array([100, 8_985_195_556_438_212_612, 3], np.int64)
    negative, outside = timeline_problems(ts, dur)
    assert not negative.any()
    assert outside.tolist() == [False, True, False]


def test_an_operator_table_of_events_overlapping_in_part_ends() -> None:
    """Own durations (each operator less the counted ones inside it) on a lane whose events
    overlap only in part (ends wrapped past int64 in a damaged trace) are computed in finite
    time: the events nothing encloses end the loop."""
    import pandas as pd

    from opprof.analysis.ops import own_durations

    ev = pd.DataFrame({"rank": 0, "pid": 1, "tid": 1,
                       "ts": np.array([8, 72, 97], np.int64) + 10**18,
                       "dur": np.array([8223372036854775830, 8223372036854775809, 41],
                                       np.int64)})
    with np.errstate(over="ignore"):
        assert len(own_durations(ev)) == 3


def test_a_byte_not_utf8_around_the_events_is_said(tmp_path: Path) -> None:
    """A flipped byte in a key of the fields around the events (a device's properties) loses
    that field as one in an event would: the report says so (⚠, `meta.read_warnings`)."""
    doc = json.loads(gzip.decompress(KINETO_FIXTURE.read_bytes()))
    doc["deviceProperties"] = [{"id": 0, "name": "GPU"}]
    text = json.dumps(doc).encode().replace(b'"name": "GPU"', b'"n\xffme": "GPU"', 1)
    path = tmp_path / "t.json"
    path.write_bytes(text)
    r = run_cli("report", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    warned = json.loads(r.stdout)["meta"]["read_warnings"]
    assert warned == {"bytes of JSON text not UTF-8 outside the events (the fields holding "
                      "them unread)": 1}
    assert r.stderr.count("⚠") == 1
