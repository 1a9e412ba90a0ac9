"""Diff two traces: per phase and per canonical op, A and B per step, ratio, delta, and the
share of the step-time gap each explains, ordered by that share; then one plain sentence.
Memory beside time: each run's peaks (opprof.analysis.memory.run_memory), A/B and A−B."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import phase_summary, step_breakdown
from opprof.analysis.convergence import Comparison
from opprof.analysis.convergence import compare as compare_convergence
from opprof.analysis.efficiency import EfficiencyComparison
from opprof.analysis.efficiency import compare as compare_efficiency
from opprof.analysis.memory import compare_memory, memory_part
from opprof.analysis.noise import Noise, assess
from opprof.analysis.ops import op_table
from opprof.analysis.report import Report
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.analysis.gate import Gate
    from opprof.jsontypes import JSONObject
    from opprof.meta import MetaMapping


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
    a_noise: Noise | None = None
    b_noise: Noise | None = None
    #: Memory side by side (opprof.analysis.memory.compare_memory); empty without memory rows.
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: Per op, A's step if that op ran at B's speed (``diff --whatif``;
    #: :func:`opprof.model.whatif.op_swaps`), or None.
    whatif: pd.DataFrame | None = None
    #: Each side's file metadata (framework, model, batch size, …), shown by the HTML page.
    a_meta: JSONObject = field(default_factory=dict)
    b_meta: JSONObject = field(default_factory=dict)
    #: Which run reaches a test accuracy first, split into step time and steps needed
    #: (opprof.analysis.convergence.compare); None when neither has a convergence table.
    convergence: Comparison | None = None

    #: Each side's unprofiled step time (``meta["unprofiled_step_ns"]``: the timed steps
    #: without the profiler), or None when the trace has none.
    a_unprofiled_ns: float | None = None
    b_unprofiled_ns: float | None = None
    #: One line per way the two runs differ that makes their comparison unfair (device,
    #: framework version, batch size, workers), each starting with ⚠.
    mismatches: list[str] = field(default_factory=list)
    #: Which run uses its machine better and which operators explain it
    #: (opprof.analysis.efficiency.compare); None when the diff was made from traces.
    efficiency: EfficiencyComparison | None = None
    #: The regression gate of B (NEW) against A (BASE) (``diff --fail-above``;
    #: :mod:`opprof.analysis.gate`), or None.
    gate: Gate | None = None
    #: Collective time per step by parallel dimension and collective (``dim``, ``op``, A, B,
    #: A/B, A−B): from the reports' collectives (opprof.analysis.collectives); empty when
    #: neither side has any.
    comm: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def step_ratio(self) -> float:
        """A's profiled step time over B's."""
        return self.a_step_ns / self.b_step_ns if self.b_step_ns else float("inf")

    @property
    def basis(self) -> str:
        """What the headline ratio divides: "unprofiled" when both runs have unprofiled step
        times (the profiler's overhead differs by framework), else "profiled"."""
        return "unprofiled" if self.a_unprofiled_ns and self.b_unprofiled_ns else "profiled"

    def overhead(self, side: str) -> float | None:
        """The profiler's overhead of side "a" or "b": median profiled step over median
        unprofiled step (the report header's figure, opprof.analysis.noise), else the mean
        profiled step over the unprofiled one."""
        noise = self.a_noise if side == "a" else self.b_noise
        if noise and noise.overhead:
            return float(noise.overhead)
        step, unprofiled = ((self.a_step_ns, self.a_unprofiled_ns) if side == "a"
                            else (self.b_step_ns, self.b_unprofiled_ns))
        return step / unprofiled if unprofiled else None

    @property
    def headline_ratio(self) -> float:
        """A's step time over B's, on :attr:`basis`."""
        if self.basis == "unprofiled":
            return self.a_unprofiled_ns / self.b_unprofiled_ns  # type: ignore[operator]
        return self.step_ratio


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
    df["share_of_gap"] = df["delta_ns"] / gap + 0.0 if gap else np.nan  # + 0.0: no -0.0%
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
    d.efficiency = compare_efficiency(a.efficiency, b.efficiency, d.a_label, d.b_label)
    d.comm = compare_comm(a.collectives, b.collectives)
    return d


def compare_comm(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Collective time per step of A and B by (parallel dimension, collective): ``dim``,
    ``op``, ``a_ns_per_step``, ``b_ns_per_step``, ``ratio``, ``delta_ns``."""
    def per(c: pd.DataFrame) -> pd.Series:
        if c.empty:
            return pd.Series(dtype=float)
        dim = c["dim"].fillna("").replace("", "-") if "dim" in c else "-"
        return c.assign(dim=dim).groupby(["dim", "op"])["ns_per_step"].sum()
    sa, sb = per(a), per(b)
    if sa.empty and sb.empty:
        return pd.DataFrame()
    df = pd.DataFrame({"a_ns_per_step": sa, "b_ns_per_step": sb}).fillna(0.0)
    df["ratio"] = df["a_ns_per_step"] / df["b_ns_per_step"].where(df["b_ns_per_step"] > 0)
    df["delta_ns"] = df["a_ns_per_step"] - df["b_ns_per_step"]
    df = df.reset_index()
    return df.loc[df["delta_ns"].abs().sort_values(ascending=False, kind="stable").index
                  ].reset_index(drop=True)


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
    la, lb = _name(a, a_name), _name(b, b_name)
    if la == lb:
        la, lb = (a_name, b_name) if a_name != b_name else (f"{la} (A)", f"{lb} (B)")
    ua, ub = _unprofiled(a.meta), _unprofiled(b.meta)
    return Diff(la, lb, a_step, b_step, phases, ops,
                _sentence(la, lb, a_step, b_step, phases, ops, ua, ub),
                a_meta=dict(a.meta), b_meta=dict(b.meta), a_unprofiled_ns=ua,
                b_unprofiled_ns=ub, mismatches=mismatches(a.meta, b.meta),
                convergence=compare_convergence(a.meta, b.meta, la, lb))


def _name(trace: Trace | Report, file_name: str) -> str:
    """Framework and model when the metadata has a model; else (`opprof run`, an imported
    trace) the file's name, with the framework when the name does not say it."""
    if trace.meta.get("model"):
        return label(trace, file_name)
    fw = str(trace.meta.get("framework") or "")
    return f"{file_name} ({fw})" if fw and fw not in file_name else file_name


def _unprofiled(meta: MetaMapping) -> float | None:
    v = meta.get("unprofiled_step_ns")
    try:
        return float(v) if v and float(v) > 0 else None
    except (TypeError, ValueError):
        return None


#: What must match for two runs' times to compare what their frameworks do, and its name.
MATCH_KEYS = (("device", "device"), ("framework_version", "framework version"),
              ("batch_size", "batch size"), ("workers", "workers"))


def mismatches(a: MetaMapping, b: MetaMapping) -> list[str]:
    """One ⚠ line naming how two runs differ in device, framework version (of the same
    framework), batch size or workers, when both say; empty when they match."""
    diffs = []
    for key, name in MATCH_KEYS:
        va, vb = a.get(key), b.get(key)
        if key == "framework_version" and a.get("framework") != b.get("framework"):
            continue
        if va not in (None, "") and vb not in (None, "") and str(va) != str(vb):
            diffs.append(f"{name} ({va} vs {vb})")
    if not diffs:
        return []
    return [f"⚠ the runs differ in {', '.join(diffs)}: the gap is not the frameworks' alone"]


def _sentence(la: str, lb: str, a_step: float, b_step: float, phases: pd.DataFrame,
              ops: pd.DataFrame, ua: float | None = None, ub: float | None = None) -> str:
    if not a_step or not b_step:
        return "One of the traces has no steps, so there is no step-time gap to explain."
    gap = a_step - b_step
    if abs(gap) < 1e-9 * max(a_step, 1):
        return f"{la} and {lb} take the same profiled step time ({_ms(a_step)})."
    slow_is_a = gap > 0
    slower, faster = (la, lb) if slow_is_a else (lb, la)
    s_step, f_step = (a_step, b_step) if slow_is_a else (b_step, a_step)
    if ua and ub:  # the headline: without the profiler, whose overhead differs by framework
        slow_u = ua >= ub
        su, fu = (ua, ub) if slow_u else (ub, ua)
        head = (f"{la if slow_u else lb} takes {su / fu:.2f}x {lb if slow_u else la}'s "
                f"unprofiled step time ({_ms(su)} vs {_ms(fu)} per step; profiled "
                f"{s_step / f_step:.2f}x for {slower}: {_ms(s_step)} vs {_ms(f_step)})")
    else:
        head = (f"{slower} takes {s_step / f_step:.2f}x {faster}'s profiled step time "
                f"({_ms(s_step)} vs {_ms(f_step)} per step)")
    # the profiler's overhead can turn the ranking round: the operators (all profiled)
    # then explain the profiled gap, the other way round from the headline
    turned = ua is not None and ub is not None and bool(ua and ub) and (ua >= ub) != slow_is_a
    if turned:
        head += ("; the profiled steps rank them the other way round, so the operators (all "
                 "timed under the profiler) do not explain the unprofiled gap")
    same_sign = ops[np.sign(ops["delta_ns"]) == np.sign(gap)]
    if same_sign.empty:
        return head + "."
    top = same_sign.iloc[0]
    s_op, f_op = ((top["a_ns_per_step"], top["b_ns_per_step"]) if slow_is_a
                  else (top["b_ns_per_step"], top["a_ns_per_step"]))
    times = f"{s_op / f_op:.2f}x" if f_op else f"only in {slower}"
    what = (f"of the profiled gap ({slower} slower), {top['op']} explains most of it"
            if turned else f"{top['op']} explains most of it")
    text = (f"{head}; {what}: {_ms(s_op)} vs {_ms(f_op)} per step "
            f"({times}), {top['share_of_gap']:.0%} of the {'profiled ' if ua and ub else ''}gap")
    ph = phases[np.sign(phases["delta_ns"]) == np.sign(gap)]
    if not ph.empty:
        text += f"; the {ph.iloc[0]['phase']} phase accounts for {ph.iloc[0]['share_of_gap']:.0%}"
    return text + "."


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.2f} ms"


def memory_verdict(d: Diff) -> str | None:
    """One verdict on memory: the largest worker's resident peak before profiling (the
    profiler's own buffers left out), else while profiling (said so); None without both."""
    from opprof.render.units import mib

    for metric, what in (("unprofiled_rss", "resident peak before profiling, the profiler's "
                                            "buffers left out"),
                         ("peak_rss", "resident peak while profiling, the profiler's buffers "
                                      "included: no unprofiled peak in both")):
        row = d.memory[d.memory["metric"] == metric] if len(d.memory) else d.memory
        if len(row) and row["ratio"].notna().all():
            r = row.iloc[0]
            more = (f"{d.a_label} uses {r['ratio']:.2f}x {d.b_label}'s memory"
                    if r["ratio"] >= 1 else
                    f"{d.b_label} uses {1 / r['ratio']:.2f}x {d.a_label}'s memory")
            return (f"Memory verdict: {more} ({what}: {mib(r['a_bytes'])} vs "
                    f"{mib(r['b_bytes'])}, largest worker).")
    return None
