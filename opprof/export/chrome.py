"""Chrome trace JSON export (chrome://tracing, ui.perfetto.dev): one process per rank, one
thread per lane, the canonical op and phase in each event's args; memory as counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from opprof.export.tracks import lanes, split_memory
from opprof.files import write_atomic
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject

#: The suffix of a file this exporter writes.
EXTENSION = ".json"


def document(trace: Trace) -> JSONObject:
    """The chrome-trace document as a dict."""
    events, memory = split_memory(trace.events)
    ev = lanes(events)
    t0 = int(ev["ts"].min()) if len(ev) else 0
    out: list[JSONObject] = []
    meta_rows = ev.drop_duplicates("lane")[["rank", "role", "pid", "tid", "device", "lane"]]
    for r in meta_rows.to_dict("records"):
        out.append({"ph": "M", "name": "process_name", "pid": int(r["rank"]),
                    "args": {"name": f"rank {r['rank']} ({r['role']})"}})
        out.append({"ph": "M", "name": "thread_name", "pid": int(r["rank"]), "tid": int(r["lane"]),
                    "args": {"name": f"{r['device']} pid {r['pid']} tid {r['tid']}"}})
    frame = ev.assign(
        ts_us=(ev["ts"].to_numpy(np.int64) - t0) / 1000.0,
        dur_us=ev["dur"].to_numpy(np.int64) / 1000.0,
    )
    cols = ["rank", "lane", "name", "kind", "op", "phase", "step", "ts_us", "dur_us", "bytes"]
    for r in frame[cols].astype(object).where(frame[cols].notna(), None).to_dict("records"):
        out.append({"ph": "X", "pid": r["rank"], "tid": r["lane"], "name": r["name"],
                    "cat": r["kind"], "ts": r["ts_us"], "dur": r["dur_us"],
                    "args": {"op": r["op"], "phase": r["phase"], "step": r["step"],
                             "bytes": r["bytes"]}})
    for r in memory[["rank", "track", "ts", "bytes"]].to_dict("records"):
        out.append({"ph": "C", "pid": int(r["rank"]), "name": r["track"], "cat": "memory",
                    "ts": (int(r["ts"]) - t0) / 1000.0, "args": {"bytes": int(r["bytes"])}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"opprof": {k: v for k, v in trace.meta.items() if k != "step_bounds"},
                          "t0_ns": t0}}


def write(trace: Trace, path: Path) -> Path:
    """Write the chrome-trace JSON."""
    return write_atomic(path, json.dumps(document(trace), default=str))
