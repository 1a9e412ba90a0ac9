"""The model of a sharded data-parallel (FSDP) training step: what `opprof model --mode fsdp`
simulates, its inputs from a trace (units, their bytes, the collectives' α–β) and its
prediction for N workers.

**Units.** FSDP shards the parameters by unit (FSDP2: every ``fully_shard``-ed module, then
the root for what is left). Each unit's unsharded parameter bytes come from the trace's
metadata (``unit_param_bytes``: `opprof record` notes them in every torch recording, so a
1-worker trace can be modelled as FSDP), else from the all-gathers of one forward pass in an
FSDP trace (the full buffer ``c10d::_allgather_base_`` gathers), else the model is one unit of
all the gradient bytes. Each unit's share of the forward and backward compute follows its
gradients in the backward pass (the unit whose gradients take a third of backward gets a third
of both), else its share of the bytes.

**The step**, on a compute lane and one link (collectives one at a time, in issue order)::

    forward:  AG(root) · [AG(u) → forward(u) → copy-out]  for u = root, 1 … U
    backward: [AG(u) → backward(u) → copy-out → RS(u)]    for u = U … 1, then the root's
              backward and RS (the root stays gathered after forward: no second AG)
    update:   the optimizer on this rank's 1/N shard, after the last RS, each of its calls
              a DTensor's dispatch more (:func:`optimizer_calls`, calibrate's
              ``sharded_op_ns``)

- all-gather (AG) of a unit of n bytes and reduce-scatter (RS): what the training thread
  pays for the call after the last rank entered it, FSDP's copies inside (`opprof calibrate
  --mode fsdp` times it so; :func:`fsdp_calls` reads it from an FSDP trace): the measured
  curve, the ring's α–β ``(N−1)·α + (N−1)/N·n·β`` beyond it and at other N
  (:mod:`opprof.model.commmodel`), each kind its own; a network that times the
  collective alone (an earlier calibrate, a GPU trace's spans) adds FSDP's copies around it
  (copy-in of the shard, copy-out of the gathered unit, the gradient's copy-in before RS) at
  ``copy_ns_per_byte`` per byte on the compute lane;
- **prefetch** (``overlap``, NCCL on GPU: collectives on their own streams): the AG of the
  next unit is issued as the current unit's compute starts, so it runs beside it; the RS of a
  unit runs beside the next unit's backward; the update waits for the last RS;
- **blocking** (gloo on CPU): the issuing thread waits for every collective (FSDP2's ranges
  enclose the whole gloo transfer in the traces), so AG and RS add to the step in full.
- the wait for the slowest worker: with prefetch, σ·E[max of N normals] once per step (σ: the
  base's per-step compute, :mod:`.predict`); blocking, at every collective, from the σ of the
  compute segment before it and the spread of the ranks' exits from the one before
  (:func:`blocking_wait`).

Phases of the simulated step: forward, backward, update, load, h2d, other as given;
``comm`` is everything else — the waits for collectives and FSDP's copies, as the measured
breakdown files FSDP's copies (op ``memory``, phase ``comm``) — so they sum to the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.errors import OpprofError
from opprof.filters import counted, names_where, on_host, step_work
from opprof.intervals import containing, coverage, lane_ids
from opprof.kinds import Collective
from opprof.model.commmodel import Network, fit
from opprof.model.step import COMPUTE_PHASES, ShardedPlan, SimResult, expected_max_normal
from opprof.taxonomy import COMM_OPS
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array

KINDS = ("all_gather", "reduce_scatter")
#: FSDP's copies when neither a calibration nor the trace gives them: 4 GB/s, a memcpy of a
#: CPU core.
ASSUMED_COPY_NS_PER_BYTE = 0.25
_BACKEND_SPAN = r"^[A-Za-z]\w*:[A-Za-z_]\w*$"
#: FSDP2's range around one unit's collective on the training thread (the root's has no unit)
_FSDP_CALL = r"^FSDP::(all_gather|post_backward_reduce)(?: \((.*)\))?$"
_FSDP_COPY_OUT = r"^FSDP::all_gather_copy_out(?: \((.*)\))?$"
_C10D_CALL = r"^c10d::_(?:allgather|reduce_scatter)_base_$"


def simulate_sharded(plan: ShardedPlan) -> SimResult:
    """Run the step (see the module docstring)."""
    ph = {p: float(plan.phases.get(p, 0.0)) for p in COMPUTE_PHASES}
    b = np.asarray(plan.unit_bytes, np.float64)
    talk = plan.communicate and plan.workers > 1 and len(b) > 0
    sent: list[dict[str, Any]] = []
    link = 0.0

    def send(kind: str, ready: float, n: float) -> float:
        nonlocal link
        if not talk or n <= 0:  # a root that holds no parameters of its own gathers none
            return ready
        start = max(ready, link)
        link = start + float(plan.cost(kind, n)) * plan.comm_scale
        sent.append({"kind": kind, "ready_ns": ready, "start_ns": start, "end_ns": link,
                     "bytes": n})
        return link

    copy = (lambda n: plan.copy_ns_per_byte * n) if talk else (lambda n: 0.0)
    fwd = ph["forward"] * plan.share
    bwd = ph["backward"] * plan.share
    t = ph["h2d"]
    units = len(b)
    gathered = {0: send("all_gather", t, b[0])} if units else {}
    for i in range(units):
        start = max(t, gathered[i])
        more = i + 1 < units
        if more and plan.overlap:
            gathered[i + 1] = send("all_gather", start, b[i + 1])
        t = start + copy(b[i] / max(plan.workers, 1) + b[i]) + fwd[i]
        if more and not plan.overlap:
            gathered[i + 1] = send("all_gather", t, b[i + 1])
    order = list(range(units - 1, 0, -1)) + ([0] if units else [])
    gathered = {order[0]: send("all_gather", t, b[order[0]])} if units > 1 else {0: t}
    for k, i in enumerate(order):
        start = max(t, gathered.get(i, t))
        nxt = order[k + 1] if k + 1 < len(order) and order[k + 1] != 0 else None
        if nxt is not None and plan.overlap:
            gathered[nxt] = send("all_gather", start, b[nxt])
        gather_copy = copy(b[i] / max(plan.workers, 1) + b[i]) if i != 0 else 0.0
        t = start + gather_copy + bwd[i] + copy(b[i])
        done = send("reduce_scatter", t, b[i])
        if not plan.overlap:
            t = done
        if nxt is not None and not plan.overlap:
            gathered[nxt] = send("all_gather", t, b[nxt])
    compute = ph["h2d"] + ph["forward"] + ph["backward"]
    sync = max(t, link) + (plan.straggler_ns if sent else 0.0)
    exposed = sync - compute
    rest = sync + ph["update"] + ph["other"]
    load = max(0.0, plan.io_busy_ns - rest) if plan.io_prefetch else ph["load"]
    phases = {"load": load, "h2d": ph["h2d"], "forward": ph["forward"],
              "backward": ph["backward"], "update": ph["update"], "comm": exposed,
              "other": ph["other"]}
    busy = sum(m["end_ns"] - m["start_ns"] for m in sent)
    compute_end = ph["h2d"] + ph["forward"] + ph["backward"]
    hidden = sum(max(0.0, min(m["end_ns"], compute_end) - m["start_ns"]) for m in sent) \
        if plan.overlap else 0.0
    for m in sent:
        for key in ("ready_ns", "start_ns", "end_ns"):
            m[key] += load
    return SimResult(sum(phases.values()), phases, busy, hidden, sent)


# ------------------------------------------------------------------ inputs from a trace


def unit_bytes(trace: Trace) -> tuple[Array, str]:
    """Each unit's unsharded parameter bytes (root first, forward order) and where they come
    from (see the module docstring); empty when the trace tells nothing."""
    given = trace.meta.get("unit_param_bytes")
    if given:
        return np.asarray([int(v) for v in given], np.int64), \
            "the model's FSDP units (recorded parameter sizes)"
    ev = trace.events
    # the cheap numeric tests first: the names' text only of the all-gathers left
    calls = ev[(ev["op"] == "all_gather") & (ev["bytes"] > 0) & (ev["step"] >= 0)]
    calls = calls[calls["name"].astype(str).str.startswith("c10d::")]
    if len(calls):
        first = calls[(calls["rank"] == calls["rank"].min())]
        first = first[first["step"] == first["step"].min()].sort_values("ts")
        n = first["bytes"].to_numpy(np.int64)
        # Every unit but the root is gathered again in backward: forward's are the first
        # ones, up to where the same sizes come round again.
        units = (len(n) + 1) // 2
        return n[:units], "the all-gathers of one forward pass in the trace"
    return np.zeros(0, np.int64), ""


def unit_shares(trace_layers: pd.DataFrame, nbytes: Array) -> Array:
    """Each unit's share of the compute: the backward time of its gradients (gradients in
    backward order matched to units in reverse forward order by cumulative bytes), else its
    share of the bytes."""
    total = float(nbytes.sum())
    if not len(nbytes) or total <= 0:
        return np.ones(max(len(nbytes), 1)) / max(len(nbytes), 1)
    fallback = nbytes / total
    g = trace_layers
    if g is None or not len(g) or "backward_ns" not in g or float(g["bytes"].sum()) <= 0:
        return fallback
    back = np.r_[nbytes[1:][::-1], nbytes[:1]]  # backward order: units U … 1, then the root
    edges = np.cumsum(back) / float(back.sum())
    mid = (np.cumsum(g["bytes"].to_numpy(np.float64)) - g["bytes"].to_numpy(np.float64) / 2)
    mid /= float(g["bytes"].sum())
    which = np.minimum(np.searchsorted(edges, mid, side="right"), len(back) - 1)
    work = np.bincount(which, weights=g["backward_ns"].to_numpy(np.float64),
                       minlength=len(back))
    if work.sum() <= 0:
        return fallback
    work = work / work.sum()
    shares: Array = np.r_[work[-1:], work[:-1][::-1]]  # back to forward order, root first
    return shares


def segment_spread(trace: Trace, share: Array) -> float | None:
    """Σ of :func:`segment_sigmas` (ns; None where it has none)."""
    sigmas = segment_sigmas(trace, share)
    return None if sigmas is None else float(sigmas.sum())


def segment_sigmas(trace: Trace, share: Array) -> Array | None:
    """Each compute segment's standard deviation over the trace's worker (rank, step)s, in ns:
    the units' forward segments (forward order), then their backward segments (backward
    order); None when the steps do not run the same operators, or with fewer than two steps.

    On gloo every all-gather and reduce-scatter is a barrier: a rank that finishes the unit's
    compute before it waits there for the slowest, so the step pays a wait at every segment
    s, not once per step (:func:`blocking_wait`). The segments are each unit's forward
    (forward order) and backward (backward order) compute, cut where the trace's counted
    operators of the phase reach the units' cumulative shares of it (their mean position over
    the steps); a segment's time is the wall time from the previous cut to its own, less the
    communication inside that window (an FSDP trace's own collectives). On a host shared by
    other processes, time slicing makes segments vary a lot more than whole steps do (a rank
    that lost the CPU in one segment catches up in the next), which the per-step σ misses."""
    ev = trace.events
    sel = step_work(ev).to_numpy()
    if not sel.any() or len(share) < 1:
        return None
    ev = ev[sel]
    comm = ev[(ev["kind"] == "comm").to_numpy() | ev["op"].isin(COMM_OPS).to_numpy()]
    host_ops = ev[ev["counted"].to_numpy(bool) & (ev["kind"] == "cpu_op").to_numpy()]
    sigmas: list[Array] = []
    orders = {"forward": np.asarray(share, np.float64),
              "backward": np.r_[share[1:][::-1], share[:1]].astype(np.float64)}
    for phase, shares in orders.items():
        ops = host_ops[host_ops["phase"] == phase]
        groups = list(ops.groupby(["rank", "step"], sort=True))
        if len(groups) < 2:
            return None
        rows = []
        for (rank, _), g in groups:
            end = np.sort((g["ts"] + g["dur"]).to_numpy(np.int64))
            start = int(g["ts"].min())
            c = comm[comm["rank"] == rank]
            covered = coverage(c["ts"].to_numpy(np.int64),
                                   (c["ts"] + c["dur"]).to_numpy(np.int64))
            rows.append((np.r_[start, end], covered))
        if len({len(t) for t, _ in rows}) != 1:
            return None
        # compute time from the phase's start to each operator's end, per (rank, step)
        work = np.array([(t - t[0]) - (cov(t) - cov(t[:1])) for t, cov in rows],
                        np.float64)
        frac = (work / np.maximum(work[:, -1:], 1.0)).mean(axis=0)
        cut = np.searchsorted(frac, np.cumsum(shares)[:-1], side="left")
        at = np.r_[0, np.minimum(cut, work.shape[1] - 1), work.shape[1] - 1]
        seg = np.diff(work[:, at], axis=1)
        sigmas.append(seg.std(axis=0, ddof=1))
    out: Array = np.concatenate(sigmas)
    return out


def blocking_wait(sigmas: Array, exit_spread_ns: float, units: int, workers: int) -> float:
    """The expected wait for the slowest of ``workers`` ranks summed over one step's blocking
    collectives (ns): at each, E[max of N standard normals] × the σ of the ranks' arrival,
    √(σ_s² + σ_x²) — the compute segment before it (``sigmas``: :func:`segment_sigmas`) and
    the spread of the ranks' exits from the collective before (``exit_spread_ns``, measured
    by `opprof calibrate --mode fsdp`). A step of U units has 3U − 1 collectives (U + U − 1
    all-gathers, U reduce-scatters) and 2U segments: the U − 1 backward all-gathers that
    follow a reduce-scatter with no compute between pay the exits' spread alone."""
    x = max(0.0, float(exit_spread_ns))
    s = np.asarray(sigmas, np.float64)
    alone = max(0, 3 * units - 1 - len(s))
    return expected_max_normal(workers) * (float(np.sqrt(s * s + x * x).sum()) + alone * x)


def optimizer_calls(trace: Trace) -> float:
    """The calls the optimizer's step makes per (rank, step), the mean: the host operators
    directly inside each ``Optimizer.step#…`` range (SGD with momentum: ``mul_``, ``add_``,
    ``add_`` per parameter). On FSDP2's sharded parameters every one is a call on a
    ``DTensor``, which costs its dispatch on top of the shard's work (`opprof calibrate
    --mode fsdp`: ``sharded_op_ns``); 0 where the trace shows no optimizer step."""
    ev = trace.events
    ev = ev[step_work(ev) & on_host(ev) & (ev["kind"] == "cpu_op")]
    is_step = names_where(ev, lambda name: name.startswith("Optimizer.step#"))
    if not is_step.any():
        return 0.0
    outer = ev[is_step]
    lane = lane_ids(ev["rank"].to_numpy(), ev["pid"].to_numpy(), ev["tid"].to_numpy())
    at = ev.index.get_indexer(outer.index)
    pos = containing(lane, ev["ts"].to_numpy(np.int64), (ev["ts"] + ev["dur"]).to_numpy(np.int64),
                     lane[at], outer["ts"].to_numpy(np.int64),
                     (outer["ts"] + outer["dur"]).to_numpy(np.int64))
    depth = ev["depth"].to_numpy(np.int64)
    inner = (pos >= 0) & (depth == outer["depth"].to_numpy(np.int64)[np.maximum(pos, 0)] + 1)
    return float(inner.sum()) / len(outer)


def fsdp_calls(trace: Trace) -> tuple[pd.DataFrame, float]:
    """FSDP2's collectives as its training thread pays them, the way `opprof calibrate --mode
    fsdp` times them: per call (``FSDP::all_gather (unit)`` — copy-in, all-gather, and its
    ``FSDP::all_gather_copy_out`` — or ``FSDP::post_backward_reduce (unit)`` — the
    gradients' copy, reduce-scatter, the shard's copy) and rank: ``kind``, ``unit``,
    ``bytes`` (the unit's unsharded bytes: the largest ``c10d::`` call inside), ``enter``,
    ``exit``, ``copy_out_ns``, ``wait_ns`` (for the last rank to enter the same call: the
    step's k-th call of that kind and unit) and ``ns`` (the rest: exit − the last entry +
    the copy-out); and the ranks' exits' spread (the pooled σ of one rank's exit about the
    call's mean, ns). Empty where the trace has no FSDP2 ranges around collectives."""
    cols = ["rank", "step", "kind", "unit", "bytes", "enter", "exit", "copy_out_ns",
            "wait_ns", "ns"]
    ev = trace.events
    ev = ev[step_work(ev) & on_host(ev)]
    names = pd.Series(pd.unique(ev["name"].astype(str)))
    ranges = names.str.extract(_FSDP_CALL)
    is_copy_out = names.str.match(_FSDP_COPY_OUT)
    which = {"range": names[ranges[0].notna()], "copy_out": names[is_copy_out],
             "call": names[names.str.match(_C10D_CALL)]}
    if not len(which["range"]) or not len(which["call"]):
        return pd.DataFrame(columns=cols), 0.0
    name = ev["name"].astype(str)
    part = {k: ev[name.isin(v).to_numpy()] for k, v in which.items()}
    kind_of = dict(zip(which["range"], ranges.loc[which["range"].index, 0], strict=True))
    unit_of = dict(zip(which["range"], ranges.loc[which["range"].index, 1].fillna(""),
                       strict=True))
    unit_of.update(zip(which["copy_out"],
                       which["copy_out"].str.extract(_FSDP_COPY_OUT)[0].fillna(""),
                       strict=True))
    both = pd.concat(part.values())
    lane = lane_ids(both["rank"].to_numpy(), both["pid"].to_numpy(), both["tid"].to_numpy())
    lanes = dict(zip(part, np.split(lane, np.cumsum([len(v) for v in part.values()])[:-1]),
                     strict=True))
    r, c = part["range"], part["call"]
    r_end = (r["ts"] + r["dur"]).to_numpy(np.int64)
    pos = containing(lanes["call"], c["ts"].to_numpy(np.int64),
                     (c["ts"] + c["dur"]).to_numpy(np.int64), lanes["range"],
                     r["ts"].to_numpy(np.int64), r_end)
    nbytes = np.zeros(len(r), np.int64)
    np.maximum.at(nbytes, pos[pos >= 0], c["bytes"].to_numpy(np.int64)[pos >= 0])
    rname = r["name"].astype(str)
    calls = pd.DataFrame({
        "rank": r["rank"].to_numpy(), "step": r["step"].to_numpy(),
        "kind": np.where(rname.map(kind_of) == "all_gather", "all_gather", "reduce_scatter"),
        "unit": rname.map(unit_of).to_numpy(), "bytes": nbytes,
        "enter": r["ts"].to_numpy(np.int64), "exit": r_end})
    calls = calls[calls["bytes"] > 0].sort_values(["rank", "enter"], kind="stable")
    key = ["rank", "step", "kind", "unit"]
    calls["k"] = calls.groupby(key, sort=False).cumcount()
    co = part["copy_out"]
    outs = pd.DataFrame({"rank": co["rank"].to_numpy(), "step": co["step"].to_numpy(),
                         "kind": "all_gather", "unit": co["name"].astype(str).map(unit_of),
                         "ts": co["ts"].to_numpy(np.int64),
                         "copy_out_ns": co["dur"].to_numpy(np.int64)}).sort_values(["rank",
                                                                                    "ts"])
    outs["k"] = outs.groupby(key, sort=False).cumcount()
    calls = calls.merge(outs[[*key, "k", "copy_out_ns"]], on=[*key, "k"], how="left")
    calls["copy_out_ns"] = calls["copy_out_ns"].fillna(0).astype(np.int64)
    same = calls.groupby(["step", "kind", "unit", "k"], sort=False)
    ranks = calls.groupby("step")["rank"].transform("nunique")
    calls = calls[(same["rank"].transform("nunique") == ranks) & (ranks >= 2)]
    if calls.empty:
        return pd.DataFrame(columns=cols), 0.0
    same = calls.groupby(["step", "kind", "unit", "k"], sort=False)
    last = same["enter"].transform("max")
    done = calls["exit"] + calls["copy_out_ns"]
    calls = calls.assign(wait_ns=last - calls["enter"], ns=done - last)
    dev = (done - done.groupby([calls[c] for c in ("step", "kind", "unit", "k")])
           .transform("mean")).to_numpy(np.float64)
    free = len(calls) - same.ngroups
    spread = float(np.sqrt((dev * dev).sum() / free)) if free > 0 else 0.0
    return calls[cols].reset_index(drop=True), spread


def trace_samples(trace: Trace) -> pd.DataFrame:
    """(kind, bytes, ns) of the FSDP collectives a multi-worker trace holds, for fitting:
    the backend's own spans (``gloo:all_gather`` …) with their unsharded bytes — an
    all-gather's payload is the unit it gathers (a span that carries only its input shard is
    scaled × N), a reduce-scatter's (gloo: an all-reduce of the whole buffer, during
    backward) the whole buffer — and their transfer time (the wait for the last rank left
    out, :func:`opprof.analysis.ranks.match`)."""
    from opprof.analysis.breakdown import step_breakdown
    from opprof.analysis.ranks import match

    ev = trace.events
    workers = int(trace.meta.get("workers") or len(trace.ranks) or 1)
    sel = step_work(ev) & on_host(ev) \
        & ev["name"].astype(str).str.match(_BACKEND_SPAN) & (ev["bytes"] > 0) \
        & ev["op"].isin(["all_gather", "reduce_scatter", "all_reduce"])
    spans = ev.loc[sel, ["rank", "step", "pid", "tid", "name", "ts", "dur", "bytes", "op"]]
    if spans.empty or workers < 2:
        return pd.DataFrame(columns=["kind", "bytes", "ns"])
    spans = spans.assign(name=spans["name"].astype(str), end=spans["ts"] + spans["dur"])
    bounds = step_breakdown(trace)[["rank", "step", "start", "end"]]
    c = match(spans.sort_values(["rank", "ts"]).reset_index(drop=True), bounds, True)
    gather = (c["op"] == "all_gather").to_numpy()
    nbytes = c["bytes"].to_numpy(np.int64)
    # torch 2.x's spans carry the gathered (unit's) bytes; a span that carries its input
    # shard — no unit of that size, one of N times it — is scaled to the unit
    units = unit_bytes(trace)[0]
    shard = gather & ~np.isin(nbytes, units) & np.isin(nbytes * workers, units)
    return pd.DataFrame({
        "kind": np.where(gather, "all_gather", "reduce_scatter"),
        "bytes": np.where(shard, nbytes * workers, nbytes).astype(np.int64),
        "ns": c["transfer_ns"].to_numpy(np.float64)})


def copy_rate(trace: Trace, nbytes: Array, steps: int) -> float | None:
    """ns per byte of FSDP's copies in a multi-worker FSDP trace: its ``memory`` time in
    phase ``comm`` per step over the bytes the model copies per step (None: none)."""
    ev = trace.events
    workers = int(trace.meta.get("workers") or len(trace.ranks) or 1)
    sel = step_work(ev) & counted(ev) \
        & (ev["op"] == "memory") & (ev["phase"] == "comm")
    per_step = float(ev.loc[sel, "dur"].sum()) / max(steps, 1)
    total = nbytes.astype(np.float64)
    copied = float(np.sum(2 * (total / workers + total)) - (total[0] / workers + total[0])
                   + total.sum()) if len(total) else 0.0
    if per_step <= 0 or copied <= 0 or workers < 2:
        return None
    return per_step / copied


def fit_network(samples: pd.DataFrame, workers: int, copy_ns_per_byte: float | None,
                center: str = "median", **fields: object) -> Network:
    """An ``fsdp`` network from (kind, bytes, ns) samples: the all-gather's α–β, the
    reduce-scatter's in ``info`` (the all-gather's where it has none); each size's time the
    ``center`` of its calls (:func:`opprof.model.commmodel.fit`)."""
    ag = samples[samples["kind"] == "all_gather"]
    rs = samples[samples["kind"] == "reduce_scatter"]
    if ag.empty and rs.empty:
        raise OpprofError("no all-gather or reduce-scatter with a size and a time to fit")
    main = fit(ag if len(ag) else rs, Collective.FSDP, workers, 1,
               center, **fields)
    info = dict(main.info)
    if len(rs) and len(ag):
        other = fit(rs, Collective.FSDP, workers, 1, center)
        info["reduce_scatter"] = {"alpha_ns": other.alpha_ns,
                                  "beta_ns_per_byte": other.beta_ns_per_byte, "fit": other.fit,
                                  "samples": other.samples}
    if copy_ns_per_byte is not None:
        info["copy_ns_per_byte"] = float(copy_ns_per_byte)
    main.info = info
    return main
