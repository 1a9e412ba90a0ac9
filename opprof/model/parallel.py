"""The step of a model-parallel job at other degrees: tensor parallel (``tp``), pipeline
parallel (``pp``, and other micro-batch counts) and expert parallel (``ep``), from one trace of
the job, and the check of a prediction against a measured run (docs/parallelism.md).

From the base trace (its mean (rank, step), :mod:`opprof.analysis.report`):

- **tp** at degree ``t0`` → ``t``: the *sharded compute* — the matrix products that ran on the
  local shards of DTensors (inside a ``PythonSubclass`` dispatch: the column- and row-parallel
  layers) — scales by ``t0 / t``; the tensor-parallel collectives keep their count and size (the
  activations they reduce do not shrink with ``t``): their measured exposed time (the share of
  it the base's step shows as ``comm``) moves to ``t`` by the ratio of a ring all-reduce's α–β
  cost (all-gather, reduce-scatter: half of it) among ``t`` and ``t0`` ranks; DTensor's own work
  (the rest of the operators around those dispatches, ``Redistribute``, the wrapping of tensors)
  stays while ``t > 1`` and goes at ``t = 1``, with the collectives.
- **pp** with ``p0`` stages and ``m0`` micro-batches → ``p``, ``m``: each micro-batch's forward
  and backward on the slowest stage (measured: :mod:`opprof.analysis.pipeline`) scale by
  ``(p0 / p) · (m0 / m)`` (layers spread over ``p`` stages, the batch over ``m`` micro-batches);
  the pipelined part of the step is ``(m + p − 1) · (f + b + x)`` for GPipe and 1F1B alike, ``x``
  the activation (gradient) transfer of one micro-batch between stages (the base's measured
  per-micro-batch transfer scaled by ``m0 / m``; none at ``p = 1``); the optimizer step scales
  by ``p0 / p`` (each stage updates its layers), the rest of the step stays.
- **ep** (``e0`` → ``e`` ranks of experts): the all-to-all exchanges keep their count; the bytes
  each rank sends leave for ``e − 1`` peers instead of ``e0 − 1``, at the α–β of an
  all-to-all; the experts' compute per rank is taken as unchanged (tokens per rank stay when
  the global batch grows with ``e``).

**Calibration**: predicted = measured + (modelled(target) − modelled(base)), so at the base's
own layout the prediction is the measured step; the network is the given one (``opprof
calibrate``), else α–β fitted on the base's own collectives (their transfer time vs bytes),
else an assumed 10 Gb/s Ethernet.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.analysis.report import Report, build_report
from opprof.errors import OpprofError
from opprof.filters import counted, on_host, step_work
from opprof.kinds import Collective
from opprof.model.commmodel import Network, assumed
from opprof.taxonomy import COMM_OPS
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject

DIMENSIONS = ("tp", "pp", "ep")
#: Collectives whose cost is a ring all-reduce's (all-gather and reduce-scatter: half of it).
_RING_HALF = ("all_gather", "reduce_scatter", "all_to_all")


@dataclass
class ParallelBase:
    """What the model reads from the base trace (ns per (rank, step), means)."""

    label: str
    mode: str
    workers: int
    degrees: dict[str, int]
    step_ns: float
    update_ns: float
    #: tp: products on local shards, DTensor's own work, collectives (calls, bytes, ns) and
    #: the exposed share of their time (the comm phase's share that is theirs, over it)
    sharded_ns: float = 0.0
    dtensor_ns: float = 0.0
    tp_calls: pd.DataFrame = field(default_factory=pd.DataFrame)
    tp_exposed: float = 1.0
    #: pp: micro-batches, the slowest stage's forward and backward per micro-batch, and the
    #: transfer per micro-batch (ns), the schedule
    microbatches: int = 0
    f_mb_ns: float = 0.0
    b_mb_ns: float = 0.0
    x_mb_ns: float = 0.0
    schedule: str = ""
    #: ep: all-to-all bytes per rank and step, calls, exposed ns
    a2a_bytes: float = 0.0
    a2a_calls: float = 0.0
    a2a_exposed_ns: float = 0.0


@dataclass
class ParallelPrediction:
    """The step at one target layout, its terms (ns), speed-up over the base."""

    degrees: dict[str, int]
    microbatches: int
    step_ns: float
    terms: dict[str, float]

    def to_dict(self) -> JSONObject:
        return {"degrees": dict(self.degrees), "microbatches": self.microbatches,
                "step_ns": self.step_ns, "terms": dict(self.terms)}


@dataclass(frozen=True)
class ParallelCheck:
    """A prediction beside a measured run of its layout."""

    label: str
    degrees: dict[str, int]
    microbatches: int
    predicted_ns: float
    measured_ns: float

    @property
    def error(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted_ns - self.measured_ns) / self.measured_ns

    def to_dict(self) -> JSONObject:
        return {"label": self.label, "degrees": dict(self.degrees),
                "microbatches": self.microbatches, "predicted_ns": self.predicted_ns,
                "measured_ns": self.measured_ns, "error": self.error}


@dataclass(frozen=True)
class ParallelResult:
    """Everything `opprof model` says about a model-parallel job (immutable:
    :func:`predict_parallel` makes it, :func:`with_parallel_check` adds its check)."""

    base: ParallelBase
    network: Network
    dimension: str
    predictions: list[ParallelPrediction]
    check: ParallelCheck | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> JSONObject:
        b = self.base
        return {"base": {"label": b.label, "mode": b.mode, "workers": b.workers,
                         "degrees": dict(b.degrees), "step_ns": b.step_ns,
                         "microbatches": b.microbatches, "schedule": b.schedule},
                "dimension": self.dimension,
                "network": {"alpha_ns": self.network.alpha_ns,
                            "beta_ns_per_byte": self.network.beta_ns_per_byte,
                            "source": self.network.source},
                "predictions": [p.to_dict() for p in self.predictions],
                "check": self.check.to_dict() if self.check else None, "notes": self.notes}


def parallel_base(trace: Trace, label: str = "", report: Report | None = None) -> ParallelBase:
    """The model's inputs from a trace (module docstring)."""
    rep = report or build_report(trace)
    steps = rep.steps
    if steps.empty:
        raise OpprofError(f"{label or 'the trace'} has no profiled steps to model")
    n = len(steps)
    meta = trace.meta
    par = meta.get("parallelism") or {}
    degrees = {d: int((par.get(d) or {}).get("degree") or 1) for d in DIMENSIONS}
    # a trace opprof did not record names no mode: its layout then (DDP's all-reduce: dp)
    base = ParallelBase(label=label, mode=str(meta.get("mode") or "+".join(par) or "single"),
                        workers=int(meta.get("workers") or 1), degrees=degrees,
                        step_ns=float(steps["dur_ns"].mean()),
                        update_ns=float(steps["update"].mean()))
    ev = trace.events
    work = ev[step_work(ev) & counted(ev) & on_host(ev)]
    if degrees["tp"] > 1:
        base.sharded_ns, base.dtensor_ns = _dtensor_compute(ev, work, n)
        c = rep.collectives
        tp = c[c["dim"] == "tp"] if "dim" in c else c.iloc[0:0]
        base.tp_calls = tp[["op", "calls_per_step", "bytes_per_call", "ns_per_step"]].copy()
        # the comm phase is the exposed communication (calls, waits, transfers): the
        # tensor-parallel collectives' share of it, by their share of the collectives' time
        comm_ns = float(steps["comm"].mean())
        time_ns = float(tp["ns_per_step"].sum())
        all_ns = float(c["ns_per_step"].sum())
        base.tp_exposed = comm_ns * time_ns / all_ns / time_ns if time_ns > 0 else 1.0
    if degrees["pp"] > 1 and len(rep.pipeline):
        _pipeline_terms(base, rep.pipeline, rep.collectives)
    if degrees["ep"] > 1 and len(rep.experts):
        e = rep.experts
        base.a2a_bytes = float(e["bytes_sent"].mean())
        base.a2a_calls = float(e["calls"].mean())
        c = rep.collectives
        a2a = c[c["op"] == "all_to_all"]
        base.a2a_exposed_ns = float(a2a["ns_per_step"].sum()) * (1 - float(
            (a2a["hidden"].fillna(0) * a2a["time_ns"]).sum() / max(a2a["time_ns"].sum(), 1)))
    return base


def _dtensor_compute(ev: pd.DataFrame, work: pd.DataFrame, n: int) -> tuple[float, float]:
    """(ns per step of the matrix products on local shards, ns per step of DTensor's own
    work): the products (``aten::addmm``, ``mm`` …) that ran inside a DTensor dispatch
    (``PythonSubclass``), and the rest of the compute operators around such dispatches (the
    optimizer's on DTensor parameters too) and of DTensor's wrappers (``Redistribute``,
    ``_FromTorchTensor`` …), less the communication waited for inside them."""
    from opprof.intervals import Nesting, lane_ids
    from opprof.walltime import container

    host = ev[step_work(ev) & on_host(ev)]
    names = host["name"].astype(str)
    lane = lane_ids(host["rank"].to_numpy(np.int64), host["pid"].to_numpy(np.int64),
                    host["tid"].to_numpy(np.int64))
    ts = host["ts"].to_numpy(np.int64)
    nesting = Nesting(lane, ts, ts + host["dur"].to_numpy(np.int64))
    sub = (names == "PythonSubclass").to_numpy()
    _, in_sub = nesting.nest(sub)
    product = names.str.fullmatch(r"aten::(?:addmm|mm|bmm|baddbmm|_addmm_activation)").to_numpy()
    inside = product & (in_sub >= 0)  # on the shards (the DTensor-level product is outside)
    _, outer = nesting.nest(inside)
    local = inside & (outer == np.arange(len(host)))
    local_ns = float(host["dur"].to_numpy(np.int64)[local].sum())
    compute = work[work["phase"].isin(["forward", "backward", "update"])]
    subs = host[sub]
    pos = container(subs[["rank", "pid", "tid", "ts", "dur"]],
                    compute[["rank", "pid", "tid", "ts", "dur"]])
    around = compute.iloc[np.unique(pos[pos >= 0])]
    wrappers = compute[compute["name"].astype(str).str.match(
        r"(?:autograd::engine::evaluate_function: )?(?:Nested)?Redistribute|_FromTorchTensor|"
        r"_ToTorchTensor")]
    wrappers = wrappers[~wrappers.index.isin(around.index)]
    # less the communication they waited in (wait_tensor inside an operator on a DTensor):
    # the collectives' own term
    comm = host[counted(host) & host["op"].isin(sorted(COMM_OPS))]
    outer = pd.concat([around, wrappers])[["rank", "pid", "tid", "ts", "dur"]]
    waited = comm[_within(comm, outer)]
    own = (float(around["dur"].sum()) - local_ns + float(wrappers["dur"].sum())
           - float(waited["dur"].sum()))
    return local_ns / n, max(own, 0.0) / n


def _within(inner: pd.DataFrame, outer: pd.DataFrame) -> pd.Series:
    """Which ``inner`` events lie inside one of ``outer`` on their lane."""
    from opprof.walltime import container

    outer = outer.sort_values(["rank", "pid", "tid", "ts"])
    pos = container(inner[["rank", "pid", "tid", "ts", "dur"]], outer)
    return pd.Series(pos >= 0, index=inner.index)


def _pipeline_terms(base: ParallelBase, pipe: pd.DataFrame, coll: pd.DataFrame) -> None:
    """The slowest stage's per-micro-batch forward, backward and transfer."""
    per_stage = pipe.groupby("stage").agg(f=("forward_ns_per_microbatch", "mean"),
                                          b=("backward_ns_per_microbatch", "mean"),
                                          m=("microbatches", "median"))
    total = per_stage["f"].fillna(0) + per_stage["b"].fillna(0)
    slow = per_stage.loc[total.idxmax()]
    base.microbatches = int(slow["m"])
    base.f_mb_ns, base.b_mb_ns = float(slow["f"] or 0), float(slow["b"] or 0)
    base.schedule = str(pipe["schedule"].iloc[0])
    p2p = coll[coll["op"].isin(["send", "recv"])] if len(coll) else coll
    transfer = float(p2p["transfer_ns"].sum()) if len(p2p) else 0.0
    calls = float(p2p["calls"].sum()) if len(p2p) else 0.0
    # one micro-batch's activation forward and gradient back: a send/recv pair each way
    base.x_mb_ns = 2 * transfer / calls if calls else 0.0


def network_for(base_trace: Trace, given: Network | None) -> Network:
    """The network of the prediction: the given one, else α–β fitted on the base's own
    collectives, else the assumed Ethernet."""
    if given is not None:
        return given
    from opprof.model.predict import network_from_trace

    fitted = network_from_trace(base_trace)
    return fitted if fitted is not None else assumed(Collective.ALLREDUCE)


def modelled(base: ParallelBase, net: Network, degrees: dict[str, int],
             microbatches: int) -> dict[str, float]:
    """The modelled terms (ns) of a step at ``degrees`` with ``microbatches``."""
    terms: dict[str, float] = {}
    t0, t = base.degrees["tp"], degrees.get("tp", base.degrees["tp"])
    if base.degrees["tp"] > 1 or t > 1:
        terms["tp_compute"] = base.sharded_ns * t0 / max(t, 1)
        terms["tp_dtensor"] = base.dtensor_ns if t > 1 else 0.0
        # the measured exposed time of the collectives, moved to t by the α–β model's ratio
        at_t0, at_t = _tp_cost(base, net, t0), _tp_cost(base, net, t)
        measured = float(base.tp_calls["ns_per_step"].sum()) * base.tp_exposed if len(
            base.tp_calls) else 0.0
        terms["tp_comm"] = measured * at_t / at_t0 if at_t0 > 0 else 0.0
    p0, p = base.degrees["pp"], degrees.get("pp", base.degrees["pp"])
    if base.microbatches and (p0 > 1 or p > 1):
        m0, m = base.microbatches, microbatches or base.microbatches
        scale = (p0 / max(p, 1)) * (m0 / max(m, 1))
        f, b = base.f_mb_ns * scale, base.b_mb_ns * scale
        x = base.x_mb_ns * m0 / max(m, 1) if p > 1 else 0.0
        terms["pp_pipeline"] = (m + p - 1) * (f + b + x)
        terms["pp_update"] = base.update_ns * p0 / max(p, 1)
    e0, e = base.degrees["ep"], degrees.get("ep", base.degrees["ep"])
    if base.a2a_calls and (e0 > 1 or e > 1):
        per_peer = base.a2a_bytes / max(e0 - 1, 1) / max(base.a2a_calls, 1)
        one = (float(net.alpha_ns) * (e - 1) + per_peer * (e - 1) * float(net.beta_ns_per_byte)
               if e > 1 else 0.0)
        terms["ep_all_to_all"] = one * base.a2a_calls
    return terms


def _tp_cost(base: ParallelBase, net: Network, t: int) -> float:
    """α–β time per step of the base's tensor-parallel collectives among ``t`` ranks."""
    if t <= 1 or base.tp_calls.empty:
        return 0.0
    total = 0.0
    for r in base.tp_calls.to_dict("records"):
        one = float(np.asarray(net.cost_ns(float(r["bytes_per_call"]), t)).reshape(-1)[0])
        total += (one / 2 if r["op"] in _RING_HALF else one) * float(r["calls_per_step"])
    return total


def predict_parallel(trace: Trace, dimension: str, degrees: list[int],
                     microbatches: int | None = None, network: Network | None = None,
                     label: str = "") -> ParallelResult:
    """The step of ``trace``'s job with its ``dimension`` at each of ``degrees`` (and, for
    ``pp``, ``microbatches`` micro-batches), calibrated to the measured step."""
    if dimension not in DIMENSIONS:
        raise OpprofError(f"--mode {dimension}: choose from {', '.join(DIMENSIONS)}")
    rep = build_report(trace)
    base = parallel_base(trace, label, rep)
    if base.degrees[dimension] < 2:
        raise OpprofError(f"{label or 'the trace'} ran no {dimension} (its layout: "
                          f"{base.mode}); record or run the job with {dimension} to model it")
    net = network_for(trace, network)
    at_base = modelled(base, net, base.degrees, base.microbatches)
    predictions = []
    for d in degrees:
        target = {**base.degrees, dimension: d}
        m = microbatches or base.microbatches
        new = modelled(base, net, target, m)
        step = base.step_ns + sum(new.values()) - sum(at_base.values())
        predictions.append(ParallelPrediction(target, m, max(step, 0.0), new))
    notes = []
    if dimension == "ep":
        notes.append("ep: the experts' compute per rank is taken as unchanged (tokens "
                     "per rank kept); only the all-to-all changes")
    return ParallelResult(base, net, dimension, predictions, notes=notes)


def with_parallel_check(result: ParallelResult, check: ParallelCheck) -> ParallelResult:
    """``result`` with its check against a measured run."""
    return replace(result, check=check)


def check_parallel(result: ParallelResult, measured: Trace, label: str = "measured"
                   ) -> ParallelCheck:
    """The prediction for ``measured``'s layout beside its mean step (a prediction is made
    when none of the result's matches it)."""
    steps = build_report(measured).steps
    if steps.empty:
        raise OpprofError("no profiled steps to check against", path=label)
    par = measured.meta.get("parallelism") or {}
    dim = result.dimension
    degree = int((par.get(dim) or {}).get("degree") or 1)
    m = int(measured.meta.get("microbatches") or 0) or _measured_microbatches(measured) or (
        1 if dim == "pp" and degree == 1 else result.base.microbatches)
    net, base = result.network, result.base
    target = {**base.degrees, dim: degree}
    at_base = modelled(base, net, base.degrees, base.microbatches)
    new = modelled(base, net, target, m)
    predicted = base.step_ns + sum(new.values()) - sum(at_base.values())
    return ParallelCheck(label, target, m, max(predicted, 0.0), float(steps["dur_ns"].mean()))


def _measured_microbatches(trace: Trace) -> int:
    """The micro-batches of a measured pipeline (0: none)."""
    pipe = build_report(trace).pipeline
    return int(pipe["microbatches"].median()) if len(pipe) else 0


def rows(result: ParallelResult) -> list[dict[str, Any]]:
    """The predictions as table rows (what the renderers show)."""
    out = []
    for p in result.predictions:
        out.append({"degree": p.degrees[result.dimension], "microbatches": p.microbatches,
                    "step_ns": p.step_ns,
                    "speedup": result.base.step_ns / p.step_ns if p.step_ns else None,
                    **p.terms})
    return out
