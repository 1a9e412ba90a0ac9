"""The benchmark matrix comparison: per run samples/s, step time, phases, scaling
efficiency and peak memory (with its ratio to the leanest run of the same model and worker
count), the canonical operators with the largest cross-framework ratios (the research's
"convolution_backward 7.67x" table), and for each multi-worker run the model's prediction
from its 1-worker run beside the measurement (made by :mod:`opprof.model.benchpredict`).
Pure functions over recorded runs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import phase_summary, step_breakdown
from opprof.analysis.convergence import TARGETS
from opprof.analysis.convergence import summary as convergence_summary
from opprof.analysis.memory import RunMemory, memory_part, run_memory
from opprof.analysis.noise import NOISE_SPREAD, Noise, assess, flags
from opprof.analysis.ops import op_table
from opprof.kinds import DONE, Mode, RunStatus
from opprof.taxonomy import PHASES
from opprof.trace import Trace, convergence_frame

if TYPE_CHECKING:
    from opprof.flops.peaks import PeakOptions
    from opprof.jsontypes import JSONObject
    from opprof.meta import MetaMapping

#: An operator enters the cross-framework table when it takes at least this share of the
#: slower run's step time (tiny operators give huge, meaningless ratios).
MIN_OP_SHARE = 0.01
#: Each run's memory in the bench table (opprof.analysis.memory.run_memory), bytes.
MEMORY_COLUMNS = ("unprofiled_rss_bytes", "peak_rss_bytes", "job_rss_bytes",
                  "peak_allocated_bytes")


class CurveColumns(TypedDict):
    """One run's convergence curve in bench.json's ``curves``: one list per column, thinned
    (:data:`CURVE_POINTS`), None between evaluations."""

    step: list[int]
    time_ns: list[int]
    loss: list[float | None]
    train_accuracy: list[float | None]
    test_accuracy: list[float | None]


@dataclass
class BenchConvergence:
    """A run's convergence in the bench table's terms (:func:`convergence_columns`): final
    loss, best test accuracy, seconds of training to each target test accuracy (None: not
    reached), and its curve, thinned."""

    final_loss: float | None
    best_test_accuracy: float | None
    time_to_s: dict[float, float | None]  # target accuracy → seconds
    curve: CurveColumns

    def columns(self) -> dict[str, float | None]:
        """The bench table's :data:`CONVERGENCE_COLUMNS`."""
        return {"final_loss": self.final_loss, "best_test_accuracy": self.best_test_accuracy,
                **{f"time_to_{round(t * 100)}_s": s for t, s in self.time_to_s.items()}}


@dataclass
class BenchPrediction:
    """The model's prediction of a multi-worker run from its 1-worker run, checked against
    it (:func:`opprof.model.benchpredict.prediction`): predicted profiled step and scaling
    (step(1) / step(N)) beside the measured scaling, the error, and a note saying where α
    and β came from — or, with the numbers None, why there is no prediction."""

    note: str = ""
    predicted_step_ns: float | None = None
    prediction_error: float | None = None
    predicted_scaling: float | None = None
    profiled_scaling: float | None = None


@dataclass
class Spread:
    """A figure over a combination's repetitions (``bench --repeat``): the median of the
    repetitions that have it, their minimum and maximum (all None: none has it)."""

    median: float | None = None
    low: float | None = None
    high: float | None = None


@dataclass
class RunSummary:
    """What the comparison needs from one run (:func:`summarize`), or from the repetitions of
    one combination (:func:`combine_repeats`), and its prediction (:func:`prediction`)."""

    memory: RunMemory
    samples_per_s: float | None
    unprofiled_step_ns: float | None
    step_ns: float | None  # mean profiled step
    phases: dict[str, float]  # wall ns per step of each phase
    ops: dict[str, float]  # host ns per rank-step of each canonical op
    batch_size: int | None
    framework_version: str | None
    noise: Noise | None
    #: `bench --converge`: the bench table's convergence columns (with ``--repeat``: their
    #: medians) and the run's curve (thinned)
    convergence: dict[str, float | None] | None = None
    curve: CurveColumns | None = None
    #: ``bench --repeat``: how many, which one is the median (from 1), the spreads over them
    repeats: int | None = None
    median_repeat: int | None = None
    spreads: dict[str, Spread] = field(default_factory=dict)
    repeat_spread: float | None = None  # (max − min) / median of samples/s
    curves: list[CurveColumns | None] | None = None  # every repetition's curve
    prediction: BenchPrediction | None = None
    #: Model FLOPs per step, MFU and HFU against the peak named (opprof.analysis.efficiency);
    #: None without shapes or a peak.
    flops_per_step: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    peak_source: str | None = None


@dataclass
class Run:
    """One combination of the matrix and what became of it."""

    fw: str
    model: str
    workers: int
    mode: str
    status: str = RunStatus.PLANNED
    reason: str = ""
    wall_s: float | None = None
    summary: RunSummary | None = None
    #: `bench --batch-size 16,64` / `--threads 1,2` (a sweep): this run's value (None: the
    #: bench's one value)
    batch_size: int | None = None
    threads: int | None = None

    @property
    def name(self) -> str:
        """File stem of the run's trace."""
        return (f"{self.model}-{self.fw}-w{self.workers}-{self.mode}"
                + (f"-b{self.batch_size}" if self.batch_size is not None else "")
                + (f"-t{self.threads}" if self.threads is not None else ""))

    @property
    def point(self) -> tuple[int | None, int | None]:
        """Its place in the sweeps (batch size, threads); runs compare within one."""
        return self.batch_size, self.threads


@dataclass
class Bench:
    """A bench's results (bench.json, :func:`opprof.pipeline.bench.read_bench`): one row per
    run (:func:`compare`), the cross-framework op ratios, the config, the curves."""

    table: pd.DataFrame
    ratios: pd.DataFrame
    config: JSONObject
    path: Path | None = None
    #: `bench --converge`: run name → one curve per repetition (step, time_ns, loss,
    #: train_accuracy, test_accuracy lists).
    curves: dict[str, list[CurveColumns | None]] = field(default_factory=dict)
    #: `bench --threads 1,2 / --batch-size 16,64`: the sweep along each dimension
    #: (:func:`opprof.analysis.sweeps.sweep` rows), empty when not swept.
    sweeps: dict[str, pd.DataFrame] = field(default_factory=dict)


def summarize(trace: Trace, peak: PeakOptions | None = None) -> RunSummary:
    """What the comparison needs from one run's trace (``peak``: the machine's, for MFU)."""
    from opprof.analysis.efficiency import combine as combine_efficiency
    from opprof.analysis.efficiency import efficiency_part
    from opprof.analysis.report import split_ranks

    steps = step_breakdown(trace)
    phases = phase_summary(steps)
    ops = op_table(trace, n_steps=len(steps))
    m = trace.meta
    conv = convergence_columns(m)
    eff = combine_efficiency([efficiency_part(t) for t in split_ranks(trace)], m, steps, peak)
    return RunSummary(
        flops_per_step=eff.flops_per_step if eff else None,
        mfu=eff.mfu if eff else None, hfu=eff.hfu if eff else None,
        peak_source=(eff.peak.source or None) if eff else None,
        memory=run_memory(memory_part(trace).ranks),
        samples_per_s=m.get("samples_per_s"),
        unprofiled_step_ns=m.get("unprofiled_step_ns"),
        step_ns=float(steps["dur_ns"].mean()) if len(steps) else None,
        phases={p: float(phases.loc[p, "ns_per_step"]) for p in PHASES},
        ops=ops.groupby("op")["ns_per_step"].sum().to_dict(),
        batch_size=m.get("batch_size"),
        framework_version=m.get("framework_version"),
        noise=assess(m, steps),
        convergence=conv.columns() if conv is not None else None,
        curve=conv.curve if conv is not None else None)


#: The bench table's convergence columns (`bench --converge`): final loss, best test
#: accuracy, and seconds of training to each target test accuracy (None: not reached).
CONVERGENCE_COLUMNS = ("final_loss", "best_test_accuracy",
                       *(f"time_to_{round(t * 100)}_s" for t in TARGETS))
#: Points kept per curve in bench.json (every evaluation, and the loss thinned to this).
CURVE_POINTS = 200


def convergence_columns(meta: MetaMapping) -> BenchConvergence | None:
    """A run's convergence in the bench table's terms, and its curve (thinned) for
    bench.json's ``curves``; None without a convergence table."""
    s = convergence_summary(meta)
    if s is None:
        return None
    time_to: dict[float, float | None] = {}
    for t in TARGETS:
        ns = s.time_to_accuracy.get(str(t))
        time_to[t] = ns / 1e9 if ns is not None else None
    curve = convergence_frame(meta)
    curve = curve[curve["rank"] == curve["rank"].min()]
    every = max(1, -(-len(curve) // CURVE_POINTS))
    keep = (curve["step"] % every == 0) | curve["test_accuracy"].notna()
    kept = curve[keep].drop(columns=["rank"]).astype(object)
    return BenchConvergence(s.final_loss, s.best_test_accuracy, time_to,
                            kept.where(kept.notna(), None).to_dict("list"))


def combine_repeats(summaries: list[RunSummary]) -> RunSummary:
    """One combination's summary from its repetitions (``bench --repeat``): the repetition
    whose profiled step time is the median (``median_repeat``, from 1) gives the phases,
    operators and memory (so they still sum to its step); samples/s and the step times are
    the medians over repetitions, with their minimum, maximum and spread ((max − min) /
    median); the combination is flagged with
    every flag of that repetition, and ``noisy`` when its repetitions' samples/s spread more
    than :data:`~opprof.analysis.noise.NOISE_SPREAD`."""
    if len(summaries) == 1:
        return replace(summaries[0], repeats=1)
    order = sorted(range(len(summaries)), key=lambda i: summaries[i].step_ns or 0.0)
    mid = order[(len(order) - 1) // 2]
    out = replace(summaries[mid], median_repeat=mid + 1, spreads={})

    def stats(values: list[float | None]) -> Spread:
        known = [v for v in values if v]
        return Spread(float(np.median(known)), float(min(known)), float(max(known))) \
            if known else Spread()

    for key, values in (("samples_per_s", [x.samples_per_s for x in summaries]),
                        ("unprofiled_step_ns", [x.unprofiled_step_ns for x in summaries])):
        out.spreads[key] = stats(values)
    out.samples_per_s = out.spreads["samples_per_s"].median
    out.unprofiled_step_ns = out.spreads["unprofiled_step_ns"].median
    if any(x.curve is not None for x in summaries):  # every repetition's curve, the spread
        out.curves = [x.curve for x in summaries]
        out.convergence = {}
        for key in CONVERGENCE_COLUMNS:
            out.spreads[key] = stats([(x.convergence or {}).get(key) for x in summaries])
            out.convergence[key] = out.spreads[key].median
    sps = out.spreads["samples_per_s"]
    med, low, high = sps.median, sps.low, sps.high
    spread = (high - low) / med if med and high is not None and low is not None else None
    noise = out.noise
    if noise is not None and spread is not None and spread > NOISE_SPREAD:
        noise = noise.flagged("noisy")
    out.repeats, out.repeat_spread, out.noise = len(summaries), spread, noise
    return out


def compare(runs: list[Run], top: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run: status, samples/s, step times, phases, scaling efficiency;
    the operators with the largest cross-framework ratios)."""
    rows = []
    for r in runs:
        s = r.summary
        noise = s.noise if s is not None else None
        pred = (s.prediction if s is not None else None) or BenchPrediction()
        mem = s.memory if s is not None else RunMemory()
        sps = s.spreads.get("samples_per_s", Spread()) if s is not None else Spread()
        row = {"fw": r.fw, "model": r.model, "workers": r.workers, "mode": r.mode,
               "batch_size": r.batch_size if r.batch_size is not None else (
                   s.batch_size if s else None),
               "threads": r.threads,
               "status": r.status, "samples_per_s": s.samples_per_s if s else None,
               "unprofiled_step_ns": s.unprofiled_step_ns if s else None,
               "step_ns": s.step_ns if s else None,
               **{p: s.phases.get(p) if s else None for p in PHASES},
               "scaling_efficiency": None, "profiled_scaling": pred.profiled_scaling,
               "predicted_step_ns": pred.predicted_step_ns,
               "predicted_scaling": pred.predicted_scaling,
               "prediction_error": pred.prediction_error,
               "prediction_note": pred.note,
               "unprofiled_rss_bytes": mem.unprofiled_rss_bytes,
               "peak_rss_bytes": mem.peak_rss_bytes, "job_rss_bytes": mem.job_rss_bytes,
               "peak_allocated_bytes": mem.peak_allocated_bytes,
               "rss_ratio": None, "wall_s": r.wall_s, "reason": r.reason,
               "flags": ",".join(flags(noise)),
               "unprofiled_spread": noise.spread if noise else None,
               "unprofiled_drift": noise.drift if noise else None,
               "overhead": noise.overhead if noise else None,
               "repeats": s.repeats if s else None,
               "samples_per_s_min": sps.low, "samples_per_s_max": sps.high,
               "repeat_spread": s.repeat_spread if s else None,
               "flops_per_step": s.flops_per_step if s else None,
               "mfu": s.mfu if s else None, "hfu": s.hfu if s else None,
               "peak_source": s.peak_source if s else None,
               **(s.convergence if s is not None and s.convergence is not None else {})}
        rows.append(row)
    table = pd.DataFrame(rows)
    _memory_ratios(table, runs)
    single = {(r.fw, r.model, r.point): r.summary.samples_per_s for r in runs
              if r.mode == Mode.SINGLE and r.summary and r.summary.samples_per_s}
    for i, r in enumerate(runs):
        one = single.get((r.fw, r.model, r.point))
        n_thr = r.summary.samples_per_s if r.summary else None
        if one and n_thr:
            table.loc[i, "scaling_efficiency"] = n_thr / (r.workers * one)
    return table, op_ratios(runs, top)


def _memory_ratios(table: pd.DataFrame, runs: list[Run]) -> None:
    """``rss_ratio``: each run's resident peak before profiling (largest worker; the peak
    until the last profiled step where that is unknown) over the smallest among the runs of
    the same model, batch size and worker count (1.00x: the leanest; in place). Before
    profiling, because the profilers' own buffers differ and grow with the profiled steps."""
    peak = pd.to_numeric(table["unprofiled_rss_bytes"], errors="coerce").fillna(
        pd.to_numeric(table["peak_rss_bytes"], errors="coerce"))
    key = pd.Series([f"{r.model}|{r.summary.batch_size if r.summary else None}|{r.workers}"
                     for r in runs], index=table.index)
    least = peak.groupby(key).transform("min") if len(table) else peak
    table["rss_ratio"] = (peak / least.where(least > 0)).astype(object).where(
        peak.notna(), None)


def op_ratios(runs: list[Run], top: int) -> pd.DataFrame:
    """For every two runs of different frameworks with the same model, batch size and worker
    count: per canonical op (host time per rank-step), slower / faster; the largest first."""
    cols = ["model", "batch_size", "workers", "op", "slower", "faster", "slower_ns_per_step",
            "faster_ns_per_step", "ratio"]
    done = [(r, r.summary) for r in runs if r.status in DONE and r.summary is not None]
    out = []
    for (a, sa), (b, sb) in itertools.combinations(done, 2):
        if a.fw == b.fw or (a.model, a.workers, a.threads) != (b.model, b.workers, b.threads) \
                or sa.batch_size != sb.batch_size:
            continue
        for op in sorted(set(sa.ops) & set(sb.ops) - {"other"}):
            ta, tb = sa.ops[op], sb.ops[op]
            if ta <= 0 or tb <= 0:
                continue
            slow, fast, ts, tf = (a, b, ta, tb) if ta >= tb else (b, a, tb, ta)
            if ts < MIN_OP_SHARE * ((sa if slow is a else sb).step_ns or 0):
                continue
            out.append({"model": a.model, "batch_size": sa.batch_size,
                        "workers": a.workers, "op": op, "slower": f"{slow.fw} {slow.mode}",
                        "faster": f"{fast.fw} {fast.mode}", "slower_ns_per_step": ts,
                        "faster_ns_per_step": tf, "ratio": ts / tf})
    if not out:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(out)[cols]
    return df.sort_values("ratio", ascending=False, kind="stable").head(top).reset_index(
        drop=True)
