"""The small tables charts are drawn from: reshapes of a report's, a diff's or a bench's
aggregates (per-step phase rows, operator tables, rank × step matrices, per-device and
per-rank rows), in display units (ms per step, MiB). Shared by the HTML report
(opprof.render.html) and the paper figures (opprof.render.figures); nothing here plots, and
nothing reads events, so a chart's size depends on steps, ranks and operators, never on the
trace's event count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof import kinds
from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.taxonomy import PHASES

if TYPE_CHECKING:  # the bench's results, read by opprof.pipeline.bench.read_bench
    from opprof.analysis.matrix import Bench

MS = 1e6
MIB = 2.0**20
#: The device categories of opprof.analysis.devices, in stacking order.
DEVICE_PARTS = ("compute", "comm", "memcpy", "idle")


def ms(v: object) -> float:
    """ns → ms (NaN for a missing value)."""
    x = pd.to_numeric(v, errors="coerce")
    return float(x) / MS if x is not None and x == x else float("nan")


def step_phases(rep: Report) -> pd.DataFrame:
    """Per step: the wall-time phases in ms (mean over the ranks that have the step, so the
    phases still sum to the mean step time), index ``step``, plus ``ranks``."""
    s = rep.steps
    if s.empty:
        return pd.DataFrame(columns=[*PHASES, "ranks"])
    g = s.groupby("step", sort=True)
    out = g[list(PHASES)].mean() / MS
    out["ranks"] = g["rank"].nunique()
    return out


def phase_means(rep: Report) -> pd.Series:
    """The report's wall-time phases, ms per step (sum = mean step time)."""
    return rep.phases["ns_per_step"].reindex(list(PHASES)).fillna(0.0) / MS


def op_rows(ops: pd.DataFrame, top: int | None) -> pd.DataFrame:
    """The largest operators (ms per step, with phase and counts), largest first."""
    if ops.empty:
        return pd.DataFrame(columns=["op", "phase", "ms_per_step", "count", "mean_ms"])
    o = ops.sort_values("ns_per_step", ascending=False, kind="stable")
    o = o if top is None else o.head(top)
    return pd.DataFrame({"op": o["op"].astype(str), "phase": o["phase"].astype(str),
                         "ms_per_step": o["ns_per_step"] / MS, "count": o["count"],
                         "mean_ms": o["mean_ns"] / MS}).reset_index(drop=True)


def rank_step_matrix(rep: Report, value: str = "own_ns") -> pd.DataFrame:
    """Ranks × steps of ``value`` in ms (own time: step minus the wait for others)."""
    rs = rep.rank_steps
    if rs is None or rs.empty or value not in rs:
        return pd.DataFrame()
    return rs.pivot_table(index="rank", columns="step", values=value, aggfunc="mean") / MS


def stragglers(rep: Report) -> pd.DataFrame:
    """Per step with two ranks or more: the slowest rank and its excess over the median (ms)."""
    st = rep.stragglers
    if st is None or st.empty:
        return pd.DataFrame(columns=["step", "slowest_rank", "excess_ms", "excess_share"])
    return pd.DataFrame({"step": st["step"], "slowest_rank": st["slowest_rank"],
                         "excess_ms": st["excess_ns"] / MS,
                         "excess_share": st["excess_share"]}).reset_index(drop=True)


def wait_transfer(rep: Report) -> pd.DataFrame:
    """Per rank: own (non-communication) time, wait for others and transfer, ms per step."""
    r = rep.ranks
    if r is None or r.empty:
        return pd.DataFrame(columns=["rank", "own_ms", "wait_ms", "transfer_ms"])
    return pd.DataFrame({"rank": r["rank"].astype(int),
                         "own_ms": (r["dur_ns"] - r["comm_ns"].fillna(0)) / MS,
                         "wait_ms": r["wait_ns"].fillna(0) / MS,
                         "transfer_ms": r["transfer_ns"].fillna(0) / MS}).reset_index(drop=True)


def device_rows(rep: Report) -> pd.DataFrame:
    """Per GPU (rank, device): compute, comm, memcpy and idle ms over its span (they sum to
    the span), and the shares."""
    d = rep.devices
    if d is None or d.empty:
        return pd.DataFrame(columns=["label", *(f"{p}_ms" for p in DEVICE_PARTS)])
    out = pd.DataFrame({"label": [f"rank {int(r)} · {dev}" for r, dev in
                                  zip(d["rank"], d["device"].astype(str), strict=True)]})
    for p in DEVICE_PARTS:
        out[f"{p}_ms"] = d[f"{p}_ns"].to_numpy(float) / MS
        out[f"{p}_share"] = d[f"{p}_share"].to_numpy(float)
    out["span_ms"] = d["span_ns"].to_numpy(float) / MS
    return out


#: Memory bars per rank: label → the memory table's column.
RANK_MEMORY = {"peak resident": "peak_rss_bytes",
               "resident before profiling": "unprofiled_rss_bytes",
               "allocator allocated": "peak_allocated_bytes",
               "allocator reserved": "peak_reserved_bytes", "parameters": "param_bytes"}


def memory_rows(rep: Report) -> pd.DataFrame:
    """Per rank (label ``rank R (role)``): the memory bars in MiB; series no rank has are left
    out."""
    m = rep.memory.ranks
    if m is None or m.empty:
        return pd.DataFrame()
    out = pd.DataFrame({"label": [f"rank {int(r)} ({role})" for r, role in
                                  zip(m["rank"], m["role"].astype(str), strict=True)]})
    for name, col in RANK_MEMORY.items():
        v = pd.to_numeric(m[col], errors="coerce").to_numpy(float) / MIB
        if np.isfinite(v).any():
            out[name] = v
    return out


def phase_memory(rep: Report) -> pd.DataFrame:
    """Per rank: the main series' peak per phase in MiB (NaN: no sample in that phase)."""
    m = rep.memory.ranks
    if m is None or m.empty:
        return pd.DataFrame()
    out = pd.DataFrame({p: pd.to_numeric(m[f"peak_{p}_bytes"], errors="coerce").to_numpy(float)
                        / MIB for p in PHASES})
    out.insert(0, "label", [f"rank {int(r)}" for r in m["rank"]])
    return out


#: Memory bars spanning more than this factor (resident hundreds of MiB beside an allocator's
#: or the parameters' few) are drawn on a log axis, so the small ones stay visible.
LOG_SPAN = 100.0


def wants_log(values: pd.DataFrame) -> bool:
    """Whether positive values span more than LOG_SPAN (see above)."""
    v = values.to_numpy(float).ravel()
    v = v[np.isfinite(v) & (v > 0)]
    return len(v) > 1 and v.max() / v.min() > LOG_SPAN


@dataclass
class Waterfall:
    """From B's step to A's step: each part's A−B (ms); the parts sum to the gap."""

    start_label: str
    start_ms: float
    parts: pd.DataFrame  # name, delta_ms
    end_label: str
    end_ms: float


def diff_waterfall(d: Diff, level: str, top: int = 10) -> Waterfall:
    """The gap A−B split into phases (exact: phases sum to the step) or into the ``top``
    operators by |A−B| plus the rest (time outside those operators)."""
    a, b = d.a_step_ns / MS, d.b_step_ns / MS
    if level == "phase":
        df = d.phases.set_index("phase").reindex(list(PHASES)).fillna(0.0)
        parts = pd.DataFrame({"name": list(PHASES), "delta_ms": df["delta_ns"].to_numpy() / MS})
        parts = parts[parts["delta_ms"].abs() > 0]
    else:
        ops = d.ops.head(top)
        parts = pd.DataFrame({"name": ops["op"].astype(str),
                              "delta_ms": ops["delta_ns"].to_numpy(float) / MS})
        rest = (a - b) - float(parts["delta_ms"].sum())
        if abs(rest) > 1e-9 * max(abs(a), 1.0):
            parts = pd.concat([parts, pd.DataFrame({"name": ["rest of the step"],
                                                    "delta_ms": [rest]})])
    return Waterfall(f"{d.b_label} (B)", b, parts.reset_index(drop=True),
                     f"{d.a_label} (A)", a)


# --- bench ----------------------------------------------------------------------------------

DONE = tuple(s.value for s in kinds.DONE)


def bench_curves(b: Bench) -> pd.DataFrame:
    """`bench --converge`: one row per point of every run's curves — ``label`` (model, then
    :func:`run_label`), ``fw``, ``repeat`` (from 1), ``step``, ``time_s``, ``loss``,
    ``test_accuracy`` (NaN between evaluations)."""
    frames = []
    t = b.table
    for _, row in t.iterrows():
        name = f"{row['model']}-{row['fw']}-w{int(row['workers'])}-{row['mode']}"
        for k, curve in enumerate(b.curves.get(name) or [], 1):
            if not curve:
                continue
            df = pd.DataFrame(curve)
            frames.append(pd.DataFrame({
                "label": f"{row['model']} · {run_label(row)}", "fw": row["fw"], "repeat": k,
                "step": df["step"], "time_s": df["time_ns"] / 1e9,
                "loss": pd.to_numeric(df["loss"]),
                "test_accuracy": pd.to_numeric(df["test_accuracy"])}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["label", "fw", "repeat", "step", "time_s", "loss", "test_accuracy"])


def trace_curves(traces: list[tuple[str, Report]]) -> pd.DataFrame:
    """:func:`bench_curves`' rows from traces recorded with ``--converge`` (rank 0's curve
    of each, the lowest rank's)."""
    from opprof.trace import convergence_frame

    frames = []
    for label, rep in traces:
        c = convergence_frame(rep.meta)
        if c.empty:
            continue
        c = c[c["rank"] == c["rank"].min()]
        frames.append(pd.DataFrame({"label": label, "fw": rep.meta.get("framework", ""),
                                    "repeat": 1, "step": c["step"], "time_s": c["time_ns"] / 1e9,
                                    "loss": c["loss"], "test_accuracy": c["test_accuracy"]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["label", "fw", "repeat", "step", "time_s", "loss", "test_accuracy"])


def run_label(row: pd.Series) -> str:
    """``fw mode ×N`` (``fw`` alone for one worker)."""
    if int(row["workers"]) == 1:
        return str(row["fw"])
    return f"{row['fw']} {row['mode']} ×{int(row['workers'])}"


def bench_phases(b: Bench) -> dict[str, pd.DataFrame]:
    """Per model: one row per recorded run (index: its label), the phases in ms per step."""
    t = b.table
    t = t[t["status"].isin(DONE)] if "status" in t else t
    out = {}
    for model, g in t.groupby("model", sort=False):
        g = g.sort_values(["workers", "fw", "mode"], kind="stable")
        df = g[list(PHASES)].apply(pd.to_numeric, errors="coerce").fillna(0.0) / MS
        df.index = [run_label(r) for _, r in g.iterrows()]
        out[str(model)] = df
    return out


def bench_ratios(b: Bench) -> pd.DataFrame:
    """The cross-framework operator ratios with a label per row, largest first."""
    r = b.ratios
    if r.empty:
        return pd.DataFrame(columns=["label", "ratio", "slower", "faster"])
    out = r.copy()
    out["label"] = [f"{o} · {m} ×{int(w)}" if int(w) > 1 else f"{o} · {m}"
                    for o, m, w in zip(r["op"], r["model"], r["workers"], strict=True)]
    out["pair"] = [f"{s} / {f}" for s, f in zip(r["slower"], r["faster"], strict=True)]
    out["slower_ms"] = r["slower_ns_per_step"] / MS
    out["faster_ms"] = r["faster_ns_per_step"] / MS
    return out.reset_index(drop=True)


def bench_speedup(b: Bench) -> pd.DataFrame:
    """Per framework, model and mode (with its 1-worker run): speed-up vs workers, measured
    on the profiled steps (``N · step(1) / step(N)``) and predicted by the model from the
    1-worker run (``N · step(1) / predicted step(N)``); 1 at one worker."""
    t = b.table
    t = t[t["status"].isin(DONE)] if "status" in t else t
    rows = []
    for (fw, model), g in t.groupby(["fw", "model"], sort=False):
        if not (g["workers"] == 1).any():
            continue
        for mode, m in g[g["workers"] > 1].groupby("mode", sort=False):
            rows.append({"fw": fw, "model": model, "mode": mode, "workers": 1,
                         "measured": 1.0, "predicted": 1.0})
            for _, r in m.sort_values("workers").iterrows():
                n = int(r["workers"])
                meas = pd.to_numeric(r.get("profiled_scaling"), errors="coerce")
                pred = pd.to_numeric(r.get("predicted_scaling"), errors="coerce")
                rows.append({"fw": fw, "model": model, "mode": mode, "workers": n,
                             "measured": n * meas if meas == meas else np.nan,
                             "predicted": n * pred if pred == pred else np.nan})
    return pd.DataFrame(rows, columns=["fw", "model", "mode", "workers", "measured",
                                       "predicted"])


#: Memory bars per bench run: label → bench.csv column.
BENCH_MEMORY = {"resident before profiling": "unprofiled_rss_bytes",
                "peak resident": "peak_rss_bytes",
                "job resident (all processes)": "job_rss_bytes",
                "allocator allocated": "peak_allocated_bytes"}


def bench_memory(b: Bench) -> pd.DataFrame:
    """Per recorded run (label ``model · fw mode ×N``): memory in MiB; empty series left out."""
    t = b.table
    t = t[t["status"].isin(DONE)] if "status" in t else t
    if t.empty:
        return pd.DataFrame()
    out = pd.DataFrame({"label": [f"{r['model']} · {run_label(r)}" for _, r in t.iterrows()]})
    for name, col in BENCH_MEMORY.items():
        if col in t:
            v = pd.to_numeric(t[col], errors="coerce").to_numpy(float) / MIB
            if np.isfinite(v).any():
                out[name] = v
    return out if out.shape[1] > 1 else pd.DataFrame()
