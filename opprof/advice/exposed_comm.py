"""Exposed communication: the step waits for collectives that no compute runs beside (the
``comm`` phase). Evidence: the exposed time, the part of it that is waiting for a slower rank
(which no change to the collectives removes: the straggler rule's), the collectives behind it
and their shares, the parallel layout, the gradient bytes. Actions by what dominates:

* gradients' all-reduce — gradient accumulation (one all-reduce and one update per several
  batches: DDP's ``no_sync``, or a hand-written all-reduce after the last batch only); where
  DistributedDataParallel runs the model (its ranges in the trace), another bucket size
  (smaller buckets start all-reducing earlier in backward) and, for the buffers' broadcast at
  every forward, ``broadcast_buffers=False``;
* FSDP's all-gathers — keep the parameters gathered after forward (``reshard_after_forward=
  False``: no all-gather again in backward) and prefetch;
* a parameter server's push/pull — more servers;
* expert parallelism's all-to-all — overlap the token exchange with the experts' compute;
* tensor parallelism's all-reduces / all-gathers between the layers' matmuls (most of the
  collectives' time in the ``tp`` dimension) — sequence parallel and async TP so the
  transfers overlap the matmuls, or a lower TP degree;
* a job with no backward (inference) — no gradient knob applies: the collectives issued
  asynchronously;
* pipeline stages waiting in send/recv — more micro-batches (the pipeline rule's, where the
  pipeline analysis measures the bubble).

Savings: the phase model with the knob turned (:mod:`opprof.model.knobs`: the DDP policy with
other buckets, accumulation), the graph replay for an operator's collectives (FSDP's
all-gathers halved, the broadcast removed), every collective hidden as the bound where no knob
models the change — on the part of the exposed time the dominant collectives hold."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opprof.advice.base import Advice, Knob
from opprof.kinds import PS_MODES, Mode
from opprof.model.knobs import (
    Predicted,
    accumulated,
    buckets,
    comm_hidden,
    more_servers,
    op_scaled,
)

if TYPE_CHECKING:
    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "exposed-communication"
NEEDS: tuple[str, ...] = ()
MiB = 1 << 20
#: DDP bucket caps tried (MiB).
BUCKETS_MB = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100)
#: The collectives that carry gradients (amortized by accumulation, shaped by buckets).
GRADIENT = ("all_reduce", "reduce_scatter")


def advise(ev: Evidence) -> list[Advice]:
    """The exposed-communication advice (see the module docstring)."""
    comm, step = ev.phase_ns("comm"), ev.step_ns
    if comm <= 0 or step <= 0:
        return []
    shares = _shares(ev)
    wait = ev.wait_ns
    evidence: JSONObject = {"comm_ns_per_step": comm, "comm_share": comm / step,
                            "collective_shares": dict(shares), "waiting_ns_per_step": wait,
                            "transfer_ns_per_step": comm - wait, "mode": ev.mode,
                            "workers": ev.context.base.workers}
    top = max(shares, key=lambda k: shares[k]) if shares else ""
    what = f"collectives (mostly {top})" if top else "collectives"
    finding = (f"exposed communication: the step waits {comm / 1e6:,.1f} ms for {what} "
               f"nothing runs beside ({comm / step:.0%} of the step)")
    if wait > 0:
        finding += (f"; {wait / 1e6:,.1f} ms of it is waiting for a slower rank, which no "
                    "change to the collectives removes")
    mode = ev.mode
    if ev.pipeline_job:
        if ev.pipeline is not None:
            return []  # the pipeline rule measures the bubble itself
        return [_pipeline_waits(ev, finding, evidence)]
    if mode == Mode.FSDP or top == "all_gather":
        return [_gathers(ev, finding, evidence, shares)]
    if mode in PS_MODES:
        return [_servers(ev, finding, evidence)]
    if top == "all_to_all":
        return [_experts(ev, finding, evidence, shares)]
    tp = _dim_share(ev, "tp")
    if tp >= 0.5:
        evidence["tp_share"] = tp
        return [_tensor_parallel(ev, finding, evidence, tp)]
    if ev.phase_ns("backward") <= 0:  # no gradients to accumulate or bucket (inference)
        return [_overlap(ev, finding, evidence)]
    # DDP's own collectives: the gradients' all-reduce and the buffers' broadcast before every
    # forward (which dominates a small model with batch norm: Lightning's DDP, accumulating)
    ddp_own = sum(shares.get(k, 0.0) for k in GRADIENT) + (
        shares.get("broadcast", 0.0) if ev.ddp else 0.0)
    if ddp_own >= 0.5 or not shares:
        return [_gradients(ev, finding, evidence, shares)]
    return [_overlap(ev, finding, evidence)]


def _shares(ev: Evidence) -> dict[str, float]:
    """Each collective's share of the collectives' time (``--by comm``'s kinds)."""
    kinds = ev.report.collective_kinds
    total = float(kinds["comm_ns"].sum()) if len(kinds) else 0.0
    if total <= 0:
        return {}
    return {str(r["op"]): float(r["comm_ns"]) / total for r in kinds.to_dict("records")}


def _dim_share(ev: Evidence, dim: str) -> float:
    """The share of the collectives' time that serves parallel dimension ``dim``."""
    c = ev.report.collectives
    if not len(c) or "dim" not in c or "time_ns" not in c:
        return 0.0
    total = float(c["time_ns"].sum())
    return float(c.loc[c["dim"] == dim, "time_ns"].sum()) / total if total > 0 else 0.0


def _capped(pred: Predicted, cap: float, how: str = "") -> Predicted:
    """``pred`` with its saving at most ``cap`` (the exposed time the change can reach)."""
    if pred.saving_ns <= cap:
        return pred
    return Predicted(pred.base_step_ns, pred.base_step_ns - cap, pred.engine,
                     pred.how + (f"; at most {how}" if how else ""))


def _advice(ev: Evidence, finding: str, action: str, pred: Predicted, confidence: str,
            evidence: JSONObject, knob: Knob | None = None) -> Advice:
    return Advice(NAME, finding, action, pred.saving_ns, pred.saving_ns / ev.step_ns,
                  confidence, evidence, pred.how, knob)


def _gradients(ev: Evidence, finding: str, evidence: JSONObject,
               shares: dict[str, float]) -> Advice:
    ctx = ev.context
    total = int(ctx.base.gradients.total_bytes)
    wait = ev.wait_ns
    grad = sum(shares.get(k, 0.0) for k in GRADIENT) if shares else 1.0
    reach = (ev.phase_ns("comm") - wait) * grad  # the exposed gradient transfer
    evidence["gradient_bytes"] = total
    evidence["gradient_share"] = grad
    options: list[tuple[Predicted, str, Knob | None]] = []
    if total > 0 and ev.ddp and ctx.base.workers > 1:
        cands = [(mb, buckets(ctx, int(mb * MiB), wait)) for mb in BUCKETS_MB
                 if mb * MiB < 2 * total]
        if cands:
            mb, best = max(cands, key=lambda c: c[1].saving_ns)
            options.append((_capped(best, reach, "the exposed gradient transfer"),
                            f"DistributedDataParallel(..., bucket_cap_mb={mb:g}) so the "
                            "gradients' all-reduce starts earlier in backward (DDP's buckets "
                            "are 1 MiB first, then 25 MiB)", Knob("--bucket-mb", "bucket_mb", mb)))
    how = ("model.no_sync() on the first {}" if ev.ddp else
           "the gradients all-reduced after the last only, not after the first {}")
    micro = ev.micro_batches  # a loop that accumulates already: its step holds these
    evidence["micro_batches"] = micro
    for k in (2, 4):
        pred = accumulated(ctx, k, ev.phase_ns("comm") - reach)
        if micro > 1:
            what = (f"accumulate gradients over {k * micro} micro-batches, not {micro} ({k}× "
                    f"the step's; {how.format(k * micro - 1)}): one all-reduce and one update "
                    f"per {k} of today's steps")
        else:
            what = (f"accumulate gradients over {k} batches ({how.format(k - 1)}): one "
                    f"all-reduce and one update per {k} batches")
        options.append((pred, what + "; the effective batch grows, so retune the learning rate",
                        None))
    bcast = shares.get("broadcast", 0.0)
    if bcast >= 0.1 and ev.ddp:
        pred = op_scaled(ctx, "broadcast", 0.0)
        options.append((pred, "DistributedDataParallel(..., broadcast_buffers=False): DDP "
                              "broadcasts the model's buffers (batch-norm statistics) from rank "
                              "0 before every forward; skip it where the buffers need not match",
                        None))
    evidence["all_hidden_saving_ns"] = comm_hidden(ctx, wait).saving_ns
    pred, action, knob = max(options, key=lambda o: o[0].saving_ns)
    evidence["alternatives"] = [f"{a.split(':')[0].split(' so ')[0]} "
                                f"({p.saving_ns / 1e6:,.1f} ms)"
                                for p, a, _ in options if a != action]
    return _advice(ev, finding, action, pred, "medium", evidence, knob)


def _gathers(ev: Evidence, finding: str, evidence: JSONObject,
             shares: dict[str, float]) -> Advice:
    pred = op_scaled(ev.context, "all_gather", 0.5)
    action = ("keep each unit's parameters gathered from forward to backward "
              "(fully_shard(..., reshard_after_forward=False) on the units that fit in "
              "memory): FSDP then all-gathers them once per step, not again in backward; "
              "prefetch the next unit's all-gather (set_modules_to_forward_prefetch / "
              "set_modules_to_backward_prefetch)")
    evidence["model_note"] = "half of the all-gathers' time (backward's) removed"
    return _advice(ev, finding, action, pred, "low", evidence)


def _servers(ev: Evidence, finding: str, evidence: JSONObject) -> Advice:
    s = max(ev.context.base.servers, 1)
    pred = more_servers(ev.context, 2 * s)
    action = (f"spread the parameters over more servers ({s} → {2 * s}): each push/pull "
              "then moves a smaller share through each server")
    return _advice(ev, finding, action, pred, "medium", evidence,
                   Knob("--servers", "servers", 2 * s))


def _experts(ev: Evidence, finding: str, evidence: JSONObject,
             shares: dict[str, float]) -> Advice:
    share = shares.get("all_to_all", 0.0)
    reach = (ev.phase_ns("comm") - ev.wait_ns) * share
    pred = _capped(comm_hidden(ev.context, ev.wait_ns), reach, "the all-to-all's share")
    action = ("the experts' token exchange (all-to-all) blocks the step: overlap it with the "
              "experts' compute (split the batch and dispatch one part while the other "
              "computes), lower the capacity factor, or place the experts so fewer tokens "
              "leave their rank")
    evidence["model_note"] = "upper bound: the all-to-all's share of the exposed time hidden"
    return _advice(ev, finding, action, pred, "low", evidence)


def _tensor_parallel(ev: Evidence, finding: str, evidence: JSONObject, tp: float) -> Advice:
    reach = (ev.phase_ns("comm") - ev.wait_ns) * tp
    pred = _capped(comm_hidden(ev.context, ev.wait_ns), reach, "the tensor-parallel share")
    action = ("tensor parallelism's collectives sit between the layers' matmuls and block "
              "them: shard the activations between the blocks too (SequenceParallel, so "
              "all-gather / reduce-scatter replace the all-reduce) and let them overlap the "
              "matmuls (async TP: torch.compile with "
              "torch._inductor.config._micro_pipeline_tp = True), or lower the TP degree (keep "
              "it inside a node's fast links; use the other ranks for data parallel)")
    evidence["model_note"] = "upper bound: the tensor-parallel collectives' share hidden"
    return _advice(ev, finding, action, pred, "low", evidence)


def _overlap(ev: Evidence, finding: str, evidence: JSONObject) -> Advice:
    pred = comm_hidden(ev.context, ev.wait_ns)
    action = ("issue the collectives asynchronously (async_op=True) and wait for them only "
              "where their result is needed, so compute runs beside them")
    evidence["model_note"] = "upper bound: every collective hidden"
    return _advice(ev, finding, action, pred, "low", evidence)


def _pipeline_waits(ev: Evidence, finding: str, evidence: JSONObject) -> Advice:
    pred = comm_hidden(ev.context, ev.wait_ns)
    finding = finding.replace("collectives (mostly send)", "transfers between pipeline "
                                                           "stages (send/recv)")
    finding = finding.replace("collectives (mostly recv)", "transfers between pipeline "
                                                           "stages (send/recv)")
    action = ("the stages wait for each other's activations and gradients: more "
              "micro-batches per step (smaller ones), or an interleaved / 1F1B schedule, so "
              "each stage has work while it waits")
    evidence["model_note"] = ("upper bound: every send/recv hidden; the pipeline analysis "
                              "(--by pipeline) measures the bubble itself")
    return _advice(ev, finding, action, pred, "low", evidence)
