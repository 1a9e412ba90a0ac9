"""Compiled graphs in a trace: the steps that compiled, and the fused kernels behind ``fused``.

- **Compiling steps**: per (rank, step), the time of its ``compile`` operators (torch.compile's
  Dynamo tracing and inductor's code generation, a first compilation or a recompilation); such
  a step's time is compile time, not training, and the report flags it.
- **Fused kernels**: per ``fused`` / ``fused_backward`` row of the operator table, what it
  holds by native name (inductor's kernels, ``cpp_fused_gelu_native_layer_norm_0``,
  ``triton_poi_fused_add_relu_1``, whose names list the aten operators they fuse, and the
  graphs' own time): count and total per side (``where``: ``host`` for the graph calls and
  the launch wrappers, ``device`` for the GPU kernels they ran), so each of ``--by op``'s
  tables can show the largest under its own row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from opprof.analysis.ops import op_mask
from opprof.taxonomy import FUSED_OPS
from opprof.trace import Trace

COMPILE_COLUMNS = ["rank", "step", "compile_ns"]
KERNEL_COLUMNS = ["where", "op", "phase", "name", "count", "total_ns"]


def compile_steps(trace: Trace) -> pd.DataFrame:
    """Per (rank, step) with compilation in it: ``compile_ns``, the time of its counted
    ``compile`` operators."""
    ev = trace.events
    ev = ev.loc[op_mask(ev, "host") & (ev["op"] == "compile"), ["rank", "step", "dur"]]
    if ev.empty:
        return pd.DataFrame({c: np.zeros(0, np.int64) for c in COMPILE_COLUMNS})
    g = ev.groupby(["rank", "step"], observed=True)["dur"].sum()
    return g.rename("compile_ns").reset_index().astype(np.int64)[COMPILE_COLUMNS]


def fused_kernels(trace: Trace) -> pd.DataFrame:
    """Per (where, op, phase, native name) of the counted ``fused`` / ``fused_backward``
    events, ``where`` being ``host`` or ``device``: ``count`` and ``total_ns``."""
    all_ev = trace.events
    fused = all_ev["op"].isin(FUSED_OPS)
    sides = {w: all_ev.loc[op_mask(all_ev, w) & fused, ["op", "phase", "name", "dur"]]
             for w in ("host", "device")}
    ev = pd.concat(list(sides.values()), ignore_index=True)
    if ev.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    where = np.repeat(list(sides), [len(v) for v in sides.values()])
    # grouped by the columns' codes; text made for the groups alone (not once per event:
    # a trace of fused kernels has hundreds of thousands)
    keys = ["where", "op", "phase", "name"]
    frame = pd.DataFrame({"where": pd.Categorical(where), "op": ev["op"].astype("category"),
                          "phase": ev["phase"].astype("category"),
                          "name": ev["name"].astype("category"),
                          "dur": ev["dur"].to_numpy(np.int64)})
    out = frame.groupby(keys, sort=False, observed=True)["dur"].agg(
        count="size", total_ns="sum").reset_index()
    for k in keys:
        out[k] = out[k].astype(object).astype(str)
    return merge_kernels([out])


def merge_kernels(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Several :func:`fused_kernels` tables as one (counts and totals added), largest first."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    df = pd.concat(parts, ignore_index=True)
    out = df.groupby(["where", "op", "phase", "name"], sort=False)[["count", "total_ns"]].sum()
    return out.reset_index().sort_values("total_ns", ascending=False, kind="stable"
                                         ).reset_index(drop=True)[KERNEL_COLUMNS]
