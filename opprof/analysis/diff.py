"""Diff two traces: per phase and per canonical op, A and B per step, ratio, delta, and the
share of the step-time gap each explains, ordered by that share (the sentence naming what
explains most of it is the renderers': :mod:`opprof.render.verdicts`). Memory beside time:
each run's peaks (opprof.analysis.memory.run_memory), A/B and A−B."""

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


@dataclass(frozen=True)
class Diff:
    """The comparison of trace A with trace B (ratio = A / B, delta = A - B); immutable, all
    a diff's renderers draw."""

    a_label: str
    b_label: str
    a_step_ns: float
    b_step_ns: float
    phases: pd.DataFrame
    ops: pd.DataFrame
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
    #: Each way the two runs differ that makes their comparison unfair (device, framework
    #: version, batch size, workers): (what, A's value, B's value).
    mismatched: list[tuple[str, str, str]] = field(default_factory=list)
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
    return _diff(a, b, sa, sb, op_table(a, n_steps=len(sa)), op_table(b, n_steps=len(sb)),
                 a_name, b_name,
                 compare_memory(memory_part(a).ranks, memory_part(b).ranks),
                 assess(a.meta, sa), assess(b.meta, sb))


def diff_reports(a: Report, b: Report, a_name: str = "A", b_name: str = "B") -> Diff:
    """:func:`diff` from two reports (what `opprof diff` uses: each side analyzed rank by
    rank, see opprof.job)."""
    from dataclasses import replace

    d = _diff(a, b, a.steps, b.steps, a.ops, b.ops, a_name, b_name,
              compare_memory(a.memory.ranks, b.memory.ranks), a.noise, b.noise,
              compare_comm(a.collectives, b.collectives))
    fws = (str(a.meta.get("framework") or ""), str(b.meta.get("framework") or ""))
    return replace(d, efficiency=compare_efficiency(a.efficiency, b.efficiency, d.a_label,
                                                    d.b_label, fws))


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
    df.index.names = ["dim", "op"]  # (lost where one side has no collectives)
    df = df.reset_index()
    return df.loc[df["delta_ns"].abs().sort_values(ascending=False, kind="stable").index
                  ].reset_index(drop=True)


def _diff(a: Trace | Report, b: Trace | Report, sa: pd.DataFrame, sb: pd.DataFrame,
          ta: pd.DataFrame, tb: pd.DataFrame, a_name: str, b_name: str,
          memory: pd.DataFrame, a_noise: Noise | None, b_noise: Noise | None,
          comm: pd.DataFrame | None = None) -> Diff:
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
    return Diff(la, lb, a_step, b_step, phases, ops, a_noise=a_noise, b_noise=b_noise,
                memory=memory, comm=comm if comm is not None else pd.DataFrame(),
                a_meta=dict(a.meta), b_meta=dict(b.meta), a_unprofiled_ns=ua,
                b_unprofiled_ns=ub, mismatched=mismatches(a.meta, b.meta),
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


def mismatches(a: MetaMapping, b: MetaMapping) -> list[tuple[str, str, str]]:
    """How two runs differ in device, framework version (of the same framework), batch size
    or workers, where both say: (what, A's value, B's value); empty when they match."""
    diffs = []
    for key, name in MATCH_KEYS:
        va, vb = a.get(key), b.get(key)
        if key == "framework_version" and a.get("framework") != b.get("framework"):
            continue
        if va not in (None, "") and vb not in (None, "") and str(va) != str(vb):
            diffs.append((name, str(va), str(vb)))
    return diffs
