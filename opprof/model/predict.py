"""Predict the step time and speed-up of synchronous data-parallel training on N workers from
one trace, and check a prediction against a measured multi-worker trace, term by term.

The prediction (see docs/model.md for the equations and what they leave out):

1. **Baseline**: the trace's terms (:mod:`opprof.model.terms`, mean over its worker
   (rank, step)s), its gradients in backward order (:mod:`opprof.model.gradients`), its
   per-worker resources, and the collectives it already holds.
2. **Network**: α and β of the mode's collective (:mod:`opprof.model.commmodel`) — from
   ``--network`` (``opprof calibrate``), else fitted from the trace's own collectives, else an
   assumed 10 Gb/s Ethernet, and the result says which.
3. **Simulation** (:mod:`opprof.model.simulate`) of one step at the base's worker count and
   at each N. Every worker computes what the base's worker computed (the same per-worker batch
   and resources), so the compute terms carry over; communication, its overlap with backward,
   the wait for the slowest worker (σ of the base's per-step compute time × the expected
   maximum of N standard normals; ``straggler=False`` leaves it out) and, for a parameter
   server, the servers' update come from the simulation.
4. **Calibration to the measurement**: predicted = measured + (simulated(N) − simulated(base))
   per compute term, and for the exposed communication of a base that has some, measured ×
   simulated(N) / simulated(base). So at the base's own N the prediction *is* the measured
   step, exactly; from a 1-worker trace the compute terms are the measured ones and the
   communication is the simulated one.

Speed-up ``S(N) = N · t(1) / t(N)`` with ``t(1)`` the base's step without communication (the
measured step of a 1-worker base), efficiency ``S(N) / N``.

A prediction holds for workers with the base's resources (device, threads, cores per worker);
:func:`check` refuses a measured trace whose workers had others, with one line saying which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import COMPUTE, step_breakdown
from opprof.analysis.ranks import ASYNC_MODES, collectives, match
from opprof.errors import OpprofError
from opprof.filters import on_host, step_work
from opprof.intervals import union_length
from opprof.kinds import PS_MODES, Collective, Framework, Mode, Role, default_mode
from opprof.model.colocation import NONE as NO_COLOCATION
from opprof.model.colocation import (
    Colocation,
    Curve,
    Placement,
    colocation,
    curve_from_cores,
    from_network,
    per_host,
    placement,
    spread_over,
)
from opprof.model.commmodel import Network, assumed, collective_of, fit
from opprof.model.gradients import FLOAT_BYTES, GradientProfile, profile
from opprof.model.instep import in_step_of
from opprof.model.interference import Interference, Measured, from_cores, measure
from opprof.model.resources import Resources, resource_mismatch, resources
from opprof.model.sharded import (
    ASSUMED_COPY_NS_PER_BYTE,
    blocking_wait,
    copy_rate,
    fit_network,
    fsdp_calls,
    optimizer_calls,
    segment_sigmas,
    unit_bytes,
    unit_shares,
)
from opprof.model.sharded import trace_samples as sharded_samples
from opprof.model.simulate import policy_for, simulate
from opprof.model.step import (
    COMPUTE_PHASES,
    Policy,
    ShardedPlan,
    SimResult,
    StepPlan,
    expected_max_normal,
)
from opprof.model.terms import PHASE_OF, TERM_OF, Terms, terms_from_steps
from opprof.sharding import REFINES, sharded_mode
from opprof.taxonomy import PHASES
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.jsontypes import JSONObject

_NOT_GRADIENT = r"(?i)broadcast|barrier|gather|scatter|send|recv|alltoall"


#: The phases co-location slows: the worker's compute (of its update, what stays on it where
#: a parameter server runs the optimizer).
COLOCATED = COMPUTE


@dataclass
class BaseMeta:
    """What the model keeps of a trace's metadata: what a check compares (framework, model,
    per-worker batch) and says (data set, device); None where the trace does not say."""

    framework: str | None = None
    model: str | None = None
    batch_size: int | None = None
    dataset: str | None = None
    device: str | None = None


@dataclass
class Baseline:
    """Everything the model takes from one trace."""

    label: str
    framework: str
    mode: str
    workers: int
    servers: int
    terms: Terms
    gradients: GradientProfile
    resources: Resources
    samples: pd.DataFrame  # the trace's gradient collectives: bytes, ns (transfer time)
    samples_note: str
    sigma_ns: float  # std of the per-step compute time (step minus exposed comm)
    meta: BaseMeta = field(default_factory=BaseMeta)
    units: Units | None = None  # FSDP units (:func:`fsdp_units`)
    #: compute slowed beside the trace's own collectives (:mod:`.interference`)
    interference: Measured | None = None
    #: where its workers (and servers) computed (:mod:`.colocation`)
    placement: Placement = field(default_factory=lambda: spread_over(1, 0, 1, "one worker"))
    #: the optimizer's own operators per step (ns; :func:`optimizer_ns`): what moves to
    #: parameter servers that take the update; the rest of the update phase stays
    optimizer_ns: float = 0.0

    @property
    def phases(self) -> dict[str, float]:
        """Mean wall ns per phase."""
        return {PHASE_OF[t]: v for t, v in self.terms.mean().items()}

    @property
    def step_ns(self) -> float:
        """Mean measured step."""
        return self.terms.step_ns

    @property
    def collective(self) -> str | None:
        """The collective of the base's mode, if it communicates."""
        if self.mode in (Mode.ALLREDUCE, *PS_MODES, Mode.FSDP) and (
                self.workers > 1 or self.mode not in (Mode.ALLREDUCE, Mode.FSDP)):
            return collective_of(self.mode)
        return None

    @property
    def device(self) -> str:
        """Where the base trained (``cpu``, ``cuda``)."""
        return str(self.meta.device or "cpu")


def baseline(trace: Trace, label: str = "", steps: pd.DataFrame | None = None) -> Baseline:
    """Read the model's inputs from a trace (``steps``: its :func:`step_breakdown`, when the
    caller has it)."""
    steps = step_breakdown(trace) if steps is None else steps
    if steps.empty:
        raise OpprofError(f"{label or 'trace'}: no steps on worker ranks; nothing to model")
    t = terms_from_steps(steps)
    meta = trace.meta
    workers = int(meta.get("workers") or len(trace.ranks) or 1)
    mode = infer_mode(trace, workers)
    samples, note = _trace_samples(trace, steps, mode, workers)
    sigma = _compute_sigma(t.per_step)
    gradients = profile(trace)
    return Baseline(label=label, framework=str(meta.get("framework") or ""), mode=mode,
                    workers=workers, servers=int(meta.get("servers") or 0), terms=t,
                    gradients=gradients, resources=resources(meta), samples=samples,
                    samples_note=note, sigma_ns=sigma,
                    meta=BaseMeta(meta.get("framework"), meta.get("model"),
                                  meta.get("batch_size"), meta.get("dataset"),
                                  meta.get("device")),
                    units=fsdp_units(trace, gradients, t.steps),
                    interference=measure(trace, t.steps) if workers > 1 else None,
                    placement=placement(meta, workers),
                    optimizer_ns=optimizer_ns(trace, len(steps)))


def optimizer_ns(trace: Trace, rank_steps: int) -> float:
    """The mean time over ``rank_steps`` (the step breakdown's rows) of the update phase's
    optimizer operators (canonical ``weights_update``, counted, their union over threads). A
    parameter server that takes the optimizer takes this; the update's other time — the
    training loop's own Python around the optimizer, its gradient copies — stays on the
    worker."""
    ev = trace.events
    keep = step_work(ev) & ev["counted"].astype(bool) & on_host(ev) \
        & (ev["phase"].astype(str) == "update") & (ev["op"].astype(str) == "weights_update")
    e = ev[keep.to_numpy()]
    if e.empty:
        return 0.0
    start = e["ts"].to_numpy(np.int64)
    groups = e.assign(end=start + e["dur"].to_numpy(np.int64)).groupby(["rank", "step"],
                                                                      observed=True)
    per = [union_length(g["ts"].to_numpy(np.int64), g["end"].to_numpy(np.int64))
           for _, g in groups]  # one per (rank, step): a few dozen
    return float(np.sum(per)) / max(rank_steps, 1)


@dataclass
class Units:
    """What the FSDP model needs from a trace: each unit's unsharded bytes (root first,
    forward order), its share of the compute, where they come from, and FSDP's copy rate
    measured in an FSDP trace (ns per byte; None when it ran no FSDP)."""

    bytes: Array
    share: Array
    source: str
    copy_ns_per_byte: float | None
    #: Σ over the compute segments between blocking collectives of each one's σ (ns;
    #: :func:`opprof.model.sharded.segment_spread`), None where the trace cannot say
    segment_sigma_ns: float | None = None
    #: each of those segments' σ (ns; :func:`opprof.model.sharded.segment_sigmas`)
    segment_sigmas: Array | None = None
    #: the spread of the ranks' exits from FSDP's calls in an FSDP trace (ns;
    #: :func:`opprof.model.sharded.fsdp_calls`), whose times hold FSDP's copies; None
    #: where the trace has no FSDP calls on CPU
    exit_spread_ns: float | None = None
    #: the calls of the optimizer's step per step (:func:`.sharded.optimizer_calls`), each a
    #: call on a sharded parameter under FSDP
    optimizer_calls: float = 0.0


def fsdp_units(trace: Trace, gradients: GradientProfile, steps: int) -> Units:
    """The :class:`Units` of a trace (:mod:`opprof.model.sharded`)."""
    nbytes, source = unit_bytes(trace)
    if not len(nbytes):
        total = gradients.total_bytes
        nbytes = np.array([total], np.int64) if total else np.zeros(0, np.int64)
        source = "one unit of all the gradient bytes (the trace names no FSDP units)"
    layers = gradients.layers if len(nbytes) > 1 else None
    share = unit_shares(layers, nbytes)
    sigmas = segment_sigmas(trace, share) if len(nbytes) else None
    calls, spread = _blocking_calls(trace)
    return Units(nbytes, share, source,
                 copy_rate(trace, nbytes, steps) if len(nbytes) else None,
                 None if sigmas is None else float(sigmas.sum()), sigmas,
                 spread if len(calls) else None, optimizer_calls(trace))


def _blocking_calls(trace: Trace) -> tuple[pd.DataFrame, float]:
    """FSDP's calls as the training thread pays them (:func:`.sharded.fsdp_calls`) in a CPU
    trace, where gloo blocks it; none on a GPU, where NCCL runs them beside compute."""
    if str(trace.meta.get("device") or "cpu").startswith("cuda"):
        return pd.DataFrame(columns=["kind", "bytes", "ns"]), 0.0
    return fsdp_calls(trace)


def infer_mode(trace: Trace, workers: int | None = None) -> str:
    """The trace's distributed mode: from its metadata, else from what ran (imported native
    traces): one worker is ``single``; servers make it a parameter server (``ps-sync`` for
    MXNet, whose kvstore is usually synchronous; ``ps-async`` for TensorFlow, whose only
    parameter-server strategy is); otherwise ``allreduce``. FSDP's ranges or ZeRO's optimizer
    make a data-parallel trace ``fsdp`` / ``zero`` (:mod:`opprof.sharding`)."""
    meta = trace.meta
    if meta.get("mode") not in REFINES:
        return str(meta["mode"])
    names = trace.events["name"]
    sharded = sharded_mode(names.cat.categories if isinstance(names.dtype, pd.CategoricalDtype)
                           else names.unique())
    if sharded:
        return sharded
    if meta.get("mode"):
        return str(meta["mode"])
    workers = workers or int(meta.get("workers") or len(trace.ranks) or 1)
    if workers <= 1:
        return Mode.SINGLE
    servers = meta.get("servers") or int((trace.events["role"] == Role.SERVER).any())
    if servers:
        return Mode.PS_ASYNC if meta.get("framework") == Framework.TF else Mode.PS_SYNC
    return Mode.ALLREDUCE


def _compute_sigma(rows: pd.DataFrame) -> float:
    """How much one worker's compute time (step − exposed comm) varies independently of the
    others': the pooled standard deviation across ranks within a step when the trace has
    several ranks, else the standard deviation across its steps."""
    compute = rows.assign(c=(rows["dur_ns"] - rows["t_comm"]).astype(np.float64))
    if compute["rank"].nunique() > 1:
        var = compute.groupby("step")["c"].var(ddof=1).dropna()
        return float(np.sqrt(var.mean())) if len(var) else 0.0
    c = compute["c"].to_numpy()
    return float(np.std(c, ddof=1)) if len(c) > 1 else 0.0


def _trace_samples(trace: Trace, steps: pd.DataFrame, mode: str,
                   workers: int) -> tuple[pd.DataFrame, str]:
    """(bytes, ns) of the gradient collectives in the trace: their transfer time (waiting for
    the last rank excluded, in synchronous modes) and payload."""
    empty = pd.DataFrame(columns=["bytes", "ns"])
    if mode == Mode.FSDP:
        calls, _ = _blocking_calls(trace)
        s = calls[["kind", "bytes", "ns"]] if len(calls) else sharded_samples(trace)
        note = ("FSDP's calls on the training thread from the last rank in, their copies "
                "inside (unsharded bytes)" if len(calls) else
                "the backend's all-gather / reduce-scatter spans (unsharded bytes)")
        return s[(s["bytes"] > 0) & (s["ns"] > 0)].reset_index(drop=True), note
    if mode not in (Mode.ALLREDUCE, *PS_MODES) or (mode == Mode.ALLREDUCE and workers < 2):
        return empty, ""
    timing, _ = collectives(trace)
    if timing.empty:
        return empty, "the trace holds no collectives"
    timing = timing[~timing["name"].str.contains(_NOT_GRADIENT, regex=True)]
    coll = match(timing, steps[["rank", "step", "start", "end"]], mode not in ASYNC_MODES)
    coll = coll[coll["step"] >= 0]
    if coll.empty:
        return empty, "the trace holds no gradient collectives"
    nbytes = coll["bytes"].to_numpy(np.int64).copy()
    note = "payloads from the trace"
    if mode != Mode.ALLREDUCE and trace.meta.get("comm_bytes_per_step"):
        nbytes //= 2  # MXNet's comm windows count push and pull; the model's n is one way
        note = "payloads from the trace (push + pull windows, halved)"
    ns = coll["transfer_ns"].to_numpy(np.float64)
    if not (nbytes > 0).any():
        params = trace.meta.get("params")
        if not params:
            return empty, "the trace's collectives carry no sizes and meta has no params"
        longest = coll.assign(ns=ns).groupby(["rank", "step"])["ns"].idxmax()
        coll = coll.loc[longest]
        ns = coll["transfer_ns"].to_numpy(np.float64)
        nbytes = np.full(len(coll), int(params) * FLOAT_BYTES, np.int64)
        note = ("the trace's collectives carry no sizes: the longest of each step taken as "
                "the all-reduce of every gradient (meta params × 4 B)")
    out = pd.DataFrame({"bytes": nbytes, "ns": ns})
    return out[(out["bytes"] > 0) & (out["ns"] > 0)].reset_index(drop=True), note


def network_for(base: Baseline, collective: str, given: Network | None,
                servers: int) -> tuple[Network, str]:
    """The network to predict with, and a sentence saying where it comes from."""
    if given is not None:
        if given.collective != collective:
            raise OpprofError(f"the network file measured {given.collective}; this prediction "
                              f"needs {collective} (run `opprof calibrate` for that mode)")
        return given, (f"{given.source or 'given'}: {given.backend or 'network'} measured with "
                       f"{given.workers} workers")
    if base.collective == collective:
        net = _fit_trace(base)
        if net is not None:
            return net, (f"fitted to the trace's {len(base.samples)} collectives "
                         f"({base.samples_note})")
    net = assumed(collective)
    return net, ("assumed: 10 Gb/s Ethernet (α = 25 µs, β = 0.8 ns/B); measure yours with "
                 "`opprof calibrate`")


def network_from_trace(trace: Trace) -> Network | None:
    """α and β fitted to the gradient collectives a multi-worker trace holds (None: it has
    none to fit)."""
    return _fit_trace(baseline(trace, ""))


def _fit_trace(base: Baseline) -> Network | None:
    if base.collective is None or not len(base.samples):
        return None
    try:
        if base.collective == Collective.FSDP:
            units = base.units
            inside = units is not None and units.exit_spread_ns is not None
            copy = 0.0 if inside else units.copy_ns_per_byte if units is not None else None
            net = fit_network(base.samples, base.workers, copy, "mean" if inside else "median",
                              source="trace", framework=base.framework,
                              backend="collectives in the trace")
            if inside and units is not None:
                net.info.update({"copies": "inside the FSDP calls' times",
                                 "exit_spread_ns": units.exit_spread_ns})
            return net
        net = fit(base.samples, base.collective, base.workers, max(base.servers, 1),
                  source="trace", framework=base.framework, backend="collectives in the trace")
    except OpprofError:
        return None
    if base.collective == Collective.PS:  # MXNet's windows hold the servers' optimizer too
        net.info["includes_server_update"] = True
    return net


def plan(base: Baseline, workers: int, mode: str, servers: int, network: Network, *,
         deltas: dict[str, float] | None = None, comm_scale: float = 1.0,
         communicate: bool = True, io_hidden: bool = False,
         straggler: bool = False, interference: float = 0.0,
         comm_interference: float = 0.0, colocation: float = 0.0,
         colocation_wait_ns: float = 0.0) -> tuple[StepPlan | ShardedPlan, Policy]:
    """The simulation inputs for ``workers`` workers of the base's kind, with compute-phase
    changes ``deltas`` (ns per step, per phase) applied, the worker's compute (forward,
    backward, its own update) × ``1 + colocation`` (:mod:`.colocation`, relative to the base's)
    and ``colocation_wait_ns`` more wait for the most crowded host's workers."""
    collective = collective_of(mode) if mode != Mode.SINGLE else Collective.ALLREDUCE
    if collective == Collective.FSDP:
        return _sharded_plan(base, workers, network, deltas, comm_scale, communicate,
                             io_hidden, straggler, colocation, colocation_wait_ns)
    policy = policy_for(base.framework, collective)
    phases = {p: base.phases[p] for p in COMPUTE_PHASES}
    for p, d in (deltas or {}).items():
        if p in phases:
            phases[p] = max(0.0, phases[p] + d)
    moved = policy.server_update and not base.collective == Collective.PS
    server_update = 0.0
    if moved:
        # The optimizer's operators move from the worker to the servers (keys split over
        # them); the rest of the update — the loop's own Python around push and pull — stays
        optimizer = min(base.optimizer_ns, phases["update"])
        server_update = optimizer / max(servers, 1)
        phases["update"] -= optimizer
    for p in COLOCATED:
        phases[p] *= 1.0 + colocation
    if network.info.get("includes_server_update"):
        server_update = 0.0
    if io_hidden:
        phases["load"] = 0.0
    io_busy = base.terms.extra()["io_busy_ns"]
    prefetch = io_busy > 1.01 * base.phases["load"] + 1e3
    g = base.gradients.layers
    ready = g["ready_frac"].to_numpy(np.float64) if len(g) else np.zeros(0)
    nbytes = g["bytes"].to_numpy(np.int64) if len(g) else np.zeros(0, np.int64)
    if not len(g) and base.gradients.total_bytes:
        ready, nbytes = np.ones(1), np.array([base.gradients.total_bytes])
    talk = communicate and (workers > 1 or collective == Collective.PS) and mode != Mode.SINGLE
    sync = mode not in ASYNC_MODES
    wait = base.sigma_ns * expected_max_normal(workers) if (straggler and sync) else 0.0
    wait += colocation_wait_ns if sync else 0.0

    # the in-step latency: on every message of a step that sends its gradients in a few
    # (DDP's buckets, one packed or one after backward); once a step where every key goes
    # on its own one after another (a kvstore: only the first key follows the compute)
    latency = _in_step_latency(base, network, collective, policy, workers, max(servers, 1))
    first, latency = (latency, 0.0) if policy.per_tensor else (0.0, latency)

    def cost(n: float) -> float:
        return float(network.cost_ns(n, workers, max(servers, 1))) + latency

    pack = float(network.info.get("pack_ns_per_byte") or 0.0) * float(np.sum(nbytes))
    return StepPlan(phases=phases, ready_frac=ready, grad_bytes=nbytes, policy=policy,
                    cost=cost, comm_scale=comm_scale, io_busy_ns=0.0 if io_hidden else io_busy,
                    io_prefetch=prefetch and not io_hidden, straggler_ns=wait,
                    server_update_ns=server_update, communicate=talk, pack_ns=pack,
                    interference=interference, comm_interference=comm_interference,
                    first_extra_ns=first,
                    input_ns=0.0 if io_hidden else distributed_input_ns(
                        base, network, collective, workers)), policy


def distributed_input_ns(base: Baseline, network: Network, collective: str,
                         workers: int) -> float:
    """What TensorFlow's distributed dataset adds to each step of ``workers`` > 1
    MultiWorkerMirroredStrategy workers predicted from a base that iterated its dataset
    itself (one worker, no strategy): every batch comes through the strategy's iterator —
    each worker's shard, prefetched on a thread of its own — which `opprof calibrate --fw tf`
    times against the plain dataset (the network file's ``info.distributed_input``); 0
    elsewhere (another framework, a base that ran the strategy, a network without it)."""
    if (base.framework != Framework.TF or collective != Collective.ALLREDUCE or workers < 2
            or base.collective is not None or network.framework not in ("", Framework.TF)):
        return 0.0
    info = network.info.get("distributed_input")
    return float(info.get("ns") or 0.0) if isinstance(info, dict) else 0.0


def _in_step_latency(base: Baseline, network: Network, collective: str, policy: Policy,
                     workers: int, servers: int) -> float:
    """What a data-parallel step's gradient collective pays beyond the α–β's latency (ns),
    with a network file from `opprof calibrate` of the base's framework that timed it after a
    burst of compute on every rank (the in-step calls, :mod:`opprof.model.instep`): such a
    call starts later than one made back to back — the collective's threads asleep through
    the compute, the host's wake-ups — so its latency is the in-step line's (its cost of no
    bytes, after the last rank entered) where that is larger than the network's; the bytes
    keep the α–β's rate. 0 elsewhere (a network fitted from a trace, or written before
    calibrate timed such calls, or another framework's)."""
    ps = collective == Collective.PS  # one worker still pushes to its servers
    if not (ps or (collective == Collective.ALLREDUCE and workers > 1)):
        return 0.0
    if network.framework and network.framework != base.framework:
        return 0.0
    instep = in_step_of(network, "all_reduce")
    if instep is None:
        return 0.0
    alpha = float(np.asarray(network.cost_ns(0.0, workers, servers)).reshape(-1)[0])
    # (a call's time after the last rank entered it: one worker's is taken as the calibrated
    # workers', whose wait for each other it leaves out)
    return max(0.0, instep.after_ns(0.0, workers if workers > 1 else instep.workers) - alpha)


def interference_for(base: Baseline, network: Network, workers: int) -> Interference:
    """How much compute slows beside the collectives of ``workers`` workers: measured by
    `opprof calibrate` (the network file), else in the base's own trace (a multi-worker base
    with compute beside its collectives), else from the cores each worker has."""
    s = network.info.get("interference")
    if s is not None and network.source == "calibrate":
        return Interference(float(s), "calibrate: a compute loop and the collective timed alone "
                                      "and beside each other",
                            float(network.info.get("comm_interference") or 0.0))
    m = base.interference
    if m is not None and m.matched:
        # the collective's own slowdown is in the α–β fitted to the trace's collectives
        return Interference(m.slowdown, f"the trace: {m.matched} operators beside a "
                                        "collective against the same away from one")
    return from_cores(base.resources, workers)


def colocation_curve(base: Baseline, network: Network) -> tuple[Curve, tuple[str, ...]]:
    """The co-location curve to predict with (:mod:`.colocation`): `opprof calibrate`'s loop
    (the network file), else the cores; and what to say about it (a loop of another model or
    other threads than the base's)."""
    curve = from_network(network.info) if network.source == "calibrate" else None
    if curve is None:
        return curve_from_cores(base.resources), ()
    notes = []
    model, batch = base.meta.model, base.meta.batch_size
    if curve.model and model and (curve.model != model or (
            curve.batch_size and batch and curve.batch_size != batch)):
        notes.append(f"co-location calibrated with {curve.model} (batch {curve.batch_size}), "
                     f"not the base's {model} (batch {batch}): `opprof calibrate --model "
                     "BASE.trace` times the base's own step")
    threads = base.resources.threads
    if curve.threads and threads and curve.threads != threads:
        notes.append(f"co-location calibrated with {curve.threads} thread(s) per worker, the "
                     f"base ran {threads}")
    return curve, tuple(notes)


def server_duty(base: Baseline, mode: str, workers: int, servers: int) -> float:
    """The share of a step a parameter server computes beside the workers' compute: 0 in
    synchronous modes (its optimizer runs between push and pull, while the workers wait);
    ``ps-async``, the optimizer of every worker's push, N·t_u/S of the step (at most 1)."""
    if mode != Mode.PS_ASYNC or base.step_ns <= 0:
        return 0.0
    update = base.phases["update"] if base.collective != Collective.PS else 0.0
    return min(1.0, workers * update / max(servers, 1) / base.step_ns)


def colocation_for(base: Baseline, network: Network, place: Placement, mode: str,
                   servers: int = 0) -> Colocation:
    """The co-location of ``place``'s workers running ``mode`` (:mod:`.colocation`)."""
    curve, notes = colocation_curve(base, network)
    duty = server_duty(base, mode, len(place.workers_on_host), servers)
    return colocation(curve, place, duty, base.device, notes)


def placement_for(base: Baseline, mode: str, workers: int, servers: int,
                  workers_per_host: int | None = None) -> Placement:
    """Where ``workers`` predicted workers compute: ``workers_per_host`` to a host, else the
    base's own placement at its worker count, else spread over the base's hosts."""
    s = servers if mode in PS_MODES and workers > 1 else 0
    if workers_per_host:
        return per_host(workers, workers_per_host, s)
    if workers == base.workers and s == (base.servers if base.collective else 0):
        return base.placement
    known = not base.placement.source.startswith("hosts unknown")
    return spread_over(workers, s, base.placement.hosts,
                       base.placement.source if not known else "the base's hosts"
                       if base.placement.hosts > 1 else "one host, the base's")


@dataclass(frozen=True)
class ColocationScale:
    """What co-location does to a prediction's simulation (:func:`colocation_scale`)."""

    colocation: Colocation  # of the predicted workers
    relative: float  # their compute × (1 + relative) of the base's
    wait_ns: float  # the others' wait for the most crowded host's workers


def colocation_scale(base: Baseline, network: Network, mode: str, workers: int, servers: int,
                     place: Placement, on: bool = True) -> ColocationScale:
    """The base's workers computed (1 + s_base) times slower than alone, ``place``'s workers
    will compute (1 + s) times: the base's compute × (1 + s) / (1 + s_base); the workers of
    the most crowded host slower still, which the others wait for. ``on=False``: the base's
    compute as it is (the prediction without the term)."""
    s_base = colocation_for(base, network, base.placement, base.mode, base.servers)
    coloc = colocation_for(base, network, place, mode, servers)
    if not on:
        coloc = replace(coloc, slowdown=s_base.slowdown, max_slowdown=s_base.slowdown)
    collective = collective_of(mode) if mode != Mode.SINGLE else Collective.ALLREDUCE
    moved = policy_for(base.framework, collective, base.device).server_update and \
        base.collective != Collective.PS and workers > 1
    alone = (sum(base.phases[ph] for ph in COLOCATED)
             - (base.optimizer_ns if moved else 0.0)) / (1.0 + s_base.slowdown)
    wait = (coloc.max_slowdown - coloc.slowdown) * alone if workers > 1 else 0.0
    return ColocationScale(coloc, (1.0 + coloc.slowdown) / (1.0 + s_base.slowdown) - 1.0,
                           wait)


def _sharded_plan(base: Baseline, workers: int, network: Network,
                  deltas: dict[str, float] | None, comm_scale: float, communicate: bool,
                  io_hidden: bool, straggler: bool, colocation: float = 0.0,
                  colocation_wait_ns: float = 0.0) -> tuple[ShardedPlan, Policy]:
    """:func:`plan` for ``fsdp``: the base's compute, the optimizer on a 1/N shard (of the
    base's shard, 1/N_base, in an FSDP base; from a base that did not shard, each of its calls
    plus a DTensor's dispatch), its units' bytes and compute shares."""
    policy = policy_for(base.framework, Collective.FSDP, base.device)
    phases = {p: base.phases[p] for p in COMPUTE_PHASES}
    for p, d in (deltas or {}).items():
        if p in phases:
            phases[p] = max(0.0, phases[p] + d)
    shard_of_base = base.workers if base.mode == Mode.FSDP else 1
    phases["update"] = phases["update"] * shard_of_base / max(workers, 1)
    units = base.units or Units(np.zeros(0, np.int64), np.ones(1), "", None)
    if base.mode != Mode.FSDP and workers > 1:
        # the optimizer steps FSDP2's sharded parameters: every call pays a DTensor's dispatch
        # (calibrate's ``sharded_op_ns``), which sharding does not divide
        phases["update"] += units.optimizer_calls * float(
            network.info.get("sharded_op_ns") or 0.0)
    for p in COLOCATED:
        phases[p] *= 1.0 + colocation
    if io_hidden:
        phases["load"] = 0.0
    io_busy = base.terms.extra()["io_busy_ns"]
    copy = network.info.get("copy_ns_per_byte")
    if copy is None:
        copy = units.copy_ns_per_byte if units.copy_ns_per_byte is not None else \
            ASSUMED_COPY_NS_PER_BYTE
    # Blocking collectives are barriers: the wait for the slowest worker at each (the σ of the
    # compute segment before it, from the base, and of the ranks' exits from the collective
    # before, from the network); with prefetch (GPU) once per step.
    if policy.overlap or units.segment_sigmas is None:
        wait = base.sigma_ns * expected_max_normal(workers)
    else:
        wait = blocking_wait(units.segment_sigmas,
                             float(network.info.get("exit_spread_ns") or 0.0),
                             len(units.bytes), workers)
    wait = (wait if straggler else 0.0) + colocation_wait_ns
    talk = communicate and workers > 1
    return ShardedPlan(
        phases=phases, unit_bytes=units.bytes if talk else np.zeros(0, np.int64),
        share=units.share, cost=lambda kind, n: network.kind_cost_ns(kind, n, workers),
        copy_ns_per_byte=float(copy), workers=workers, overlap=policy.overlap,
        comm_scale=comm_scale, io_busy_ns=0.0 if io_hidden else io_busy,
        io_prefetch=io_busy > 1.01 * base.phases["load"] + 1e3 and not io_hidden,
        straggler_ns=wait if talk else 0.0, communicate=talk), policy


def calibrated(measured: dict[str, float], sim_base: SimResult, sim_new: SimResult,
               comm_hidden: bool = False) -> dict[str, float]:
    """Predicted wall ns per phase: the measurement moved by what the simulation changed
    (compute phases: by the difference; exposed comm: by the ratio when both have some)."""
    out = {}
    for p in PHASES:
        m = measured.get(p, 0.0)
        if p == "comm":
            if comm_hidden:
                out[p] = 0.0
            elif sim_base.phases["comm"] > 0 and m > 0:
                out[p] = m * (sim_new.phases["comm"] / sim_base.phases["comm"])
            else:
                out[p] = max(0.0, m + sim_new.phases["comm"] - sim_base.phases["comm"])
        else:
            out[p] = max(0.0, m + (sim_new.phases[p] - sim_base.phases[p]))
    return out


@dataclass
class Prediction:
    """One predicted configuration."""

    workers: int
    mode: str
    servers: int
    step_ns: float
    speedup: float
    efficiency: float
    exposed_comm_ns: float
    comm_busy_ns: float
    wait_ns: float
    phases: dict[str, float]
    messages: int
    #: the part of the backward phase lost to compute slowed beside collectives (ns)
    interference_ns: float = 0.0
    interference: Interference | None = None
    #: per phase (forward, backward, update): the part lost to other processes computing on
    #: the same host (:mod:`.colocation`), ns
    colocation_parts: dict[str, float] = field(default_factory=dict)
    colocation: Colocation | None = None

    @property
    def colocation_ns(self) -> float:
        """Compute time lost to co-location per step (ns): the term ``t_coloc``."""
        return float(sum(self.colocation_parts.values()))

    def terms(self) -> dict[str, float]:
        """The predicted terms: t_io … other, with the backward's slowdown beside
        collectives as its own term ``t_interf`` (t_b without it) and the compute lost to
        co-location as ``t_coloc`` (t_f, t_b and t_u without it); they sum to the step."""
        out: dict[str, float] = {}
        lost = self.colocation_parts
        for p, v in self.phases.items():
            if p == "backward":
                out["t_b"] = v - self.interference_ns - lost.get(p, 0.0)
                out["t_interf"] = self.interference_ns
                out["t_coloc"] = self.colocation_ns
            else:
                out[TERM_OF[p]] = v - lost.get(p, 0.0)
        return out


@dataclass(frozen=True)
class Check:
    """A prediction beside a measured trace, term by term."""

    label: str
    measured_step_ns: float
    predicted_step_ns: float
    error: float  # (predicted − measured) / measured
    terms: pd.DataFrame  # term, predicted_ns, measured_ns, error_ns, error
    resources: Resources
    spread: Spread | None = None
    colocation: ColocationCheck | None = None


@dataclass
class ColocationCheck:
    """How much of a check's error the co-location term explains: the term predicted and as
    the measured run shows it (its workers' compute, t_interf out, beyond the prediction's
    compute alone), and the step predicted with and without it against the measured step."""

    predicted_ns: float
    measured_ns: float
    step_without_ns: float
    error_without: float  # the step's error without the term
    error: float  # with it (the check's)
    colocation: Colocation

    @property
    def explained(self) -> float:
        """Points of the step's |error| the term removes (negative: it adds error)."""
        return abs(self.error_without) - abs(self.error)

    def to_dict(self) -> JSONObject:
        """JSON form."""
        return {"predicted_ns": self.predicted_ns, "measured_ns": self.measured_ns,
                "step_without_ns": self.step_without_ns, "error_without": self.error_without,
                "error": self.error, "explained": self.explained,
                **self.colocation.to_dict()}


#: A measured run whose steps vary more than this (coefficient of variation) is too noisy to
#: judge a prediction by.
NOISY_CV = 0.10
#: ... or whose mean step is known to less than this (95% interval half-width / mean).
NOISY_HALF_WIDTH = 0.05


#: Student's t, 97.5% quantile, by degrees of freedom (at least the key; 1.96 beyond 30).
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
         10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (conservative: the
    table's next smaller df)."""
    keys = [k for k in _T975 if k <= df]
    return _T975[max(keys)] if keys and df <= 30 else (1.96 if df > 30 else math.inf)


@dataclass(frozen=True)
class Spread:
    """How well a measured run pins its mean step, and what that says of a prediction: the
    95% interval of the measured mean (t · std / √n over its n (rank, step)s), the
    prediction's error over that interval, and whether the run is too noisy to judge by (the
    verdict in words: :func:`opprof.render.verdicts.check_verdict`)."""

    steps: int
    cv: float  # std / mean of the measured steps
    half_width: float  # 95% half-width of the measured mean, relative to it
    interval_ns: tuple[float, float]  # the predicted step ± the half-width
    error_interval: tuple[float, float]  # the error against the measured mean's interval
    noisy: bool  # cv above NOISY_CV, or the half-width above NOISY_HALF_WIDTH
    error: float  # (predicted − measured mean) / measured mean

    @property
    def within(self) -> bool:
        """Whether the error interval holds 0 (the prediction within the measured noise)."""
        return self.error_interval[0] <= 0 <= self.error_interval[1]

    def to_dict(self) -> JSONObject:
        """JSON form (the verdict in words is the renderer's)."""
        return {"steps": self.steps, "cv": self.cv, "half_width": self.half_width,
                "interval_ns": list(self.interval_ns),
                "error_interval": list(self.error_interval), "noisy": self.noisy}


def spread(step_ns: Array, predicted_ns: float) -> Spread:
    """The :class:`Spread` of measured steps ``step_ns`` against a predicted step."""
    v = np.asarray(step_ns, np.float64)
    n = len(v)
    mean = float(v.mean()) if n else math.nan
    std = float(v.std(ddof=1)) if n > 1 else 0.0
    cv = std / mean if mean else math.nan
    h = t975(n - 1) * std / math.sqrt(n) / mean if n > 1 and mean else math.inf
    lo_m, hi_m = mean * (1 - h), mean * (1 + h)
    err = (predicted_ns - mean) / mean if mean else math.nan
    e_lo = predicted_ns / hi_m - 1 if hi_m > 0 else -math.inf
    e_hi = predicted_ns / lo_m - 1 if lo_m > 0 else math.inf
    noisy = not (cv <= NOISY_CV and h <= NOISY_HALF_WIDTH)
    return Spread(n, cv, h, (predicted_ns * (1 - h), predicted_ns * (1 + h)), (e_lo, e_hi),
                  noisy, err)


@dataclass(frozen=True)
class ModelResult:
    """``opprof model``'s answer (immutable: :func:`predict` makes it, ``--check`` adds its
    check with :func:`with_check`)."""

    base: Baseline
    mode: str
    servers: int
    network: Network
    network_note: str
    policy: Policy
    predictions: list[Prediction]
    check: Check | None = None
    notes: list[str] = field(default_factory=list)
    straggler: bool = True
    #: the predicted workers' placement: this many to a host (None: the base's hosts)
    workers_per_host: int | None = None
    #: the runs (base, measured) whose timing the machine's load changed (noise ``noisy``)
    noisy_runs: tuple[str, ...] = ()


def predict(trace: Trace | None, workers: list[int], mode: str | None = None,
            servers: int | None = None, network: Network | None = None,
            straggler: bool = True, label: str = "",
            base: Baseline | None = None,
            workers_per_host: int | None = None) -> ModelResult:
    """Predict the step at each worker count (see the module docstring); ``base`` instead of
    ``trace`` when the baseline is already read; ``workers_per_host``: the predicted workers
    placed so many to a host (default: on the base's hosts)."""
    if base is None:
        if trace is None:
            raise OpprofError("no trace to model")
        base = baseline(trace, label)
    mode = mode or (base.mode if base.workers > 1 and base.mode != Mode.SINGLE
                    else default_mode(base.framework))
    collective = collective_of(mode)
    if base.collective is not None and base.collective != collective:
        raise OpprofError(f"{base.label or 'the trace'} ran {base.mode}; predicting {mode} "
                          "from it would need its communication removed — model from a "
                          "1-worker trace")
    servers = servers or (base.servers if base.collective == Collective.PS else 1) or 1
    net, note = network_for(base, collective, network, servers)
    notes = []  # (a poor α–β fit is the renderers' to say: opprof.render.verdicts)
    if collective == Collective.FSDP and base.units is not None:
        notes.append(f"FSDP units: {len(base.units.bytes)} ({base.units.source}); FSDP's "
                     "copies " + (("inside the calibrated collectives' times"
                                   if net.source != "trace" else
                                   "inside the trace's FSDP calls") if net.info.get("copies")
                                  else "from the network file" if "copy_ns_per_byte" in net.info
                                  and net.source != "trace"
                                  else "measured in the trace" if base.units.copy_ns_per_byte
                                  is not None else f"assumed {ASSUMED_COPY_NS_PER_BYTE} ns/B"))
    if base.gradients.bytes_source.startswith("meta"):
        notes.append(f"gradient bytes: {base.gradients.bytes_source}")
    if not base.gradients.total_bytes:
        notes.append("no gradient bytes known: the base's own exposed communication is kept "
                     "as measured for more than one worker" if base.phases["comm"] > 0 else
                     "no gradient bytes known: communication is predicted as zero")
    dist_input = distributed_input_ns(base, net, collective, max(workers))
    if dist_input > 0:
        notes.append(f"TensorFlow's distributed dataset (every batch through the strategy's "
                     f"iterator): +{dist_input / 1e6:.2f} ms of input a step (calibrate)")
    pol = policy_for(base.framework, collective)
    extra = _in_step_latency(base, net, collective, pol, max(workers), servers)
    if extra > 0:
        notes.append(f"{'the first key' if pol.per_tensor else 'each gradient message'} of a "
                     f"step pays the latency of a call after a compute burst (calibrate's "
                     f"in-step calls, the host's wake-ups included): +{extra / 1e6:.2f} ms "
                     f"over the back-to-back call's at {max(workers)} workers")
    notes.extend(colocation_curve(base, net)[1])
    result = ModelResult(base, mode, servers if collective == Collective.PS else 0, net, note,
                         policy_for(base.framework, collective, base.device), [], None, notes,
                         straggler, workers_per_host)
    return replace(result, predictions=[predict_one(result, n, servers) for n in workers])


def with_check(result: ModelResult, measured: Trace, label: str = "measured",
               noisy_runs: tuple[str, ...] = ()) -> ModelResult:
    """``result`` with its :func:`check` against ``measured`` and the runs whose timing was
    noisy."""
    return replace(result, check=check(result, measured, label), noisy_runs=noisy_runs)


def predict_one(result: ModelResult, workers: int, servers: int | None = None,
                place: Placement | None = None, with_colocation: bool = True) -> Prediction:
    """The prediction of ``result``'s model for ``workers`` workers (and ``servers``), placed
    on hosts as ``place`` says (default: :func:`placement_for`); ``with_colocation=False``
    leaves the co-location term out (what `--check` compares it with)."""
    if workers < 1:
        raise OpprofError("--workers: every count must be at least 1")
    base, mode, net = result.base, result.mode, result.network
    collective = collective_of(mode)
    servers = servers or result.servers or 1
    base_interf = interference_for(base, net, base.workers)
    base_plan, _ = plan(base, base.workers, base.mode if base.collective else Mode.SINGLE,
                        max(base.servers, 1), net, straggler=result.straggler,
                        interference=base_interf.slowdown,
                        comm_interference=base_interf.comm_slowdown)
    sim_base = simulate(base_plan)
    single = base.step_ns - base.phases["comm"]
    interf = interference_for(base, net, workers)
    new_mode = mode if workers > 1 else Mode.SINGLE
    place = place or placement_for(base, new_mode, workers, servers, result.workers_per_host)
    cs = colocation_scale(base, net, new_mode, workers, servers, place, with_colocation)
    p, _ = plan(base, workers, new_mode, servers, net,
                straggler=result.straggler, interference=interf.slowdown,
                comm_interference=interf.comm_slowdown, colocation=cs.relative,
                colocation_wait_ns=cs.wait_ns)
    sim = simulate(p)
    # one worker that talks to no one has no communication, known sizes or not
    phases = calibrated(base.phases, sim_base, sim, comm_hidden=not p.communicate)
    measured_interf = base.interference.extra_ns if base.interference is not None else 0.0
    interf_ns = min(phases["backward"], max(
        0.0, measured_interf + (sim.interference_ns - sim_base.interference_ns)))
    # the co-location term: the part (s / (1 + s)) of each slowed phase's compute
    coloc = cs.colocation
    lost = coloc.slowdown / (1.0 + coloc.slowdown)
    parts = {ph: lost * max(0.0, phases[ph] - (interf_ns if ph == "backward" else 0.0))
             for ph in COLOCATED}
    step = base.step_ns + sum(phases[k] - base.phases[k] for k in PHASES)
    speedup = workers * single / step if step > 0 else float("nan")
    busy = sim.comm_busy_ns
    measured_busy = base.terms.extra()["comm_busy_ns"]
    if sim_base.comm_busy_ns > 0 and measured_busy > 0:
        busy = measured_busy * (sim.comm_busy_ns / sim_base.comm_busy_ns)
    elif p.communicate and phases["comm"] > 0:  # kept as measured (sizes unknown)
        busy = max(busy, measured_busy)
    return Prediction(workers=workers, mode=mode if workers > 1 else Mode.SINGLE,
                      servers=servers if collective == Collective.PS and workers > 1 else 0,
                      step_ns=step,
                      speedup=speedup, efficiency=speedup / workers,
                      exposed_comm_ns=phases["comm"], comm_busy_ns=busy,
                      wait_ns=p.straggler_ns if p.communicate else 0.0, phases=phases,
                      messages=len(sim.messages), interference_ns=interf_ns,
                      interference=interf, colocation_parts=parts, colocation=coloc)


def resource_fix(base: Resources, target: Resources, workers: int) -> str:
    """The command line that makes the two runs' per-worker resources the same: both with
    the thread count each of the measured run's workers can keep busy."""
    cores = target.cores_per_worker
    want = int(cores) if cores and cores >= 1 else (target.threads or base.threads or 1)
    if base.threads == want and target.threads != want:
        return (f"record the {workers}-worker run with the baseline's threads (opprof "
                f"record --workers {workers} ... --threads {want})")
    if target.threads == want and base.threads != want:
        return f"record the baseline with the workers' threads (opprof record ... --threads {want})"
    return (f"record both with the same threads, {want} per worker on this host (opprof record "
            f"... --threads {want} for the baseline and the {workers}-worker run)")


def check(result: ModelResult, measured: Trace, label: str = "measured") -> Check:
    """The prediction for the measured trace's worker count beside its terms. Refuses (one
    line) when the measured workers had other resources, another mode or model."""
    base = result.base
    meta = measured.meta
    m_workers = int(meta.get("workers") or len(measured.ranks) or 1)
    m_mode = str(meta.get("mode") or "")
    if m_mode and m_workers > 1 and m_mode != result.mode:
        raise OpprofError(f"{label} ran --mode {m_mode}; the prediction is for --mode "
                          f"{result.mode}")
    for key, a in (("framework", base.meta.framework), ("model", base.meta.model),
                   ("batch_size", base.meta.batch_size)):
        b = meta.get(key)
        if a is not None and b is not None and a != b:
            raise OpprofError(f"{label} has {key} {b}, the modelled trace {a}: a prediction "
                              "holds for the same framework, model and per-worker batch")
    target = resources(meta)
    why = resource_mismatch(base.resources, target)
    if why:
        raise OpprofError(f"{label}'s workers had other resources than the modelled trace's "
                          f"({why}); a prediction holds only for the same per-worker "
                          f"resources — {resource_fix(base.resources, target, m_workers)}")
    m_servers = int(meta.get("servers") or 0)
    place = placement(meta, m_workers, m_servers)
    pred = predict_one(result, m_workers, m_servers or None, place)
    without = predict_one(result, m_workers, m_servers or None, place, with_colocation=False)
    mt = terms_from_steps(step_breakdown(measured))
    if not mt.steps:
        raise OpprofError(f"{label}: no steps on worker ranks")
    meas = dict(mt.mean())
    mi = measure(measured, mt.steps)
    # the measured run's own slowdown beside its collectives, out of its t_b
    meas["t_interf"] = min(meas["t_b"], mi.extra_ns) if mi is not None else 0.0
    meas["t_b"] -= meas["t_interf"]
    # and its co-location: its workers' compute beyond the prediction's compute alone, out of
    # the terms co-location slows (in proportion), so its terms still sum to its step
    pred_terms = pred.terms()
    slowed = [TERM_OF[ph] for ph in pred.colocation_parts]
    alone = sum(pred_terms[t] for t in slowed)
    computed = sum(meas[t] for t in slowed)
    meas["t_coloc"] = computed - alone if computed > 0 else 0.0
    for t in slowed:
        meas[t] = meas[t] * alone / computed if computed > 0 else meas[t]
    rows = []
    for t in pred.terms():
        p, m = pred.terms()[t], meas[t]
        rows.append({"term": t, "predicted_ns": p, "measured_ns": m, "error_ns": p - m,
                     "error": (p - m) / m if m else (0.0 if p == 0 else math.inf)})
    step_m = mt.step_ns
    rows.append({"term": "step", "predicted_ns": pred.step_ns, "measured_ns": step_m,
                 "error_ns": pred.step_ns - step_m,
                 "error": (pred.step_ns - step_m) / step_m if step_m else math.nan})
    error = (pred.step_ns - step_m) / step_m if step_m else math.nan
    coloc = ColocationCheck(
        pred.colocation_ns, meas["t_coloc"], without.step_ns,
        (without.step_ns - step_m) / step_m if step_m else math.nan, error,
        pred.colocation or without.colocation or NO_COLOCATION)
    return Check(label, step_m, pred.step_ns, error, pd.DataFrame(rows), target,
                 spread(mt.per_step["dur_ns"].to_numpy(np.float64), pred.step_ns), coloc)
