"""Deterministic mutations of real traces of every format, and the check each must pass:
read (with a ⚠ read warning when the mutation made a value unusable) or refused in one line
naming the file — never a traceback, a hang or memory without bound.

Used by ``tests/test_fuzz_reader.py`` (a few hundred cases, in-process) and by
``benchmarks/fuzz_reader.py`` (more, every format, a summary)."""

from __future__ import annotations

import gzip
import json
import random
import re
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
                  SHARED / "kineto-gpu" / "amd-mi250-toy-train.json.gz",
                  FIXTURES / "gpu" / "compiled-adamw.pt.trace.json.gz"]
MXNET_SOURCE = FIXTURES / "mxnet" / "lenet5-single" / "rank0_worker.json.gz"
NSYS_SOURCE = FIXTURES / "shared" / "nsys" / "saxpy-mpi-cuda.sqlite"
MXNET_DUMPS = FIXTURES / "mxnet" / "lenet5-single"
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
    #: the unmutated input this case was made from (its report is the baseline the numbers
    #: are compared with); "" for none
    source: str = ""
    #: the mutation changed only values that are valid as such (a flipped digit, a shifted
    #: time): its numbers may change without a word; any other change of the numbers owes
    #: a ⚠ line
    valid_values: bool = False


@dataclass
class Result:
    """What reading a case gave: ``ok`` (with its read warnings), ``refused`` (one line),
    or a failure: ``traceback``, ``hang``, ``multi-line``, ``silent`` (must_warn, yet read
    with no warning), ``changed`` (the report's numbers differ from the unmutated input's
    with no warning, where the mutation was not a valid value's change), ``blow-up``
    (memory past the limit), ``unnamed`` (a refusal that names no file)."""

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


def _shape(doc: object) -> object:
    """What a document is made of, values aside: the top level's keys and each event's keys
    and value types (a mutation that keeps it changed only values that are valid as such)."""
    if not isinstance(doc, dict):
        return type(doc).__name__
    events = doc.get("traceEvents")
    ev_shape = [tuple(sorted((k, type(v).__name__) for k, v in e.items()))
                if isinstance(e, dict) else type(e).__name__
                for e in events] if isinstance(events, list) else type(events).__name__
    return sorted(doc), ev_shape


def _valid_values(raw: bytes, damaged: bytes) -> bool:
    """Whether ``damaged`` is JSON of the same shape as ``raw`` (only values changed, each a
    valid value of its type: a flipped digit, a letter of a name)."""
    try:
        return _shape(json.loads(damaged)) == _shape(json.loads(raw))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False


#: Structure mutations of one JSON trace: (tag, what is done to the document, owes a ⚠
#: whatever the numbers). The others owe one where the report's numbers change.
def _structure(xs: list[int], rng: random.Random, mxnet: bool
               ) -> list[tuple[str, Callable[[dict], None], bool]]:
    one = rng.choice(xs)

    def each(f: Callable[[dict], None]) -> Callable[[dict], None]:
        def apply(d: dict) -> None:
            for i in xs:
                f(d["traceEvents"][i])
        return apply

    def at(f: Callable[[dict], None]) -> Callable[[dict], None]:
        return lambda d: f(d["traceEvents"][one])

    def drop(key: str) -> Callable[[dict], None]:
        return lambda e: e.pop(key, None)

    def setv(key: str, value: object) -> Callable[[dict], None]:
        return lambda e: e.__setitem__(key, value)

    def negate_ts(e: dict) -> None:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = -abs(e["ts"]) - 1

    def duplicate(d: dict) -> None:
        d["traceEvents"].append(dict(d["traceEvents"][one]))

    out = [("all_ts_negative", each(negate_ts), True),
           ("no_name_anywhere", each(drop("name")), True),
           ("no_name", at(drop("name")), True),
           ("no_pid", at(drop("pid")), True),
           ("pid_text", at(setv("pid", "abc")), True),
           ("no_ts", at(drop("ts")), True),
           ("no_tid", at(drop("tid")), False),
           ("no_ph", at(drop("ph")), False),
           ("no_cat", at(drop("cat")), False),
           ("no_args", at(drop("args")), False),
           ("name_number", at(setv("name", 7)), False),
           ("duplicate_event", duplicate, False),
           ("no_events", lambda d: d.__setitem__("traceEvents", []), False)]
    if not mxnet:
        out += [("no_dur", at(drop("dur")), True),
                ("base_time_text", lambda d: d.__setitem__("baseTimeNanoseconds", "abc"), True),
                ("no_distributed_info", lambda d: d.pop("distributedInfo", None), False),
                ("device_properties_text",
                 lambda d: d.__setitem__("deviceProperties", "abc"), False)]
    return out


def json_cases(src: Path, out: Path, rng: random.Random, n_values: int,
               n_bytes: int, mxnet: bool = False) -> Iterator[Case]:
    """The unmutated trace (the baseline), value mutations (each owes a warning), structure
    mutations (a field removed or retyped, an event duplicated: a ⚠ owed where the numbers
    change) and byte damage of one JSON trace."""
    doc = _load_json(src)
    raw = json.dumps(doc).encode()
    events = doc["traceEvents"]
    xs = _complete(events) or [i for i, e in enumerate(events) if e.get("ph") in ("B", "E")]
    stem = src.name.split(".")[0]
    suffix = ".json" if mxnet else ".json.gz"
    fname = (lambda k: f"{k}_{stem}/rank0_worker.json") if mxnet else (
        lambda k: f"{k}_{stem}{suffix}")
    key = f"{src}{':mxnet' if mxnet else ''}"

    def put(tag: str, d: dict | bytes, must: bool, valid: bool = False) -> Case:
        p = out / fname(tag)
        p.parent.mkdir(parents=True, exist_ok=True)
        return Case(f"{src.name}: {tag}", [_write(d, p)], must, key, valid)

    yield put("unmutated", raw, False, True)
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
    for tag, change, must in _structure(xs, rng, mxnet):
        d = json.loads(raw)
        change(d)
        yield put(tag, d, must)
    # a flipped byte in an object key (not UTF-8): that field would be lost without a word
    keys = [m.start() for m in re.finditer(rb'"name":', raw)]
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
    # damage: truncation, flipped bytes, zeroed runs (no crash allowed; a ⚠ owed where the
    # numbers change, unless only a value changed into another valid one)
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
        yield put(f"{what}{j}", bytes(b), False, _valid_values(raw, bytes(b)))
    if not mxnet:
        gz = gzip.compress(raw, 1)
        p = out / f"gztrunc_{stem}.json.gz"
        p.write_bytes(gz[: len(gz) // 2])
        yield Case(f"{src.name}: gzip cut in half", [p], False, key)


def sqlite_cases(src: Path, out: Path, rng: random.Random, fmt: str,
                 timed: tuple[str, ...], dropped: tuple[tuple[str, bool], ...],
                 emptied: tuple[str, ...]) -> Iterator[Case]:
    """An NVIDIA SQLite export (nsys or nvprof) unmutated (the baseline), with rows ending
    before they start (``timed`` tables: a ⚠ owed), tables dropped (``dropped``: (table,
    whether a correct export may lack it: then its numbers may change without a word)) or
    emptied, and damaged pages."""
    key = f"{src}:{fmt}"

    def copy(tag: str) -> Path:
        p = out / f"{tag}.{'sqlite' if fmt == 'nsys' else 'nvvp'}"
        shutil.copyfile(src, p)
        return p

    yield Case(f"{fmt}: unmutated", [copy("unmutated")], False, key, True)
    have = _tables(src)
    # an export from elsewhere may lack a table (no NVTX ranges, no copies): what it lacks
    # is not mutated
    timed = tuple(t for t in timed if t in have)
    dropped = tuple((t, o) for t, o in dropped if t in have)
    emptied = tuple(t for t in emptied if t in have)
    for table in timed:
        p = copy(f"backwards_{table}")
        with sqlite3.connect(p) as con:
            con.execute(f'UPDATE "{table}" SET "end" = start - 1000 WHERE rowid IN '
                        f'(SELECT rowid FROM "{table}" LIMIT 2)')
        yield Case(f"{fmt}: end < start in {table}", [p], True, key)
    for table, optional in dropped:
        p = copy(f"no_{table}")
        with sqlite3.connect(p) as con:
            con.execute(f'DROP TABLE "{table}"')
        yield Case(f"{fmt}: {table} dropped", [p], False, key, optional)
    for table in emptied:
        p = copy(f"empty_{table}")
        with sqlite3.connect(p) as con:
            con.execute(f'DELETE FROM "{table}"')
        yield Case(f"{fmt}: {table} emptied", [p], False, key)
    data = src.read_bytes()
    for j in range(6):
        b = bytearray(data)
        at = rng.randrange(4096, len(b))
        b[at:at + 512] = rng.randbytes(len(b[at:at + 512]))
        p = out / f"pages{j}.{'sqlite' if fmt == 'nsys' else 'nvvp'}"
        p.write_bytes(bytes(b))
        # random bytes in a page: a value may change into another valid one
        yield Case(f"{fmt}: 512 random bytes at {at}", [p], False, key, True)
    p = out / f"cut.{'sqlite' if fmt == 'nsys' else 'nvvp'}"
    p.write_bytes(data[: len(data) // 3])
    yield Case(f"{fmt}: cut to a third", [p], False, key)


def nsys_cases(src: Path, out: Path, rng: random.Random) -> Iterator[Case]:
    """A real nsys export, mutated (:func:`sqlite_cases`); an NVTX range ending before it
    starts; an empty StringIds table."""
    yield from sqlite_cases(
        src, out, rng, "nsys",
        ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
         "CUPTI_ACTIVITY_KIND_MEMCPY"),
        (("CUPTI_ACTIVITY_KIND_KERNEL", False), ("CUPTI_ACTIVITY_KIND_RUNTIME", False),
         ("CUPTI_ACTIVITY_KIND_MEMCPY", True), ("NVTX_EVENTS", True), ("StringIds", False),
         ("TARGET_INFO_GPU", True)),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"))
    if "NVTX_EVENTS" in _tables(src):
        p = out / "nvtx_backwards.sqlite"
        shutil.copyfile(src, p)
        with sqlite3.connect(p) as con:
            con.execute('UPDATE NVTX_EVENTS SET "end" = start - 5 WHERE "end" IS NOT NULL AND '
                        'rowid IN (SELECT rowid FROM NVTX_EVENTS WHERE "end" IS NOT NULL '
                        'LIMIT 1)')
        yield Case("nsys: NVTX range ending before it starts", [p], True, f"{src}:nsys")
    p = out / "nostrings.sqlite"
    shutil.copyfile(src, p)
    with sqlite3.connect(p) as con:
        con.execute("DELETE FROM StringIds")
    yield Case("nsys: empty StringIds", [p], False, f"{src}:nsys", True)


def nvprof_cases(out: Path, rng: random.Random) -> Iterator[Case]:
    """An nvprof export (the tests' writer of nvprof's schema: no real one is public),
    mutated as :func:`sqlite_cases` does."""
    from tests.nvidia_sqlite import torch_job, write_nvprof

    src = write_nvprof(out / "source.nvvp", torch_job(ranks=1, steps=2))
    yield from sqlite_cases(
        src, out, rng, "nvprof",
        ("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
         "CUPTI_ACTIVITY_KIND_MEMCPY"),
        (("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", False),
         ("CUPTI_ACTIVITY_KIND_RUNTIME", False), ("CUPTI_ACTIVITY_KIND_MARKER", True),
         ("StringTable", False), ("CUPTI_ACTIVITY_KIND_DEVICE", True)),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL"))


def trace_cases(src: Path, out: Path, rng: random.Random, n: int) -> Iterator[Case]:
    """opprof `.trace` Parquet files with negative durations or wild times (owed a warning)
    and with damaged bytes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    meta = table.schema.metadata
    rows = table.num_rows
    key = f"{src}:trace"
    base = out / "unmutated.trace"
    shutil.copyfile(src, base)
    yield Case(".trace: unmutated", [base], False, key, True)
    for j in range(n):
        col = rng.choice(["dur", "ts"])
        values = table.column(col).to_numpy().copy()
        at = rng.sample(range(rows), rng.randint(1, 3))
        values[at] = -rng.randint(1, 10**6) if col == "dur" else -(10**15)
        t = table.set_column(table.schema.get_field_index(col), col, pa.array(values))
        p = out / f"{col}{j}.trace"
        pq.write_table(t.replace_schema_metadata(meta), p)
        yield Case(f".trace: {len(at)} {col} made negative", [p], True, key)
    t = table.set_column(table.schema.get_field_index("dur"), "dur",
                         pa.array(np.full(rows, -1, np.int64)))
    p = out / "alldur.trace"
    pq.write_table(t.replace_schema_metadata(meta), p)
    yield Case(".trace: every duration negative", [p], True, key)
    data = src.read_bytes()
    for j in range(4):
        b = bytearray(data)
        at = rng.randrange(8, len(b) - 8)
        b[at] ^= 0xFF
        p = out / f"flip{j}.trace"
        p.write_bytes(bytes(b))
        yield Case(f".trace: byte {at} flipped", [p], False, key, True)


def xplane_cases(src: Path, out: Path, rng: random.Random, n: int) -> Iterator[Case]:
    """XPlane files with negative event durations (owed a warning), and damaged bytes.
    Needs TensorFlow's XPlane protobuf."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    data = src.read_bytes()
    key = f"{src}:xplane"
    d = out / "unmutated"
    d.mkdir(parents=True, exist_ok=True)
    (d / "host.xplane.pb").write_bytes(data)
    yield Case("xplane: unmutated", [d / "host.xplane.pb"], False, key, True)
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
        yield Case("xplane: negative durations", [p], True, key)
    for j in range(2):
        b = bytearray(data)
        at = rng.randrange(len(b))
        b[at:at + 32] = rng.randbytes(len(b[at:at + 32]))
        d = out / f"flip{j}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / "host.xplane.pb"
        p.write_bytes(bytes(b))
        yield Case(f"xplane: 32 random bytes at {at}", [p], False, key, True)


class _Hang(Exception):
    pass


def fingerprint(rep: object) -> tuple:
    """The numbers a report gives: its steps (rank, step, duration), its operators (op,
    phase, count, total) and device operators, the ranks it has."""
    def rows(df: object, cols: list[str]) -> tuple:
        import pandas as pd

        if not isinstance(df, pd.DataFrame) or df.empty:
            return ()
        have = [c for c in cols if c in df.columns]
        return tuple(sorted(map(tuple, df[have].astype(str).to_numpy().tolist())))

    return (rows(getattr(rep, "steps", None), ["rank", "step", "dur_ns"]),
            rows(getattr(rep, "ops", None), ["op", "phase", "count", "total_ns"]),
            rows(getattr(rep, "device_ops", None), ["op", "count", "total_ns"]))


#: Memory past which a read is a blow-up: what the read itself raised this process's
#: resident set by, at its peak (:func:`read_peak`).
BLOW_UP_BYTES = 2 << 30


def check(case: Case, time_limit_s: int = 60, baselines: dict | None = None) -> Result:
    """Read ``case`` as ``opprof report`` does (in this process) and judge the outcome.
    ``baselines``: the fingerprint of each source's unmutated read, filled by its
    ``valid_values`` case with no source yet (the first of each source), compared with
    every later case of that source."""
    from opprof.errors import OpprofError
    from opprof.files import shown
    from opprof.job import report

    def alarm(sig: int, frame: object) -> None:
        raise _Hang

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(time_limit_s)
    start = read_peak()
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
    except MemoryError:
        return Result(case, "blow-up", "MemoryError")
    except Exception:  # noqa: BLE001 - any other exception is the failure looked for
        return Result(case, "traceback", traceback.format_exc(limit=-3))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    grown = read_peak(start)
    if grown > BLOW_UP_BYTES:
        return Result(case, "blow-up", f"the read's peak {grown >> 20} MiB above its start")
    warnings = rep.meta.get("read_warnings") or {}
    if case.must_warn and not warnings:
        return Result(case, "silent", "read with no ⚠ line", warnings)
    if baselines is not None and case.source:
        fp = fingerprint(rep)
        base = baselines.setdefault(case.source, fp)
        if fp != base and not warnings and not case.valid_values:
            changed = [i for i, (a, b) in enumerate(zip(fp, base, strict=True)) if a != b]
            what = ", ".join(("steps", "operators", "device operators")[i] for i in changed)
            return Result(case, "changed", f"{what} changed with no ⚠ line", warnings)
    return Result(case, "ok", "", warnings)


FAILURES = ("traceback", "hang", "blow-up", "multi-line", "silent", "changed", "unnamed")


def peak_rss_bytes() -> int:
    """This process's peak resident memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` figure in KiB (None where there is none: not Linux)."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def read_peak(start: int | None = None) -> int:
    """Without ``start``: reset this process's peak resident set to its current one (Linux's
    ``clear_refs`` 5) and return the current one, in bytes. With it: how far the peak rose
    above ``start`` since. The fuzzer holds its sources and mutations (gigabytes for a large
    trace), so the process's lifetime peak says nothing about one read; where the reset is
    not allowed, the lifetime peak is compared instead (``start`` 0)."""
    if start is None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            return 0
        return (_status_kib("VmRSS") or 0) * 1024
    hwm = _status_kib("VmHWM")
    peak = hwm * 1024 if hwm is not None and start else peak_rss_bytes()
    return max(0, peak - start)


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
    yield from nvprof_cases(_sub(out, "nvprof"), rng)
    yield from trace_cases(make_trace(_sub(out, "tr")), _sub(out, "trace"), rng,
                           max(3, values // 4))
    if xplane:
        yield from xplane_cases(_present(XPLANE_SOURCE), _sub(out, "xplane"), rng, 3)


def source_cases(src: Path, out: Path, seed: int, values: int, damage: int) -> Iterator[Case]:
    """The same mutation families and oracle applied to any trace given (a real trace
    recorded by others): a Kineto JSON (``.json``/``.json.gz``), an nsys SQLite export, an
    opprof ``.trace``; a folder: each such file in it, smallest first. Deterministic for
    ``seed`` and the file's name."""
    if src.is_dir():
        files = sorted((p for p in src.rglob("*") if p.is_file() and _kind(p)),
                       key=lambda p: (p.stat().st_size, p.name))
        for i, f in enumerate(files):
            yield from source_cases(f, _sub(out, f"{i}_{f.name}"), seed, values, damage)
        return
    rng = random.Random(f"{seed}:{src.name}")
    out.mkdir(parents=True, exist_ok=True)
    kind = _kind(src)
    if kind == "kineto":
        yield from json_cases(src, out, rng, values, damage)
    elif kind == "nsys":
        yield from nsys_cases(src, out, rng)
    elif kind == "trace":
        yield from trace_cases(src, out, rng, max(3, values // 4))
    else:
        raise ValueError(f"{src}: not a trace the fuzzer mutates "
                         "(.json, .json.gz, .sqlite, .trace)")


def _tables(src: Path) -> set[str]:
    """The tables an SQLite export holds (one from elsewhere may lack some)."""
    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as con:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _kind(path: Path) -> str:
    """The format the fuzzer mutates a file as, by its name ("" for none)."""
    name = path.name
    if name.endswith((".json", ".json.gz")):
        return "kineto"
    if name.endswith(".sqlite"):
        return "nsys"
    if name.endswith(".trace"):
        return "trace"
    return ""


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
