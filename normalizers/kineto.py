"""torch.profiler (Kineto) chrome-trace JSON → the common events table.

Reads every complete (``ph == "X"``) event: CPU operators, user annotations (step and
phase markers, ``nccl:*``/``gloo:*`` collectives), CUDA/HIP runtime calls, GPU kernels,
memcpy and memset. Timestamps are microseconds, relative to ``baseTimeNanoseconds`` when
the file has it, else absolute; they become int64 nanoseconds since the epoch. The rank is
``distributedInfo.rank``. Device events are tied to the runtime call that launched them by
``args.correlation`` and so to the operator around that call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opprof.errors import OpprofError
from opprof.events import finish
from opprof.taxonomy import mapping_table
from opprof.trace import Trace

NAME = "kineto"
_KIND_OF_CAT = {
    "cpu_op": "cpu_op", "operator": "cpu_op",
    "user_annotation": "marker", "gpu_user_annotation": "marker",
    "python_function": "marker", "trace": "marker",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "cuda_sync": "runtime",
    "overhead": "runtime",
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
}
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
_KINETO_CATS = {"cpu_op", "kernel", "cuda_runtime", "user_annotation", "python_function",
                "gpu_memcpy", "cuda_driver"}
_DTYPE_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long int": 8,
                "int": 4, "Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8,
                "Int": 4, "signed char": 1, "unsigned char": 1, "bool": 1, "long": 8}


def claims_json(doc: Any) -> bool:
    """A Kineto trace: a dict of traceEvents with Kineto's schema or categories."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return False
    if "schemaVersion" in doc or "distributedInfo" in doc or "deviceProperties" in doc:
        return True
    return any(isinstance(e, dict) and e.get("cat") in _KINETO_CATS
               for e in doc["traceEvents"][:500])


def from_docs(docs: list[tuple[Path, dict]], meta: dict) -> Trace:
    """Normalize one Kineto document per rank into one Trace."""
    frames, ranks, devices, dist = [], [], [], {}
    offsets, errors = {}, {}
    for path, doc in docs:
        rank = _rank_of(doc, path, len(ranks))
        if rank in ranks:
            rank = max(ranks) + 1
        ranks.append(rank)
        # Plain object strings: pandas 3's Arrow strings cost more than they save here.
        with pd.option_context("future.infer_string", False):
            frames.append(_raw_events(doc, rank, path))
        # Clock alignment (opprof.collectors.torch): rank r's clock + offset = rank 0's.
        clock = doc.get("opprofClock") or {}
        offsets[str(rank)] = int((meta.get("clock_offsets_ns") or {}).get(
            str(rank), clock.get("offset_ns", 0)))
        errors[str(rank)] = int(clock.get("error_ns", 0))
        frames[-1]["ts"] += offsets[str(rank)]
        devices.extend(d.get("name", "") for d in doc.get("deviceProperties", []) or [])
        if doc.get("distributedInfo"):
            dist[str(rank)] = doc["distributedInfo"]
    raw = pd.concat(frames, ignore_index=True)
    has_gpu = raw["kind"].isin(["kernel", "memcpy", "memset"]).any()
    info = {
        "source_formats": [NAME],
        "sources": [str(p) for p, _ in docs],
        "framework": meta.get("framework", "torch"),
        "workers": len(ranks),
        "device": "cuda" if has_gpu else "cpu",
        "gpus": sorted(set(devices)),
        "clock_error_ns": errors,
    }
    if dist:
        info["distributed"] = dist
    info.update(meta)
    info["clock_offsets_ns"] = offsets  # as applied (the meta may name only some ranks)
    return finish(raw, mapping_table(NAME), info)


def _rank_of(doc: dict, path: Path, default: int) -> int:
    info = doc.get("distributedInfo") or {}
    try:
        return int(info.get("rank", default))
    except (TypeError, ValueError):
        return default


def _raw_events(doc: dict, rank: int, path: Path) -> pd.DataFrame:
    events = doc["traceEvents"]
    ev = pd.DataFrame.from_records(
        events, columns=["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
    )
    ev = ev[ev["ph"] == "X"].reset_index(drop=True)
    if ev.empty:
        raise OpprofError(f"{path}: Kineto trace with no complete events")
    base_ns = int(doc.get("baseTimeNanoseconds", 0) or 0)
    ts_us = pd.to_numeric(ev["ts"], errors="coerce").to_numpy(dtype=np.float64)
    dur_us = pd.to_numeric(ev["dur"], errors="coerce").fillna(0).to_numpy(dtype=np.float64)
    if np.isnan(ts_us).any():
        raise OpprofError(f"{path}: Kineto events without a numeric timestamp")
    cat = ev["cat"].astype(object).fillna("").astype(str).str.lower()
    arg_dicts = ev["args"].to_numpy(dtype=object)
    no_args = pd.isna(ev["args"]).to_numpy()
    if no_args.any():
        arg_dicts[no_args] = [{}] * int(no_args.sum())
    args = pd.DataFrame.from_records(
        arg_dicts,
        columns=["correlation", "device", "bytes", "Input Dims", "Input type",
                 "In msg nelems", "Out msg nelems", "dtype"],
    )
    on_device = cat.isin(_DEVICE_CATS).to_numpy()
    dev_no = pd.to_numeric(args["device"], errors="coerce")
    pid = pd.to_numeric(ev["pid"], errors="coerce")
    dev_no = dev_no.fillna(pid).fillna(0).astype(np.int64)
    device = np.where(on_device, "cuda:" + dev_no.astype(str), "cpu")
    kind = cat.map(_KIND_OF_CAT).fillna("cpu_op").to_numpy(dtype=object)
    nbytes = pd.to_numeric(args["bytes"], errors="coerce").fillna(0).astype(np.int64)
    comm_bytes = _comm_bytes(ev["name"], args)
    nbytes = nbytes.where(comm_bytes.isna(), comm_bytes).astype(np.int64)
    detail = args["Input Dims"].where(args["Input Dims"].notna())
    detail = detail.astype(str).where(detail.notna(), None) if detail.notna().any() else None
    return pd.DataFrame({
        "rank": rank,
        "role": "worker",
        "pid": pid.fillna(-1).astype(np.int64),
        "tid": pd.to_numeric(ev["tid"], errors="coerce").fillna(-1).astype(np.int64),
        "device": device,
        "ts": base_ns + np.rint(ts_us * 1000).astype(np.int64),
        "dur": np.rint(dur_us * 1000).astype(np.int64),
        "name": ev["name"].astype(object).fillna("").astype(str),
        "kind": kind,
        "bytes": nbytes,
        "detail": detail,
        "link": pd.to_numeric(args["correlation"], errors="coerce").fillna(-1).astype(np.int64),
    })


def _comm_bytes(names: pd.Series, args: pd.DataFrame) -> pd.Series:
    """Payload of collectives: message elements x dtype size, else the first input's size."""
    out = pd.Series(np.nan, index=names.index)
    is_comm = names.astype(str).str.match(r"(?:nccl|gloo|mpi|ucc|xccl):|record_param_comms|c10d::")
    if not is_comm.any():
        return out
    sub = args[is_comm.to_numpy()]
    size = sub["dtype"].map(_DTYPE_BYTES)
    nel = pd.to_numeric(sub["In msg nelems"], errors="coerce")
    first_dims = sub["Input Dims"].map(_first_numel)
    first_type = sub["Input type"].map(
        lambda t: _DTYPE_BYTES.get(t[0]) if isinstance(t, list) and t else None)
    val = (nel * size).where(nel.notna() & size.notna(), first_dims * first_type)
    out[is_comm.to_numpy()] = val.to_numpy(dtype=float)
    return out


def _first_numel(dims: Any) -> float:
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        return float(np.prod(dims[0])) if dims[0] else np.nan
    return np.nan
