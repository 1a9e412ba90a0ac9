"""Everything `opprof report` shows: computed rank by rank, then combined.

:func:`analyze` reduces one rank's events (or several ranks') to a :class:`RankPart` — its
step breakdown rows, compact operator-duration tables, device rows, its memory peaks and
the small tables the cross-rank analysis needs — and :func:`combine` turns the parts of
every rank into the :class:`Report`. Parts are small (no events), so a job of any rank
count is analyzed with a few ranks' events in memory at a time, in any process
(``opprof.parallel``). The result is identical to analyzing all ranks at once
(``build_report``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from opprof.analysis.breakdown import comm_overlap_ratio, phase_summary, step_breakdown
from opprof.analysis.collectives import COLUMNS as COLLECTIVE_COLUMNS
from opprof.analysis.collectives import collective_part, combine_collectives
from opprof.analysis.compiled import compile_steps, fused_kernels, merge_kernels
from opprof.analysis.convergence import Summary
from opprof.analysis.convergence import summary as convergence_summary
from opprof.analysis.devices import COLUMNS as DEVICE_COLUMNS
from opprof.analysis.devices import device_breakdown
from opprof.analysis.efficiency import Efficiency, EfficiencyPart, efficiency_part
from opprof.analysis.efficiency import combine as combine_efficiency
from opprof.analysis.experts import COLUMNS as EXPERT_COLUMNS
from opprof.analysis.experts import LOAD_COLUMNS, combine_experts, expert_part
from opprof.analysis.memory import MemoryPart, combine_memory, memory_part
from opprof.analysis.noise import Noise, assess
from opprof.analysis.ops import merge_durations, op_durations, table_from_durations
from opprof.analysis.pipeline import COLUMNS as PIPELINE_COLUMNS
from opprof.analysis.pipeline import combine_pipeline, pipeline_part
from opprof.analysis.ranks import (
    RankLocal,
    collectives,
    combine_ranks,
    concat_local,
    rank_local,
    synchronous,
)
from opprof.strings import plain_strings
from opprof.trace import Trace, rank_slices

if TYPE_CHECKING:
    from opprof.analysis.critpath import RankWalk
    from opprof.flops.peaks import PeakOptions
    from opprof.meta import MetaMapping

RANK_STEP_COLUMNS = ["rank", "step", "dur_ns", "own_ns", "comm_ns", "wait_ns", "transfer_ns"]


@dataclass(frozen=True)
class Report:
    """The analysis of one trace: per-step breakdown, phase summary, operator tables; all a
    report's renderers draw (immutable: made once, by :func:`combine`)."""

    meta: MetaMapping
    steps: pd.DataFrame
    phases: pd.DataFrame
    ops: pd.DataFrame
    device_ops: pd.DataFrame
    ranks: pd.DataFrame
    comm_overlap: float | None
    devices: pd.DataFrame = field(default_factory=pd.DataFrame)
    stragglers: pd.DataFrame = field(default_factory=pd.DataFrame)
    device_span: str = "steps"
    memory: MemoryPart = field(default_factory=MemoryPart)
    #: One row per (rank, step): ``rank``, ``step``, ``dur_ns``, ``own_ns``, ``comm_ns``,
    #: ``wait_ns``, ``transfer_ns`` (opprof.analysis.ranks: own = step − wait); what the
    #: rank × step heatmap of the HTML report shows.
    rank_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: The run's timing quality (opprof.analysis.noise); None without unprofiled samples.
    noise: Noise | None = None
    #: Steps that compiled a graph (opprof.analysis.compiled): rank, step, compile_ns.
    compile_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: What the fused rows hold, by native name (opprof.analysis.compiled), with
    #: ``ns_per_step``.
    fused_kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: Per collective kind (opprof.analysis.ranks ``kinds``): calls, time, wait, transfer,
    #: hidden share, mean per (rank, step).
    collective_kinds: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: The convergence curve's summary (opprof.analysis.convergence); None without one.
    convergence: Summary | None = None
    #: One row per (collective, process group, size): opprof.analysis.collectives.
    collectives: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=COLLECTIVE_COLUMNS))
    #: One row per (rank, step): the critical path's bound-by split
    #: (opprof.analysis.critpath); computed when `report --by critical` and the HTML report
    #: ask for it (empty otherwise).
    critical: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: FLOPs, bytes, MFU and HFU, the roofline (opprof.analysis.efficiency); None when the
    #: trace holds no operator shapes.
    efficiency: Efficiency | None = None
    #: One row per (rank, step) of a pipeline stage (opprof.analysis.pipeline).
    pipeline: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=PIPELINE_COLUMNS))
    #: All-to-all bytes per peer per (rank, step), and the experts' load per (step, call)
    #: (opprof.analysis.experts).
    experts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EXPERT_COLUMNS))
    expert_load: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=LOAD_COLUMNS))


@dataclass
class RankPart:
    """One rank's (or a few ranks') share of a report; no events, only small tables."""

    ranks: list[int]
    events: int
    steps: pd.DataFrame
    host_durations: pd.DataFrame
    device_durations: pd.DataFrame
    devices: pd.DataFrame
    local: RankLocal
    memory: MemoryPart = field(default_factory=MemoryPart)
    compile_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    fused_kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)
    efficiency: EfficiencyPart = field(default_factory=EfficiencyPart)
    pipeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    experts: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: the critical-path walks of its steps (``report --by critical``, HTML), or None
    critical: RankWalk | None = None


def analyze(trace: Trace, device_span: str = "steps", critical: bool = False,
            steps: pd.DataFrame | None = None) -> RankPart:
    """The per-rank work of a report, on the ranks of ``trace`` (usually one); ``critical``:
    with the critical-path walks of its steps (:func:`opprof.analysis.critpath.rank_walk`);
    ``steps``: its :func:`step_breakdown`, when the caller has it."""
    full = trace
    if "detail" in trace.events:  # only collective_part reads it; every filter would copy it
        trace = Trace(trace.events.drop(columns=["detail"]), trace.meta)
    if steps is None:
        steps = step_breakdown(trace)
    # what collective_part and rank_local both start from (of the whole table: none of it
    # reads ``detail``, and the model asked for the same table's already)
    found = collectives(full)
    comm = collective_part(full, found=found)  # reads the process groups in ``detail``
    return RankPart(
        ranks=[int(r) for r in pd.unique(trace.events["rank"])],
        events=len(trace.events),
        steps=steps,
        host_durations=op_durations(trace, "host"),
        device_durations=op_durations(trace, "device"),
        devices=device_breakdown(trace, device_span),
        local=rank_local(trace, steps, found=found),
        memory=memory_part(trace),
        compile_steps=compile_steps(trace),
        fused_kernels=fused_kernels(trace),
        collectives=comm,
        efficiency=efficiency_part(trace),
        pipeline=pipeline_part(trace),
        experts=expert_part(full),
        critical=_walk(trace, steps) if critical else None,
    )


def _walk(trace: Trace, steps: pd.DataFrame) -> RankWalk:
    from opprof.analysis.critpath import rank_walk

    return rank_walk(trace, steps)


def combine(parts: list[RankPart], meta: MetaMapping,
            device_span: str = "steps", peak: PeakOptions | None = None,
            critical: pd.DataFrame | None = None) -> Report:
    """The report of a job from the parts of its ranks (in any order); ``peak``: what the user
    said of the machine's peak (opprof.flops.peaks); ``critical``: the critical path of its
    steps computed already (:func:`opprof.analysis.critpath.critical_path` on the job's
    graph), else from the parts' walks."""
    parts = sorted(parts, key=lambda p: min(p.ranks, default=-1))
    steps = _concat([p.steps for p in parts])
    n = len(steps)
    ranks = combine_ranks(steps, concat_local([p.local for p in parts]), synchronous(meta))
    devices = _concat([p.devices for p in parts])
    kernels = merge_kernels([p.fused_kernels for p in parts])
    kernels["ns_per_step"] = kernels["total_ns"] / max(n, 1)
    experts, expert_load = combine_experts([p.experts for p in parts])
    return Report(
        meta=meta,
        steps=steps,
        phases=phase_summary(steps),
        ops=table_from_durations(merge_durations([p.host_durations for p in parts]), n),
        device_ops=table_from_durations(merge_durations([p.device_durations for p in parts]),
                                        n),
        ranks=ranks.ranks,
        comm_overlap=comm_overlap_ratio(steps),
        devices=devices if len(devices) else pd.DataFrame(columns=DEVICE_COLUMNS),
        stragglers=ranks.stragglers,
        device_span=device_span,
        memory=combine_memory([p.memory for p in parts]),
        rank_steps=ranks.per_step.reindex(columns=RANK_STEP_COLUMNS),
        noise=assess(meta, steps),
        compile_steps=_concat([p.compile_steps for p in parts]),
        fused_kernels=kernels,
        collective_kinds=ranks.kinds,
        convergence=convergence_summary(meta),
        collectives=combine_collectives([p.collectives for p in parts], n, ranks.collectives),
        efficiency=combine_efficiency([p.efficiency for p in parts], meta, steps, peak),
        pipeline=combine_pipeline([p.pipeline for p in parts], meta),
        experts=experts,
        expert_load=expert_load,
        critical=critical if critical is not None else _critical(parts, meta),
    )


def _critical(parts: list[RankPart], meta: MetaMapping) -> pd.DataFrame:
    """The critical path of every (rank, step), from the ranks' walks (empty without)."""
    walks = [p.critical for p in parts if p.critical is not None]
    if not walks:
        return pd.DataFrame()
    from opprof.analysis.critpath import combine_walks

    return combine_walks(walks, synchronous(meta))


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    full = [f for f in frames if len(f)]
    if not full:
        return frames[0] if frames else pd.DataFrame()
    return full[0] if len(full) == 1 else pd.concat(full, ignore_index=True)


def split_ranks(trace: Trace) -> list[Trace]:
    """One Trace per rank (same metadata), ranks in order of first appearance."""
    ev = trace.events
    slices = rank_slices(ev)
    if len(slices) <= 1:
        return [trace]
    return [Trace(ev.iloc[rows].reset_index(drop=True), trace.meta) for _, rows in slices]


def build_report(trace: Trace, device_span: str = "steps",
                 peak: PeakOptions | None = None,
                 critical: pd.DataFrame | None = None,
                 steps: pd.DataFrame | None = None) -> Report:
    """Analyze a trace for `opprof report` (rank by rank, then combined), with its critical
    path when given (``steps``: the whole trace's :func:`step_breakdown`, when the caller has
    it: each rank's rows are that rank's breakdown, a step breakdown being rank by rank)."""
    with plain_strings():
        return combine([analyze(t, device_span, steps=_rank_steps(steps, t))
                        for t in split_ranks(trace)], trace.meta, device_span, peak, critical)


def _rank_steps(steps: pd.DataFrame | None, trace: Trace) -> pd.DataFrame | None:
    """The rows of ``steps`` of the ranks of ``trace`` (a copy, its own index), None where it
    has none (then :func:`analyze` breaks the steps down itself, its empty table the same)."""
    if steps is None:
        return None
    mine = steps[steps["rank"].isin(pd.unique(trace.events["rank"]))]
    return mine.reset_index(drop=True) if len(mine) else None
