"""The step of a tensor- or pipeline-parallel job predicted from a one-worker trace of the same
model and batch, and checked against a measured run (`opprof model BASE --mode tp|pp`).

Every term starts from the base's *typical* operators (:mod:`opprof.model.baseops`) and the
prediction moves the base's measured mean step by what changes, so at degree 1 (and one
micro-batch) it *is* the measured step, and the terms sum to the step.

**Tensor parallel at degree t** (:mod:`opprof.model.tpsplit` says which operators the plan
shards and what DTensor costs):

- replicated operators and the time between operators: as measured;
- sharded operators (the pairs' windows, forward and backward): each keeps ``1/t`` of its
  work, ``fixed + (d − fixed)/t``; the optimizer's variable part shrinks by the sharded
  parameters' share;
- DTensor's own work (``t > 1``): per sharded pair its measured forward and backward cost,
  per optimizer call on a DTensor parameter its measured cost (the base's optimizer calls per
  parameter × the sharded layers' parameters);
- the collectives (``t > 1``): per pair one all-reduce of the activation in the forward and
  one in the backward, each blocking: the network's cost of it among ``t`` ranks (``opprof
  calibrate``'s measured curve, α–β beyond it) and the wait for the slowest of the ``t`` ranks
  at it: E[max of t normals] × σ of the stretch of the step before it, over the base's steps
  (:meth:`BaseOps.segment_sigmas`);
- co-location: the ``t`` ranks compute the same at the same time on the base's host (or
  ``--workers-per-host``): their compute × (1 + s) (:mod:`opprof.model.colocation`, the same
  curve and placement as the data-parallel model), shown as ``t_coloc``.

**Pipeline parallel with p stages and m micro-batches** (:mod:`opprof.model.ppsplit`):
each stage's per-micro-batch forward and backward are its operators keeping ``1/m`` of their
work plus its share of the time between operators (by its operators), its optimizer its share
of the base's; each activation and gradient costs calibrate's pipeline hand-off (a
two-stage pipeline's transfers timed while both ranks compute: :mod:`opprof.model.instep`),
else its send/recv after a burst, else the network's α + n·β; the schedule (GPipe or 1F1B) is
simulated over several steps and the step is its period — what a stage spends waiting is its
comm: the bubble (the wait were hand-offs free) and what the transfers add to it.
Co-location slows a stage's compute by s × the share of it that another stage computes beside
it (from a first simulation), then the schedule is simulated again.

The result's terms are the wall-time phases (``t_io`` … ``other``, as the measured breakdown
has them) with ``t_coloc`` taken out of ``t_f``, ``t_b``, ``t_u``; ``parts`` name the model's
pieces (sharded, DTensor, all-reduce, wait; per-stage times, bubble, transfers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import step_breakdown
from opprof.analysis.report import build_report
from opprof.errors import OpprofError
from opprof.kinds import Collective, Mode
from opprof.model.baseops import BaseOps, base_ops, scaled_ns
from opprof.model.colocation import Colocation, Placement, per_host, placement, spread_over
from opprof.model.commmodel import Network, assumed
from opprof.model.instep import in_step_of, pipeline_handoff
from opprof.model.ppsplit import (
    SCHEDULES,
    Stages,
    StageTimes,
    ideal_bubble_share,
    pp_stages,
    simulate,
    stage_table,
)
from opprof.model.predict import (
    ColocationCheck,
    Spread,
    baseline,
    colocation_scale,
    resource_fix,
    spread,
)
from opprof.model.resources import resource_mismatch, resources
from opprof.model.sharded import optimizer_calls
from opprof.model.step import expected_max_normal
from opprof.model.terms import TERMS, terms_from_steps
from opprof.model.tpsplit import TpPlan, dtensor_cost, tp_plan
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject
    from opprof.model.predict import Baseline

DIMENSIONS = ("tp", "pp")
_COMPUTE = {"t_f": "forward", "t_b": "backward", "t_u": "update"}


@dataclass
class SplitPrediction:
    """The step at one degree (and micro-batch count): its terms (they sum to the step), the
    model's pieces and the co-location applied."""

    degree: int
    microbatches: int
    schedule: str
    step_ns: float
    terms: dict[str, float]
    parts: dict[str, float]
    speedup: float
    colocation: Colocation
    stages: pd.DataFrame | None = None

    def to_dict(self) -> JSONObject:
        """JSON form."""
        out: JSONObject = {"degree": self.degree, "microbatches": self.microbatches,
                           "schedule": self.schedule, "step_ns": self.step_ns,
                           "speedup": self.speedup, "terms": dict(self.terms),
                           "parts": dict(self.parts), "colocation": self.colocation.to_dict()}
        if self.stages is not None:
            out["stages"] = self.stages.to_dict("records")
        return out


@dataclass
class SplitCheck:
    """A prediction beside the measured run of its layout, term by term."""

    label: str
    degree: int
    microbatches: int
    schedule: str
    predicted_ns: float
    measured_ns: float
    terms: pd.DataFrame  # term, predicted_ns, measured_ns, error_ns, error
    spread: Spread
    colocation: ColocationCheck
    #: the host's noise (:attr:`BaseOps.noise`) in the base and, the mean over its ranks, in
    #: the measured run: a check across runs whose noise differs measures the host too
    noise: dict[str, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted_ns - self.measured_ns) / self.measured_ns

    def to_dict(self) -> JSONObject:
        """JSON form (the keys of the data-parallel check, and the layout)."""
        return {"label": self.label, "degree": self.degree, "microbatches": self.microbatches,
                "schedule": self.schedule, "predicted_ns": self.predicted_ns,
                "measured_ns": self.measured_ns, "error": self.error,
                "terms": [{k: (None if k == "error" and not _finite(v) else v)
                           for k, v in r.items()} for r in self.terms.to_dict("records")],
                "spread": self.spread.to_dict(), "colocation": self.colocation.to_dict(),
                "noise": {k: (v if _finite(v) else None) for k, v in self.noise.items()}}


def _finite(x: object) -> bool:
    """A finite number (JSON has no NaN or infinity)."""
    return isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(frozen=True)
class SplitResult:
    """`opprof model`'s answer for a one-worker base and a model-parallel dimension."""

    label: str
    dimension: str
    base: BaseOps
    meta: dict[str, Any]
    network: Network
    network_note: str
    plan: str
    predictions: list[SplitPrediction]
    check: SplitCheck | None = None
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model: _Model | None = field(default=None, repr=False)

    def to_dict(self) -> JSONObject:
        """JSON form."""
        b = self.base
        return {"base": {"label": self.label, "mode": "single", "workers": 1,
                         "model": self.meta.get("model"),
                         "batch_size": self.meta.get("batch_size"), "step_ns": b.step_ns,
                         "steps": b.steps, "call_ns": b.call_ns,
                         "terms": {t: b.mean_phase_ns[p] for t, p in _TERM_PHASE.items()}},
                "dimension": self.dimension, "from": "one worker", "plan": self.plan,
                "network": {"alpha_ns": self.network.alpha_ns,
                            "beta_ns_per_byte": self.network.beta_ns_per_byte,
                            "source": self.network.source, "note": self.network_note},
                "predictions": [p.to_dict() for p in self.predictions],
                "check": self.check.to_dict() if self.check else None,
                "assumptions": self.assumptions, "notes": self.notes}


#: a term under this share of the measured step is negligible: no relative error
_NEGLIGIBLE = 1e-4

_TERM_PHASE = {"t_io": "load", "t_h2d": "h2d", "t_f": "forward", "t_b": "backward",
               "t_u": "update", "t_comm": "comm", "other": "other"}


@dataclass
class _Model:
    """What one prediction needs besides the degree."""

    base: BaseOps
    dp: Baseline
    network: Network
    dimension: str
    tp: TpPlan | None
    calls_per_param: float
    params: float
    param_tensors: float
    workers_per_host: int | None
    notes: list[str]
    meta: Any = None
    #: one in-place arithmetic call on a parameter's gradient (ns): the optimizer's median
    #: ``aten::mul_`` / ``div_`` (else ``add_``) in the base
    grad_op_ns: float = 0.0


def _grad_op_ns(trace: Trace) -> float:
    """The base optimizer's median in-place call on one tensor (:attr:`_Model.grad_op_ns`):
    what torch's pipeline schedule pays per parameter to scale its gradients."""
    ev = trace.events
    upd = ev[(ev["phase"].astype(str) == "update").to_numpy()
             & (ev["kind"].astype(str) == "cpu_op").to_numpy()]
    names = upd["name"].astype(str)
    for pattern in (r"aten::(?:mul|div)_", r"aten::add_"):
        hit = upd["dur"][names.str.fullmatch(pattern).to_numpy()]
        if len(hit):
            return float(hit.median())
    return 0.0


def network_for(given: Network | None) -> tuple[Network, str]:
    """The network of the prediction (an all-reduce's α–β: ``opprof calibrate --fw torch``),
    else the assumed Ethernet, and a sentence saying which."""
    if given is None:
        return assumed(Collective.ALLREDUCE), (
            "assumed 10 Gb/s Ethernet (α = 25 µs, β = 0.8 ns/B): a one-worker trace holds no "
            "collective to fit; measure yours with `opprof calibrate --fw torch --workers N`")
    if given.collective != Collective.ALLREDUCE:
        raise OpprofError(f"the network file measured {given.collective}; tensor and pipeline "
                          "parallel need an all-reduce's (`opprof calibrate --fw torch "
                          "--workers N`)")
    instep = ("; each TP all-reduce and PP send/recv at its in-step cost (calibrate's calls "
              "after a compute burst)" if in_step_of(given, "all_reduce") is not None else
              "; no in-step calls in this file (calibrate again to price TP/PP collectives "
              "as a step makes them): α–β")
    return given, (f"{given.source or 'given'}: {given.backend or 'all-reduce'} measured with "
                   f"{given.workers} workers{instep}")


def _model(trace: Trace, dimension: str, network: Network, label: str,
           workers_per_host: int | None) -> _Model:
    base = base_ops(trace, label)
    dp = baseline(trace, label)
    upd = base.of("update")
    bwd = base.of("backward")
    tensors = float(bwd["name"].str.contains("AccumulateGrad").sum()) or 1.0
    calls = optimizer_calls(trace)
    params = float(trace.meta.get("params") or 0.0)
    plan = tp_plan(base, trace.meta) if dimension == "tp" else None
    notes = list(base.notes)
    if plan is not None:
        notes += plan.notes
    if dimension == "tp" and not len(upd):
        notes.append("no optimizer step in the trace: the update is taken as unchanged")
    return _Model(base, dp, network, dimension, plan, calls / tensors, params, tensors,
                  workers_per_host, notes, trace.meta,
                  _grad_op_ns(trace) if dimension == "pp" else 0.0)


def _place(m: _Model, workers: int) -> Placement:
    """Where ``workers`` ranks compute: ``--workers-per-host``, else the base's hosts."""
    if m.workers_per_host:
        return per_host(workers, m.workers_per_host)
    hosts = m.dp.placement.hosts if m.dp.placement.hosts else 1
    return spread_over(workers, 0, hosts, "one host, the base's" if hosts == 1
                       else "the base's hosts")


def _coloc(m: _Model, workers: int, place: Placement | None, on: bool) -> tuple[float, float,
                                                                            Colocation]:
    """(relative slowdown of the ranks' compute, the wait for the most crowded host, the
    co-location) — :func:`opprof.model.predict.colocation_scale`, the data-parallel hook, for
    ``workers`` synchronous ranks."""
    place = place or _place(m, workers)
    cs = colocation_scale(m.dp, m.network, Mode.ALLREDUCE, workers, 0, place, on)
    return cs.relative, cs.wait_ns, cs.colocation


# --------------------------------------------------------------------------- tensor parallel


def _tp(m: _Model, t: int, place: Placement | None = None,
        on: bool = True) -> tuple[dict[str, float], dict[str, float], Colocation,
                                  dict[str, float]]:
    """Typical compute per phase at degree ``t`` (co-location not applied), the exposed
    communication and the compute's slowdown, the co-location, the pieces."""
    assert m.tp is not None
    base, plan = m.base, m.tp
    cost = dtensor_cost(plan.activation_ndim)
    comp: dict[str, float] = {}
    parts: dict[str, float] = {}
    for phase, mask in (("forward", plan.forward), ("backward", plan.backward)):
        ops = base.of(phase)
        sharded = scaled_ns(ops[mask], 1.0 / t)
        rest = float(ops["dur_ns"].to_numpy()[~mask].sum()) + base.gap_ns(phase)
        extra = plan.pairs * (cost.forward_ns if phase == "forward" else cost.backward_ns) \
            if t > 1 else 0.0
        comp[phase] = rest + sharded + extra
        parts[f"{phase}_sharded_ns"] = sharded
        parts[f"{phase}_replicated_ns"] = rest
        parts[f"{phase}_dtensor_ns"] = extra
    upd = base.of("update")
    share = (plan.sharded_params / m.params) if m.params else (
        plan.dtensor_params / m.param_tensors)
    share = min(max(share, 0.0), 1.0)
    fixed = float(upd["fixed_ns"].sum())
    var = float(upd["dur_ns"].sum()) - fixed
    dt_upd = plan.dtensor_params * m.calls_per_param * cost.update_call_ns if t > 1 else 0.0
    comp["update"] = fixed + var * (1.0 - share + share / t) + base.gap_ns("update") + dt_upd
    parts["update_dtensor_ns"] = dt_upd
    # the collectives: blocking all-reduces, each after its segment of the step
    comm, wait = 0.0, 0.0
    instep = in_step_of(m.network, "all_reduce")
    if t > 1 and plan.pairs and instep is not None:
        # calibrate's in-step calls: each after the compute between two of the step's
        # collectives (their mean: the wait is linear in it), the wait for the last rank
        # measured with the rest of the call
        calls = 2 * len(plan.activation_bytes)
        burst = (sum(comp.values()) + base.phase_ns["load"] + base.phase_ns["h2d"]
                 + base.phase_ns["other"]) / max(calls, 1)
        for nbytes in plan.activation_bytes:
            comm += 2.0 * instep.after_ns(float(nbytes), t)
        wait = calls * instep.wait(burst, t)
        parts["burst_ns"] = burst
    elif t > 1 and plan.pairs:
        for nbytes in plan.activation_bytes:
            comm += 2.0 * float(np.asarray(m.network.cost_ns(float(nbytes), t)).reshape(-1)[0])
        cuts = [("forward", c) for c in plan.forward_cuts] + [
            ("backward", c) for c in plan.backward_cuts]
        wait = expected_max_normal(t) * float(base.segment_sigmas(cuts).sum())
    parts["allreduce_ns"] = comm
    parts["wait_ns"] = wait
    rel, cwait, coloc = _coloc(m, t, place, on)
    parts["colocation_wait_ns"] = cwait if t > 1 else 0.0
    return comp, {"comm": comm + wait + parts["colocation_wait_ns"], "slowdown": rel}, coloc, \
        parts


def _predict_tp(m: _Model, t: int, place: Placement | None = None,
                on: bool = True) -> SplitPrediction:
    one, _, _, _ = _tp(m, 1)
    comp, x, coloc, parts = _tp(m, t, place, on)
    return _assemble(m, t, 1, "", comp, one, x["comm"], x["slowdown"], coloc, parts, None)


# --------------------------------------------------------------------------- pipeline parallel


def _stage_times(m: _Model, stages: Stages, micro: int) -> list[StageTimes]:
    base = m.base
    out = []
    before = base.phase_ns["load"] + base.phase_ns["h2d"] + base.phase_ns["other"]
    # the optimizer's operators split by the stage's parameters; the time between them (the
    # training loop's own Python) each stage runs whole
    upd = float(base.of("update")["dur_ns"].sum())
    upd_gap = base.gap_ns("update")
    for s in range(stages.p):
        per = {}
        for phase, where in (("forward", stages.forward), ("backward", stages.backward)):
            ops = base.of(phase)
            mine = where == s
            share_ops = mine.sum() / max(len(ops), 1)
            per[phase] = scaled_ns(ops[mine], 1.0 / micro) + base.gap_ns(phase) * share_ops
        # torch's pipeline schedule scales every gradient of the stage by 1/m before the
        # optimizer (``PipelineStage.scale_grads``): one in-place call per parameter tensor
        scale = m.grad_op_ns * m.param_tensors * float(stages.update_share[s]) \
            if micro > 1 else 0.0
        out.append(StageTimes(per["forward"] * base.noise, per["backward"] * base.noise,
                              (upd * float(stages.update_share[s]) + upd_gap + scale)
                              * base.noise,
                              before))
    return out


def _p2p_ns(net: Network, nbytes: float) -> float:
    """One point-to-point transfer of ``nbytes``: half a 2-rank ring all-reduce of twice the
    bytes — α + n·β on the all-reduce's line (its two messages of n each way), and where the
    network holds measured sizes, half what the all-reduce of 2n measured (handing the
    message to the backend's thread and waking the receiver included)."""
    return float(np.asarray(net.cost_ns(2.0 * float(nbytes), 2)).reshape(-1)[0]) / 2.0


def _transfers(m: _Model, stages: Stages, times: list[StageTimes], micro: int
               ) -> tuple[list[float], float]:
    """Each cut's cost of one micro-batch's activation or gradient, and the actions' jitter
    (:func:`simulate`): calibrate's pipeline hand-off where the network has one (its bytes
    moved by the p2p calls' cost per byte; no jitter: the hand-off was fitted to a real
    pipeline's period, its stages' drift in it); else its in-step send/recv — what one costs
    after both ranks are in it, and how far two ranks doing the same work drift apart (their
    mean wait at the call, E[max of 2 normals] × σ: σ over one action's mean compute); else
    half a 2-rank all-reduce of twice the bytes (:func:`_p2p_ns`)."""
    instep = in_step_of(m.network, "p2p")
    hand = pipeline_handoff(m.network)
    burst = float(np.mean([(t.forward + t.backward) / 2.0 for t in times]))
    if hand is not None and stages.p > 1:
        per_byte = instep.line[1] if instep is not None and instep.line is not None else 0.0
        return [max(hand.ns + per_byte * (n / micro - hand.bytes), 0.0)
                for n in stages.boundary_bytes], 0.0
    x = [instep.after_ns(n / micro, 2) if instep is not None else
         _p2p_ns(m.network, n / micro) for n in stages.boundary_bytes]
    jitter = (instep.wait(burst, 2) / expected_max_normal(2) / burst
              if instep is not None and stages.p > 1 and burst > 0 else 0.0)
    return x, jitter


def _pp(m: _Model, p: int, micro: int, schedule: str, place: Placement | None = None,
        on: bool = True) -> tuple[float, dict[str, float], dict[str, float], Colocation,
                                  pd.DataFrame]:
    """(the period, the stages' mean compute per phase with co-location, the pieces, the
    co-location, the stage table)."""
    stages = pp_stages(m.base, m.meta, p)
    times = _stage_times(m, stages, micro)
    x, jitter = _transfers(m, stages, times, micro)
    sim = simulate(times, micro, x, x, schedule, jitter=jitter)
    rel, cwait, coloc = _coloc(m, p, place, on)
    slow = max(rel, 0.0)
    if p > 1 and slow > 0:
        scaled = [StageTimes(tm.forward * (1 + slow * o), tm.backward * (1 + slow * o),
                             tm.update * (1 + slow * o), tm.before)
                  for tm, o in zip(times, sim.overlap, strict=True)]
        sim2 = simulate(scaled, micro, x, x, schedule, jitter=jitter)
    else:
        scaled, sim2 = times, sim
    comp = {"forward": float(np.mean([micro * t.forward for t in scaled])),
            "backward": float(np.mean([micro * t.backward for t in scaled])),
            "update": float(np.mean([t.update for t in scaled]))}
    alone = {"forward": float(np.mean([micro * t.forward for t in times])),
             "backward": float(np.mean([micro * t.backward for t in times])),
             "update": float(np.mean([t.update for t in times]))}
    # the bubble: what the schedule waits with free hand-offs; the transfers: what the
    # hand-offs add to that wait (a transfer made while the stage still computes adds none)
    free = simulate(scaled, micro, [0.0] * len(x), [0.0] * len(x), schedule, jitter=jitter)
    added = np.clip(sim2.comm - free.comm, 0.0, sim2.comm)
    parts = {"bubble_ns": float(np.mean(sim2.comm - added)),
             "transfer_ns": float(np.mean(added)),
             "ideal_bubble_share": ideal_bubble_share(p, micro),
             "colocation_wait_ns": 0.0, "jitter": jitter,
             **{f"alone_{k}_ns": v for k, v in alone.items()}}
    del cwait  # the stages' compute is slowed where they overlap, in the simulation
    table = stage_table(stages, scaled).assign(
        comm_ns=sim2.comm, transfer_ns=added, overlap=sim2.overlap)
    return sim2.step_ns, comp, parts, coloc, table


def _predict_pp(m: _Model, p: int, micro: int, schedule: str, place: Placement | None = None,
                on: bool = True) -> SplitPrediction:
    period1, one, _, _, _ = _pp(m, 1, 1, schedule)
    period, comp, parts, coloc, table = _pp(m, p, micro, schedule, place, on)
    base = m.base
    step = base.step_ns + (period - period1)
    terms = {t: base.mean_phase_ns[ph] for t, ph in _TERM_PHASE.items()}
    alone = {ph: parts[f"alone_{ph}_ns"] for ph in ("forward", "backward", "update")}
    for t, ph in _COMPUTE.items():
        terms[t] += alone[ph] - one[ph]
    coloc_ns = sum(comp[ph] - alone[ph] for ph in alone)
    terms["t_comm"] = parts["bubble_ns"] + parts["transfer_ns"]
    terms["t_coloc"] = coloc_ns
    # the simulated step, less what the terms hold, is the next step's load overlapping
    # (a stage's load while its neighbour still works): kept in the step as the period says
    terms["other"] += step - sum(terms.values())
    single = base.step_ns
    return SplitPrediction(p, micro, schedule, step, terms,
                           {k: v for k, v in parts.items() if not k.startswith("alone_")},
                           single / step if step else math.nan, coloc, table)


# --------------------------------------------------------------------------- shared


def _assemble(m: _Model, degree: int, micro: int, schedule: str, comp: dict[str, float],
              one: dict[str, float], comm: float, slowdown: float, coloc: Colocation,
              parts: dict[str, float], table: pd.DataFrame | None) -> SplitPrediction:
    """Terms from the base's mean phases moved by the modelled compute's change, the
    exposed communication and the co-location (``slowdown`` of the compute)."""
    base = m.base
    terms = {t: base.mean_phase_ns[ph] for t, ph in _TERM_PHASE.items()}
    lost = 0.0
    for t, ph in _COMPUTE.items():
        terms[t] = max(0.0, terms[t] + base.noise * (comp[ph] - one[ph]))
        lost += terms[t] * max(slowdown, 0.0)
    terms["t_comm"] += comm
    terms["t_coloc"] = lost if degree > 1 else 0.0
    step = sum(terms.values())
    return SplitPrediction(degree, micro, schedule, step, terms, parts,
                           base.step_ns / step if step else math.nan, coloc, table)


def predict_from_single(trace: Trace, dimension: str, degrees: list[int],
                        microbatches: int | None = None, network: Network | None = None,
                        label: str = "", schedule: str | None = None,
                        workers_per_host: int | None = None) -> SplitResult:
    """The step of ``trace``'s model and batch with its ``dimension`` split over each of
    ``degrees`` ranks (``pp``: ``microbatches`` micro-batches, ``schedule``)."""
    if dimension not in DIMENSIONS:
        raise OpprofError(f"--mode {dimension} from a one-worker trace: choose tp or pp "
                          "(expert parallel needs a trace that routes tokens to experts)")
    if schedule is not None and schedule not in SCHEDULES:
        raise OpprofError(f"--schedule {schedule}: choose {', '.join(SCHEDULES)}")
    fw = str(getattr(trace.meta.get("framework"), "value", trace.meta.get("framework")) or "")
    if fw and fw != "torch":
        raise OpprofError(f"{label or 'the trace'} is a {fw} run: --mode {dimension} from one "
                          "worker splits a torch model (DTensor's tensor parallel, "
                          "torch.distributed.pipelining's stages)")
    net, note = network_for(network)
    m = _model(trace, dimension, net, label, workers_per_host)
    batch = int(trace.meta.get("batch_size") or 0)
    micro = microbatches or _default_microbatches(batch)
    sched = schedule or "gpipe"
    meta = {k: trace.meta.get(k) for k in ("framework", "model", "batch_size", "threads",
                                           "device")}
    predictions = [_predict_tp(m, d) if dimension == "tp" else _predict_pp(m, d, micro, sched)
                   for d in degrees]
    plan = (m.tp.source if m.tp is not None else
            pp_stages(m.base, trace.meta, max(max(degrees), 2)).source)
    return SplitResult(label, dimension, m.base, meta, net, note, plan, predictions,
                       assumptions=_assumptions(m, dimension, micro, sched), notes=m.notes,
                       model=m)


def with_split_check(result: SplitResult, check: SplitCheck) -> SplitResult:
    """``result`` with its check against a measured run."""
    return replace(result, check=check)


def _default_microbatches(batch: int) -> int:
    """`opprof record --mode pp`'s: 4 when the batch divides so, else 2 (1 without a batch)."""
    if batch <= 1:
        return 1
    return 4 if batch % 4 == 0 else 2


def _assumptions(m: _Model, dimension: str, micro: int, schedule: str) -> list[str]:
    from opprof.model.baseops import FIXED_CALLS

    out = [f"an operator keeping a share φ of its work takes fixed + (d − fixed)·φ, fixed = "
           f"{FIXED_CALLS:g} × its nested calls × {m.base.call_ns / 1e3:.2f} µs (the trace's "
           "median aten::view); the time between operators stays"]
    if dimension == "tp" and m.tp is not None:
        cost = dtensor_cost(m.tp.activation_ndim)
        out.append(f"plan: {m.tp.source}")
        out.append(f"DTensor's own time per sharded pair {cost.forward_ns / 1e3:,.0f} µs "
                   f"forward, {cost.backward_ns / 1e3:,.0f} µs backward, "
                   f"{cost.update_call_ns / 1e3:,.1f} µs per optimizer call on a DTensor "
                   f"parameter ({m.tp.activation_ndim}-D activations; measured on "
                   f"{cost.source})")
    else:
        hand = pipeline_handoff(m.network)
        how = (f"calibrate's pipeline hand-off, {hand.ns / 1e6:.2f} ms at {hand.bytes:,} B "
               "(a two-stage pipeline's transfers made while both ranks compute)"
               if hand is not None else
               "calibrate's send/recv after a compute burst, and the ranks' drift"
               if in_step_of(m.network, "p2p") is not None else
               "half a 2-rank all-reduce of twice its bytes (α + n·β, the measured curve "
               "where the network has one)")
        out.append(f"{schedule}, {micro} micro-batch(es); each activation or gradient "
                   f"between stages costs {how}")
    return out


# --------------------------------------------------------------------------- the check


def check_from_single(result: SplitResult, measured: Trace,
                      label: str = "measured") -> SplitCheck:
    """The prediction for ``measured``'s layout (its degree of the dimension, micro-batches
    and schedule, its hosts) beside its terms, with the noise verdict and what co-location
    explains."""
    m = result.model
    if m is None:
        raise OpprofError("no model to check")
    meta = measured.meta
    dim = result.dimension
    par = meta.get("parallelism") or {}
    degree = int((par.get(dim) or {}).get("degree") or 0) or int(meta.get("workers") or 1)
    for key in ("framework", "model", "batch_size"):
        a, b = result.meta.get(key), meta.get(key)
        if a is not None and b is not None and str(a) != str(b):
            raise OpprofError(f"{label} has {key} {b}, the modelled trace {a}: a prediction "
                              "holds for the same framework, model and batch")
    a, b = result.meta.get("model"), meta.get("model")
    if (a is None) != (b is None):
        raise OpprofError(f"{label} is " + (f"a run of the built-in {b}, the modelled trace a "
                                            "user's script" if b is not None else
                                            f"a user's script, the modelled trace the built-in "
                                            f"{a}") + ": a prediction holds for the same model "
                          "and batch")
    mode = str(meta.get("mode") or "")
    if mode and dim not in mode.split("+"):
        raise OpprofError(f"{label} ran --mode {mode}; the prediction is for {dim}")
    # the same refusal as the data-parallel check: a 2-thread base cannot predict workers
    # sharing its host with one thread each
    mine, target = resources(m.meta), resources(meta)
    why = resource_mismatch(mine, target)
    if why:
        workers = int(meta.get("workers") or degree)
        raise OpprofError(f"{label}'s workers had other resources than the modelled trace's "
                          f"({why}); a prediction holds only for the same per-worker "
                          f"resources — {resource_fix(mine, target, workers)}")
    place = placement(meta, int(meta.get("workers") or degree))
    steps = step_breakdown(measured)
    if steps.empty:
        raise OpprofError("no profiled steps to check against", path=label)
    if dim == "tp":
        pred = _predict_tp(m, degree, place)
        without = _predict_tp(m, degree, place, on=False)
        micro, sched = 1, ""
    else:
        pipe = build_report(measured).pipeline
        micro = int(pipe["microbatches"].median()) if len(pipe) else \
            _default_microbatches(int(meta.get("batch_size") or 0))
        sched = str(pipe["schedule"].iloc[0]) if len(pipe) else "gpipe"
        sched = sched if sched in SCHEDULES else "gpipe"
        pred = _predict_pp(m, degree, micro, sched, place)
        without = _predict_pp(m, degree, micro, sched, place, on=False)
    mt = terms_from_steps(steps)
    meas = dict(mt.mean())
    slowed = list(_COMPUTE)
    alone = sum(pred.terms[t] for t in slowed)
    computed = sum(meas[t] for t in slowed)
    meas["t_coloc"] = computed - alone if computed > 0 else 0.0
    for t in slowed:
        meas[t] = meas[t] * alone / computed if computed > 0 else meas[t]
    rows = []
    step_m = mt.step_ns
    for t in (*TERMS, "t_coloc"):
        p, v = pred.terms.get(t, 0.0), meas.get(t, 0.0)
        # a term the measured run spent (next to) nothing on has no relative error
        negligible = abs(v) < _NEGLIGIBLE * step_m
        rows.append({"term": t, "predicted_ns": p, "measured_ns": v, "error_ns": p - v,
                     "error": (p - v) / v if not negligible else (
                         0.0 if abs(p) < _NEGLIGIBLE * step_m else math.nan)})
    rows.append({"term": "step", "predicted_ns": pred.step_ns, "measured_ns": step_m,
                 "error_ns": pred.step_ns - step_m, "error": (pred.step_ns - step_m) / step_m})
    err = (pred.step_ns - step_m) / step_m
    coloc = ColocationCheck(pred.terms["t_coloc"], meas["t_coloc"], without.step_ns,
                            (without.step_ns - step_m) / step_m, err, pred.colocation)
    noise = []
    for r in sorted(steps["rank"].unique()):
        try:
            noise.append(base_ops(measured, label, int(r)).noise)
        except OpprofError:
            continue
    return SplitCheck(label, degree, micro, sched, pred.step_ns, step_m, pd.DataFrame(rows),
                      spread(mt.per_step["dur_ns"].to_numpy(np.float64), pred.step_ns), coloc,
                      {"base": m.base.noise,
                       "measured": float(np.mean(noise)) if noise else math.nan})
