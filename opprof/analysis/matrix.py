"""The benchmark matrix comparison: per run samples/s, step time, phases, scaling
efficiency and peak memory (with its ratio to the leanest run of the same model and worker
count), the canonical operators with the largest cross-framework ratios (the research's
"convolution_backward 7.67x" table), and for each multi-worker run the model's prediction
from its 1-worker run beside the measurement. Pure functions over recorded runs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import phase_summary, step_breakdown
from opprof.analysis.commmodel import Network
from opprof.analysis.convergence import TARGETS
from opprof.analysis.convergence import summary as convergence_summary
from opprof.analysis.memory import memory_part, run_memory
from opprof.analysis.noise import NOISE_SPREAD, assess, flags
from opprof.analysis.ops import op_table
from opprof.analysis.predict import check, network_from_trace, predict
from opprof.errors import OpprofError
from opprof.kinds import DONE, Mode, RunStatus
from opprof.taxonomy import PHASES
from opprof.trace import Trace, convergence_frame

if TYPE_CHECKING:
    from opprof.meta import MetaMapping

#: An operator enters the cross-framework table when it takes at least this share of the
#: slower run's step time (tiny operators give huge, meaningless ratios).
MIN_OP_SHARE = 0.01
#: Each run's memory in the bench table (opprof.analysis.memory.run_memory), bytes.
MEMORY_COLUMNS = ("unprofiled_rss_bytes", "peak_rss_bytes", "job_rss_bytes",
                  "peak_allocated_bytes")


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
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """File stem of the run's trace."""
        return f"{self.model}-{self.fw}-w{self.workers}-{self.mode}"


@dataclass
class Bench:
    """A bench's results (bench.json, :func:`opprof.pipeline.bench.read_bench`): one row per
    run (:func:`compare`), the cross-framework op ratios, the config, the curves."""

    table: pd.DataFrame
    ratios: pd.DataFrame
    config: dict[str, Any]
    path: Path | None = None
    #: `bench --converge`: run name → one curve per repetition (step, time_ns, loss,
    #: train_accuracy, test_accuracy lists).
    curves: dict[str, Any] = field(default_factory=dict)


def summarize(trace: Trace) -> dict[str, Any]:
    """What the comparison needs from one run's trace."""
    steps = step_breakdown(trace)
    phases = phase_summary(steps)
    ops = op_table(trace, n_steps=len(steps))
    m = trace.meta
    memory = run_memory(memory_part(trace).ranks)
    return {
        "memory": {k: memory[k] for k in MEMORY_COLUMNS},
        "samples_per_s": m.get("samples_per_s"),
        "unprofiled_step_ns": m.get("unprofiled_step_ns"),
        "step_ns": float(steps["dur_ns"].mean()) if len(steps) else None,
        "phases": {p: float(phases.loc[p, "ns_per_step"]) for p in PHASES},
        "ops": ops.groupby("op")["ns_per_step"].sum().to_dict(),
        "batch_size": m.get("batch_size"),
        "framework_version": m.get("framework_version"),
        "noise": assess(m, steps),
        **convergence_columns(m),
    }


#: The bench table's convergence columns (`bench --converge`): final loss, best test
#: accuracy, and seconds of training to each target test accuracy (None: not reached).
CONVERGENCE_COLUMNS = ("final_loss", "best_test_accuracy",
                       *(f"time_to_{round(t * 100)}_s" for t in TARGETS))
#: Points kept per curve in bench.json (every evaluation, and the loss thinned to this).
CURVE_POINTS = 200


def convergence_columns(meta: MetaMapping) -> dict[str, Any]:
    """A run's convergence in the bench table's terms, and its curve (thinned) for
    bench.json's ``curves``; empty without a convergence table."""
    s = convergence_summary(meta)
    if s is None:
        return {}
    out: dict[str, Any] = {"final_loss": s.final_loss,
                           "best_test_accuracy": s.best_test_accuracy}
    for t in TARGETS:
        ns = s.time_to_accuracy.get(str(t))
        out[f"time_to_{round(t * 100)}_s"] = ns / 1e9 if ns is not None else None
    curve = convergence_frame(meta)
    curve = curve[curve["rank"] == curve["rank"].min()]
    every = max(1, -(-len(curve) // CURVE_POINTS))
    keep = (curve["step"] % every == 0) | curve["test_accuracy"].notna()
    kept = curve[keep].drop(columns=["rank"]).astype(object)
    out["curve"] = kept.where(kept.notna(), None).to_dict("list")
    return out


def combine_repeats(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One combination's summary from its repetitions (``bench --repeat``): the repetition
    whose profiled step time is the median (``median_repeat``, from 1) gives the phases,
    operators and memory (so they still sum to its step); samples/s and the step times are
    the medians over repetitions, with their minimum, maximum and spread ((max − min) /
    median); the combination is flagged with
    every flag of that repetition, and ``noisy`` when its repetitions' samples/s spread more
    than :data:`~opprof.analysis.noise.NOISE_SPREAD`."""
    if len(summaries) == 1:
        return {**summaries[0], "repeats": 1}
    order = sorted(range(len(summaries)), key=lambda i: summaries[i]["step_ns"] or 0.0)
    mid = order[(len(order) - 1) // 2]
    out = {**summaries[mid], "median_repeat": mid + 1}

    def stats(key: str) -> tuple[float | None, float | None, float | None]:
        values = [x[key] for x in summaries if x.get(key)]
        return (float(np.median(values)), float(min(values)), float(max(values))) \
            if values else (None, None, None)

    for key in ("samples_per_s", "unprofiled_step_ns"):
        out[key], out[f"{key}_min"], out[f"{key}_max"] = stats(key)
    if any("curve" in x for x in summaries):  # every repetition's curve, for the spread
        out["curves"] = [x.get("curve") for x in summaries]
        for key in CONVERGENCE_COLUMNS:
            out[key], out[f"{key}_min"], out[f"{key}_max"] = stats(key)
    med, low, high = stats("samples_per_s")
    spread = (high - low) / med if med and high is not None and low is not None else None
    noise = out.get("noise")
    if noise is not None and spread is not None and spread > NOISE_SPREAD:
        noise = noise.flagged("noisy")
    out.update(repeats=len(summaries), repeat_spread=spread, noise=noise)
    return out


def compare(runs: list[Run], top: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run: status, samples/s, step times, phases, scaling efficiency;
    the operators with the largest cross-framework ratios)."""
    rows = []
    for r in runs:
        s = r.summary
        noise = s.get("noise")
        pred = s.get("prediction") or {}
        row = {"fw": r.fw, "model": r.model, "workers": r.workers, "mode": r.mode,
               "status": r.status, "samples_per_s": s.get("samples_per_s"),
               "unprofiled_step_ns": s.get("unprofiled_step_ns"), "step_ns": s.get("step_ns"),
               **{p: s.get("phases", {}).get(p) for p in PHASES},
               "scaling_efficiency": None, "profiled_scaling": pred.get("profiled_scaling"),
               "predicted_step_ns": pred.get("predicted_step_ns"),
               "predicted_scaling": pred.get("predicted_scaling"),
               "prediction_error": pred.get("prediction_error"),
               "prediction_note": pred.get("note", ""),
               **{k: s.get("memory", {}).get(k) for k in MEMORY_COLUMNS},
               "rss_ratio": None, "wall_s": r.wall_s, "reason": r.reason,
               "flags": ",".join(flags(noise)),
               "unprofiled_spread": noise.spread if noise else None,
               "unprofiled_drift": noise.drift if noise else None,
               "overhead": noise.overhead if noise else None, "repeats": s.get("repeats"),
               "samples_per_s_min": s.get("samples_per_s_min"),
               "samples_per_s_max": s.get("samples_per_s_max"),
               "repeat_spread": s.get("repeat_spread"),
               **{k: s.get(k) for k in CONVERGENCE_COLUMNS if k in s}}
        rows.append(row)
    table = pd.DataFrame(rows)
    _memory_ratios(table, runs)
    single = {(r.fw, r.model): r.summary.get("samples_per_s") for r in runs
              if r.mode == Mode.SINGLE and r.summary.get("samples_per_s")}
    for i, r in enumerate(runs):
        one, n_thr = single.get((r.fw, r.model)), r.summary.get("samples_per_s")
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
    key = pd.Series([f"{r.model}|{r.summary.get('batch_size')}|{r.workers}" for r in runs],
                    index=table.index)
    least = peak.groupby(key).transform("min") if len(table) else peak
    table["rss_ratio"] = (peak / least.where(least > 0)).astype(object).where(
        peak.notna(), None)


def prediction(single: Trace, multi: Trace, network: Network | None = None) -> dict[str, Any]:
    """The model's prediction of a multi-worker run from the same framework and model's
    1-worker run (:mod:`opprof.analysis.predict`), checked against it: predicted profiled step
    and scaling (step(1) / step(N)) beside the measured ones, the error, and a note saying
    where α and β came from — or why there is no prediction."""
    workers = int(multi.meta.get("workers") or len(multi.ranks) or 1)
    mode = str(multi.meta.get("mode") or "")
    try:
        if network is None:
            network = network_from_trace(multi)
        result = predict(single, [workers], mode=mode or None,
                         servers=int(multi.meta.get("servers") or 0) or None, network=network)
        c = check(result, multi, "the measured run")
    except OpprofError as exc:
        return {"note": str(exc)}
    one = result.base.step_ns
    return {"predicted_step_ns": c.predicted_step_ns, "prediction_error": c.error,
            "predicted_scaling": one / c.predicted_step_ns if c.predicted_step_ns else None,
            "profiled_scaling": one / c.measured_step_ns if c.measured_step_ns else None,
            "note": f"network {result.network.source}: {result.network_note}"}


def op_ratios(runs: list[Run], top: int) -> pd.DataFrame:
    """For every two runs of different frameworks with the same model, batch size and worker
    count: per canonical op (host time per rank-step), slower / faster; the largest first."""
    cols = ["model", "batch_size", "workers", "op", "slower", "faster", "slower_ns_per_step",
            "faster_ns_per_step", "ratio"]
    done = [r for r in runs if r.status in DONE and r.summary]
    out = []
    for a, b in itertools.combinations(done, 2):
        if a.fw == b.fw or (a.model, a.workers) != (b.model, b.workers) or \
                a.summary["batch_size"] != b.summary["batch_size"]:
            continue
        for op in sorted(set(a.summary["ops"]) & set(b.summary["ops"]) - {"other"}):
            ta, tb = a.summary["ops"][op], b.summary["ops"][op]
            if ta <= 0 or tb <= 0:
                continue
            slow, fast, ts, tf = (a, b, ta, tb) if ta >= tb else (b, a, tb, ta)
            if ts < MIN_OP_SHARE * (slow.summary["step_ns"] or 0):
                continue
            out.append({"model": a.model, "batch_size": a.summary["batch_size"],
                        "workers": a.workers, "op": op, "slower": f"{slow.fw} {slow.mode}",
                        "faster": f"{fast.fw} {fast.mode}", "slower_ns_per_step": ts,
                        "faster_ns_per_step": tf, "ratio": ts / tf})
    if not out:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(out)[cols]
    return df.sort_values("ratio", ascending=False, kind="stable").head(top).reset_index(
        drop=True)
