"""What the rules read from one trace, computed once and shared: the report (phases, operators,
ranks, memory, noise), the what-if context (the model's baseline and the dependency graph),
the critical path's bound-by split, the names the trace holds — and, where their analyses
exist, the pipeline and efficiency tables the bubble and low-efficiency rules read."""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.filters import device_work, on_host, workers
from opprof.intervals import lane_ids, nest
from opprof.parallelism import DDP_FORWARD, DDP_NAME

#: Point-to-point operators (a pipeline's stages hand activations and gradients on).
P2P = ("send", "recv")

if TYPE_CHECKING:
    from opprof.analysis.report import Report
    from opprof.meta import MetaMapping
    from opprof.model.whatif import Context
    from opprof.trace import Trace


class Evidence:
    """One trace's evidence for the rules (each property computed on first use)."""

    def __init__(self, trace: Trace, report: Report, label: str = "",
                 context: Context | None = None) -> None:
        self.trace = trace
        self.report = report
        self.label = label
        if context is not None:  # made already (the report's critical path shares its graph)
            self.__dict__["context"] = context

    # ------------------------------------------------------------------ the run

    @property
    def meta(self) -> MetaMapping:
        """The trace's metadata."""
        return self.report.meta

    @property
    def framework(self) -> str:
        """``torch``, ``tf``, ``mxnet`` … (empty when the trace does not say)."""
        return str(self.meta.get("framework") or "")

    @property
    def mode(self) -> str:
        """The parallel layout the model infers (``single``, ``allreduce``, ``fsdp`` …)."""
        return str(self.context.base.mode)

    @cached_property
    def step_ns(self) -> float:
        """The mean profiled step of the worker ranks (what the shares divide)."""
        steps = self.report.steps
        return float(steps["dur_ns"].mean()) if len(steps) else 0.0

    def phase_ns(self, phase: str) -> float:
        """A phase's mean wall ns per step (the breakdown: exposed time)."""
        phases = self.report.phases
        if phase not in phases.index:
            return 0.0
        return float(phases.loc[phase, "ns_per_step"])

    @cached_property
    def gpu(self) -> bool:
        """Whether the worker ranks ran device work (kernels, copies)."""
        ev = self.trace.events
        return bool((device_work(ev) & workers(ev)).any())

    @cached_property
    def names(self) -> pd.Index:
        """Every native event name in the trace, once each."""
        col = self.trace.events["name"]
        if isinstance(col.dtype, pd.CategoricalDtype):
            used = np.unique(col.cat.codes.to_numpy())
            return pd.Index(col.cat.categories[used[used >= 0]])
        return pd.Index(col.dropna().unique())

    def named(self, pattern: str) -> list[str]:
        """The trace's event names matching the regular expression ``pattern``."""
        rx = re.compile(pattern)
        return [str(n) for n in self.names if rx.search(str(n))]

    def ops_per_step(self, where: str = "host") -> pd.Series:
        """Canonical operator → its time per step (host operators or device kernels)."""
        t = self.report.ops if where == "host" else self.report.device_ops
        if t.empty:
            return pd.Series(dtype=float)
        out: pd.Series = t.groupby("op")["ns_per_step"].sum().sort_values(ascending=False)
        return out

    @cached_property
    def wait_ns(self) -> float:
        """The part of the exposed communication (``comm`` phase) that is waiting for a slower
        rank, per step: each (rank, step)'s wait (:mod:`opprof.analysis.ranks`) up to its
        exposed communication, the mean over them (0 for one rank)."""
        per, steps = self.report.rank_steps, self.report.steps
        if per.empty or "wait_ns" not in per or steps.empty:
            return 0.0
        both = steps[["rank", "step", "comm"]].merge(per[["rank", "step", "wait_ns"]],
                                                     on=["rank", "step"], how="left")
        wait = np.minimum(both["wait_ns"].fillna(0.0).to_numpy(np.float64),
                          both["comm"].to_numpy(np.float64))
        return float(wait.mean()) if len(wait) else 0.0

    @cached_property
    def p2p_share(self) -> float:
        """The share of the collectives' time that is point-to-point (send/recv)."""
        kinds = self.report.collective_kinds
        total = float(kinds["comm_ns"].sum()) if len(kinds) else 0.0
        if total <= 0:
            return 0.0
        return float(kinds.loc[kinds["op"].isin(P2P), "comm_ns"].sum()) / total

    @cached_property
    def ddp(self) -> bool:
        """Whether torch's DistributedDataParallel runs the model (its forward's range, its
        reducer's): its knobs (buckets, ``no_sync``, ``broadcast_buffers``) apply."""
        return bool(self.named(f"^(?:{DDP_NAME.pattern})"))

    @cached_property
    def micro_batches(self) -> int:
        """The forward passes a step holds where the loop accumulates gradients (Lightning's
        ``accumulate_grad_batches``, the Hugging Face ``gradient_accumulation_steps``, DDP's
        ``no_sync``): per worker rank and step, DDP's forward ranges where DDP runs the model,
        else the host's loss computations (a loss module and the operators inside it: the
        outermost, once); the median over them, 1 where the trace shows neither."""
        ev = self.trace.events
        sel = workers(ev) & on_host(ev) & (ev["step"] >= 0)
        ddp = sel & ev["name"].isin(self.named(f"^(?:{DDP_FORWARD.pattern})"))
        sel = ddp if ddp.any() else sel & (ev["op"] == "loss") & (ev["phase"] == "forward")
        if not sel.any():
            return 1
        d = ev.loc[sel, ["rank", "pid", "tid", "step", "ts", "dur"]]
        rank, ts = d["rank"].to_numpy(np.int64), d["ts"].to_numpy(np.int64)
        _, outer = nest(lane_ids(rank, d["pid"].to_numpy(np.int64), d["tid"].to_numpy(np.int64)),
                        ts, ts + d["dur"].to_numpy(np.int64), np.ones(len(d), bool))
        per = pd.Series(outer == np.arange(len(d))).groupby([rank, d["step"].to_numpy()]).sum()
        return max(1, int(np.median(per.to_numpy())))

    @property
    def pipeline_job(self) -> bool:
        """A pipeline-parallel job: its mode names ``pp``, or most of its communication is
        send/recv between stages."""
        return "pp" in str(self.meta.get("mode") or "").split("+") or self.p2p_share > 0.5

    # ------------------------------------------------------------------ the model and graph

    @cached_property
    def context(self) -> Context:
        """The what-if context (baseline and dependency graph; opprof.model.whatif)."""
        from opprof.model.whatif import context

        return context(self.trace, self.label)

    @cached_property
    def critical(self) -> pd.DataFrame:
        """The critical path's bound-by split per (rank, step) (empty: no graph)."""
        from opprof.analysis.critpath import COLUMNS, bound_by

        graph = self.context.graph
        if graph is None:
            return pd.DataFrame()
        if len(self.report.critical):  # the report's, from this graph: the same split
            return self.report.critical[COLUMNS]
        return bound_by(graph[0])

    def bound_share(self, part: str, ranks: list[int] | None = None) -> float:
        """The share of the steps the critical path gives to ``part`` (compute, comm, launch,
        sync, load, idle), over all (rank, step) or ``ranks``'."""
        c = self.critical
        if c.empty:
            return 0.0
        if ranks is not None:
            c = c[c["rank"].isin(ranks)]
        total = float(c["step_ns"].sum())
        return float(c[part].sum()) / total if total > 0 else 0.0

    # ------------------------------------------------------------------ other analyses

    @property
    def pipeline(self) -> pd.DataFrame | None:
        """The pipeline table (``report --by pipeline``: rank, step, stage, schedule,
        microbatches, bubble_ns …), None where the report has none (not a pipeline job, or an
        opprof without the pipeline analysis)."""
        return _table(getattr(self.report, "pipeline", None))

    @property
    def roofline(self) -> pd.DataFrame | None:
        """The roofline rows (op, phase, flops, bytes, intensity, achieved_flops_per_s,
        achieved_bytes_per_s, roofline_share, bound …), None without FLOPs for this trace."""
        eff = getattr(self.report, "efficiency", None)
        return _table(getattr(eff, "roofline", None)) if eff is not None else None

    @property
    def efficiency(self) -> Any:
        """The report's efficiency (MFU, peak …), None without it."""
        return getattr(self.report, "efficiency", None)


def _table(value: object) -> pd.DataFrame | None:
    return value if isinstance(value, pd.DataFrame) and len(value) else None

