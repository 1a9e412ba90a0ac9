"""Interference: how much compute slows down while a collective runs beside it on the same
cores (gloo's reduction and copies, gRPC, kvstore threads on a CPU host; NCCL kernels taking
SMs on a GPU), from what the model can measure:

1. ``opprof calibrate``'s compute loop timed alone and beside the collective (the network
   file's ``info.interference``);
2. the trace's own operators: the same operator (name and shapes) beside a collective and away
   from one, in a trace that communicates (:func:`measure`);
3. the cores each worker has: a collective needs a core of its own; where a worker's compute
   threads leave none free, compute and communication share them (:func:`from_cores`).

The slowdown ``s`` means: compute beside a collective takes ``(1 + s)`` times its time alone.
Over ``T`` ns of wall time in which a collective runs beside compute, the compute loses
``T · s / (1 + s)`` ns (:meth:`Interference.extra_ns`): the interference term. The other way
round, the collective beside compute takes ``(1 + comm_slowdown)`` times its calibrated time
(it shares the cores too), which makes ``T`` longer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from opprof.filters import communication, counted, step_work
from opprof.intervals import containing, coverage, merge
from opprof.model.resources import Resources
from opprof.trace import Trace


@dataclass(frozen=True)
class Interference:
    """A compute slowdown beside communication and where it comes from."""

    slowdown: float  # compute beside a collective takes (1 + slowdown) × its time alone
    source: str
    #: and the collective beside compute takes (1 + comm_slowdown) × its calibrated time
    comm_slowdown: float = 0.0

    def extra_ns(self, beside_ns: float) -> float:
        """Wall ns compute loses over ``beside_ns`` ns in which a collective ran beside it."""
        s = max(0.0, self.slowdown)
        return max(0.0, beside_ns) * s / (1.0 + s)

    def to_dict(self) -> dict[str, float | str]:
        """JSON form."""
        return {"slowdown": self.slowdown, "comm_slowdown": self.comm_slowdown,
                "source": self.source}


NONE = Interference(0.0, "none: nothing runs beside compute")


def from_cores(res: Resources, workers: int) -> Interference:
    """The slowdown when ``workers`` workers with ``res``'s threads share its host: the
    collective needs one core; with ``t`` compute threads on ``c`` cores per worker
    (``c < t + 1``) compute and collective share them, each running at ``c / (t + 1)`` of
    its rate: ``s = (t + 1) / c − 1`` for both. Not on GPUs (NCCL's SM use is not modelled)."""
    if str(res.device).startswith("cuda"):
        return Interference(0.0, "GPU: NCCL's use of the SMs beside compute is not modelled "
                                 "(0); measure it with a multi-worker base trace")
    t = res.threads or res.effective
    if not t or not res.cpus:
        return Interference(0.0, "threads or CPUs unknown: assumed 0")
    hosts = max(res.hosts, 1)
    cores = res.cpus / max(1, -(-workers // hosts))
    c = max(cores, float(t))  # fewer cores than threads: the resource check refuses it
    s = max(0.0, (t + 1) / c - 1.0)
    return Interference(s, f"cores: {t:g} compute thread(s) and the collective's on "
                           f"{cores:g} core(s) per worker", comm_slowdown=s)


#: The largest share of its time beside a collective an operator is taken to lose (q < 1).
MAX_LOST_SHARE = 0.9


@dataclass(frozen=True)
class Measured:
    """Interference measured in a trace: the slowdown of the operators that ran beside a
    collective over the same operators away from one, and what it cost per rank-step."""

    slowdown: float
    extra_ns: float  # mean per (rank, step): the compute time lost beside collectives
    beside_ns: float  # mean per (rank, step): operator time beside a collective
    matched: int  # operators beside a collective with a reference away from one


def measure(trace: Trace, rank_steps: int) -> Measured | None:
    """The backward operators of the trace's workers beside a collective against the same
    operators (name and input shapes) away from one. None: no operator ran beside a
    collective, or none has a reference (GPU traces: not measured here).

    An operator's *own* time leaves out the communication calls nested in it on its own
    thread: there it waits for a collective it issued (FSDP's all-gather and reduce-scatter
    from autograd hooks, DDP's all-reduce call) and computes nothing. It runs *beside* a
    collective for the part of its own time that a collective on another thread of its rank
    (gloo's, the kvstore's) covers. If beside a collective compute runs at 1/(1 + s) of its
    speed, an operator of reference time r that spends b ns beside one takes
    r + b·s/(1 + s): so q = s/(1 + s) = Σ(own − r) / Σ b over the operators that have a
    reference, and the time lost per rank-step is q · Σ b (the model's ``T·s/(1+s)``)."""
    ev = trace.events
    if not len(ev) or rank_steps <= 0 or (ev["kind"] == "kernel").any():
        return None
    worker = step_work(ev).to_numpy()
    comm = worker & ((ev["kind"] == "comm").to_numpy() | communication(ev).to_numpy())
    ops = worker & (ev["kind"] == "cpu_op").to_numpy() & counted(ev).to_numpy(bool) & (
        ev["phase"] == "backward").to_numpy() & ~comm
    if not comm.any() or not ops.any():
        return None
    rank = ev["rank"].to_numpy(np.int64)
    lane = np.unique(np.column_stack([rank, ev["pid"].to_numpy(np.int64),
                                      ev["tid"].to_numpy(np.int64)]), axis=0,
                     return_inverse=True)[1].reshape(-1)
    ts = ev["ts"].to_numpy(np.int64)
    end = ts + ev["dur"].to_numpy(np.int64)
    o = np.flatnonzero(ops)
    c = np.flatnonzero(comm)
    own = (end[o] - ts[o]).astype(np.float64)
    beside = np.zeros(len(o))
    for ln in np.unique(lane[o]):
        mine = np.flatnonzero(lane[o] == ln)
        mine = mine[np.argsort(ts[o[mine]], kind="stable")]
        s0, e0 = ts[o[mine]], end[o[mine]]
        # the calls the operators wait in on their own thread (merged: calls nest)
        cl = c[lane[c] == ln]
        cl = cl[(containing(lane[cl], ts[cl], end[cl], lane[o[mine]], s0, e0) >= 0)]
        b_s, b_e = merge(ts[cl], end[cl])
        b_of = mine[np.searchsorted(s0, b_s, side="right") - 1] if len(b_s) else b_s
        np.subtract.at(own, b_of, (b_e - b_s).astype(np.float64))
        others = c[(rank[c] == rank[o[mine[0]]]) & (lane[c] != ln)]
        if not len(others):
            continue
        covered = coverage(ts[others], end[others])
        beside[mine] = covered(e0) - covered(s0)
        # waiting in its own call while another thread's collective runs is not beside it
        np.subtract.at(beside, b_of, covered(b_e) - covered(b_s))
    beside = np.maximum(beside, 0.0)
    sel = ev.iloc[o]
    key = sel["name"].astype("string")
    if "detail" in sel:
        key = key + "|" + sel["detail"].astype("string").fillna("")
    df = pd.DataFrame({"key": key.to_numpy(), "own": own, "beside": beside})
    near = df[df["beside"] > 0]
    if not len(near):
        return None
    ref = df[df["beside"] <= 0].groupby("key")["own"].median()
    near = near.assign(ref=near["key"].map(ref))
    matched = near.dropna(subset=["ref"])
    if not len(matched) or not matched["beside"].sum():
        return None
    q = float((matched["own"] - matched["ref"]).sum() / matched["beside"].sum())
    q = min(max(q, 0.0), MAX_LOST_SHARE)
    total = float(near["beside"].sum())
    return Measured(slowdown=q / (1.0 - q), extra_ns=q * total / rank_steps,
                    beside_ns=total / rank_steps, matched=len(matched))

