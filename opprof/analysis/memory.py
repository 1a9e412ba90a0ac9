"""Memory per rank: resident peak, allocator peaks, the model's parameter bytes, the step of
the peak and the peak per phase, from the memory rows of the events table
(opprof.normalizers.memory_rows).

Per rank, from its own rows (so it streams rank by rank like every per-rank analysis),
over the rank's life **until the end of its last profiled step** (a server's or scheduler's:
the job's last step; without steps, all of it) — start-up, warm-up, the unprofiled timing
steps and the profiled ones; what comes after (the profiler writing its trace, shutting
down) is no training and stays out of the peaks, though its rows stay in the table:

- ``peak_rss_bytes``: the largest resident-set sample (``rss``, sampled from outside the
  process); ``hwm_bytes``: the kernel's own high-water mark at that point (the last ``hwm``
  row before it: VmHWM), the check on the sampled peak; ``unprofiled_rss_bytes``: the largest
  resident sample before the rank's first profiled step (start-up, warm-up and the unprofiled
  timing steps): training without the profiler, whose own buffers grow with every profiled
  step (torch's by ~120 MiB a ResNet-18 step on a CPU) — the reference, as the unprofiled
  step time is for time;
- ``peak_allocated_bytes`` / ``peak_reserved_bytes``: the largest ``allocated`` /
  ``reserved`` row of the rank's accelerator when it has one (the largest over its GPUs),
  else of the host; null when the framework exposed no allocator. ``allocated_source`` and
  ``allocated_device`` say whose figure it is: torch's CPU allocator (``kineto`` on ``cpu``)
  and MXNet's storage counters (``mxnet``) count what was allocated while the profiler ran
  (tensors allocated before — the parameters, the optimizer's state — are not in them);
  torch's CUDA caching allocator (``kineto`` on ``cuda:N``), TensorFlow's allocators
  (``xprof``) and CUDA as Nsight Systems sees it (``nsys``) count everything allocated;
- ``param_bytes``: the model's trainable parameters (elements × dtype size) from the run's
  facts; null for servers and schedulers and when unknown (an imported trace);
- the **main series** is ``rss`` when the rank has it, else ``allocated``, else
  ``reserved``; ``peak_step`` is the step of its largest sample (the first such sample), null
  when that sample lies outside the profiled steps (start-up, warm-up, a server);
- ``by_phase``: per phase, the largest main-series sample whose instant the wall-time step
  breakdown gives to that phase (``opprof.analysis.breakdown.phase_at``: the same tiers that
  make the phases sum to the step time, set on the row at normalization); samples outside
  the profiled steps count in no phase; a phase no sample fell in is null (a phase shorter
  than the sampling interval can have none; allocator rows, one per allocation, have one in
  every phase that allocates or frees);
- per step, the largest main-series sample (``steps``), and a timeline: the largest sample
  in each of ``TIMELINE_BINS`` equal bins over the rank's profiled steps, first start to
  last end (a server's: the job's) (``timeline``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pandas as pd

from opprof.filters import memory as memory_rows
from opprof.taxonomy import PHASES
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.meta import MetaMapping

TIMELINE_BINS = 48
COLUMNS = ["rank", "role", "peak_rss_bytes", "hwm_bytes", "unprofiled_rss_bytes",
           "peak_allocated_bytes",
           "peak_reserved_bytes", "param_bytes", "peak_step", "series", "allocated_source",
           "allocated_device", "samples", *(f"peak_{p}_bytes" for p in PHASES)]
STEP_COLUMNS = ["rank", "step", "series", "peak_bytes"]
TIMELINE_COLUMNS = ["rank", "series", "start", "end", "bins"]


@dataclass
class MemoryPart:
    """One rank's (or a few ranks') memory: one row per rank, per-step peaks, timelines."""

    ranks: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COLUMNS))
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))
    timeline: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=TIMELINE_COLUMNS))


def memory_part(trace: Trace) -> MemoryPart:
    """The memory of every rank of ``trace`` that has memory rows."""
    ev = trace.events
    mem = ev[memory_rows(ev)]
    if mem.empty:
        return MemoryPart()
    spans = _spans(trace)
    rows, steps, lines = [], [], []
    for rank, m in mem.groupby("rank", sort=True):
        span = spans.get(int(rank), spans.get(None))
        row, st, line = _rank(int(rank), m, trace.meta, span)
        rows.append(row)
        steps.append(st)
        if line is not None:
            lines.append(line)
    return MemoryPart(pd.DataFrame(rows, columns=COLUMNS),
                      _concat(steps, STEP_COLUMNS),
                      pd.DataFrame(lines, columns=TIMELINE_COLUMNS))


def combine_memory(parts: list[MemoryPart]) -> MemoryPart:
    """The memory of a job from its ranks' parts (ranks in order)."""
    out = MemoryPart(_concat([p.ranks for p in parts], COLUMNS),
                     _concat([p.steps for p in parts], STEP_COLUMNS),
                     _concat([p.timeline for p in parts], TIMELINE_COLUMNS))
    for df in (out.ranks, out.steps, out.timeline):
        if len(df):
            df.sort_values("rank", kind="stable", inplace=True)
            df.reset_index(drop=True, inplace=True)
    return out


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    full = [f for f in frames if len(f)]
    if not full:
        return pd.DataFrame(columns=columns)
    return pd.concat(full, ignore_index=True)[columns]


def _spans(trace: Trace) -> dict[int | None, tuple[int, int]]:
    """Per rank, its profiled steps from the first start to the last end; under None, those
    of every rank in the metadata (for a server or scheduler, which has no steps)."""
    b = trace.step_bounds()
    if b.empty:
        return {}
    out: dict[int | None, tuple[int, int]] = {
        int(r): (int(g["start"].min()), int(g["end"].max())) for r, g in b.groupby("rank")}
    out[None] = (int(b["start"].min()), int(b["end"].max()))
    return out


#: Whose allocator rows a native format carries (the ``detail`` of its memory rows).
ALLOCATOR_SOURCE = {"kineto": "kineto", "mxnet": "mxnet", "xplane": "xprof", "nsys": "nsys"}


def _source(meta: MetaMapping) -> str | None:
    formats = [ALLOCATOR_SOURCE[f] for f in meta.get("source_formats") or []
               if f in ALLOCATOR_SOURCE]
    return formats[0] if formats else None


def _peak(m: pd.DataFrame, name: str) -> tuple[int | None, str | None]:
    """(peak bytes, device) of series ``name``: the accelerator's when the rank has one (the
    largest over its devices), else the host's."""
    s = m[m["name"] == name]
    if s.empty:
        return None, None
    dev = s["device"].astype(str)
    gpu = s[dev != "cpu"]
    pick = gpu if len(gpu) else s
    i = pick["bytes"].to_numpy().argmax()
    return int(pick["bytes"].iloc[i]), str(pick["device"].iloc[i])


def _main(m: pd.DataFrame) -> tuple[str | None, pd.DataFrame]:
    """The main series of a rank and its rows (see the module docstring)."""
    for name in ("rss", "allocated", "reserved"):
        s = m[m["name"] == name]
        if len(s):
            dev = s["device"].astype(str)
            if name != "rss" and (dev != "cpu").any():
                top = s.groupby(dev.to_numpy())["bytes"].max().idxmax()
                s = s[dev == top]
            return name, s
    return None, m.iloc[0:0]


def _param_bytes(meta: MetaMapping, rank: int, role: str) -> int | None:
    for r in meta.get("per_rank") or []:
        if isinstance(r, dict) and r.get("rank") == rank and r.get("role") == role:
            if r.get("param_bytes") is not None:
                return int(r["param_bytes"])
    if role == "worker" and meta.get("param_bytes") is not None:
        return int(meta["param_bytes"])
    return None


class Timeline(TypedDict):
    """A rank's main series over its profiled steps: the largest sample in each of
    :data:`TIMELINE_BINS` equal bins from ``start`` to ``end`` (None: no sample in it)."""

    rank: int
    series: str | None
    start: int
    end: int
    bins: list[int | None]


#: One row of :attr:`MemoryPart.ranks` (its :data:`COLUMNS`).
RankRow = dict[str, int | str | None]


def _rank(rank: int, m: pd.DataFrame, meta: MetaMapping, span: tuple[int, int] | None
          ) -> tuple[RankRow, pd.DataFrame, Timeline | None]:
    role = str(m["role"].iloc[0])
    before = None
    if span is not None:
        m = m[m["ts"] < span[1]]
        pre = m[(m["name"] == "rss") & (m["ts"] < span[0])]
        before = int(pre["bytes"].max()) if len(pre) else None
    rss, _ = _peak(m, "rss")
    hwm = m[m["name"] == "hwm"]
    alloc, a_dev = _peak(m, "allocated")
    reserved, _ = _peak(m, "reserved")
    a_src = _source(meta) if alloc is not None else None
    series, s = _main(m)
    s = s.sort_values("ts", kind="stable")
    values = s["bytes"].to_numpy(np.int64)
    peak_step = None
    if len(values):
        step = int(s["step"].iloc[int(values.argmax())])
        peak_step = step if step >= 0 else None
    inside = s[s["step"] >= 0]
    by_phase = inside.groupby(inside["phase"].astype(str))["bytes"].max() if len(inside) else {}
    row: RankRow = {"rank": rank, "role": role, "peak_rss_bytes": rss,
           "hwm_bytes": int(hwm.sort_values("ts")["bytes"].iloc[-1]) if len(hwm) else None,
           "unprofiled_rss_bytes": before,
           "peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved,
           "param_bytes": _param_bytes(meta, rank, role), "peak_step": peak_step,
           "series": series, "allocated_source": a_src, "allocated_device": a_dev,
           "samples": int(len(s)),
           **{f"peak_{p}_bytes": (int(by_phase[p]) if p in by_phase else None) for p in PHASES}}
    steps = (inside.groupby("step")["bytes"].max().rename("peak_bytes").reset_index()
             .assign(rank=rank, series=series)[STEP_COLUMNS]) if len(inside) else \
        pd.DataFrame(columns=STEP_COLUMNS)
    line: Timeline | None = None
    if span is not None and len(values):
        start, end = span
        t = s["ts"].to_numpy(np.int64)
        sel = (t >= start) & (t < end)
        if sel.any():
            width = max(end - start, 1)
            b = np.minimum((t[sel] - start) * TIMELINE_BINS // width, TIMELINE_BINS - 1)
            top = np.full(TIMELINE_BINS, -1, np.int64)
            np.maximum.at(top, b, values[sel])
            line = {"rank": rank, "series": series, "start": start, "end": end,
                    "bins": [int(v) if v >= 0 else None for v in top]}
    return row, steps, line


#: The per-run memory figures `diff` and `bench` compare (bytes; None when unknown).
RUN_METRICS = ("peak_rss_bytes", "unprofiled_rss_bytes", "job_rss_bytes",
               "peak_allocated_bytes",
               "peak_reserved_bytes", "param_bytes",
               *(f"peak_{p}_bytes" for p in PHASES))


def _number(v: object) -> int | float | None:
    """A metric's value as a number (None: none, or not a number)."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@dataclass
class RunMemory:
    """One run's memory (:func:`run_memory`), bytes; None where unknown."""

    peak_rss_bytes: int | None = None
    unprofiled_rss_bytes: int | None = None
    #: the resident peaks of every process added up
    job_rss_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    param_bytes: int | None = None
    #: phase → the largest main-series sample in it
    by_phase: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys(PHASES))
    #: the main series of the per-phase peaks (``rss``, ``allocated``, ``reserved``)
    series: str | None = None
    #: whose allocator figure it is (``kineto cpu``, ``xprof cpu`` …)
    allocator: str | None = None

    def metrics(self) -> dict[str, int | None]:
        """The figures of :data:`RUN_METRICS`, by name."""
        return {"peak_rss_bytes": self.peak_rss_bytes,
                "unprofiled_rss_bytes": self.unprofiled_rss_bytes,
                "job_rss_bytes": self.job_rss_bytes,
                "peak_allocated_bytes": self.peak_allocated_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes, "param_bytes": self.param_bytes,
                **{f"peak_{p}_bytes": self.by_phase.get(p) for p in PHASES}}


def run_memory(ranks: pd.DataFrame) -> RunMemory:
    """One run's memory from its per-rank rows: the largest worker's resident, allocator and
    per-phase peaks (the worker holding the most; all ranks when there is no worker),
    ``job_rss_bytes`` the resident peaks of every process (workers, servers, schedulers)
    added up — the job's footprint when the peaks coincide, an upper bound otherwise — and
    the model's parameter bytes; ``series``: the main series of the per-phase peaks;
    ``allocator``: whose allocator figure it is (``kineto cpu``, ``xprof cpu`` …)."""
    if ranks.empty:
        return RunMemory()
    workers = ranks[ranks["role"] == "worker"]
    rows = workers if len(workers) else ranks

    def top(col: str) -> int | None:
        v = pd.to_numeric(rows[col], errors="coerce").dropna()
        return int(v.max()) if len(v) else None

    rss = pd.to_numeric(ranks["peak_rss_bytes"], errors="coerce").dropna()
    series = rows["series"].dropna()
    alloc = rows.dropna(subset=["allocated_source"])
    return RunMemory(
        peak_rss_bytes=top("peak_rss_bytes"), unprofiled_rss_bytes=top("unprofiled_rss_bytes"),
        job_rss_bytes=int(rss.sum()) if len(rss) else None,
        peak_allocated_bytes=top("peak_allocated_bytes"),
        peak_reserved_bytes=top("peak_reserved_bytes"), param_bytes=top("param_bytes"),
        by_phase={p: top(f"peak_{p}_bytes") for p in PHASES},
        series=str(series.iloc[0]) if len(series) else None,  # of the per-phase peaks
        allocator=(f"{alloc['allocated_source'].iloc[0]} "
                   f"{'cpu' if alloc['allocated_device'].iloc[0] == 'cpu' else 'gpu'}"
                   if len(alloc) else None))


def compare_memory(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two runs' memory side by side (per-rank rows of each): per metric of
    :data:`RUN_METRICS` known in either, A and B bytes, ratio A/B and delta A−B. The
    per-phase peaks are compared only when both runs' main series is the same (resident
    against resident), and allocator peaks get a ratio only when both come from the same
    kind of allocator (``run_memory``'s ``allocator``: torch's CPU allocator counts what the
    profiled steps allocated, TensorFlow's every large tensor: not comparable)."""
    ma, mb = run_memory(a), run_memory(b)
    rows = []
    same = ma.series is not None and ma.series == mb.series
    alike = ma.allocator == mb.allocator
    metrics_a, metrics_b = ma.metrics(), mb.metrics()
    for k in RUN_METRICS:
        va, vb = _number(metrics_a[k]), _number(metrics_b[k])
        if (va is None and vb is None) or (k in _PHASE_METRICS and not same):
            continue
        pair = (va, vb) if va is not None and vb is not None and (
            alike or k not in _ALLOCATOR_METRICS) else None
        rows.append({"metric": k.removesuffix("_bytes"), "a_bytes": va, "b_bytes": vb,
                     "ratio": pair[0] / pair[1] if pair and pair[1] else None,
                     "delta_bytes": pair[0] - pair[1] if pair else None})
    out = pd.DataFrame(rows, columns=["metric", "a_bytes", "b_bytes", "ratio", "delta_bytes"])
    return out.astype({"a_bytes": "Int64", "b_bytes": "Int64", "delta_bytes": "Int64",
                       "ratio": "float64"})


_PHASE_METRICS = {f"peak_{p}_bytes" for p in PHASES}
_ALLOCATOR_METRICS = {"peak_allocated_bytes", "peak_reserved_bytes"}
