"""What-if: a trace's step re-simulated with operators, communication, I/O or the worker
count changed; and, for two traces, how much A's step would shrink if each operator ran at
B's speed (``opprof diff --whatif``).

Changes and how each moves the step:

- ``--op OP=FACTOR``: the operator's time × FACTOR. Its *wall* time (:mod:`opprof.analysis.
  critical`: the part of its phase's wall time it holds, shared evenly with operators running
  beside it) changes by (FACTOR − 1) × wall, in its phase; a backward change also moves when
  gradients are ready, so the simulation re-times the communication hidden behind backward.
- ``--op OP=B.trace``: FACTOR = B's time of OP per step / this trace's (canonical operators,
  so any two frameworks compare): device time where the trace has GPU kernels, else host.
- ``--comm hidden`` (all communication behind compute: the exposed comm term becomes 0) or
  ``--comm FACTOR`` (every collective × FACTOR, re-simulated); ``--op comm=…`` (or any
  communication op: ``--op all_reduce=…``) is the same.
- ``--io hidden``: loading fully prefetched (the load term becomes 0).
- ``--workers N`` (with ``--mode``, ``--servers``, ``--network``): as ``opprof model``.

Engine. Where the trace has a dependency graph (:mod:`opprof.analysis.critpath`: host order,
launch → kernel, stream order, syncs, collectives matched across ranks), operator and
communication factors replay it: every node of the operator (each collective's transfer) ×
its factor, each step re-timed through its dependencies, the step moved by the mean change
(``engine`` ``graph``; an unedited replay gives every measured step back exactly, so a null
what-if is still the measurement). Hidden communication or I/O (terms the phase model
defines) and another worker count use the phase-level model (``engine`` ``phases``); with the
graph, the phases carry the graph's step (the gap to the model goes to the phases it moved).

The new step is the measured one moved by what the simulation changed
(:func:`opprof.model.predict.calibrated`), so a what-if that changes nothing returns the
measured step exactly, and on a serial run (one operator at a time, one worker) replacing an
operator's time by B's moves the step by exactly B's time minus A's. Each change's own effect
(applied alone) is reported beside the combined one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import step_breakdown
from opprof.analysis.critpath import COMM as COMM_PART
from opprof.analysis.critpath import Graph, graph_of, replay
from opprof.analysis.ops import op_table
from opprof.analysis.opshare import op_wall
from opprof.errors import OpprofError
from opprof.filters import device_work
from opprof.kinds import Collective, Mode, default_mode
from opprof.model.commmodel import Network, collective_of
from opprof.model.predict import (
    Baseline,
    baseline,
    calibrated,
    colocation_scale,
    interference_for,
    network_for,
    placement_for,
    plan,
)
from opprof.model.simulate import simulate
from opprof.taxonomy import CANONICAL_OPS, COMM_OPS, PHASES
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.jsontypes import JSONObject


class Context:
    """What a what-if needs from one trace, computed once: the model's baseline and the
    dependency graph up front; each operator's wall time and time per step when a what-if
    first scales an operator (the advice's rules mostly scale none)."""

    def __init__(self, base: Baseline, trace: Trace, steps: pd.DataFrame,
                 graph: tuple[Graph, Array] | None = None) -> None:
        self.base = base
        #: The trace's dependency graph and a topological order (opprof.analysis.critpath);
        #: None where it has none: the phase-level model answers alone.
        self.graph = graph
        self._trace, self._steps = trace, steps

    @property
    def label(self) -> str:
        """The trace's label."""
        return self.base.label

    @functools.cached_property
    def wall(self) -> pd.DataFrame:
        """op, phase, wall_ns (mean per step)."""
        n = max(len(self._steps), 1)
        w = op_wall(self._trace, self._steps)
        return (w.groupby(["op", "phase"])["wall_ns"].sum() / n).reset_index()

    @functools.cached_property
    def op_time(self) -> pd.Series:
        """op → time per step (device where the trace has GPU kernels)."""
        n = max(len(self._steps), 1)
        has_device = bool(device_work(self._trace.events).any())
        t = op_table(self._trace, "device" if has_device else "host", n_steps=n)
        return t.groupby("op")["ns_per_step"].sum() if len(t) else pd.Series(dtype=float)


def context(trace: Trace, label: str = "", graph: bool = True,
            steps: pd.DataFrame | None = None) -> Context:
    """Read a trace for what-ifs (``graph``: build its dependency graph for replay;
    ``steps``: its :func:`step_breakdown`, when the caller has it)."""
    steps = step_breakdown(trace) if steps is None else steps
    base = baseline(trace, label, steps)
    return Context(base, trace, steps, graph_of(trace, steps) if graph else None)


@dataclass(frozen=True)
class Change:
    """One requested change and its own effect on the step (applied alone)."""

    kind: str  # op / comm / io / workers
    target: str
    value: str
    factor: float | None = None
    wall_ns: float | None = None
    delta_ns: float = 0.0

    def to_dict(self) -> JSONObject:
        """JSON form."""
        return {"kind": self.kind, "target": self.target, "value": self.value,
                "factor": self.factor, "wall_ns": self.wall_ns, "delta_ns": self.delta_ns}


@dataclass(frozen=True)
class WhatIf:
    """The re-simulated step beside the measured one (immutable: :func:`whatif` makes it)."""

    label: str
    base_step_ns: float
    step_ns: float
    base_phases: dict[str, float]
    phases: dict[str, float]
    scenario: list[Change]
    workers: int
    mode: str
    network_note: str = ""
    #: Operators asked for that do not run in the trace (nothing to scale).
    absent_ops: list[str] = field(default_factory=list)
    #: What computed the step: ``graph`` (the dependency graph replayed,
    #: opprof.analysis.critpath) or ``phases`` (the phase-level model).
    engine: str = "phases"

    @property
    def delta_ns(self) -> float:
        """New step minus measured step."""
        return self.step_ns - self.base_step_ns


OpValue = float | Context


def whatif(ctx: Context, ops: dict[str, OpValue] | None = None, comm: str | float | None = None,
           io_hidden: bool = False, workers: int | None = None, mode: str | None = None,
           servers: int | None = None, network: Network | None = None,
           value_labels: dict[str, str] | None = None) -> WhatIf:
    """Apply the changes together, and each alone for its own effect."""
    ops = dict(ops or {})
    value_labels = value_labels or {}
    for op in ops:
        if op not in CANONICAL_OPS:
            raise OpprofError(f"--op {op}: not a canonical operator (see docs/taxonomy.md: "
                              f"{', '.join(CANONICAL_OPS)})")
    if isinstance(comm, str) and comm != "hidden":
        raise OpprofError(f"--comm {comm}: give hidden or a factor")
    factors: dict[str, float | None] = {op: _factor(ctx, op, v) for op, v in ops.items()}
    asked: list[Change] = []
    for op, f in factors.items():
        wall = float(ctx.wall.loc[ctx.wall["op"] == op, "wall_ns"].sum())
        given = ops[op]
        value = value_labels.get(op) or (f"{given:g}" if isinstance(given, float)
                                         else given.label)
        asked.append(Change("op", op, value, f, wall))
    if comm is not None:
        asked.append(Change("comm", "comm", "hidden" if comm == "hidden" else f"{comm:g}",
                            None if comm == "hidden" else float(comm)))
    if io_hidden:
        asked.append(Change("io", "load", "hidden"))
    if workers is not None:
        asked.append(Change("workers", "workers", str(workers)))
    result = _apply(ctx, factors, comm, io_hidden, workers, mode, servers, network)
    changes = [replace(ch, delta_ns=_apply(
        ctx, {ch.target: ch.factor} if ch.kind == "op" else {},
        comm if ch.kind == "comm" else None, ch.kind == "io",
        workers if ch.kind == "workers" else None, mode, servers, network).delta_ns)
        for ch in asked]
    absent = [op for op, f in factors.items()
              if f is not None and not float(ctx.wall.loc[ctx.wall["op"] == op, "wall_ns"].sum())
              and op not in COMM_OPS]
    return replace(result, scenario=changes, absent_ops=absent)


def _factor(ctx: Context, op: str, value: OpValue) -> float:
    if isinstance(value, Context):
        mine = float(ctx.op_time.get(op, 0.0))
        theirs = float(value.op_time.get(op, 0.0))
        if mine <= 0:
            return 1.0
        return theirs / mine
    f = float(value)
    if not f >= 0:
        raise OpprofError(f"--op {op}={value}: the factor must be a number ≥ 0")
    return f


def _apply(ctx: Context, factors: dict[str, float | None], comm: str | float | None,
           io_hidden: bool, workers: int | None, mode: str | None, servers: int | None,
           network: Network | None) -> WhatIf:
    base = ctx.base
    deltas = {p: 0.0 for p in PHASES}
    comm_scale = 1.0
    for op, f in factors.items():
        if f is None:
            continue
        if op in COMM_OPS:  # the model's one communication lane: any collective scales it
            comm_scale *= f
            continue
        rows = ctx.wall[ctx.wall["op"] == op]
        for r in rows.itertuples():
            deltas[r.phase] += (f - 1.0) * r.wall_ns
    hidden = comm == "hidden"
    if comm is not None and not hidden:
        comm_scale *= float(comm)
    m = base.workers
    n = workers or m
    base_mode = base.mode if base.collective else Mode.SINGLE
    if mode is None:
        mode = base.mode if base.collective else (
            default_mode(base.framework) if n > 1 else Mode.SINGLE)
    collective = collective_of(mode) if mode != Mode.SINGLE else (
        base.collective or Collective.ALLREDUCE)
    if base.collective is not None and base.collective != collective:
        raise OpprofError(f"{base.label or 'the trace'} ran {base.mode}; a what-if keeps its "
                          "mode (model another mode from a 1-worker trace)")
    s = servers or (base.servers if base.collective == Collective.PS else 1) or 1
    net, note = network_for(base, collective, network, s)
    # compute slowed beside collectives, re-timed with them (not when comm is hidden: that
    # what-if removes exactly the exposed communication)
    i0, i1 = interference_for(base, net, m), interference_for(base, net, n)
    s0, s1 = (0.0, 0.0) if hidden else (i0.slowdown, i1.slowdown)
    p0, _ = plan(base, m, base_mode, max(base.servers, 1), net, straggler=True,
                 interference=s0, comm_interference=0.0 if hidden else i0.comm_slowdown)
    # other workers computing on the same hosts slow the compute (opprof.model.colocation)
    new_mode = mode if n > 1 else Mode.SINGLE
    cs = colocation_scale(base, net, new_mode, n, s, placement_for(base, new_mode, n, s))
    p1, _ = plan(base, n, new_mode, s, net,
                 deltas=deltas, comm_scale=comm_scale, communicate=not hidden,
                 io_hidden=io_hidden, straggler=True, interference=s1,
                 comm_interference=0.0 if hidden else i1.comm_slowdown,
                 colocation=cs.relative, colocation_wait_ns=cs.wait_ns)
    phases = calibrated(base.phases, simulate(p0), simulate(p1), comm_hidden=hidden)
    if io_hidden:
        phases["load"] = 0.0
    if not any(deltas.values()) and comm_scale == 1.0 and not hidden and not io_hidden \
            and n == m and mode in (base_mode, base.mode):
        phases = dict(base.phases)  # nothing changed: the measurement itself
    step = base.step_ns + sum(phases[p] - base.phases[p] for p in PHASES)
    engine = "phases"
    if ctx.graph is not None and n == m and not hidden and not io_hidden and (
            any(f is not None and f != 1.0 for f in factors.values()) or comm_scale != 1.0):
        # the graph scales each collective's own nodes by its factor; --comm scales them all
        every = float(comm) if comm is not None and not hidden else 1.0
        step = base.step_ns + _replay_delta(ctx.graph, factors, every)
        _spread(phases, base.phases, step - base.step_ns)
        engine = "graph"
    talks = n > 1
    return WhatIf(base.label, base.step_ns, step, dict(base.phases), phases, [], n,
                  mode if talks else Mode.SINGLE, note if talks or base.collective else "",
                  engine=engine)


def _replay_delta(graph: tuple[Graph, Array], factors: dict[str, float | None],
                  comm_scale: float) -> float:
    """Mean change of the step over every (rank, step) when the graph is replayed with
    the operators' node times × their factors (a collective's: its own nodes; ``comm``: every
    collective's) and all communication × ``comm_scale`` (0: the graph replays the measured
    steps exactly)."""
    g, order = graph
    factor = np.ones(len(g.start))
    for op, f in factors.items():
        if f is not None and op not in COMM_OPS:
            factor[g.op == op] *= f
    comm = g.category == COMM_PART
    for op, f in factors.items():
        if f is not None and op in COMM_OPS:  # op comm: every collective, as --comm
            factor[comm & ((g.op == op) | (op == "comm"))] *= f
    if comm_scale != 1.0:
        factor[comm] *= comm_scale
    edited = replay(g, factor, order)
    measured = replay(g, None, order)
    return float((edited["replay_ns"] - measured["replay_ns"]).mean())


def _spread(phases: dict[str, float], base: dict[str, float], delta: float) -> None:
    """Make ``phases`` sum to the base step + ``delta``: the gap between the graph's and
    the phase model's step goes to the phases the change moved (in proportion), else to
    ``other``."""
    gap = base and delta - sum(phases[p] - base[p] for p in PHASES)
    if not gap:
        return
    moved = {p: abs(phases[p] - base[p]) for p in PHASES}
    total = sum(moved.values())
    if total <= 0:
        phases["other"] += gap
        return
    for p in PHASES:
        phases[p] += gap * moved[p] / total


def op_swaps(a: Context, b: Context) -> pd.DataFrame:
    """Per canonical operator A runs: A's step if that operator ran at B's speed, and the
    saving, largest first (``opprof diff --whatif``)."""
    cols = ["op", "a_ns_per_step", "b_ns_per_step", "ratio", "a_wall_ns", "whatif_step_ns",
            "saving_ns", "saving_share"]
    rows = []
    step = a.base.step_ns
    for op in a.op_time.index:
        ta = float(a.op_time.get(op, 0.0))
        if ta <= 0 or op == "other":
            continue
        tb = float(b.op_time.get(op, 0.0))
        w = whatif(a, {op: b})
        rows.append({"op": op, "a_ns_per_step": ta, "b_ns_per_step": tb,
                     "ratio": ta / tb if tb else float("inf"),
                     "a_wall_ns": float(a.wall.loc[a.wall["op"] == op, "wall_ns"].sum()),
                     "whatif_step_ns": w.step_ns, "saving_ns": step - w.step_ns,
                     "saving_share": (step - w.step_ns) / step if step else float("nan")})
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values("saving_ns", ascending=False, kind="stable").reset_index(drop=True)
