"""Deterministic mutations of real traces of every format, and the check each must pass:
read (with a ⚠ read warning when the mutation made a value unusable) or refused in one line
naming the file — never a traceback, a hang or memory without bound.

Used by ``tests/test_fuzz_reader.py`` (a few hundred cases, in-process) and by
``benchmarks/fuzz_reader.py`` (more, every format, a summary)."""

from __future__ import annotations

import gzip
import json
import random
import resource
import shutil
import signal
import sqlite3
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
SHARED = FIXTURES / "shared"  # HTA's and Pipit's traces (fixtures/README.md)

#: (label, source) of the JSON traces mutated: Kineto (torch, DDP, shared GPU traces), MXNet.
KINETO_SOURCES = [FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz",
                  FIXTURES / "torch-ddp" / "lenet5-gloo-2steps-rank0.pt.trace.json.gz",
                  SHARED / "kineto-gpu" / "alexnet-1gpu.json.gz",
                  SHARED / "kineto-gpu" / "amd-mi250-toy-train.json.gz"]
MXNET_SOURCE = FIXTURES / "mxnet" / "lenet5-single" / "rank0_worker.json.gz"
NSYS_SOURCE = SHARED / "nsys" / "saxpy-mpi-cuda.sqlite"
XPLANE_SOURCE = next((FIXTURES / "tf" / "lenet5-allreduce-2w" / "worker0").rglob(
    "*.xplane.pb"), None)

#: A value that no reader can use, per field: each must give a ⚠ line or a refusal.
BAD_DUR = ["abc", None, -5, -1e6, 1e300, [1], {"a": 1}, True]
BAD_TS = [-1e6, -1e12, "x", None, 1e300, [2]]
BAD_ID = [1.5, -2.5]
BAD_RANK = ["one", 1e12, -1, 2.5]


@dataclass
class Case:
    """One mutated input: its files, what was done, and whether a ⚠ or refusal is owed."""

    name: str
    paths: list[Path]
    must_warn: bool  # the mutation made a value unusable: a ⚠ line or a refusal is owed


@dataclass
class Result:
    """What reading a case gave: ``ok`` (with its read warnings), ``refused`` (one line),
    or a failure: ``traceback``, ``hang``, ``multi-line``, ``silent`` (must_warn, yet read
    with no warning), ``unnamed`` (a refusal that names no file)."""

    case: Case
    outcome: str
    detail: str = ""
    warnings: dict | None = None


def _load_json(path: Path) -> dict:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        return json.load(f)


def _write(doc: dict | bytes, path: Path) -> Path:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, 1)
    path.write_bytes(data)
    return path


def _complete(events: list) -> list[int]:
    return [i for i, e in enumerate(events) if isinstance(e, dict) and e.get("ph") == "X"]


def json_cases(src: Path, out: Path, rng: random.Random, n_values: int,
               n_bytes: int, mxnet: bool = False) -> Iterator[Case]:
    """Value mutations (each owes a warning) and byte/structure damage of one JSON trace."""
    doc = _load_json(src)
    raw = json.dumps(doc).encode()
    events = doc["traceEvents"]
    xs = _complete(events) or [i for i, e in enumerate(events) if e.get("ph") in ("B", "E")]
    stem = src.name.split(".")[0]
    suffix = ".json" if mxnet else ".json.gz"
    fname = (lambda k: f"{k}_{stem}/rank0_worker.json") if mxnet else (
        lambda k: f"{k}_{stem}{suffix}")

    def put(tag: str, d: dict | bytes, must: bool) -> Case:
        p = out / fname(tag)
        p.parent.mkdir(parents=True, exist_ok=True)
        return Case(f"{src.name}: {tag}", [_write(d, p)], must)

    k = 0
    fields = [("dur", BAD_DUR), ("ts", BAD_TS), ("pid", BAD_ID), ("tid", BAD_ID)]
    if mxnet:
        fields = [("ts", ["negative", "x", None, 1e300])]
    for _ in range(n_values):
        field_, values = rng.choice(fields)
        value = rng.choice(values)
        d = json.loads(raw)
        i = rng.choice(xs)
        if value == "negative":  # a time since the epoch made negative
            value = -abs(d["traceEvents"][i][field_] or 1)
        d["traceEvents"][i][field_] = value
        yield put(f"v{k}_{field_}", d, True)
        k += 1
    # a flipped byte in an object key (not UTF-8): that field would be lost without a word
    keys = [m for m in range(len(raw)) if raw[m:m + 7] == b'"name":']
    for j in range(3):
        m = keys[rng.randrange(len(keys))] + 2
        yield put(f"key{j}", raw[:m] + b"\xff" + raw[m + 1:], True)
    if not mxnet:
        for value in BAD_RANK:
            d = json.loads(raw)
            d["distributedInfo"] = {**(d.get("distributedInfo") or {}), "rank": value}
            yield put(f"rank_{value}", d, True)
        steps = [i for i, e in enumerate(events) if str(e.get("name", "")).startswith(
            "ProfilerStep#")]
        if steps:
            d = json.loads(raw)
            d["traceEvents"][steps[0]]["dur"] = -1
            yield put("badstep", d, True)
        d = json.loads(raw)
        for i in _complete(d["traceEvents"]):
            d["traceEvents"][i]["dur"] = "unusable"
        yield put("alldur", d, True)
    # damage: truncation, flipped bytes, an event deleted (no warning owed, no crash allowed)
    for j in range(n_bytes):
        what = rng.choice(["truncate", "flip", "flip", "zero"])
        b = bytearray(raw)
        at = rng.randrange(len(b))
        if what == "truncate":
            b = b[:at]
        elif what == "flip":
            b[at] ^= 1 << rng.randrange(8)
        else:
            b[at:at + 64] = b"\x00" * len(b[at:at + 64])
        yield put(f"{what}{j}", bytes(b), False)
    if not mxnet:
        gz = gzip.compress(raw, 1)
        p = out / f"gztrunc_{stem}.json.gz"
        p.write_bytes(gz[: len(gz) // 2])
        yield Case(f"{src.name}: gzip cut in half", [p], False)


def nsys_cases(src: Path, out: Path, rng: random.Random) -> Iterator[Case]:
    """nsys exports with rows ending before they start, an empty StringIds table, a table
    dropped, and damaged pages."""
    def copy(tag: str) -> Path:
        p = out / f"{tag}.sqlite"
        shutil.copyfile(src, p)
        return p

    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                  "CUPTI_ACTIVITY_KIND_MEMCPY"):
        p = copy(f"backwards_{table}")
        with sqlite3.connect(p) as con:
            con.execute(f'UPDATE "{table}" SET "end" = start - 1000 WHERE rowid IN '
                        f'(SELECT rowid FROM "{table}" LIMIT 2)')
        yield Case(f"nsys: end < start in {table}", [p], True)
    p = copy("nvtx_backwards")
    with sqlite3.connect(p) as con:
        con.execute('UPDATE NVTX_EVENTS SET "end" = start - 5 WHERE "end" IS NOT NULL AND '
                    'rowid IN (SELECT rowid FROM NVTX_EVENTS WHERE "end" IS NOT NULL LIMIT 1)')
    yield Case("nsys: NVTX range ending before it starts", [p], True)
    p = copy("nostrings")
    with sqlite3.connect(p) as con:
        con.execute("DELETE FROM StringIds")
    yield Case("nsys: empty StringIds", [p], False)
    p = copy("nokernels")
    with sqlite3.connect(p) as con:
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    yield Case("nsys: kernel table dropped", [p], False)
    data = src.read_bytes()
    for j in range(6):
        b = bytearray(data)
        at = rng.randrange(4096, len(b))
        b[at:at + 512] = rng.randbytes(len(b[at:at + 512]))
        p = out / f"pages{j}.sqlite"
        p.write_bytes(bytes(b))
        yield Case(f"nsys: 512 random bytes at {at}", [p], False)
    p = out / "cut.sqlite"
    p.write_bytes(data[: len(data) // 3])
    yield Case("nsys: cut to a third", [p], False)


def trace_cases(src: Path, out: Path, rng: random.Random, n: int) -> Iterator[Case]:
    """opprof `.trace` Parquet files with negative durations or wild times (owed a warning)
    and with damaged bytes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    meta = table.schema.metadata
    rows = table.num_rows
    for j in range(n):
        col = rng.choice(["dur", "ts"])
        values = table.column(col).to_numpy().copy()
        at = rng.sample(range(rows), rng.randint(1, 3))
        values[at] = -rng.randint(1, 10**6) if col == "dur" else -(10**15)
        t = table.set_column(table.schema.get_field_index(col), col, pa.array(values))
        p = out / f"{col}{j}.trace"
        pq.write_table(t.replace_schema_metadata(meta), p)
        yield Case(f".trace: {len(at)} {col} made negative", [p], True)
    t = table.set_column(table.schema.get_field_index("dur"), "dur",
                         pa.array(np.full(rows, -1, np.int64)))
    p = out / "alldur.trace"
    pq.write_table(t.replace_schema_metadata(meta), p)
    yield Case(".trace: every duration negative", [p], True)
    data = src.read_bytes()
    for j in range(4):
        b = bytearray(data)
        at = rng.randrange(8, len(b) - 8)
        b[at] ^= 0xFF
        p = out / f"flip{j}.trace"
        p.write_bytes(bytes(b))
        yield Case(f".trace: byte {at} flipped", [p], False)


def xplane_cases(src: Path, out: Path, rng: random.Random, n: int) -> Iterator[Case]:
    """XPlane files with negative event durations (owed a warning), and damaged bytes.
    Needs TensorFlow's XPlane protobuf."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    data = src.read_bytes()
    for j in range(n):
        space = xplane_pb2.XSpace()
        space.ParseFromString(data)
        evs = [e for p in space.planes if p.name.startswith("/host") for ln in p.lines
               for e in ln.events if e.duration_ps > 0]
        for e in rng.sample(evs, rng.randint(1, 3)):
            e.duration_ps = -e.duration_ps
        d = out / f"neg{j}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / "host.xplane.pb"
        p.write_bytes(space.SerializeToString())
        yield Case("xplane: negative durations", [p], True)
    for j in range(2):
        b = bytearray(data)
        at = rng.randrange(len(b))
        b[at:at + 32] = rng.randbytes(len(b[at:at + 32]))
        d = out / f"flip{j}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / "host.xplane.pb"
        p.write_bytes(bytes(b))
        yield Case(f"xplane: 32 random bytes at {at}", [p], False)


class _Hang(Exception):
    pass


def check(case: Case, time_limit_s: int = 60) -> Result:
    """Read ``case`` as ``opprof report`` does (in this process) and judge the outcome."""
    from opprof.errors import OpprofError
    from opprof.files import shown
    from opprof.job import report

    def alarm(sig: int, frame: object) -> None:
        raise _Hang

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(time_limit_s)
    try:
        rep = report([str(p) for p in case.paths], jobs=1)
    except OpprofError as exc:
        text = shown(f"opprof: error: {exc}")
        if "\n" in text:
            return Result(case, "multi-line", text)
        named = any(str(p) in str(exc) or p.name in str(exc) or str(p.parent) in str(exc)
                    for p in case.paths)
        return Result(case, "refused" if named else "unnamed", text)
    except _Hang:
        return Result(case, "hang", f"past {time_limit_s} s")
    except Exception:  # noqa: BLE001 - any other exception is the failure looked for
        return Result(case, "traceback", traceback.format_exc(limit=-3))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    warnings = rep.meta.get("read_warnings") or {}
    if case.must_warn and not warnings:
        return Result(case, "silent", "read with no ⚠ line", warnings)
    return Result(case, "ok", "", warnings)


FAILURES = ("traceback", "hang", "multi-line", "silent", "unnamed")


def peak_rss_bytes() -> int:
    """This process's peak resident memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_trace(out: Path) -> Path:
    """An opprof `.trace` imported from the DDP fixture (the source of the .trace cases)."""
    from opprof.pipeline.imports import import_

    return import_([str(FIXTURES / "torch-ddp")], out / "ddp.trace", jobs=1).path


def all_cases(out: Path, seed: int, values: int, damage: int,
              xplane: bool = False) -> Iterator[Case]:
    """Every format's cases, deterministic for ``seed``."""
    rng = random.Random(seed)
    for src in KINETO_SOURCES:
        yield from json_cases(_present(src), _sub(out, src.name), rng, values, damage)
    yield from json_cases(MXNET_SOURCE, _sub(out, "mxnet"), rng, values // 2, damage // 2,
                          mxnet=True)
    yield from nsys_cases(_present(NSYS_SOURCE), _sub(out, "nsys"), rng)
    yield from trace_cases(make_trace(_sub(out, "tr")), _sub(out, "trace"), rng,
                           max(3, values // 4))
    if xplane:
        yield from xplane_cases(_present(XPLANE_SOURCE), _sub(out, "xplane"), rng, 3)


def _present(path: Path | None) -> Path:
    """A source the fuzzing mutates: a missing one is an error (the cases never shrink)."""
    if path is None or not path.is_file():
        raise FileNotFoundError(f"the fuzzing source {path} is missing from the repository")
    return path


def _sub(out: Path, name: str) -> Path:
    d = out / name.replace(".", "_")
    d.mkdir(parents=True, exist_ok=True)
    return d


Check = Callable[[Case], Result]
