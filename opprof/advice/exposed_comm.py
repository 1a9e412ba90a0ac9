"""Exposed communication: the step waits for collectives that no compute runs beside (the
``comm`` phase). Evidence: the exposed time, the collectives behind it (wait for other ranks
vs transfer), the parallel layout, the gradient bytes. Actions by layout: DistributedDataParallel
— another bucket size (smaller buckets start all-reducing earlier in backward), gradient
accumulation (``no_sync``: one all-reduce per several batches); FSDP — keep the parameters
gathered after forward (``reshard_after_forward=False``: no all-gather again in backward) and
prefetch; a parameter server — more servers; pipeline stages waiting in send/recv — more
micro-batches. Saving: the phase model with the knob turned (:mod:`opprof.analysis.knobs`),
the graph replay for FSDP's all-gathers; the time spent waiting for a slower rank is the
straggler rule's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opprof.advice.base import Advice, Knob
from opprof.analysis.knobs import (
    Predicted,
    accumulated,
    buckets,
    comm_hidden,
    more_servers,
    op_scaled,
)
from opprof.kinds import PS_MODES, Mode

if TYPE_CHECKING:
    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "exposed-communication"
NEEDS: tuple[str, ...] = ()
MiB = 1 << 20
#: DDP bucket caps tried (MiB).
BUCKETS_MB = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100)


def advise(ev: Evidence) -> list[Advice]:
    """The exposed-communication advice (see the module docstring)."""
    comm, step = ev.phase_ns("comm"), ev.step_ns
    if comm <= 0 or step <= 0:
        return []
    kinds = ev.report.collective_kinds
    by_op = ({str(r["op"]): float(r["comm_ns"]) for r in kinds.to_dict("records")}
             if len(kinds) else {})
    wait = ev.wait_ns
    evidence: JSONObject = {"comm_ns_per_step": comm, "comm_share": comm / step,
                      "collectives_ns_per_step": by_op, "waiting_ns_per_step": wait,
                      "transfer_ns_per_step": comm - wait,
                      "mode": ev.mode, "workers": ev.context.base.workers}
    finding = (f"exposed communication: the step waits {comm / 1e6:,.1f} ms for collectives "
               f"nothing runs beside ({comm / step:.0%} of the step)")
    if wait > 0:
        finding += (f"; {wait / 1e6:,.1f} ms of it is waiting for a slower rank, which no "
                    "change to the collectives removes")
    mode = ev.mode
    if ev.pipeline_job:
        if ev.pipeline is not None:
            return []  # the pipeline rule measures the bubble itself
        return [_pipeline_waits(ev, finding, evidence, step)]
    if mode == Mode.FSDP:
        return [_fsdp(ev, finding, evidence, step)]
    if mode in PS_MODES:
        return [_servers(ev, finding, evidence, step)]
    return [_allreduce(ev, finding, evidence, step)]


def _advice(ev: Evidence, finding: str, action: str, pred: Predicted, confidence: str,
            evidence: JSONObject, knob: Knob | None = None) -> Advice:
    return Advice(NAME, finding, action, pred.saving_ns, pred.saving_ns / ev.step_ns,
                  confidence, evidence, pred.how, knob)


def _allreduce(ev: Evidence, finding: str, evidence: JSONObject, step: float) -> Advice:
    ctx = ev.context
    total = int(ctx.base.gradients.total_bytes)
    evidence["gradient_bytes"] = total
    options: list[tuple[Predicted, str, Knob | None]] = []
    if total > 0 and ev.framework == "torch":
        wait = ev.wait_ns
        cands = [(mb, buckets(ctx, int(mb * MiB), wait)) for mb in BUCKETS_MB
                 if mb * MiB < 2 * total]
        mb, best = max(cands, key=lambda c: c[1].saving_ns)
        options.append((best, f"DistributedDataParallel(..., bucket_cap_mb={mb:g}) so the "
                              "gradients' all-reduce starts earlier in backward (now "
                              "1 MiB first, then 25 MiB buckets)",
                        Knob("--bucket-mb", "bucket_mb", mb)))
    for k in (2, 4):
        pred = accumulated(ctx, k, ev.wait_ns)
        options.append((pred, f"accumulate gradients over {k} batches (model.no_sync() on the "
                              f"first {k - 1}): one all-reduce and update per {k} batches; the "
                              "effective batch grows, so retune the learning rate", None))
    bound = comm_hidden(ctx, ev.wait_ns)
    evidence["all_hidden_saving_ns"] = bound.saving_ns
    pred, action, knob = max(options, key=lambda o: o[0].saving_ns)
    others = [f"{a.split(' so ')[0].split(':')[0]} ({p.saving_ns / 1e6:,.1f} ms)"
              for p, a, _ in options if a != action]
    evidence["alternatives"] = others
    return _advice(ev, finding, action, pred,
                   "medium" if pred.engine == "phases" else "high", evidence, knob)


def _fsdp(ev: Evidence, finding: str, evidence: JSONObject, step: float) -> Advice:
    pred = op_scaled(ev.context, "all_gather", 0.5)
    action = ("keep each unit's parameters gathered from forward to backward "
              "(fully_shard(..., reshard_after_forward=False) on the units that fit in "
              "memory): FSDP then all-gathers them once per step, not again in backward; "
              "prefetch the next unit's all-gather (set_modules_to_forward_prefetch / "
              "set_modules_to_backward_prefetch)")
    evidence["model_note"] = "half of the all-gathers' time (backward's) removed"
    return _advice(ev, finding, action, pred, "low", evidence)


def _servers(ev: Evidence, finding: str, evidence: JSONObject, step: float) -> Advice:
    s = max(ev.context.base.servers, 1)
    pred = more_servers(ev.context, 2 * s)
    action = (f"spread the parameters over more servers ({s} → {2 * s}): each push/pull "
              "then moves a smaller share through each server")
    return _advice(ev, finding, action, pred, "medium", evidence,
                   Knob("--servers", "servers", 2 * s))


def _pipeline_waits(ev: Evidence, finding: str, evidence: JSONObject, step: float) -> Advice:
    pred = comm_hidden(ev.context, ev.wait_ns)
    finding = finding.replace("collectives", "point-to-point transfers between pipeline "
                                             "stages (send/recv)")
    action = ("the stages wait for each other's activations and gradients: more "
              "micro-batches per step (smaller ones), or an interleaved / 1F1B schedule, so "
              "each stage has work while it waits")
    evidence["model_note"] = ("upper bound: every send/recv hidden; the pipeline analysis "
                              "(--by pipeline) measures the bubble itself")
    return _advice(ev, finding, action, pred, "low", evidence)
