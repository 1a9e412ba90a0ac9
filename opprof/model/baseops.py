"""The operators of a one-worker trace as the model-parallel models read them
(:mod:`opprof.model.fromsingle`): each phase's counted host operators in step order with their
*typical* time, the calls nested in each, the trace's cost of one call, and how an operator's
time moves when it keeps only a share of its work.

- **Typical time**: the median, over the steps that ran the same operators in that phase,
  of each position's duration — of an even number of steps the *lower* of the two middle
  values. On a host shared with other processes one operator of one step can take ten times
  its usual time (the thread lost its core); a mean over four steps follows such bursts, a
  median per position does not — but the usual median of four steps averages its two middle
  values, so a pause that recurs every other step (the one-worker transformer's
  ``Optimizer.step`` took 0.7–1.1 ms in two of four steps and 3.0–5.6 ms in the other two,
  on several recordings at load 2.6–3.4; none at load 1.0: the host) entered the typical time
  by half, and a model that splits the optimizer by parameters split that pause too. The
  models move the base's *measured* step by differences of typical times, so at the base's
  own layout the prediction is the measurement.
- **Fixed and variable time** (:func:`scaled_ns`): an operator that keeps a share ``φ`` of its
  work (a micro-batch of ``1/m`` of the batch, a ``1/t`` shard of a layer) takes
  ``c + (d − c)·φ``: ``c`` its fixed part — dispatching it and the calls nested in it, the
  profiler's records of them, the autograd bookkeeping — which does not shrink with the work.
  ``c = min(d, FIXED_CALLS × nested calls × call_ns)``, ``call_ns`` the trace's median
  ``aten::view`` (a call that does no work). Measured on the built-in transformer recorded at
  batch 8 and at 2 and 4 (docs/parallelism.md): the batch-2 operators took 47–74% of their
  batch-8 time, not 25%.
- **Time between operators** (:meth:`BaseOps.gap_ns`): the part of a phase no counted operator
  covers — the Python of the modules around the operators, which does not shrink with the
  work — taken from the step where it is least (min over steps of the phase's wall time less
  its operators): on a busy host most steps' gaps also hold the time the thread waited for a
  core.
- **The host's noise** (:attr:`BaseOps.noise`): the base's compute phases took ``noise`` times
  their typical operators and gaps (the mean over steps, bursts included, over the typical
  step: 1 on a quiet host, 1.5–3 on this project's shared 2-core one). The models scale what
  they change by it — a thread that gets a share of a core gets it for new work too — so a
  prediction keeps the base's noise in proportion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import step_breakdown
from opprof.errors import OpprofError
from opprof.filters import on_host, step_work
from opprof.intervals import Nesting, lane_ids
from opprof.taxonomy import COMM_OPS, PHASES
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array

#: The fixed cost of an operator, in calls of the trace's ``call_ns`` per call nested in it
#: (docs/parallelism.md, "From a one-worker trace": fitted on the built-in transformer's
#: operators at batch 8 against the same at batch 2 and 4).
FIXED_CALLS = 3.0
#: Calls that do no work: their median duration is the trace's cost of one call.
_NO_WORK = ("aten::view", "aten::as_strided", "aten::t", "aten::transpose")
#: Bytes per element of an activation (float32; the trace does not record dtypes).
FLOAT_BYTES = 4
COMPUTE = ("forward", "backward", "update")


@dataclass
class BaseOps:
    """A one-worker trace's operators, phases and step (module docstring)."""

    #: one row per counted host operator of a typical step: ``phase``, ``pos`` (its place in
    #: the phase), ``name``, ``op``, ``detail``, ``dur_ns`` (typical), ``nested`` (host calls
    #: inside it, itself included), ``fixed_ns``
    ops: pd.DataFrame
    #: typical (median over steps) and mean wall ns per phase (the means sum to the step)
    phase_ns: dict[str, float]
    mean_phase_ns: dict[str, float]
    step_ns: float
    call_ns: float
    steps: int
    #: standard deviation over steps of the step's compute (step less exposed comm), ns
    sigma_ns: float
    #: per compute phase: the time between operators (the least over steps), ns
    gaps: dict[str, float] = field(default_factory=dict)
    #: the mean compute phases over their typical operators and gaps (module docstring)
    noise: float = 1.0
    notes: list[str] = field(default_factory=list)
    #: per step (of the usual operators) and operator: its end, ns after the step's start
    ends: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: each step's duration, ns
    step_durs: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))

    def of(self, phase: str) -> pd.DataFrame:
        """The operators of ``phase`` in order."""
        return self.ops[self.ops["phase"] == phase]

    def gap_ns(self, phase: str) -> float:
        """The time of ``phase`` no operator covers, the least over steps (≥ 0)."""
        return self.gaps.get(phase, 0.0)

    def segment_sigmas(self, cuts: list[tuple[str, int]]) -> Array:
        """The standard deviation over steps of each stretch of the step between consecutive
        ``cuts`` (a phase and an operator's position: the stretch ends where it does), the
        first from the last cut of the step before (its end and the next step's start): on a
        busy host a short stretch varies by a time slice, which a σ of whole steps spread in
        proportion misses. Zeros with fewer than two steps."""
        if not cuts or self.ends.empty:
            return np.zeros(len(cuts))
        keys = pd.MultiIndex.from_tuples(cuts, names=["phase", "pos"])
        at = self.ends.set_index(["phase", "pos", "step"])["end_ns"].unstack("step")
        at = at.reindex(keys).dropna(axis=1)
        if at.shape[1] < 2:
            return np.zeros(len(cuts))
        t = np.sort(at.to_numpy(np.float64), axis=0)
        dur = self.step_durs.reindex(at.columns).to_numpy(np.float64)
        seg = np.vstack([t[:1] + dur - t[-1:], np.diff(t, axis=0)])
        out: Array = seg.std(axis=1, ddof=1)
        return out

    def typical_ns(self, phase: str) -> float:
        """The typical phase: its operators' typical times and its gap."""
        return float(self.of(phase)["dur_ns"].sum()) + self.gap_ns(phase)


def base_ops(trace: Trace, label: str = "", rank: int | None = None) -> BaseOps:
    """The :class:`BaseOps` of a one-worker trace (one clear error otherwise), or of one
    ``rank`` of any trace."""
    name = label or "the trace"
    steps = step_breakdown(trace)
    if rank is not None:
        steps = steps[steps["rank"] == rank]
    if steps.empty:
        raise OpprofError(f"{name} has no profiled steps to model")
    if steps["rank"].nunique() > 1:
        raise OpprofError(f"{name} has {steps['rank'].nunique()} workers; modelling tensor or "
                          "pipeline parallel from it needs a one-worker trace (or a trace "
                          "that already runs that dimension)")
    ev = trace.events
    host = ev[step_work(ev).to_numpy() & on_host(ev).to_numpy()
              & ev["kind"].isin(["cpu_op", "comm"]).to_numpy()]
    host = host[(host["tid"].to_numpy() >= 0)
                & (host["rank"].to_numpy() == int(steps["rank"].iloc[0]))]
    names = host["name"].astype(str).to_numpy()
    lane = lane_ids(host["rank"].to_numpy(np.int64), host["pid"].to_numpy(np.int64),
                    host["tid"].to_numpy(np.int64))
    ts = host["ts"].to_numpy(np.int64)
    comm = (host["kind"] == "comm").to_numpy() | host["op"].isin(sorted(COMM_OPS)).to_numpy()
    top = host["counted"].to_numpy(bool) & ~comm
    dur = host["dur"].to_numpy(np.int64)
    nesting = Nesting(lane, ts, ts + dur)
    _, anc = nesting.nest(top)
    nested = np.bincount(anc[(anc >= 0) & ~comm], minlength=len(host))
    # an operator blocked in a collective it waits for (wait_tensor inside the next operator
    # on a DTensor) did not compute meanwhile: its own time leaves that out
    _, outer = nesting.nest(comm)
    waited = comm & (outer == np.arange(len(host))) & (anc >= 0)
    own = dur - np.bincount(anc[waited], weights=dur[waited], minlength=len(host))
    host = host.assign(dur=own, end=ts + dur)
    call = np.isin(names, _NO_WORK)
    view = names == _NO_WORK[0]
    call_ns = float(np.median(host["dur"].to_numpy(np.int64)[view if view.any() else call])) \
        if call.any() else 1000.0
    ops = host[top & host["phase"].isin(COMPUTE).to_numpy()]
    ops = ops.assign(nested=nested[top & host["phase"].isin(COMPUTE).to_numpy()],
                     phase=ops["phase"].astype(str), name=ops["name"].astype(str),
                     op=ops["op"].astype(str))
    table, ends, notes = _typical(ops, call_ns)
    start = steps.set_index("step")["start"]
    ends = ends.assign(end_ns=ends["end"].to_numpy(np.int64)
                       - start.reindex(ends["step"]).to_numpy(np.int64)).drop(columns="end")
    phase_ns = {p: float(steps[p].median()) for p in PHASES}
    mean_ns = {p: float(steps[p].mean()) for p in PHASES}
    compute = (steps["dur_ns"] - steps["comm"]).to_numpy(np.float64)
    sigma = float(np.std(compute, ddof=1)) if len(compute) > 1 else 0.0
    per_step = ops.groupby(["step", "phase"])["dur"].sum().unstack("phase")
    walls = steps.set_index("step")
    gaps = {p: max(0.0, float((walls[p] - per_step[p].reindex(walls.index).fillna(0)).min()))
            if p in per_step else 0.0 for p in COMPUTE}
    out = BaseOps(table, phase_ns, mean_ns, float(steps["dur_ns"].mean()), call_ns,
                  len(steps), sigma, gaps, 1.0, notes, ends,
                  steps.set_index("step")["dur_ns"].astype(np.float64))
    typical = sum(out.typical_ns(p) for p in COMPUTE)
    out.noise = sum(mean_ns[p] for p in COMPUTE) / typical if typical > 0 else 1.0
    return out


def _typical(ops: pd.DataFrame, call_ns: float
             ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Per phase: the operators of the steps that ran the usual number of them, each
    position's median duration (module docstring)."""
    ops = ops.sort_values(["step", "ts"], kind="stable")
    ops = ops.assign(pos=ops.groupby(["step", "phase"], sort=False).cumcount())
    parts, notes, ends = [], [], []
    for phase in COMPUTE:
        p = ops[ops["phase"] == phase]
        if p.empty:
            continue
        counts = p.groupby("step").size()
        usual = int(counts.mode().iloc[0])
        kept = counts.index[counts == usual]
        if len(kept) < len(counts):
            notes.append(f"{phase}: {len(counts) - len(kept)} of {len(counts)} steps ran "
                         f"another number of operators than the usual {usual}; left out")
        p = p[p["step"].isin(kept)]
        ends.append(p[["step", "phase", "pos", "end"]])
        first = p[p["step"] == kept[0]].set_index("pos")
        # the lower median: of an even number of steps, the lower of the two middle values
        # (a burst in half the steps would otherwise enter the typical time by half)
        g = p.groupby("pos")
        med = pd.DataFrame({"dur_ns": g["dur"].quantile(0.5, interpolation="lower"),
                            "nested": g["nested"].median()})
        parts.append(pd.DataFrame({
            "phase": phase, "pos": first.index.to_numpy(), "name": first["name"].to_numpy(),
            "op": first["op"].to_numpy(), "detail": first["detail"].astype(object).to_numpy(),
            "dur_ns": med["dur_ns"].to_numpy(np.float64),
            "nested": med["nested"].to_numpy(np.float64)}))
    cols = ["phase", "pos", "name", "op", "detail", "dur_ns", "nested"]
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
    table["fixed_ns"] = np.minimum(table["dur_ns"].to_numpy(np.float64),
                                   FIXED_CALLS * table["nested"].to_numpy(np.float64) * call_ns)
    ends_table = pd.concat(ends, ignore_index=True) if ends else pd.DataFrame(
        columns=["step", "phase", "pos", "end"])
    return table, ends_table, notes


def scaled_ns(ops: pd.DataFrame, share: float | Array) -> float:
    """Σ over ``ops`` of ``fixed + (dur − fixed) · share`` (``share`` per operator or one for
    all): their time when each keeps ``share`` of its work."""
    fixed = ops["fixed_ns"].to_numpy(np.float64)
    return float(np.sum(fixed + (ops["dur_ns"].to_numpy(np.float64) - fixed) *
                        np.asarray(share, np.float64)))


def shapes(detail: object) -> list[list[int]]:
    """The input shapes torch records (``record_shapes``) in an operator's ``detail``
    (``[[8, 32, 64], [128, 64], [128]]``; the leading ``pg=… `` of a collective skipped);
    [] when it holds none."""
    text = detail if isinstance(detail, str) else ""  # a missing detail is pandas' NA
    start = text.find("[[")
    if start < 0:
        return []
    depth, end = 0, len(text)
    for i, ch in enumerate(text[start:], start):
        depth += (ch == "[") - (ch == "]")
        if depth == 0:
            end = i + 1
            break
    try:
        value = json.loads(text[start:end])
    except ValueError:
        return []
    return [[int(x) for x in s] if isinstance(s, list) and all(isinstance(x, int) for x in s)
            else [] for s in value]
