"""NVIDIA Nsight Systems (``nsys export --type sqlite``) → the common events table.

Reads a report's SQLite export (``.sqlite``), or a ``.nsys-rep`` / ``.qdrep`` report by
running ``nsys export --type sqlite`` first (nsys must be on PATH). Tables read:

- ``CUPTI_ACTIVITY_KIND_KERNEL`` (start, end, deviceId, streamId, correlationId, globalPid,
  demangledName / shortName → ``StringIds``): kernels on ``cuda:<deviceId>``, lane
  (pid = deviceId, tid = streamId) as in Kineto traces, named by ``demangledName`` (the
  name torch.profiler shows) and by ``shortName`` where that is missing;
- ``CUPTI_ACTIVITY_KIND_MEMCPY`` (copyKind, srcKind, dstKind, bytes) and
  ``CUPTI_ACTIVITY_KIND_MEMSET`` (memKind, bytes), named as Kineto names them
  (``Memcpy HtoD (Pageable -> Device)``: copyKind 1 = HtoD is op ``h2d``, phase ``h2d``);
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` (globalTid, correlationId, nameId): CUDA API calls on the
  host thread that made them (``runtime`` events);
- ``NVTX_EVENTS`` (eventType 59 push/pop and 60 start/end ranges, 34 marks; text or
  textId → ``StringIds``; globalTid): host ranges. torch's ``emit_nvtx`` names ops
  ``aten::conv2d, seq = 12[, op_id = …][, sizes = […]]``; the suffix moves into ``detail``
  and the name keeps the operator. A range is an operator when torch marked it so (suffix),
  when it is ``aten::…``, or when the mapping table knows it as one; every other range is a
  marker (phase and step markers such as ``opprof.forward`` / ``ProfilerStep#3`` work as
  in Kineto traces);
- ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``--cuda-memory-usage=true``): the device memory CUDA
  allocated and freed, as each rank's ``reserved`` memory rows (:func:`_memory_usage`);
- ``TARGET_INFO_GPU`` + ``TARGET_INFO_CUDA_DEVICE`` (or ``TARGET_INFO_CUDA_GPU`` in reports
  from early 2021 and before) for GPU names; ``TARGET_INFO_SESSION_START_TIME.utcEpochNs``,
  when present, turns session-relative timestamps into UTC nanoseconds (the clock
  Kineto uses); ``META_DATA_EXPORT`` for the nsys version.

``globalTid`` / ``globalPid`` are serialized ids: pid = (id >> 24) & 0xFFFFFF, tid = id &
0xFFFFFF. Each process with CUDA activity is one rank (ordered by the lowest device it
uses, then pid; further files continue the numbering); when no process has CUDA activity,
each process with NVTX ranges is one. Events of other processes (a launcher, a data-loader
worker beside CUDA processes) are left out and counted in ``meta["nsys_skipped_events"]``.
A kernel row without ``globalPid`` belongs to the file's first rank.

Kernels are tied to the API call that launched them by ``correlationId`` (the ``link``
column) and so to the operator range around that call; a kernel whose correlation matches
no call, or whose call is outside every operator range, is op ``other`` — never dropped.
NCCL kernels (``ncclDevKernel_*``, ``ncclKernel_*``) are ``comm`` by name.

Schema followed: the SQLite export of Nsight Systems 2024.6 (EXPORT_SCHEMA_VERSION 3.16.1),
whose table comments NVIDIA documents in the user guide's "Exporter SQLite schema". Version
differences handled: ``NVTX_EVENTS.text`` holds unregistered strings and ``textId``
(registered strings, since the 2021 releases; absent in older exports) points into
``StringIds`` — either may be NULL; ``NVTX_EVENTS.end`` is NULL for marks and unfinished
ranges (kept with zero duration); kernel ``demangledName`` and ``shortName`` are both
``StringIds`` ids (``mangledName`` was added in 2023 and is not used); ``greenContextId``
(2024) is ignored; copies and memsets lack ``globalPid`` in some older exports (then the
first rank); GPU names come from ``TARGET_INFO_GPU`` keyed by ``id`` via
``TARGET_INFO_CUDA_DEVICE`` (pid, cudaId → gpuId) since mid-2021, from
``TARGET_INFO_CUDA_GPU`` keyed by ``deviceId`` before.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opprof import drops
from opprof.errors import ErrorKind, OpprofError
from opprof.normalizers.chrome import NONE
from opprof.normalizers.cupti import (
    NSYS_MEM_KIND,
    connect,
    copy_names,
    cupti_table,
    int_col,
    is_sqlite,
    memset_names,
    missing_tables,
    nvtx_costs,
    nvtx_kinds,
    read_table,
    split_nvtx,
    sqlite_tables,
    tables,
)
from opprof.normalizers.events import finish
from opprof.normalizers.memory_rows import add_memory, samples
from opprof.trace import Trace

NAME = "nsys"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange (ENUM_NSYS_EVENT_TYPE)
NVTX_MARK = 34
_NSYS_TABLES = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                "NVTX_EVENTS")
_EXPORT_TIMEOUT_S = 1800


def claims_file(path: Path, head: bytes) -> bool:
    """An nsys report (by suffix) or a SQLite export with nsys's tables."""
    if path.name.endswith(REPORT_SUFFIXES):
        return True
    if not is_sqlite(head):
        return False
    names = sqlite_tables(path)
    return "StringIds" in names and any(t in names for t in _NSYS_TABLES[1:])


def from_files(paths: list[Path], meta: dict) -> Trace:
    """Normalize nsys SQLite exports (or reports, exported on the fly) into one Trace."""
    frames, memory, info = [], [], _Info()
    with tempfile.TemporaryDirectory(prefix="opprof-nsys-") as tmp:
        for path in paths:
            db = _export(path, Path(tmp)) if path.name.endswith(REPORT_SUFFIXES) else path
            ev, mem = _read(db, path, info)
            frames.append(ev)
            memory.append(mem)
    raw = pd.concat(frames, ignore_index=True)
    if raw.empty:
        raise OpprofError("nsys export with no kernels, CUDA calls or NVTX ranges",
                          path=paths[0], kind=ErrorKind.NO_EVENTS)
    has_gpu = raw["kind"].isin(["kernel", "memcpy", "memset"]).any()
    torch_like = raw["name"].astype(str).str.startswith("aten::").any()
    out: dict[str, Any] = {
        "source_formats": [NAME],
        "sources": [str(p) for p in paths],
        "workers": len(info.ranks),
        "device": "cuda" if has_gpu else "cpu",
        "gpus": sorted(set(info.gpus)),
        "clock_offsets_ns": {str(r): 0 for r in info.ranks},
        "nsys_processes": info.processes,
        "nsys_skipped_events": info.skipped,
    }
    if torch_like:
        out["framework"] = "torch"
    if info.versions:
        out["nsys_version"] = sorted(set(info.versions))
    out.update(meta)
    if info.warnings:
        out[drops.KEY] = drops.merged([out.get(drops.KEY), info.warnings[drops.KEY]])
    raw = raw.assign(**nvtx_costs(raw["name"], raw["detail"]))
    return add_memory(finish(raw, cupti_table(), out), pd.concat(memory, ignore_index=True))


class _Info:
    """What reading the files found, for the trace's metadata."""

    def __init__(self) -> None:
        self.ranks: list[int] = []
        self.gpus: list[str] = []
        self.processes: dict[str, str] = {}
        self.skipped = 0
        self.versions: list[str] = []
        self.warnings: dict = {}  # opprof.drops: rows dropped, per kind


def _export(report: Path, tmp: Path) -> Path:
    """Run ``nsys export --type sqlite`` on a report; clear errors when that cannot work."""
    if not report.exists():
        raise OpprofError("no such file or folder", path=report, kind=ErrorKind.MISSING)
    nsys = shutil.which("nsys")
    if nsys is None:
        raise OpprofError(
            "reading an Nsight Systems report needs nsys on PATH to run "
            "`nsys export --type sqlite`; export it where nsys is installed and import the "
            ".sqlite file", path=report, kind=ErrorKind.USAGE)
    out = tmp / (report.name.rsplit(".", 1)[0] + ".sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
           "--output", str(out), str(report)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise OpprofError(f"nsys export ran past {_EXPORT_TIMEOUT_S}s",
                          path=report, kind=ErrorKind.RUN) from None
    if done.returncode != 0 or not out.exists():
        msg = (done.stderr or done.stdout or "").strip().splitlines()
        raise OpprofError(f"nsys export failed ({msg[-1] if msg else done.returncode})",
                          path=report, kind=ErrorKind.RUN)
    return out


def _read(db: Path, source: Path, info: _Info) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the events of one export, its CUDA memory usage as memory samples)."""
    con = connect(db)
    try:
        names = tables(con)
        if "StringIds" not in names or not any(t in names for t in _NSYS_TABLES[1:]):
            shown = ", ".join(sorted(names)[:6]) or "none"
            raise OpprofError(f"SQLite file but not an nsys export (tables: {shown})",
                              path=source, kind=ErrorKind.NOT_A_TRACE)
        strings = _strings(con)
        parts = {
            "kernel": _kernels(con, strings) if "CUPTI_ACTIVITY_KIND_KERNEL" in names else None,
            "memcpy": _memcpy(con) if "CUPTI_ACTIVITY_KIND_MEMCPY" in names else None,
            "memset": _memset(con) if "CUPTI_ACTIVITY_KIND_MEMSET" in names else None,
            "runtime": _runtime(con, strings) if "CUPTI_ACTIVITY_KIND_RUNTIME" in names else None,
            "nvtx": _nvtx(con, strings) if "NVTX_EVENTS" in names else None,
        }
        frames = [f for f in parts.values() if f is not None and len(f)]
        device = sum(len(f) for k in ("kernel", "memcpy", "memset")
                     if (f := parts[k]) is not None)
        runtime = parts["runtime"]
        calls = 0 if runtime is None else len(runtime)
        launches = 0 if runtime is None else int(
            pd.Series(runtime["name"]).str.contains("Launch", regex=False).sum())
        kernels = parts["kernel"] is not None and len(parts["kernel"]) > 0
        missing_tables(info.warnings, "nsys", device, calls, launches, kernels)
        if not frames:
            return pd.DataFrame(columns=["rank", "role", "pid", "tid", "device", "ts", "dur",
                                         "name", "kind", "bytes", "detail", "link"]), _NO_MEMORY
        ev = pd.concat(frames, ignore_index=True)
        missing = ev.pop("missing").to_numpy(bool)
        keep = drops.skip(info.warnings, missing, "start or end missing (NULL)")
        keep &= drops.skip(info.warnings, keep & (ev["dur"].to_numpy() < 0),
                           "end before start")
        if not keep.all():
            ev = ev[keep].reset_index(drop=True)
        if ev.empty:
            raise OpprofError("nsys export with no usable events "
                              f"({drops.describe(info.warnings.get(drops.KEY))})",
                              path=source, kind=ErrorKind.NO_EVENTS)
        base = max(info.ranks) + 1 if info.ranks else 0
        rank_of = _ranks(ev, base)
        if not rank_of:
            rank_of = {int(ev["proc"].max()): base}
        first = min(rank_of.values())
        proc = ev["proc"].to_numpy()
        rank = pd.Series(proc).map(rank_of)
        rank = rank.where(proc >= 0, first)  # rows that name no process
        keep = rank.notna().to_numpy()
        info.skipped += int((~keep).sum())
        ev = ev[keep].reset_index(drop=True)
        ev["rank"] = rank[keep].astype(np.int64).to_numpy()
        info.ranks.extend(sorted(set(rank_of.values())))
        info.processes.update({str(r): f"{source.name}:{p}" for p, r in rank_of.items()})
        info.gpus.extend(_gpu_names(con, names, ev, rank_of))
        info.versions.extend(_version(con, names))
        offset = _epoch_offset(con, names)
        ev["ts"] = ev["ts"] + offset
        ev["role"] = "worker"
        memory = (_memory_usage(con, names, rank_of, offset)
                  if "CUDA_GPU_MEMORY_USAGE_EVENTS" in names else _NO_MEMORY)
        return ev.drop(columns=["proc"]), memory
    except (sqlite3.DatabaseError, pd.errors.DatabaseError, UnicodeDecodeError) as exc:
        raise OpprofError(f"damaged nsys export ({exc})",
                          path=source, kind=ErrorKind.DAMAGED) from None
    finally:
        con.close()


_NO_MEMORY = samples(0, "worker", -1, "cpu", np.zeros(0, np.int64), "reserved",
                     np.zeros(0, np.int64), NAME)
#: The memory kinds that live on the GPU (nsys's ENUM_CUDA_MEM_KIND labels).
_DEVICE_MEMORY = ("Device", "Array", "Device Static")


def _memory_usage(con: sqlite3.Connection, names: set[str], rank_of: dict[int, int],
                  offset: int) -> pd.DataFrame:
    """``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``nsys profile --cuda-memory-usage=true``) as the
    ``reserved`` series per (process, GPU): the running total of the device memory CUDA
    allocated (cudaMalloc and kin) minus what it freed, from the start of the capture — what
    a caching allocator such as torch's holds as reserved (its ``allocated`` is not visible
    to CUDA). Kinds ``Device``, ``Array`` and ``Device Static`` count; host (pageable,
    pinned) and managed memory do not. Operations: 0 allocation, 1 deallocation (or by name
    from ``ENUM_CUDA_DEV_MEM_EVENT_OPER``)."""
    df = read_table(con, "CUDA_GPU_MEMORY_USAGE_EVENTS",
                    ["start", "globalPid", "deviceId", "bytes", "memKind",
                     "memoryOperationType"])
    kinds = _enum(con, names, "ENUM_CUDA_MEM_KIND") or NSYS_MEM_KIND
    opers = _enum(con, names, "ENUM_CUDA_DEV_MEM_EVENT_OPER") or {0: "Allocation",
                                                                  1: "Deallocation"}
    kind = pd.Series(int_col(df["memKind"])).map(kinds).fillna("").to_numpy(object)
    oper = pd.Series(int_col(df["memoryOperationType"])).map(opers).fillna("").to_numpy(object)
    sign = np.select([oper == "Allocation", oper == "Deallocation"], [1, -1], 0)
    proc = _pid(df["globalPid"])
    rank = pd.Series(proc).map(rank_of).to_numpy()
    keep = np.isin(kind, _DEVICE_MEMORY) & (sign != 0) & ~pd.isna(rank)
    if not keep.any():
        return _NO_MEMORY
    d = pd.DataFrame({"rank": rank[keep].astype(np.int64), "pid": proc[keep],
                      "dev": int_col(df["deviceId"], 0)[keep], "ts": int_col(df["start"], 0)[keep],
                      "delta": sign[keep] * int_col(df["bytes"], 0)[keep]})
    d = d.sort_values(["rank", "dev", "ts"], kind="stable")
    d["total"] = d.groupby(["rank", "dev"])["delta"].cumsum()
    return samples(d["rank"].to_numpy(), "worker", d["pid"].to_numpy(),
                   ("cuda:" + d["dev"].astype(str)).to_numpy(object),
                   d["ts"].to_numpy(np.int64) + offset, "reserved", d["total"].to_numpy(), NAME)


def _enum(con: sqlite3.Connection, names: set[str], table: str) -> dict[int, str]:
    """An nsys ENUM table as id → label (older exports name the label column ``name``)."""
    if table not in names:
        return {}
    cols = {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}
    col = "label" if "label" in cols else "name"
    out = {}
    for i, text in con.execute(f'SELECT id, "{col}" FROM "{table}"'):
        text = str(text or "")
        if text.startswith("CUDA_DEV_MEM_EVENT_OPR_"):  # a name, not a label
            text = text.removeprefix("CUDA_DEV_MEM_EVENT_OPR_").title()
        elif text.startswith("CUDA_MEMOPR_MEMORY_KIND_"):
            text = text.removeprefix("CUDA_MEMOPR_MEMORY_KIND_").replace("_", " ").title()
        out[int(i)] = text
    return out


def _strings(con: sqlite3.Connection) -> pd.Series:
    s = pd.read_sql_query('SELECT id, value FROM "StringIds"', con)
    return pd.Series(s["value"].to_numpy(dtype=object), index=s["id"].to_numpy(dtype=np.int64))


def _lookup(strings: pd.Series, ids: pd.Series) -> pd.Series:
    """Strings for id columns (missing ids give None), via one indexer."""
    idx = int_col(ids)
    if strings.empty:  # an export whose StringIds table is empty: no name is known
        return pd.Series(np.full(len(idx), None, dtype=object), dtype=object)
    pos = strings.index.get_indexer(idx)
    out = np.where(pos >= 0, strings.to_numpy()[np.maximum(pos, 0)], NONE)
    return pd.Series(out, dtype=object)


def _pid(global_id: pd.Series) -> np.ndarray:
    g = int_col(global_id)
    return np.where(g >= 0, (g >> 24) & 0xFFFFFF, -1)


def _tid(global_id: pd.Series) -> np.ndarray:
    g = int_col(global_id)
    return np.where(g >= 0, g & 0xFFFFFF, -1)


def _start_end(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, missing): the rows' times as int64 and which rows lack one (NULL, read
    as -1 by ``read_table``, or not a number); :func:`_read` drops and counts those, and
    those that end before they start."""
    start, end = _times(df["start"]), _times(df["end"])
    missing = (start < 0) | (end < 0)
    return np.maximum(start, 0), np.maximum(end, 0), missing


def _times(col: pd.Series) -> np.ndarray:
    """A time column as int64 ns; -1 where it is NULL, negative or not a number."""
    v = pd.to_numeric(col, errors="coerce")
    return v.where(v >= 0, -1).fillna(-1).to_numpy(np.int64)


def _device_frame(df: pd.DataFrame, names, kind: str, nbytes) -> pd.DataFrame:
    start, end, missing = _start_end(df)
    dev = int_col(df["deviceId"], 0)
    return pd.DataFrame({
        "proc": _pid(df["globalPid"]), "pid": dev, "tid": int_col(df["streamId"], 0),
        "device": pd.Series(dev).map({d: f"cuda:{d}" for d in np.unique(dev).tolist()}),
        "ts": start, "dur": end - start, "name": names, "kind": kind,
        "bytes": nbytes, "detail": None, "link": int_col(df["correlationId"]),
        "missing": missing,
    })


def _kernels(con: sqlite3.Connection, strings: pd.Series) -> pd.DataFrame:
    df = read_table(con, "CUPTI_ACTIVITY_KIND_KERNEL",
                    ["start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                     "demangledName", "shortName"])
    name = _lookup(strings, df["demangledName"])
    name = name.where(name.notna() & (name != ""), _lookup(strings, df["shortName"]))
    name = name.fillna("unnamed kernel").to_numpy(dtype=object)
    return _device_frame(df, name, "kernel", 0)


def _memcpy(con: sqlite3.Connection) -> pd.DataFrame:
    df = read_table(con, "CUPTI_ACTIVITY_KIND_MEMCPY",
                    ["start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                     "bytes", "copyKind", "srcKind", "dstKind"])
    names = copy_names(df["copyKind"], df["srcKind"], df["dstKind"], NSYS_MEM_KIND)
    return _device_frame(df, names, "memcpy", int_col(df["bytes"], 0))


def _memset(con: sqlite3.Connection) -> pd.DataFrame:
    df = read_table(con, "CUPTI_ACTIVITY_KIND_MEMSET",
                    ["start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                     "bytes", "memKind"])
    return _device_frame(df, memset_names(df["memKind"], NSYS_MEM_KIND), "memset",
                         int_col(df["bytes"], 0))


def _runtime(con: sqlite3.Connection, strings: pd.Series) -> pd.DataFrame:
    df = read_table(con, "CUPTI_ACTIVITY_KIND_RUNTIME",
                    ["start", "end", "globalTid", "correlationId", "nameId"])
    start, end, missing = _start_end(df)
    pid = _pid(df["globalTid"])
    return pd.DataFrame({
        "proc": pid, "pid": pid, "tid": _tid(df["globalTid"]), "device": "cpu",
        "ts": start, "dur": end - start,
        "name": _lookup(strings, df["nameId"]).fillna("CUDA API").to_numpy(dtype=object),
        "kind": "runtime", "bytes": 0, "detail": None, "link": int_col(df["correlationId"]),
        "missing": missing,
    })


def _nvtx(con: sqlite3.Connection, strings: pd.Series) -> pd.DataFrame:
    df = read_table(con, "NVTX_EVENTS", ["start", "end", "eventType", "text", "textId",
                                         "globalTid"], raw=("text",))
    etype = int_col(df["eventType"], NVTX_RANGE_TYPES[0])
    df = df[np.isin(etype, (*NVTX_RANGE_TYPES, NVTX_MARK))].reset_index(drop=True)
    text = df["text"].astype(object)
    text = text.where(text.notna(), _lookup(strings, df["textId"]))
    name, detail, torch_op = split_nvtx(text.fillna(""))
    start, end = _times(df["start"]), _times(df["end"])
    # marks and unfinished ranges (NULL end) have zero length; an end before its start is
    # dropped and counted (_read)
    end = np.where(end < 0, np.maximum(start, 0), end)
    pid = _pid(df["globalTid"])
    return pd.DataFrame({
        "proc": pid, "pid": pid, "tid": _tid(df["globalTid"]), "device": "cpu",
        "ts": np.maximum(start, 0), "dur": end - np.maximum(start, 0), "name": name,
        "kind": nvtx_kinds(name, torch_op, cupti_table()), "bytes": 0,
        "detail": detail, "link": -1, "missing": start < 0,
    })


def _ranks(ev: pd.DataFrame, base: int) -> dict[int, int]:
    """Process → rank: processes with CUDA activity (else with NVTX ranges), ordered by the
    lowest device they use, then pid."""
    proc = ev["proc"].to_numpy()
    cuda = ev["kind"].isin(["kernel", "memcpy", "memset", "runtime"]).to_numpy() & (proc >= 0)
    cand = np.unique(proc[cuda]) if cuda.any() else np.unique(proc[proc >= 0])
    on_dev = ev["kind"].isin(["kernel", "memcpy", "memset"]).to_numpy() & (proc >= 0)
    low = pd.Series(ev["pid"].to_numpy()[on_dev]).groupby(proc[on_dev]).min()
    order = sorted(cand.tolist(), key=lambda p: (int(low.get(p, 1 << 30)), p))
    return {int(p): base + i for i, p in enumerate(order)}


def _gpu_names(con: sqlite3.Connection, names: set[str], ev: pd.DataFrame,
               rank_of: dict[int, int]) -> list[str]:
    """Names of the GPUs the kept processes ran on."""
    used = ev.loc[ev["kind"].isin(["kernel", "memcpy", "memset"]), "pid"].unique().tolist()
    if "TARGET_INFO_GPU" in names:
        gpu = read_table(con, "TARGET_INFO_GPU", ["id", "name"], raw=("name",))
        by_id = dict(zip(int_col(gpu["id"]).tolist(), gpu["name"].astype(str), strict=True))
        if "TARGET_INFO_CUDA_DEVICE" in names:
            cd = read_table(con, "TARGET_INFO_CUDA_DEVICE", ["gpuId", "cudaId", "pid"])
            cd = cd[pd.Series(int_col(cd["pid"])).isin(list(rank_of)).to_numpy()
                    & pd.Series(int_col(cd["cudaId"])).isin(used).to_numpy()]
            ids = int_col(cd["gpuId"]).tolist()
            if ids:
                return [by_id[i] for i in ids if i in by_id]
        return [by_id[d] for d in used if d in by_id]
    if "TARGET_INFO_CUDA_GPU" in names:
        gpu = read_table(con, "TARGET_INFO_CUDA_GPU", ["deviceId", "name"], raw=("name",))
        by_id = dict(zip(int_col(gpu["deviceId"]).tolist(), gpu["name"].astype(str),
                         strict=True))
        return [by_id[d] for d in used if d in by_id]
    return []


def _version(con: sqlite3.Connection, names: set[str]) -> list[str]:
    if "META_DATA_EXPORT" not in names:
        return []
    rows = con.execute("SELECT value FROM META_DATA_EXPORT "
                       "WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchall()
    return [str(r[0]) for r in rows if r[0]]


def _epoch_offset(con: sqlite3.Connection, names: set[str]) -> int:
    """UTC ns of the session start, when the export records it (timestamps are relative)."""
    if "TARGET_INFO_SESSION_START_TIME" not in names:
        return 0
    row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    return int(row[0]) if row and row[0] else 0
