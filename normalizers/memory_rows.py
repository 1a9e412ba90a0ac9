"""The memory table: the rows of kind ``memory`` in the events table.

One `.trace` stays one table: a memory sample is one zero-duration row of the same events
table, so each rank's row group holds its memory beside its events (the per-rank streaming
analyses read them together), and a DuckDB or pandas user filters ``kind = 'memory'``:

- ``name``: the series — ``rss`` (the resident set, sampled from outside the process),
  ``hwm`` (the kernel's VmHWM: the resident peak so far), ``allocated`` / ``reserved`` (the
  framework allocator);
- ``bytes``: the value of the series at ``ts``; ``dur`` 0;
- ``ts``: the sample's instant on the trace's common clock (ranks' clock offsets applied);
- ``device``: ``cpu`` for resident memory and host allocators, ``cuda:N`` for a GPU's;
- ``rank``, ``role``, ``pid``: the process's (``pid`` its OS process id when known);
  ``tid`` :data:`MEMORY_TID` (a lane of its own);
- ``step``: the step the instant falls in, -1 outside steps (start-up, warm-up, servers);
- ``phase``: the phase the wall-time breakdown gives that instant
  (:func:`opprof.walltime.phase_at`); empty outside steps;
- ``kind`` ``memory``; ``op`` empty; ``counted`` False; ``depth`` 0; ``link`` -1;
- ``detail``: the source — ``sampled``, ``kineto``, ``xprof``, ``mxnet``, ``nsys``.

A series is a step function: its value holds from one row to the next of the same (rank,
device, name). Sampled series cover the process's whole life under opprof (start-up,
warm-up and timing steps too), so the resident peak is the process's; ``hwm`` rows are
written only when the high-water mark changes.

Memory rows never enter the operator, phase, device or rank analyses: they are not
``counted``, carry no op, are not markers and not device kinds. Normalizers add them after
:func:`.events.finish` (:func:`add_memory`), so step finding and phase inference never see
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.filters import memory
from opprof.normalizers.events import cover_label
from opprof.taxonomy import MEMORY_KIND, MEMORY_SERIES, PHASES
from opprof.trace import COLUMNS, Trace, concat_traces, conform
from opprof.walltime import phase_at

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from opprof.arrays import Array

#: The lane (tid) of memory rows.
MEMORY_TID = -3
#: The columns of a sample frame (what :func:`add_memory` takes).
SAMPLE_COLUMNS = ("rank", "role", "pid", "device", "ts", "name", "bytes", "detail")


def samples(rank: int | Array, role: str | Array, pid: int | Array, device: str | Array,
            ts: Array, name: str | Array, nbytes: Array, detail: str | Array) -> pd.DataFrame:
    """A sample frame (:data:`SAMPLE_COLUMNS`); scalars are broadcast."""
    ts = np.asarray(ts, np.int64)
    n = len(ts)

    def col(v: object, dtype: DTypeLike = object) -> Array:
        arr = np.asarray(v, dtype=dtype)
        return np.full(n, v, dtype=dtype) if arr.ndim == 0 else arr

    return pd.DataFrame({"rank": col(rank, np.int64), "role": col(role), "pid": col(pid, np.int64),
                         "device": col(device), "ts": ts, "name": col(name),
                         "bytes": col(nbytes, np.int64), "detail": col(detail)})


def is_memory(events: pd.DataFrame) -> pd.Series:
    """Which rows are memory rows (:func:`opprof.filters.memory`)."""
    return memory(events)


def without_memory(trace: Trace) -> Trace:
    """The trace without its memory rows."""
    ev = trace.events
    mem = is_memory(ev)
    if not mem.any():
        return trace
    return Trace(ev[~mem].reset_index(drop=True), trace.meta)


def memory_rows(trace: Trace, raw: pd.DataFrame) -> pd.DataFrame:
    """Memory rows (the events table's COLUMNS) for a sample frame, placed in the trace's
    steps and phases."""
    raw = raw.reset_index(drop=True)
    n = len(raw)
    unknown = sorted(set(map(str, pd.unique(raw["name"]))) - set(MEMORY_SERIES))
    if unknown:
        raise ValueError(f"unknown memory series {unknown}")
    rank = raw["rank"].to_numpy(np.int64)
    ts = raw["ts"].to_numpy(np.int64)
    b = trace.step_bounds()
    step = cover_label(rank, ts, b["rank"].to_numpy(np.int64), b["start"].to_numpy(np.int64),
                       b["end"].to_numpy(np.int64), b["step"].to_numpy(np.int64), default=-1)
    workers = (raw["role"] == "worker").to_numpy(bool)
    step = np.where(workers, step, -1)
    phase = np.full(n, -1, np.int64)
    inside = np.flatnonzero(step >= 0)
    if len(inside):
        phase[inside] = phase_at(trace, rank[inside], ts[inside])
    return pd.DataFrame({
        "rank": rank, "role": raw["role"].astype(str).to_numpy(),
        "pid": raw["pid"].to_numpy(np.int64), "tid": np.full(n, MEMORY_TID, np.int64),
        "device": raw["device"].astype(str).to_numpy(), "ts": ts, "dur": np.zeros(n, np.int64),
        "name": raw["name"].astype(str).to_numpy(),
        "kind": pd.Categorical([MEMORY_KIND] * n, categories=COLUMNS["kind"].categories),
        "op": pd.Categorical.from_codes(np.full(n, -1), dtype=COLUMNS["op"]),
        "phase": pd.Categorical.from_codes(phase, categories=list(PHASES)),
        "step": step.astype(np.int32), "depth": np.zeros(n, np.int16),
        "counted": np.zeros(n, bool), "bytes": raw["bytes"].to_numpy(np.int64),
        "detail": raw["detail"].astype(object).to_numpy(), "link": np.full(n, -1, np.int64),
    })


def add_memory(trace: Trace, raw: pd.DataFrame | None) -> Trace:
    """The trace with the samples of ``raw`` (a sample frame) as memory rows, and
    ``meta["memory_sources"]`` listing where they came from. Rows are ordered by rank, name,
    device and time."""
    if raw is None or raw.empty:
        return trace
    rows = memory_rows(trace, raw)
    rows = rows.sort_values(["rank", "name", "device", "ts"], kind="stable")
    meta = dict(trace.meta)
    sources = set(meta.get("memory_sources", [])) | set(
        map(str, pd.unique(rows["detail"].dropna())))
    meta["memory_sources"] = sorted(sources)
    events = trace.events if len(trace.events) else None
    if events is None:
        return Trace(conform(rows.reset_index(drop=True)), meta)
    return concat_traces([Trace(events), Trace(conform(rows.reset_index(drop=True)))], meta)

