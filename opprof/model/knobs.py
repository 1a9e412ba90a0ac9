"""The performance model's step under the knobs a user turns: loader workers that prefetch,
another DDP bucket size, a larger batch or gradient accumulation, communication hidden, an
operator or a rank at another speed, the host's launch overhead gone (CUDA graphs) — each a
prediction from the trace's own what-if machinery (:mod:`opprof.model.whatif`), never a
fixed fraction. `opprof advise` (:mod:`opprof.advice`) turns each into an action's saving.

Two engines, as for `opprof whatif`:

* **phases** — the phase-level model (:mod:`opprof.model.simulate`) run on the trace's
  baseline (:mod:`opprof.model.predict`) once as measured and once with the knob turned; the
  prediction is the measured step moved by what the simulation changed
  (:func:`~opprof.model.predict.calibrated`), so a knob that changes nothing predicts the
  measured step exactly;
* **graph** — the trace's dependency graph (:mod:`opprof.analysis.critpath`) replayed with some
  nodes' own time or some edges' lags scaled; the step moves by the mean change over every
  (rank, step).

A knob that changes the batch (a larger batch, accumulation) is given per *sample*: the
predicted step of ``k`` batches divided by ``k``, so its saving compares like with like.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.critpath import COMM, LAUNCH, ORDER, Graph, replay
from opprof.kinds import Collective, Mode
from opprof.model.predict import calibrated, interference_for, network_for, plan
from opprof.model.simulate import simulate
from opprof.model.step import StepPlan
from opprof.model.whatif import whatif
from opprof.taxonomy import PHASES

if TYPE_CHECKING:
    from collections.abc import Callable

    from opprof.arrays import Array
    from opprof.model.whatif import Context

#: Each graph's unedited replay (every edited one is compared with it), by the graph's id
#: (a Graph is no hashable key), with a weak reference that says it is still that graph.
_MEASURED: dict[int, tuple[weakref.ref[Graph], pd.DataFrame]] = {}

#: The phases whose time grows with the batch (per-sample work).
PER_SAMPLE = ("load", "h2d", "forward", "backward")


@dataclass(frozen=True)
class Predicted:
    """A knob's predicted step (per the base's batch of samples) and how it was predicted."""

    base_step_ns: float
    step_ns: float
    engine: str  # "phases" or "graph"
    how: str  # the model's change, in a phrase

    @property
    def saving_ns(self) -> float:
        """Measured step minus predicted step (positive: faster)."""
        return self.base_step_ns - self.step_ns


def _simulated(ctx: Context, how: str, deltas: dict[str, float] | None = None,
               edit: Callable[[StepPlan], StepPlan] | None = None, per: float = 1.0,
               wait_ns: float = 0.0, wait_scale: float = 1.0) -> Predicted:
    """The measured step moved by what the phase model changes when the step's compute phases
    move by ``deltas`` and its plan is ``edit``-ed (a data-parallel plan only), ÷ ``per``.

    ``wait_ns`` is the part of the exposed communication that is waiting for a slower rank
    (:mod:`opprof.analysis.ranks`): no change to the collectives moves it, so it is kept out
    of the simulated communication and added back × ``wait_scale`` (a larger batch makes
    the ranks' differences larger with it)."""
    base = ctx.base
    m = base.workers
    mode = base.mode if base.collective else Mode.SINGLE
    collective = base.collective or Collective.ALLREDUCE
    servers = max(base.servers, 1)
    net, _ = network_for(base, collective, None, servers)
    inter = interference_for(base, net, m)
    p0, _ = plan(base, m, mode, servers, net, straggler=True, interference=inter.slowdown,
                 comm_interference=inter.comm_slowdown)
    p1, _ = plan(base, m, mode, servers, net, deltas=deltas, straggler=True,
                 interference=inter.slowdown, comm_interference=inter.comm_slowdown)
    if edit is not None and isinstance(p1, StepPlan):
        p1 = edit(p1)
    measured = dict(base.phases)
    wait = min(max(wait_ns, 0.0), measured["comm"])
    measured["comm"] -= wait
    phases = calibrated(measured, simulate(p0), simulate(p1))
    step = (base.step_ns + sum(phases[p] - measured[p] for p in PHASES)
            + wait * (wait_scale - 1.0))
    return Predicted(base.step_ns, step / per, "phases", how)


def io_hidden(ctx: Context) -> Predicted:
    """Loading fully prefetched (`opprof whatif --io hidden`)."""
    w = whatif(ctx, io_hidden=True)
    return Predicted(w.base_step_ns, w.step_ns, w.engine, "loading hidden (what-if --io hidden)")


def load_busy_ns(ctx: Context) -> float:
    """The time a step spends loading, exposed or not (the busy load time)."""
    busy = float(ctx.base.terms.extra()["io_busy_ns"])
    return max(busy, float(ctx.base.phases["load"]))


def prefetch(ctx: Context, workers: int) -> Predicted:
    """The input pipeline in ``workers`` processes that prefetch: each makes a batch in the
    time the step now spends loading, ``workers`` of them side by side, so loading shows only
    where ``load / workers`` exceeds the rest of the step (the research's
    ``max(t_compute, t_io)``, the simulation's prefetching input pipeline): the step with the
    loading hidden (`whatif --io hidden`) plus what the workers cannot hide."""
    hidden = whatif(ctx, io_hidden=True)
    rest = hidden.step_ns
    left = max(0.0, load_busy_ns(ctx) / max(workers, 1) - rest)
    return Predicted(hidden.base_step_ns, rest + left, hidden.engine,
                     f"loading in {workers} prefetching worker(s): max(0, load / {workers} − "
                     "the rest of the step) left")


def h2d_hidden(ctx: Context) -> Predicted:
    """Host-to-device copies overlapped with compute (pinned memory, non-blocking copies)."""
    h2d = float(ctx.base.phases["h2d"])
    return _simulated(ctx, "host-to-device copies beside compute", deltas={"h2d": -h2d})


def comm_hidden(ctx: Context, wait_ns: float = 0.0) -> Predicted:
    """Every collective behind compute (`opprof whatif --comm hidden`), the wait for slower
    ranks (``wait_ns`` of the exposed communication) left: the upper bound of any overlap."""
    w = whatif(ctx, comm="hidden")
    wait = min(max(wait_ns, 0.0), float(ctx.base.phases["comm"]))
    return Predicted(w.base_step_ns, w.step_ns + wait, w.engine,
                     "communication hidden (what-if --comm hidden)"
                     + (", the wait for slower ranks left" if wait else ""))


def buckets(ctx: Context, bucket_bytes: int, wait_ns: float = 0.0) -> Predicted:
    """DistributedDataParallel with every gradient bucket capped at ``bucket_bytes``
    (``bucket_cap_mb``; the first bucket too): smaller buckets start all-reducing earlier in
    the backward pass, each paying the collective's latency."""

    def edit(p: StepPlan) -> StepPlan:
        return replace(p, policy=replace(p.policy, first_bucket_bytes=bucket_bytes,
                                         bucket_bytes=bucket_bytes))

    return _simulated(ctx, f"DDP buckets of {bucket_bytes / 2 ** 20:.3g} MiB", edit=edit,
                      wait_ns=wait_ns)


def batched(ctx: Context, k: float, wait_ns: float = 0.0) -> Predicted:
    """A batch ``k`` times larger: the per-sample phases (load, h2d, forward, backward) × k,
    the update and the gradients' communication once (the wait for slower ranks, ``wait_ns``,
    × k with the work); per the base's batch (÷ k)."""
    deltas = {p: (k - 1.0) * float(ctx.base.phases[p]) for p in PER_SAMPLE}
    return _simulated(ctx, f"batch × {k:g} (per-sample phases × {k:g}, update and "
                           "communication once), per sample", deltas=deltas, per=k,
                      wait_ns=wait_ns, wait_scale=k)


def accumulated(ctx: Context, k: int, wait_ns: float = 0.0) -> Predicted:
    """Gradient accumulation over ``k`` micro-steps (DDP ``no_sync``): the exposed
    communication (less the wait for slower ranks, ``wait_ns``, paid at every micro-step)
    and the update once per ``k`` batches; per batch."""
    ph = ctx.base.phases
    wait = min(max(wait_ns, 0.0), float(ph["comm"]))
    once = float(ph["comm"] - wait + ph["update"])
    step = ctx.base.step_ns - once * (1.0 - 1.0 / k)
    return Predicted(ctx.base.step_ns, step, "phases",
                     f"gradient accumulation over {k} micro-steps (communication and update "
                     "once), per batch")


def op_scaled(ctx: Context, op: str, factor: float) -> Predicted:
    """An operator's time × ``factor`` (`opprof whatif --op OP=FACTOR`)."""
    w = whatif(ctx, {op: factor})
    return Predicted(w.base_step_ns, w.step_ns, w.engine,
                     f"{op} × {factor:g} (what-if --op {op}={factor:g})")


def more_servers(ctx: Context, servers: int) -> Predicted:
    """A parameter-server job with ``servers`` servers (`opprof whatif --servers`)."""
    w = whatif(ctx, servers=servers, workers=ctx.base.workers)
    return Predicted(w.base_step_ns, w.step_ns, w.engine, f"{servers} parameter servers")


def replayed(ctx: Context, node_factor: Array | None, edge_factor: Array | None,
             how: str) -> Predicted | None:
    """The dependency graph replayed with nodes' own time × ``node_factor`` and edges' lags ×
    ``edge_factor`` (None: the trace has no graph)."""
    if ctx.graph is None:
        return None
    g, order = ctx.graph
    edited = replay(g, node_factor, order, edge_factor=edge_factor)
    cached = _MEASURED.get(id(g))
    if cached is not None and cached[0]() is g:
        measured = cached[1]
    else:
        measured = replay(g, None, order)
        _MEASURED.clear()  # one trace's graph at a time
        _MEASURED[id(g)] = (weakref.ref(g), measured)
    delta = float((edited["replay_ns"] - measured["replay_ns"]).mean())
    base = ctx.base.step_ns
    return Predicted(base, base + delta, "graph", how)


def launch_removed(ctx: Context) -> Predicted | None:
    """The host's issue time gone from the GPU ranks' steps — what capturing the step in CUDA
    graphs aims at: on a rank with device work, every host node the critical path calls
    ``launch`` (launch calls, host operators the GPU waits for) and the framework's gaps on
    the main thread take no time; the kernels keep theirs."""
    if ctx.graph is None:
        return None
    g, _ = ctx.graph
    gpu_ranks = np.unique(g.rank[g.on_device])
    if not len(gpu_ranks):
        return None
    on_gpu_rank = np.isin(g.rank, gpu_ranks)
    node = np.ones(len(g.start))
    node[on_gpu_rank & (g.category == LAUNCH) & ~g.on_device] = 0.0
    edge = np.ones(len(g.src))
    dst = g.dst >> 1
    edge[(g.kind == ORDER) & on_gpu_rank[dst] & g.main[dst] & ~g.on_device[dst]] = 0.0
    return replayed(ctx, node, edge, "the host's launch time and gaps removed on the GPU "
                                     "ranks (graph replay)")


def rank_scaled(ctx: Context, rank: int, factor: float) -> Predicted | None:
    """Rank ``rank``'s own work (every node on it but its collectives) × ``factor``."""
    if ctx.graph is None:
        return None
    g, _ = ctx.graph
    node = np.ones(len(g.start))
    node[(g.rank == rank) & (g.category != COMM)] = factor
    return replayed(ctx, node, None, f"rank {rank}'s work × {factor:.2f} (graph replay)")
