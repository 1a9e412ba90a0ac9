"""Diff two traces: per phase and per canonical op, A and B per step, ratio, delta, and the
share of the step-time gap each explains, ordered by that share; then one plain sentence.
Memory beside time: each run's peaks (opprof.analysis.memory.run_memory), A/B and A−B."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import phase_summary, step_breakdown
from opprof.analysis.convergence import compare as compare_convergence
from opprof.analysis.memory import compare_memory, memory_part
from opprof.analysis.noise import assess
from opprof.analysis.ops import op_table
from opprof.analysis.report import Report
from opprof.trace import Trace


@dataclass
class Diff:
    """The comparison of trace A with trace B (ratio = A / B, delta = A - B)."""

    a_label: str
    b_label: str
    a_step_ns: float
    b_step_ns: float
    phases: pd.DataFrame
    ops: pd.DataFrame
    summary: str
    #: Each side's timing quality (opprof.analysis.noise): a flagged side's numbers are
    #: noisy or inflated by the profiler, and so is the comparison.
    a_noise: dict | None = None
    b_noise: dict | None = None
    #: Memory side by side (opprof.analysis.memory.compare_memory); empty without memory rows.
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: Per op, A's step if that op ran at B's speed (``diff --whatif``;
    #: :func:`opprof.analysis.whatif.op_swaps`), or None.
    whatif: pd.DataFrame | None = None
    #: Each side's file metadata (framework, model, batch size, …), shown by the HTML page.
    a_meta: dict = field(default_factory=dict)
    b_meta: dict = field(default_factory=dict)
    #: Which run reaches a test accuracy first, split into step time and steps needed
    #: (opprof.analysis.convergence.compare); None when neither has a convergence table.
    convergence: dict | None = None

    @property
    def step_ratio(self) -> float:
        """A's step time over B's."""
        return self.a_step_ns / self.b_step_ns if self.b_step_ns else float("inf")


def label(trace: Trace | Report, fallback: str) -> str:
    """A short name for a trace: framework and model when known."""
    meta = trace.meta
    parts = [str(meta[k]) for k in ("framework", "model") if meta.get(k)]
    if meta.get("workers", 1) and int(meta.get("workers", 1)) > 1:
        parts.append(f"x{meta['workers']}")
    return " ".join(parts) or fallback


def _compare(a: pd.Series, b: pd.Series, gap: float, key: str) -> pd.DataFrame:
    df = pd.DataFrame({"a_ns_per_step": a, "b_ns_per_step": b}).fillna(0.0)
    df["ratio"] = np.where(df["b_ns_per_step"] > 0,
                           df["a_ns_per_step"] / df["b_ns_per_step"].where(df["b_ns_per_step"] > 0),
                           np.inf)
    df.loc[(df["a_ns_per_step"] == 0) & (df["b_ns_per_step"] == 0), "ratio"] = np.nan
    df["delta_ns"] = df["a_ns_per_step"] - df["b_ns_per_step"]
    df["share_of_gap"] = df["delta_ns"] / gap if gap else np.nan
    df = df.rename_axis(key).reset_index()
    order = df["delta_ns"].abs().sort_values(ascending=False, kind="stable").index
    return df.loc[order].reset_index(drop=True)


def diff(a: Trace, b: Trace, a_name: str = "A", b_name: str = "B") -> Diff:
    """Compare A with B per phase (wall time) and per canonical op (host operator time)."""
    sa, sb = step_breakdown(a), step_breakdown(b)
    d = _diff(a, b, sa, sb, op_table(a, n_steps=len(sa)), op_table(b, n_steps=len(sb)),
              a_name, b_name)
    d.memory = compare_memory(memory_part(a).ranks, memory_part(b).ranks)
    d.a_noise, d.b_noise = assess(a.meta, sa), assess(b.meta, sb)
    return d


def diff_reports(a: Report, b: Report, a_name: str = "A", b_name: str = "B") -> Diff:
    """:func:`diff` from two reports (what `opprof diff` uses: each side analyzed rank by
    rank, see opprof.job)."""
    d = _diff(a, b, a.steps, b.steps, a.ops, b.ops, a_name, b_name)
    d.memory = compare_memory(a.memory.ranks, b.memory.ranks)
    d.a_noise, d.b_noise = a.noise, b.noise
    return d


def _diff(a: Trace | Report, b: Trace | Report, sa: pd.DataFrame, sb: pd.DataFrame,
          ta: pd.DataFrame, tb: pd.DataFrame, a_name: str, b_name: str) -> Diff:
    a_step = float(sa["dur_ns"].mean()) if len(sa) else 0.0
    b_step = float(sb["dur_ns"].mean()) if len(sb) else 0.0
    gap = a_step - b_step
    pa, pb = phase_summary(sa), phase_summary(sb)
    phases = _compare(pa["ns_per_step"], pb["ns_per_step"], gap, "phase")
    oa = ta.groupby("op")["ns_per_step"].sum()
    ob = tb.groupby("op")["ns_per_step"].sum()
    ops = _compare(oa, ob, gap, "op")
    la, lb = label(a, a_name), label(b, b_name)
    if la == lb:
        la, lb = f"{la} (A)", f"{lb} (B)"
    return Diff(la, lb, a_step, b_step, phases, ops, _sentence(la, lb, a_step, b_step, phases, ops),
                a_meta=dict(a.meta), b_meta=dict(b.meta),
                convergence=compare_convergence(a.meta, b.meta, la, lb))


def _sentence(la: str, lb: str, a_step: float, b_step: float, phases: pd.DataFrame,
              ops: pd.DataFrame) -> str:
    if not a_step or not b_step:
        return "One of the traces has no steps, so there is no step-time gap to explain."
    gap = a_step - b_step
    if abs(gap) < 1e-9 * max(a_step, 1):
        return f"{la} and {lb} take the same step time ({_ms(a_step)})."
    slow_is_a = gap > 0
    slower, faster = (la, lb) if slow_is_a else (lb, la)
    s_step, f_step = (a_step, b_step) if slow_is_a else (b_step, a_step)
    head = (f"{slower} takes {s_step / f_step:.2f}x {faster}'s step time "
            f"({_ms(s_step)} vs {_ms(f_step)} per step)")
    same_sign = ops[np.sign(ops["delta_ns"]) == np.sign(gap)]
    if same_sign.empty:
        return head + "."
    top = same_sign.iloc[0]
    s_op, f_op = ((top["a_ns_per_step"], top["b_ns_per_step"]) if slow_is_a
                  else (top["b_ns_per_step"], top["a_ns_per_step"]))
    times = f"{s_op / f_op:.2f}x" if f_op else f"only in {slower}"
    text = (f"{head}; {top['op']} explains most of it: {_ms(s_op)} vs {_ms(f_op)} per step "
            f"({times}), {top['share_of_gap']:.0%} of the gap")
    ph = phases[np.sign(phases["delta_ns"]) == np.sign(gap)]
    if not ph.empty:
        text += f"; the {ph.iloc[0]['phase']} phase accounts for {ph.iloc[0]['share_of_gap']:.0%}"
    return text + "."


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"
