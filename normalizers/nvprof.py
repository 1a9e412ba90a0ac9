"""nvprof (``nvprof --export-profile``, ``.nvvp``) SQLite → the common events table.

nvprof writes CUPTI's activity records as tables with an ``_id_`` key and keeps every
string once in ``StringTable(_id_, value)``. Tables read (CUDA 8-10 era nvprof; the layout
followed is the one nvprof writes, ``Version`` 9-12, as in the CUPTI record structs):

- ``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`` and ``CUPTI_ACTIVITY_KIND_KERNEL`` (start, end,
  deviceId, streamId, correlationId, name → StringTable): kernels on ``cuda:<deviceId>``,
  lane (pid = deviceId, tid = streamId). nvprof stores the *mangled* kernel name
  (``_ZN2at6native…``); it is kept as the native name (NCCL kernels still read as comm);
- ``CUPTI_ACTIVITY_KIND_MEMCPY`` (copyKind, srcKind, dstKind, bytes; ``correlationId`` is
  the driver call's, ``runtimeCorrelationId`` the runtime call's) and ``…_MEMSET``
  (memoryKind, bytes), named as Kineto names them. Memory kinds are CUPTI's
  ``CUpti_ActivityMemoryKind`` (0 = unknown, 1 = pageable, 2 = pinned, 3 = device, …);
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` and ``…_DRIVER`` (cbid, start, end, processId, threadId,
  correlationId): CUDA API calls. nvprof records the callback id only; the names of the
  common ones come from ``cupti_runtime_cbid.h`` / ``cupti_driver_cbid.h`` (others are
  ``cudaRuntime#<cbid>`` / ``cuDriver#<cbid>``). A driver call is kept only when no runtime
  call has its correlation id (the runtime call already covers that launch);
- ``CUPTI_ACTIVITY_KIND_MARKER`` + ``CUPTI_ACTIVITY_KIND_MARKER_DATA`` (NVTX): a range is a
  start row (flags 2 = CUPTI_ACTIVITY_FLAG_MARKER_START, with the name) and an end row
  (flags 4, name 0) sharing ``id``; flags 1 is an instantaneous mark. ``objectKind`` 2
  (thread) has ``objectId`` = 12 bytes, little-endian uint32 processId, threadId, 0. Range
  names are handled as in the nsys importer (torch ``emit_nvtx`` suffixes into ``detail``);
  MARKER_DATA's category, when not 0, is added to ``detail``;
- ``CUPTI_ACTIVITY_KIND_DEVICE`` for GPU names.

Timestamps are CUPTI nanoseconds (absolute, Unix epoch). One file is one rank, in the order
given (``nvprof --profile-all-processes -o run.%p.nvvp`` writes one file per process).
Kernels are attributed through ``correlationId`` like in nsys; a kernel whose correlation
matches no API call, or whose call is outside every operator range, is op ``other``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof import drops
from opprof.errors import ErrorKind, OpprofError
from opprof.normalizers.chrome import NONE
from opprof.normalizers.cupti import (
    CUPTI_MEM_KIND,
    connect,
    copy_names,
    cupti_table,
    int_col,
    is_sqlite,
    memset_names,
    missing_tables,
    nvtx_kinds,
    read_table,
    split_nvtx,
    sqlite_tables,
    tables,
)
from opprof.normalizers.events import finish
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.meta import MetaMapping

NAME = "nvprof"
FLAG_INSTANT, FLAG_START, FLAG_END = 1, 2, 4
OBJECT_THREAD = 2
_KERNEL_TABLES = ("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_KERNEL")
#: CUpti_runtime_api_trace_cbid values of the calls training jobs make most.
RUNTIME_CBID = {
    10: "cudaGetLastError_v3020", 11: "cudaPeekAtLastError_v3020", 13: "cudaLaunch_v3020",
    17: "cudaGetDevice_v3020", 31: "cudaMemcpy_v3020", 41: "cudaMemcpyAsync_v3020",
    44: "cudaMemcpy2DAsync_v3020", 49: "cudaMemset_v3020", 51: "cudaMemsetAsync_v3020",
    126: "cudaThreadSynchronize_v3020", 131: "cudaStreamSynchronize_v3020",
    137: "cudaEventSynchronize_v3020", 147: "cudaStreamWaitEvent_v3020",
    161: "cudaMemcpyPeerAsync_v4000", 165: "cudaDeviceSynchronize_v3020",
    211: "cudaLaunchKernel_v7000", 214: "cudaLaunchKernel_ptsz_v7000",
    225: "cudaMemcpyAsync_ptsz_v7000", 235: "cudaMemsetAsync_ptsz_v7000",
    239: "cudaStreamSynchronize_ptsz_v7000", 269: "cudaLaunchCooperativeKernel_v9000",
    272: "cudaLaunchCooperativeKernelMultiDevice_v9000", 311: "cudaGraphLaunch_v10000",
}
#: CUpti_driver_api_trace_cbid values of the common launch, copy and sync calls.
DRIVER_CBID = {
    17: "cuCtxSynchronize", 126: "cuStreamSynchronize", 277: "cuMemcpyHtoDAsync_v2",
    279: "cuMemcpyDtoHAsync_v2", 281: "cuMemcpyDtoDAsync_v2", 306: "cuMemcpyAsync",
    307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz", 477: "cuLaunchCooperativeKernel",
    514: "cuGraphLaunch", 652: "cuLaunchKernelEx",
}


def claims_file(path: Path, head: bytes) -> bool:
    """An nvprof export: SQLite with nvprof's ``StringTable`` and CUPTI activity tables."""
    if not is_sqlite(head):
        return False
    names = sqlite_tables(path)
    return "StringTable" in names and any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in names)


def from_files(paths: list[Path], meta: MetaMapping) -> Trace:
    """Normalize nvprof exports, one rank per file, into one Trace."""
    frames, gpus = [], []
    warnings: dict[str, dict[str, int]] = {}
    for rank, path in enumerate(paths):
        raw, names = _read(path, rank, warnings)
        frames.append(raw)
        gpus.extend(names)
    raw = pd.concat(frames, ignore_index=True)
    if raw.empty:
        raise OpprofError("nvprof export with no kernels, CUDA calls or markers",
                          path=paths[0], kind=ErrorKind.NO_EVENTS)
    out = {
        "source_formats": [NAME],
        "sources": [str(p) for p in paths],
        "workers": len(paths),
        "device": "cuda" if raw["kind"].isin(["kernel", "memcpy", "memset"]).any() else "cpu",
        "gpus": sorted(set(gpus)),
        "clock_offsets_ns": {str(r): 0 for r in range(len(paths))},
    }
    if raw["name"].astype(str).str.startswith("aten::").any():
        out["framework"] = "torch"
    out.update(meta)
    if warnings:
        before = out.get(drops.KEY)
        out[drops.KEY] = drops.merged([before if isinstance(before, dict) else None,
                                       warnings[drops.KEY]])
    return finish(raw, cupti_table(), out)


def _read(path: Path, rank: int, warnings: dict[str, dict[str, int]]
          ) -> tuple[pd.DataFrame, list[str]]:
    con = connect(path)
    try:
        names = tables(con)
        if "StringTable" not in names:
            shown = ", ".join(sorted(names)[:6]) or "none"
            raise OpprofError(f"SQLite file but not an nvprof export (tables: {shown})",
                              path=path, kind=ErrorKind.NOT_A_TRACE)
        s = pd.read_sql_query('SELECT "_id_" AS id, value FROM "StringTable"', con)
        strings = pd.Series(s["value"].to_numpy(dtype=object),
                            index=s["id"].to_numpy(dtype=np.int64))
        api = _api(con, names)
        frames = [f for f in (
            *(_kernels(con, t, strings) for t in _KERNEL_TABLES if t in names),
            _memcpy(con, api) if "CUPTI_ACTIVITY_KIND_MEMCPY" in names else None,
            _memset(con) if "CUPTI_ACTIVITY_KIND_MEMSET" in names else None,
            api,
            _markers(con, names, strings) if "CUPTI_ACTIVITY_KIND_MARKER" in names else None,
        ) if f is not None and len(f)]
        cols = ["pid", "tid", "device", "ts", "dur", "name", "kind", "bytes", "detail", "link"]
        ev = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
        kind = ev["kind"].astype(str)
        calls = 0 if api is None else len(api)
        launches = 0 if api is None else int(
            api["name"].astype(str).str.contains("Launch", regex=False).sum())
        missing_tables(warnings, "nvprof", int(kind.isin(["kernel", "memcpy", "memset"]).sum()),
                       calls, launches, bool((kind == "kernel").any()))
        ev["rank"] = rank
        ev["role"] = "worker"
        return ev, _gpu_names(con, names, strings)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError, UnicodeDecodeError) as exc:
        raise OpprofError(f"damaged nvprof export ({exc})",
                          path=path, kind=ErrorKind.DAMAGED) from None
    finally:
        con.close()


def _lookup(strings: pd.Series, ids: pd.Series) -> pd.Series:
    pos = strings.index.get_indexer(int_col(ids))
    return pd.Series(np.where(pos >= 0, strings.to_numpy()[np.maximum(pos, 0)], NONE),
                     dtype=object)


def _duration(start: Array, end: Array) -> Array:
    """``end - start``; negative (so that ``finish`` drops and counts the row) where the
    row ends before it starts or lacks a time (NULL, read as -1)."""
    return np.where((start < 0) | (end < 0), -1, end - start)


def _device_frame(df: pd.DataFrame, names: Array, kind: str, nbytes: int | Array,
                  link: Array) -> pd.DataFrame:
    start, end = int_col(df["start"], 0), int_col(df["end"], 0)
    dev = int_col(df["deviceId"], 0)
    return pd.DataFrame({
        "pid": dev, "tid": int_col(df["streamId"], 0),
        "device": pd.Series(dev).map({d: f"cuda:{d}" for d in np.unique(dev).tolist()}),
        "ts": np.maximum(start, 0), "dur": _duration(start, end), "name": names, "kind": kind,
        "bytes": nbytes, "detail": None, "link": link,
    })


def _kernels(con: sqlite3.Connection, table: str, strings: pd.Series) -> pd.DataFrame:
    df = read_table(con, table, ["start", "end", "deviceId", "streamId", "correlationId",
                                 "name"])
    names = _lookup(strings, df["name"]).fillna("unnamed kernel").to_numpy(dtype=object)
    return _device_frame(df, names, "kernel", 0, int_col(df["correlationId"]))


def _memcpy(con: sqlite3.Connection, api: pd.DataFrame | None) -> pd.DataFrame:
    df = read_table(con, "CUPTI_ACTIVITY_KIND_MEMCPY",
                    ["start", "end", "deviceId", "streamId", "correlationId",
                     "runtimeCorrelationId", "bytes", "copyKind", "srcKind", "dstKind"])
    link = int_col(df["correlationId"])
    rt = int_col(df["runtimeCorrelationId"])
    if api is not None and len(api):
        known = np.isin(link, api["link"].to_numpy())
        link = np.where(~known & (rt > 0), rt, link)
    names = copy_names(df["copyKind"], df["srcKind"], df["dstKind"], CUPTI_MEM_KIND)
    return _device_frame(df, names, "memcpy", int_col(df["bytes"], 0), link)


def _memset(con: sqlite3.Connection) -> pd.DataFrame:
    df = read_table(con, "CUPTI_ACTIVITY_KIND_MEMSET",
                    ["start", "end", "deviceId", "streamId", "correlationId", "bytes",
                     "memoryKind"])
    return _device_frame(df, memset_names(df["memoryKind"], CUPTI_MEM_KIND), "memset",
                         int_col(df["bytes"], 0), int_col(df["correlationId"]))


def _api(con: sqlite3.Connection, names: set[str]) -> pd.DataFrame | None:
    """Runtime calls, plus driver calls whose correlation no runtime call has."""
    frames: list[pd.DataFrame] = []
    for table, cbids, prefix in (("CUPTI_ACTIVITY_KIND_RUNTIME", RUNTIME_CBID, "cudaRuntime"),
                                 ("CUPTI_ACTIVITY_KIND_DRIVER", DRIVER_CBID, "cuDriver")):
        if table not in names:
            continue
        df = read_table(con, table, ["cbid", "start", "end", "processId", "threadId",
                                     "correlationId"])
        cbid = pd.Series(int_col(df["cbid"]))
        label = cbid.map(cbids).fillna(prefix + "#" + cbid.astype(str))
        start, end = int_col(df["start"], 0), int_col(df["end"], 0)
        frame = pd.DataFrame({
            "pid": int_col(df["processId"]), "tid": int_col(df["threadId"]), "device": "cpu",
            "ts": np.maximum(start, 0), "dur": _duration(start, end),
            "name": label.to_numpy(dtype=object), "kind": "runtime", "bytes": 0,
            "detail": None, "link": int_col(df["correlationId"]),
        })
        if frames:  # driver calls under a runtime call share its correlation id
            frame = frame[~frame["link"].isin(frames[0]["link"])]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else None


def _markers(con: sqlite3.Connection, names: set[str], strings: pd.Series) -> pd.DataFrame:
    df = read_table(con, "CUPTI_ACTIVITY_KIND_MARKER",
                    ["flags", "timestamp", "id", "objectKind", "objectId", "name"],
                    raw=("objectId",))
    flags = int_col(df["flags"], 0)
    opening = (flags & (FLAG_START | FLAG_INSTANT)) != 0
    starts = df[opening].reset_index(drop=True)
    ends = df[(flags & FLAG_END) != 0]
    end_id = pd.Index(int_col(ends["id"]))
    end_ts = int_col(ends["timestamp"], 0)
    last = ~end_id.duplicated(keep="last")
    pos = end_id[last].get_indexer(int_col(starts["id"]))
    ts = int_col(starts["timestamp"], 0)
    end = np.where(pos >= 0, end_ts[last][np.maximum(pos, 0)], ts)  # unmatched: a mark
    obj = starts["objectId"].where(starts["objectId"].notna(), b"").to_numpy(dtype=object)
    ids = np.asarray(obj, dtype="S12").view("<u4").reshape(-1, 3).astype(np.int64)
    kind = int_col(starts["objectKind"])
    pid = np.where(np.isin(kind, (1, OBJECT_THREAD)), ids[:, 0], -1)
    tid = np.where(kind == OBJECT_THREAD, ids[:, 1], -1)
    text = _lookup(strings, starts["name"]).fillna("")
    name, detail, torch_op = split_nvtx(text)
    detail = pd.Series(detail, dtype=object)
    if "CUPTI_ACTIVITY_KIND_MARKER_DATA" in names:
        md = read_table(con, "CUPTI_ACTIVITY_KIND_MARKER_DATA", ["id", "category"])
        cat = pd.Series(int_col(md["category"], 0), index=int_col(md["id"]))
        cat = cat[~cat.index.duplicated()].reindex(int_col(starts["id"])).fillna(0)
        cat = cat.astype(np.int64).to_numpy()
        extra = pd.Series(np.where(cat != 0, np.char.add("category = ", cat.astype(str)),
                                   NONE), dtype=object)
        both = (detail.notna() & extra.notna()).to_numpy()
        detail = detail.where(detail.notna(), extra)
        detail[both] = detail[both].to_numpy() + ", " + extra[both].to_numpy()
    return pd.DataFrame({
        "pid": pid, "tid": tid, "device": "cpu", "ts": ts, "dur": _duration(ts, end),
        "name": name, "kind": nvtx_kinds(name, torch_op, cupti_table()), "bytes": 0,
        "detail": detail.to_numpy(dtype=object),
        "link": -1,
    })


def _gpu_names(con: sqlite3.Connection, names: set[str], strings: pd.Series) -> list[str]:
    if "CUPTI_ACTIVITY_KIND_DEVICE" not in names:
        return []
    dev = read_table(con, "CUPTI_ACTIVITY_KIND_DEVICE", ["name"])
    return [str(n) for n in _lookup(strings, dev["name"]).dropna()]
