"""A discrete-event simulation of one synchronous training step of one worker: the compute
lane (load, h2d, forward, backward, update, other) and the communication lane (gradient
collectives), with the framework's pipeline between them.

Events, in order::

    load → h2d → forward → backward ─┬→ [wait for the last collective] → update → other
                                     └ gradients ready ──→ collectives (one at a time on the
                                                            link, each from max(ready, free))

- **I/O**: loading is serial (``t_io``), or — with a prefetching input pipeline — runs in the
  background during the previous step, exposed only by ``max(0, io_busy − rest of step)``;
  plus what no prefetch hides (``StepPlan.input_ns``: TensorFlow's distributed dataset).
- **Gradients** become ready during the backward pass at the fractions of it the trace showed
  (:mod:`opprof.model.gradients`); the policy groups them into messages:
  ``buckets`` (DistributedDataParallel: reverse order, a first bucket of 1 MiB then 25 MiB
  ones, each all-reduced as soon as its last gradient is ready — overlapped with the rest of
  the backward pass), ``after-backward`` (one message of all gradients once backward ends, as
  the MXNet collector waits at every phase boundary before the kvstore push/pull) and
  ``packed-after-backward`` (TF MultiWorkerMirroredStrategy: the gradients concatenated into
  one tensor in the update, one CollectiveReduce, split back — the copies, ``pack_ns``, count
  as update time, where the trace shows them as ConcatV2 / SplitV).
- **Link**: one collective at a time, FIFO, each taking ``cost(bytes) × comm_scale``; a
  parameter server's keys (``per_tensor``: one message per gradient) go one after another,
  each paying its own latency.
- **Synchronisation**: the update waits for the last collective, plus the expected wait for
  the slowest of the N workers (``straggler_ns``) when there is communication at all.
- **Update**: on the worker after the wait, or on the parameter servers (``server_update``):
  then the servers' optimizer time (``server_update_ns``) sits between the push and the pull,
  on the communication lane, and the worker's own update term is what is left of it.

The result gives every instant of the simulated step to one phase, as the measured breakdown
does: ``comm`` is the time the compute lane waits for communication (exposed), so the phases
sum to the simulated step exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from opprof.kinds import Collective, Framework
from opprof.model.sharded import simulate_sharded
from opprof.model.step import COMPUTE_PHASES, Policy, ShardedPlan, SimResult, StepPlan

if TYPE_CHECKING:
    from opprof.arrays import Array

MiB = 1 << 20

DDP = Policy("buckets", True, MiB, 25 * MiB, False,
             "DDP buckets (1 MiB, then 25 MiB) all-reduced as soon as ready, overlapped with "
             "backward; update after the last")
AFTER_BACKWARD = Policy("after-backward", False, 0, 0, False,
                        "one all-reduce of all gradients after backward, then the update")
MWMS = Policy("packed-after-backward", False, 0, 0, False,
              "gradients packed into one tensor after backward, one all-reduce, split back, "
              "then the update (MultiWorkerMirroredStrategy)", pack=True)
KVSTORE = Policy("kvstore", False, 0, 0, True,
                 "push/pull of every key (one per gradient) after backward, one after another "
                 "on the link; the servers run the optimizer between push and pull",
                 per_tensor=True)

FSDP_PREFETCH = Policy("fsdp-prefetch", True, 0, 0, False,
                       "FSDP: per unit, all-gather before forward (the next unit's prefetched "
                       "beside this one's compute) and before backward, reduce-scatter after "
                       "backward beside the next unit's; the update on the shard after the last")
FSDP_BLOCKING = Policy("fsdp-blocking", False, 0, 0, False,
                       "FSDP on gloo: per unit, all-gather before forward and before backward, "
                       "reduce-scatter after backward, each waited for by the training thread; "
                       "the update on the shard")

#: (framework, collective) → its policy; other combinations use GENERIC.
POLICIES: dict[tuple[str, str], Policy] = {
    (Framework.TORCH, Collective.ALLREDUCE): DDP, (Framework.TF, Collective.ALLREDUCE): MWMS,
    (Framework.MXNET, Collective.PS): KVSTORE, (Framework.TF, Collective.PS): KVSTORE,
    # JAX: pmean of the gradients in the compiled step, after its backward (XLA:CPU runs it
    # there); ChainerMN: multi_node_mean_grad after backward(), before the update
    (Framework.JAX, Collective.ALLREDUCE): AFTER_BACKWARD,
    (Framework.CHAINER, Collective.ALLREDUCE): AFTER_BACKWARD}
GENERIC: dict[str, Policy] = {Collective.ALLREDUCE: DDP, Collective.PS: KVSTORE,
                              Collective.FSDP: FSDP_BLOCKING}


def policy_for(framework: str, collective: str, device: str = "cpu") -> Policy:
    """The pipeline policy of a framework's collective (a generic one where it has none);
    FSDP prefetches beside compute on GPUs and blocks on CPU (gloo)."""
    if collective == Collective.FSDP:
        return FSDP_PREFETCH if str(device).startswith("cuda") else FSDP_BLOCKING
    return POLICIES.get((framework, collective), GENERIC[collective])


def messages(ready_frac: Array, grad_bytes: Array,
             policy: Policy) -> list[tuple[float, int]]:
    """(ready fraction of backward, bytes) of each message the policy sends."""
    if not len(grad_bytes) or not int(np.sum(grad_bytes)):
        return []
    if policy.per_tensor:
        return [(1.0 if not policy.overlap else float(f), int(n))
                for f, n in zip(ready_frac, grad_bytes, strict=True) if n]
    if not policy.overlap or not policy.bucket_bytes:
        return [(1.0, int(np.sum(grad_bytes)))]
    out: list[tuple[float, int]] = []
    cap = policy.first_bucket_bytes or policy.bucket_bytes
    size, ready = 0, 0.0
    for frac, n in zip(ready_frac, grad_bytes, strict=True):
        size += int(n)
        ready = max(ready, float(frac))
        if size >= cap:
            out.append((ready, size))
            size, cap = 0, policy.bucket_bytes
    if size:
        out.append((ready, size))
    return out


def simulate(plan: StepPlan | ShardedPlan) -> SimResult:
    """Run the step (see the module docstring; an FSDP step: :mod:`.sharded`)."""
    if not isinstance(plan, StepPlan):
        return simulate_sharded(plan)
    ph = {p: float(plan.phases.get(p, 0.0)) for p in COMPUTE_PHASES}
    b0 = ph["h2d"] + ph["forward"]  # backward starts (load placed below)
    sends = messages(plan.ready_frac, plan.grad_bytes, plan.policy) if plan.communicate \
        else []
    s = max(0.0, plan.interference)
    extra, sent = 0.0, _send(plan, sends, b0, ph["backward"])
    for _ in range(50 if s and plan.policy.overlap else 0):
        # Compute beside a collective runs at 1 / (1 + s) of its speed: the backward grows by
        # T·s/(1+s) over the T ns a collective runs inside it, which moves the gradients'
        # ready times and so the collectives: iterate to the fixed point (a contraction).
        b1 = b0 + ph["backward"] + extra
        beside = sum(max(0.0, min(m["end_ns"], b1) - max(m["start_ns"], b0)) for m in sent)
        new = beside * s / (1.0 + s)
        if abs(new - extra) < 1.0:
            extra = new
            break
        extra = new
        sent = _send(plan, sends, b0, ph["backward"] + extra)
    ph["backward"] += extra
    b1 = b0 + ph["backward"]
    free = sent[-1]["end_ns"] if sent else 0.0
    sync = b1
    if sent:
        sync = max(b1, free + plan.straggler_ns)
        if plan.policy.pack:
            ph["update"] += plan.pack_ns
    exposed = sync - b1
    busy = sum(m["end_ns"] - m["start_ns"] for m in sent)
    hidden = sum(max(0.0, min(m["end_ns"], b1) - m["start_ns"]) for m in sent)
    rest = b1 + exposed + ph["update"] + ph["other"]
    load = (max(0.0, plan.io_busy_ns - rest) if plan.io_prefetch else ph["load"]) \
        + plan.input_ns
    phases = {"load": load, "h2d": ph["h2d"], "forward": ph["forward"],
              "backward": ph["backward"], "update": ph["update"], "comm": exposed,
              "other": ph["other"]}
    for m in sent:
        for k in ("ready_ns", "start_ns", "end_ns"):
            m[k] += load
    return SimResult(sum(phases.values()), phases, busy, hidden, sent, extra)


def _send(plan: StepPlan, sends: list[tuple[float, int]], b0: float,
          backward: float) -> list[dict[str, float]]:
    """The collectives on the link (FIFO), for a backward of ``backward`` ns from ``b0``."""
    total = sum(n for _, n in sends) or 1
    free = 0.0
    sent: list[dict[str, float]] = []
    b1, slow = b0 + backward, 1.0 + max(0.0, plan.comm_interference)
    for frac, n in sends:
        ready = b0 + frac * backward if plan.policy.overlap else b0 + backward
        start = max(ready, free)
        dur = (float(plan.cost(n)) + (0.0 if sent else plan.first_extra_ns)) * plan.comm_scale
        if plan.policy.server_update:  # the servers' optimizer on this key's share
            dur += plan.server_update_ns * n / total  # compute: comm_scale leaves it
        if start < b1 and slow > 1.0:  # beside the backward it runs at 1/slow of its speed
            inside = (b1 - start) / slow  # the work it gets done before backward ends
            dur = dur * slow if dur <= inside else (b1 - start) + (dur - inside)
        free = start + dur
        sent.append({"ready_ns": ready, "start_ns": start, "end_ns": free, "bytes": n})
    return sent
