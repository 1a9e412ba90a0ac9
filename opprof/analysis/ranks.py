"""Multi-rank analysis (any framework): per-rank breakdown, stragglers, waiting vs transfer
in communication, comm/compute overlap, bytes and bandwidth.

Definitions (worker ranks only; times on the common clock the normalizer aligned):

- **Collectives of a rank** — the events that show a collective *executing* on it: its
  device communication kernels/copies (NCCL) if it has any; else its host events named
  ``backend:op`` (``gloo:all_reduce``, ``nccl:all_reduce``: the backend's own span); else its
  counted host ``comm`` events (MXNet push/pull, TF collectives, torch's ``c10d::*``).
- **Bytes** of a rank: its ``backend:op`` spans' payloads if they carry any; else, per
  communication call (a counted host comm event), the largest payload among the call and the
  comm events nested in it (torch's ``record_param_comms`` inside ``c10d::allreduce_``);
  else its device comm events' bytes. Never two levels at once, so nothing is counted twice.
- **Matching** — within a step, the k-th collective of a given name on one rank is the same
  collective as the k-th of that name on every other rank; it is *matched* when every rank
  that has the step has it.
- **Wait vs transfer** (synchronous modes; not for ``ps-async``): a collective cannot finish
  on any rank before the last rank has entered it, so for a matched collective the time
  rank r spends in it from its own start until the last rank starts it, clipped to its
  duration, is *waiting for the slowest rank*; the rest of its duration is *transfer*
  (moving and reducing data). Per rank and step, ``comm_ns`` is the union of its collectives'
  time, ``transfer_ns`` the union of their transfer parts, and ``wait_ns = comm_ns -
  transfer_ns``: time inside some collective while transferring in none. Unmatched
  collectives (and every collective in ``ps-async``) count as transfer. The split is exact
  up to the ranks' clock error (``meta["clock_error_ns"]``: 0 on one machine); with only some
  ranks of a job traced, "the last rank" is the last traced one, so waits are lower bounds.
- **Own time** of a rank in a step: step time minus its wait, i.e. what it spent that the
  others did not make it spend. The **straggler** of a step is the rank with the largest
  own time; ``excess_ns`` is how much it exceeds the median own time of the ranks.
- **Overlap**: collective time during which the rank also ran a compute
  (forward/backward/update) operator; a compute operator is not counted as running while
  it is blocked in a communication call it issued on its own thread (DDP's all-reduce from
  a backward hook). ``overlap`` = overlap / comm. On a rank whose collectives run as device
  kernels, the device's: its comm kernels against its compute kernels, per step the kernels
  it launched, the last step left out of the ratio (``opprof.analysis.breakdown``: Holistic
  Trace Analysis' ``get_comm_comp_overlap``).
- **Bandwidth** = payload bytes / transfer time, over the profiled steps: the algorithm
  bandwidth of nccl-tests ("algbw"), not the bus bandwidth.
- **By collective** (``kinds``): per canonical collective (``all_gather``, ``reduce_scatter``,
  ``all_reduce`` …), calls, the union of their time, the sums of their wait and transfer
  parts, and the share of their time hidden behind compute (on a rank whose collectives run
  as device kernels, compute kernels beside them, as for its overlap) — mean per (rank, step).

All times are per step (means over the rank's steps) unless named ``total``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import COMPUTE, comm_overlap_ratio, container, step_breakdown
from opprof.filters import communication, counted, device_work, kernels, on_host, step_work, workers
from opprof.intervals import Sweep
from opprof.kinds import Mode
from opprof.taxonomy import PHASES
from opprof.trace import Trace
from opprof.walltime import blocked_spans, functional_waits

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.meta import MetaMapping

#: ``backend:op`` span names (one colon; ``c10d::x`` is not one).
BACKEND_SPAN = r"^[A-Za-z]\w*:[A-Za-z_]\w*$"
ASYNC_MODES = (Mode.PS_ASYNC,)
RANK_COLUMNS = ["rank", "steps", "dur_ns", *PHASES, "own_ns", "collectives", "comm_ns",
                "wait_ns", "transfer_ns", "wait_share", "overlap_ns", "overlap", "bytes",
                "bandwidth_Bps"]
KIND_COLUMNS = ["op", "calls", "comm_ns", "wait_ns", "transfer_ns", "wait_share",
                "overlap_ns", "hidden"]
STRAGGLER_COLUMNS = ["step", "ranks", "slowest_rank", "own_ns", "median_own_ns", "excess_ns",
                     "excess_share", "dur_ns", "wait_ns"]


@dataclass
class RankAnalysis:
    """Per-rank rows, the straggler of each step, and every collective with its split."""

    ranks: pd.DataFrame
    per_step: pd.DataFrame
    stragglers: pd.DataFrame
    collectives: pd.DataFrame
    synchronous: bool
    kinds: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=KIND_COLUMNS))


#: the last events table's collectives (:func:`collectives`): the model, its gradients and
#: the dependency graph each ask for them of the same trace. Keyed by the table (a weak
#: reference: it is never kept alive) and pandas' string option, which sets the text columns'
#: type (Arrow-backed text is handed out as Python strings where those are asked for: the
#: report asks within :func:`opprof.strings.plain_strings`); copies handed out, so no caller
#: changes what the next one gets.
_FOUND: dict[int, tuple[weakref.ref[pd.DataFrame], object, pd.DataFrame, pd.DataFrame]] = {}


def collectives(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(timing events: rank, step, pid, tid, name, op, link, ts, dur, end, bytes, event (its
    row label in ``trace.events``); payload: rank, step, bytes) of every worker rank, per the
    rules above."""
    ev = trace.events
    strings = _string_option()
    hit = _FOUND.get(id(ev))
    if hit is not None and hit[0]() is ev:
        if hit[1] == strings:
            return hit[2].copy(), hit[3].copy()
        if hit[1] is True and strings is False:  # Arrow-backed text → Python strings
            return _plain(hit[2]), _plain(hit[3])
    timing, payload = _collectives(ev)
    _FOUND.clear()  # one table at a time
    _FOUND[id(ev)] = (weakref.ref(ev), strings, timing, payload)
    return timing.copy(), payload.copy()


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` with its text columns as object arrays of Python strings: what
    :func:`_collectives` gives within :func:`opprof.strings.plain_strings` (checked on every
    fixture: tests/test_shared_work.py)."""
    out = df.copy()
    for c in out.columns:
        if isinstance(out[c].dtype, pd.StringDtype):
            out[c] = out[c].astype(object)
    return out


def _string_option() -> object:
    """pandas' ``future.infer_string`` (None where this pandas has no such option)."""
    try:
        return pd.get_option("future.infer_string")
    except (KeyError, pd.errors.OptionError):
        return None


def _collectives(ev: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`collectives` of one events table, computed."""
    base = step_work(ev) & communication(ev)
    host = on_host(ev)
    is_span = _name_matches(ev, BACKEND_SPAN)
    device, spans = base & device_work(ev), base & host & is_span
    calls = base & host & ev["counted"]
    cols = ["rank", "step", "pid", "tid", "name", "op", "link", "ts", "dur", "bytes"]

    def first_per_rank(options: list[pd.DataFrame]) -> pd.DataFrame:
        done: set[int] = set()
        parts = []
        for df in options:
            take = df[~df["rank"].isin(done)]
            parts.append(take)
            done |= set(take["rank"].unique())
        return pd.concat(parts)

    timing = first_per_rank([ev.loc[m, cols] for m in (device, spans, calls)])
    timing["name"] = timing["name"].astype(str)
    timing["op"] = timing["op"].astype(str)
    timing["end"] = timing["ts"] + timing["dur"]
    timing["event"] = timing.index  # its row in the events table
    timing = timing.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)

    # A call's payload: the largest byte count among it and the comm events nested in it.
    outer = ev.loc[calls, ["rank", "step", "pid", "tid", "ts", "dur", "bytes"]]
    inner = ev.loc[base & host & ~ev["counted"], ["rank", "pid", "tid", "ts", "dur",
                                                         "bytes"]]
    pos = container(inner, outer)
    call_bytes = outer["bytes"].to_numpy().copy()
    if (pos >= 0).any():
        np.maximum.at(call_bytes, pos[pos >= 0], inner["bytes"].to_numpy()[pos >= 0])
    outer = outer.assign(bytes=call_bytes)
    pay_cols = ["rank", "step", "bytes"]
    payload = first_per_rank([df.loc[df["bytes"] > 0, pay_cols] for df in
                              (ev.loc[spans, pay_cols], outer, ev.loc[device, pay_cols])])
    return timing, payload.reset_index(drop=True)


def _name_matches(ev: pd.DataFrame, pattern: str) -> Array:
    """Per event: does its name fully match ``pattern`` (evaluated once per distinct name)."""
    names = ev["name"].cat.categories.astype(str)
    hit = pd.Series(names).str.match(pattern).to_numpy()
    codes = ev["name"].cat.codes.to_numpy()
    return np.where(codes >= 0, hit[np.maximum(codes, 0)], False) if len(hit) else \
        np.zeros(len(ev), bool)


def match(coll: pd.DataFrame, bounds: pd.DataFrame, synchronous: bool) -> pd.DataFrame:
    """Add ``seq`` (k-th of its name in its rank's step), ``matched``, ``last_enter``,
    ``wait_ns`` and ``transfer_ns`` to each collective."""
    c = coll.copy()
    c["seq"] = c.groupby(["rank", "step", "name"], sort=False).cumcount()
    c["matched"] = False
    c["last_enter"] = c["ts"]
    if synchronous and len(c):
        ranks_in_step = bounds.groupby("step")["rank"].nunique()
        g = c.groupby(["step", "name", "seq"], sort=False)
        n = g["rank"].transform("nunique")
        need = c["step"].map(ranks_in_step).fillna(0).astype(int)
        c["matched"] = (n == need) & (need >= 2)
        c["last_enter"] = np.where(c["matched"], g["ts"].transform("max"), c["ts"])
    wait_end = np.minimum(np.maximum(c["last_enter"], c["ts"]), c["end"])
    c["wait_ns"] = (wait_end - c["ts"]).astype(np.int64)
    c["transfer_ns"] = (c["dur"] - c["wait_ns"]).astype(np.int64)
    return c


@dataclass
class RankLocal:
    """What the multi-rank analysis needs from each rank, computed on that rank alone: its
    collectives (``timing``) and payloads (small tables), and per step the union of its
    collectives (``comm_ns``) and the part of it during which compute ran (``overlap_ns``).
    Tables of several ranks concatenate (:func:`concat_local`)."""

    timing: pd.DataFrame
    payload: pd.DataFrame
    comm: pd.DataFrame
    kinds: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["rank", "step", "op", "comm_ns", "overlap_ns"]))


def rank_local(trace: Trace, steps: pd.DataFrame, *,
               found: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> RankLocal:
    """The per-rank half of the analysis (``steps``: the trace's step_breakdown; ``found``:
    its :func:`collectives`, if already made)."""
    timing, payload = collectives(trace) if found is None else found
    ev = trace.events
    cols = ["rank", "pid", "tid", "ts", "dur", "device"]  # what is read: no other copied
    done = workers(ev) & counted(ev)
    compute = ev.loc[done & ev["phase"].isin(COMPUTE), cols]
    host_comm = ev.loc[done & communication(ev) & on_host(ev), cols]
    blocked = blocked_spans(host_comm, compute[on_host(compute)],
                            functional_waits(ev))
    # on a GPU rank, what hides a collective is a compute kernel beside it (HTA's definition)
    dev_compute = ev.loc[workers(ev) & kernels(ev) & ~communication(ev), cols]
    frames, kinds = [], []
    for rank, b in steps.groupby("rank", sort=True):
        b = b.sort_values("start")
        c = timing[timing["rank"] == rank]
        args = (compute[compute["rank"] == rank], blocked[blocked["rank"] == rank])
        part = _comm_overlap(b, c, *args)
        if "comm_on_device" in b and b["comm_on_device"].any():  # the device's overlap
            part["overlap_ns"] = b["comm_overlap_ns"].to_numpy(np.int64)
            args = (dev_compute[dev_compute["rank"] == rank], blocked.iloc[:0])
        frames.append(part)
        kinds += [_comm_overlap(b, c[c["op"] == op], *args).assign(op=op)
                  for op in pd.unique(c["op"])]
    cols = ["rank", "step", "comm_ns", "overlap_ns"]
    comm = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
    local = RankLocal(timing, payload, comm)
    if kinds:
        local.kinds = pd.concat(kinds, ignore_index=True)
    return local


def concat_local(parts: list[RankLocal]) -> RankLocal:
    """Several ranks' RankLocal as one (ranks in the order given)."""
    def cat(frames: list[pd.DataFrame]) -> pd.DataFrame:
        frames = [f for f in frames if len(f)] or frames[:1]
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return RankLocal(cat([p.timing for p in parts]), cat([p.payload for p in parts]),
                     cat([p.comm for p in parts]), cat([p.kinds for p in parts]))


def rank_analysis(trace: Trace, steps: pd.DataFrame | None = None) -> RankAnalysis:
    """Everything above for one trace (``steps``: its step_breakdown, if already made)."""
    steps = step_breakdown(trace) if steps is None else steps
    return combine_ranks(steps, rank_local(trace, steps), synchronous(trace.meta))


def synchronous(meta: MetaMapping) -> bool:
    """Whether the run's mode makes ranks wait for each other (not ``ps-async``)."""
    return str(meta.get("mode", "")) not in ASYNC_MODES


def combine_ranks(steps: pd.DataFrame, local: RankLocal, synchronous: bool) -> RankAnalysis:
    """The cross-rank half: match collectives across ranks, split wait from transfer, and
    build the per-rank rows and stragglers — all on small per-rank tables."""
    bounds = steps[["rank", "step", "start", "end"]]
    coll = match(local.timing, bounds, synchronous)
    per_step = _per_step(steps, coll, local)
    return RankAnalysis(_rank_rows(per_step), per_step, _stragglers(per_step), coll,
                        synchronous, _kinds(coll, local.kinds, len(steps)))


def _kinds(coll: pd.DataFrame, kinds: pd.DataFrame, pairs: int) -> pd.DataFrame:
    """Per collective kind, mean per (rank, step): calls, time (union), wait and transfer
    (sums over its collectives), and the share of its time hidden behind compute."""
    if coll.empty or kinds.empty:
        return pd.DataFrame(columns=KIND_COLUMNS)
    n = max(pairs, 1)
    g = coll.groupby("op")
    k = kinds.groupby("op")[["comm_ns", "overlap_ns"]].sum()
    out = pd.DataFrame({"calls": g.size() / n, "wait_ns": g["wait_ns"].sum() / n,
                        "transfer_ns": g["transfer_ns"].sum() / n,
                        "wait_share": g["wait_ns"].sum() / g["dur"].sum().where(
                            g["dur"].sum() > 0)})
    out = out.join(k / n, how="left")
    out["hidden"] = out["overlap_ns"] / out["comm_ns"].where(out["comm_ns"] > 0)
    out = out.reset_index().sort_values("comm_ns", ascending=False, kind="stable")
    return out.reset_index(drop=True)[KIND_COLUMNS]


def _per_step(steps: pd.DataFrame, coll: pd.DataFrame, local: RankLocal) -> pd.DataFrame:
    """One row per (rank, step): the step breakdown plus comm, wait, transfer, overlap,
    collectives and bytes."""
    frames = [_transfer(b.sort_values("start"), coll[coll["rank"] == rank])
              for rank, b in steps.groupby("rank", sort=True)]
    cols = ["rank", "step", "transfer_ns"]
    xfer = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
    out = steps.merge(local.comm, on=["rank", "step"], how="left")
    out = out.merge(xfer, on=["rank", "step"], how="left")
    out["wait_ns"] = out["comm_ns"] - out["transfer_ns"]
    n = coll.groupby(["rank", "step"]).size().rename("collectives")
    nbytes = local.payload.groupby(["rank", "step"])["bytes"].sum().rename("bytes")
    out = out.join(n, on=["rank", "step"]).join(nbytes, on=["rank", "step"])
    for col in ("collectives", "bytes", "comm_ns", "transfer_ns", "overlap_ns", "wait_ns"):
        out[col] = out[col].fillna(0).astype(np.int64)
    out["own_ns"] = out["dur_ns"] - out["wait_ns"]
    return out


def _comm_overlap(b: pd.DataFrame, c: pd.DataFrame, comp: pd.DataFrame,
                  blk: pd.DataFrame) -> pd.DataFrame:
    """comm and overlap ns per step of one rank: the union of its collectives inside the
    step bounds, and the part of it during which a compute operator ran (not blocked)."""
    s_start = b["start"].to_numpy(np.int64)
    s_end = b["end"].to_numpy(np.int64)
    c_ts, c_end = c["ts"].to_numpy(np.int64), c["end"].to_numpy(np.int64)
    p_ts = comp["ts"].to_numpy(np.int64)
    p_end = p_ts + comp["dur"].to_numpy(np.int64)
    k_ts = blk["ts"].to_numpy(np.int64)
    k_end = k_ts + blk["dur"].to_numpy(np.int64)
    sweep = Sweep(s_start, s_end, c_ts, c_end, p_ts, p_end, k_ts, k_end)
    step_i = sweep.bins(s_start, s_end)
    comm = sweep.covered(c_ts, c_end)
    busy = sweep.covered(p_ts, p_end, (k_ts, k_end))
    n = len(b)
    return pd.DataFrame({"rank": b["rank"].to_numpy(), "step": b["step"].to_numpy(),
                         "comm_ns": sweep.total(comm, step_i, n),
                         "overlap_ns": sweep.total(comm & busy, step_i, n)})


def _transfer(b: pd.DataFrame, c: pd.DataFrame) -> pd.DataFrame:
    """transfer ns per step of one rank: the union of its collectives' transfer parts
    (from the last rank's entry to the end) inside the step bounds."""
    s_start = b["start"].to_numpy(np.int64)
    s_end = b["end"].to_numpy(np.int64)
    c_end = c["end"].to_numpy(np.int64)
    x_ts = c["ts"].to_numpy(np.int64) + c["wait_ns"].to_numpy(np.int64)
    sweep = Sweep(s_start, s_end, x_ts, c_end)
    return pd.DataFrame({"rank": b["rank"].to_numpy(), "step": b["step"].to_numpy(),
                         "transfer_ns": sweep.total(sweep.covered(x_ts, c_end),
                                                    sweep.bins(s_start, s_end), len(b))})


def _rank_rows(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per rank: means per step, shares and bandwidth over all its steps."""
    if per_step.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    g = per_step.groupby("rank")
    mean_cols = ["dur_ns", *PHASES, "own_ns", "collectives", "comm_ns", "wait_ns",
                 "transfer_ns", "overlap_ns", "bytes"]
    out = g[mean_cols].mean()
    out.insert(0, "steps", g.size())
    tot = g[["comm_ns", "wait_ns", "transfer_ns", "overlap_ns", "bytes"]].sum()
    comm = tot["comm_ns"].where(tot["comm_ns"] > 0)
    out["wait_share"] = tot["wait_ns"] / comm
    out["overlap"] = tot["overlap_ns"] / comm
    if "comm_on_device" in per_step:  # the device's ratio, as the step breakdown's
        ratio = pd.Series({r: comm_overlap_ratio(s) for r, s in
                           per_step[per_step["comm_on_device"].astype(bool)].groupby("rank")},
                          dtype=float)
        out.loc[ratio.index, "overlap"] = ratio
    xfer = tot["transfer_ns"].where(tot["transfer_ns"] > 0)
    out["bandwidth_Bps"] = (tot["bytes"] / (xfer / 1e9)).where(tot["bytes"] > 0)
    return out.reset_index()[RANK_COLUMNS]


def _stragglers(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per step with at least two ranks: the rank with the largest own time and its excess
    over the median."""
    if per_step.empty:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    ps = per_step[per_step.groupby("step")["rank"].transform("nunique") >= 2]
    if ps.empty:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    g = ps.groupby("step")
    top = ps.loc[g["own_ns"].idxmax()].set_index("step")
    med = g["own_ns"].median()
    out = pd.DataFrame({
        "ranks": g["rank"].nunique(), "slowest_rank": top["rank"], "own_ns": top["own_ns"],
        "median_own_ns": med, "excess_ns": top["own_ns"] - med,
        "excess_share": (top["own_ns"] - med) / med.where(med > 0),
        "dur_ns": top["dur_ns"], "wait_ns": top["wait_ns"],
    })
    return out.reset_index()[STRAGGLER_COLUMNS]
