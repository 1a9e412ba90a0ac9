"""Communication per collective: count, bytes, time, algorithm and bus bandwidth, hidden share.

One row per (collective op, process group, group size) over the worker ranks' steps. The
events that time a collective on a rank are those of :func:`opprof.analysis.ranks.collectives`
(its device comm kernels if it has any, else its backend spans ``gloo:all_reduce``, else its
counted host comm calls); each takes the payload and the process group of the call it
belongs to where it has none of its own (an NCCL kernel of a sampled trace: the bytes of the
``c10d::`` call that launched it, found through ``link`` and the call that encloses the
launch), and its call's bytes where they are more (``gloo:all_gather`` names only its input,
``c10d::_allgather_base_`` the gathered buffer too).

- **bytes**: the collective's message size as nccl-tests defines it (``S``: the buffer an
  all-reduce reduces, the gathered buffer of an all-gather, the scattered one of a
  reduce-scatter), from the trace's ``bytes`` column;
- **dim**: the parallel dimension the collective serves (``dp``, ``fsdp``, ``pp``, ``tp``,
  ``cp``, ``ep``: :mod:`opprof.parallelism`, written in ``detail`` as ``parallel=tp`` when the
  trace is read); '' in a trace read by an older opprof;
- **group**, **size**: the process group's name and rank count where the trace names them
  (Kineto's ``Process Group Name`` / ``Group size``, kept in ``detail`` as ``pg=NAME size=N``);
  else the job's one process group where ``distributedInfo`` lists a single one (a gloo
  trace's collectives carry no group of their own); else the group is unnamed; the size, where
  the event has none, is the job's world size (``distributedInfo``, else the worker count);
- **wait** / **transfer**: the part of each execution before the last rank entered it, and
  the rest (:mod:`opprof.analysis.ranks`; all transfer when it is not matched across ranks);
- **algbw** = bytes / transfer time (sums over the collective's executions: nccl-tests times
  a collective all ranks have entered), **busbw** = algbw × the
  collective's factor (nccl-tests' convention, n the group size): all-reduce 2(n−1)/n,
  all-gather, reduce-scatter and all-to-all (n−1)/n, broadcast, send, recv, push and pull 1;
  none for a barrier or an unnamed ``comm``;
- **time** (``time_ns``) is the executions' durations summed, as nccl-tests times them;
  **per step** (``ns_per_step``) is the time a rank had one of them in flight, per (rank,
  step): executions that overlap on a rank — asynchronous sends and receives a pipeline
  schedule keeps open together — counted once, so it never exceeds the step;
- **hidden**: the share of the collective's time during which the rank computed — compute
  kernels on a rank whose collectives run on its GPU (Holistic Trace Analysis' definition),
  compute operators not blocked in a call they issued otherwise (:mod:`opprof.analysis.ranks`;
  what blocks an operator: :func:`opprof.walltime.blocked_spans`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import COMPUTE, container
from opprof.analysis.ranks import collectives
from opprof.filters import communication, counted, kernels, on_host, workers
from opprof.intervals import Sweep
from opprof.trace import Trace
from opprof.walltime import blocked_spans, functional_issues, functional_waits

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.meta import MetaMapping

#: One row per execution of a collective on a rank: what :func:`combine_collectives` adds up
#: (``event``: its row in the rank's events, as in :func:`opprof.analysis.ranks.collectives`).
PART_COLUMNS = ["rank", "event", "op", "dim", "group", "size", "bytes", "ts", "dur",
                "hidden_ns"]
COLUMNS = ["op", "dim", "group", "size", "ranks", "calls", "calls_per_step", "bytes_per_call",
           "ns_per_step", "time_ns", "wait_ns", "transfer_ns", "bytes", "algbw_Bps",
           "busbw_Bps", "hidden"]
_GROUP = r"pg=(?P<group>\S+)"
_SIZE = r"size=(?P<size>\d+)"
_DESC = r"desc=(?P<desc>\S+)"
_DIM = r"parallel=(?P<dim>\S+)"


def bus_factor(op: str, n: int | float) -> float:
    """nccl-tests' bus bandwidth factor of a collective over ``n`` ranks (NaN: none)."""
    if not n or n != n:
        return np.nan
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "send", "recv", "push", "pull"):
        return 1.0
    return np.nan


def collective_part(trace: Trace, *,
                    found: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Every execution of a collective in the steps of the ranks of ``trace``: its op,
    group, size, bytes, duration and the ns of it hidden behind compute (``found``: what
    :func:`opprof.analysis.ranks.collectives` gives for the trace, if already made)."""
    timing, _ = collectives(trace) if found is None else found
    if timing.empty:
        return pd.DataFrame(columns=PART_COLUMNS)
    ev = trace.events
    timing = _with_calls(ev, timing)
    timing["hidden_ns"] = _hidden(ev, timing)
    world = {r: _world_size(trace.meta, int(r)) for r in timing["rank"].unique()}
    only = {r: _only_group(trace.meta, int(r)) for r in timing["rank"].unique()}
    unnamed = timing["group"] == ""
    timing.loc[unnamed, "group"] = timing.loc[unnamed, "rank"].map(only).fillna("")
    timing["size"] = timing["size"].fillna(timing["rank"].map(world)).astype(np.int64)
    return timing[PART_COLUMNS].reset_index(drop=True)


def combine_collectives(parts: list[pd.DataFrame], rank_steps: int,
                        matched: pd.DataFrame | None = None) -> pd.DataFrame:
    """The job's table from every rank's part (``rank_steps``: the (rank, step) rows of the
    job, the denominator of the per-step figures; ``matched``: the collectives matched
    across ranks, :class:`opprof.analysis.ranks.RankAnalysis`'s, whose wait for the last
    rank to enter each is left out of the bandwidth's time, as nccl-tests times a collective
    that every rank has entered)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.concat(parts, ignore_index=True)
    df["wait_ns"] = 0
    if matched is not None and len(matched) and "event" in matched:
        wait = matched.set_index(["rank", "event"])["wait_ns"]
        key = pd.MultiIndex.from_arrays([df["rank"], df["event"]])
        df["wait_ns"] = wait.reindex(key).fillna(0).to_numpy(np.int64)
    if "dim" not in df:  # parts of an older opprof
        df["dim"] = ""
    df["dim"] = df["dim"].fillna("")
    g = df.groupby(["op", "dim", "group", "size"], sort=False)
    out = g.agg(ranks=("rank", "nunique"), calls=("dur", "size"), bytes=("bytes", "sum"),
                time_ns=("dur", "sum"), wait_ns=("wait_ns", "sum"),
                hidden_ns=("hidden_ns", "sum")).reset_index()
    out["transfer_ns"] = out["time_ns"] - out["wait_ns"]
    per = max(rank_steps, 1)
    out["calls_per_step"] = out["calls"] / per
    out["bytes_per_call"] = out["bytes"] / out["calls"]
    out["ns_per_step"] = _in_flight_ns(df, g.ngroup().to_numpy(np.int64), len(out)) / per
    secs = out["transfer_ns"].where(out["transfer_ns"] > 0) / 1e9
    out["algbw_Bps"] = (out["bytes"] / secs).where(out["bytes"] > 0)
    factor = np.array([bus_factor(o, n) for o, n in zip(out["op"], out["size"], strict=True)])
    out["busbw_Bps"] = out["algbw_Bps"] * factor
    out["hidden"] = out["hidden_ns"] / out["time_ns"].where(out["time_ns"] > 0)
    return out.sort_values("time_ns", ascending=False, kind="stable")[COLUMNS].reset_index(
        drop=True)


def _in_flight_ns(df: pd.DataFrame, row: Array, rows: int) -> Array:
    """Per table row (``row``: each execution's row, 0 … ``rows`` − 1): the time its
    executions were in flight, each rank's overlapping executions counted once (the union
    of their spans), summed over the ranks; the durations summed for parts without ``ts``
    (an older opprof's)."""
    if "ts" not in df or df["ts"].isna().any():
        return np.bincount(row, weights=df["dur"].to_numpy(np.float64), minlength=rows)
    ranks = int(df["rank"].max()) + 1
    ts = df["ts"].to_numpy(np.int64)  # integers: float64 loses ns at epoch-scale times
    span = pd.DataFrame({"key": row * ranks + df["rank"].to_numpy(np.int64), "ts": ts,
                         "end": ts + df["dur"].to_numpy(np.int64)})
    span = span.sort_values(["key", "ts"], kind="stable")
    key = span["key"].to_numpy(np.int64)
    reach = span.groupby("key", sort=False)["end"].cummax().to_numpy(np.int64)
    before = np.empty_like(reach)  # the latest end of the key's earlier spans
    before[1:] = reach[:-1]
    before[np.r_[True, key[1:] != key[:-1]]] = np.iinfo(np.int64).min  # a key's first
    start = np.maximum(span["ts"].to_numpy(np.int64), before)
    new = np.clip(span["end"].to_numpy(np.int64) - start, 0, None)
    return np.bincount(key // ranks, weights=new.astype(np.float64), minlength=rows)


def _world_size(meta: MetaMapping, rank: int) -> int:
    """The job's world size as rank ``rank``'s trace says it, else the worker count."""
    info = (meta.get("distributed") or {}).get(str(rank)) or {}
    size = info.get("world_size") if isinstance(info, dict) else None
    try:
        return int(size) if size else int(meta.get("workers") or 1)
    except (TypeError, ValueError):
        return int(meta.get("workers") or 1)


def _only_group(meta: MetaMapping, rank: int) -> str | None:
    """The name of the job's one process group as rank ``rank``'s trace lists it
    (``distributedInfo.pg_config`` with a single group: every collective runs in it), else
    None."""
    info = (meta.get("distributed") or {}).get(str(rank)) or {}
    groups = info.get("pg_config") if isinstance(info, dict) else None
    if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict)):
        return None
    name, desc = groups[0].get("pg_name"), groups[0].get("pg_desc")
    if not isinstance(name, (str, int)) or isinstance(name, bool) or str(name) == "":
        return None
    ok = isinstance(desc, str) and desc and " " not in desc
    return f"{name} ({desc})" if ok else str(name)


def _with_calls(ev: pd.DataFrame, timing: pd.DataFrame) -> pd.DataFrame:
    """``timing`` with bytes (the larger of its own and its call's), group and size (its
    own, else its call's)."""
    host = workers(ev) & on_host(ev)
    cols = ["rank", "pid", "tid", "ts", "dur"]
    read = [*cols, "bytes", "counted", *(["detail"] if "detail" in ev else [])]
    comm = ev.loc[host & communication(ev), read]  # no other column copied
    calls = comm[counted(comm)]
    # a call's payload and group: the largest bytes and the first group among its events
    info = _group_of(comm)
    inner = pd.DataFrame({"call": container(comm[cols], calls[cols]),
                          "bytes": comm["bytes"].to_numpy(np.int64),
                          "group": info["group"].to_numpy(object),
                          "dim": info["dim"].to_numpy(object),
                          "size": info["size"].to_numpy(float)})
    call = inner[inner["call"] >= 0].groupby("call").agg(
        bytes=("bytes", "max"), group=("group", "first"), dim=("dim", "first"),
        size=("size", "first"))
    # a device kernel's call: the one enclosing the runtime call that launched it
    launches = ev.loc[host & (ev["link"] >= 0), [*cols, "link"]]
    key = (launches["rank"].to_numpy(np.int64) * (1 << 40)
           + launches["link"].to_numpy(np.int64))
    t_key = timing["rank"].to_numpy(np.int64) * (1 << 40) + timing["link"].to_numpy(np.int64)
    wanted = np.isin(key, t_key)  # the launches of timing events alone (each on its own)
    launches, key = launches[wanted], pd.Index(key[wanted])
    first = ~key.duplicated(keep="first")
    via_launch = pd.Series(container(launches[cols], calls[cols])[first], index=key[first])
    from_launch = via_launch.reindex(t_key).to_numpy(dtype=float)
    # a host event's call: the call itself, or the one enclosing it
    from_host = container(timing[cols], calls[cols]).astype(float)
    mine = ev.loc[timing["event"], ["device", "bytes", *(["detail"] if "detail" in ev
                                                          else [])]]
    on_device = (mine["device"] != "cpu").to_numpy()
    which = np.where(on_device, from_launch, from_host)
    c = call.reindex(np.where(np.isnan(which), -1, which).astype(np.int64))
    own = _group_of(mine)
    own_bytes = mine["bytes"].to_numpy(np.int64)
    out = timing.copy()
    # the larger: a span may see only its input (gloo:all_gather), its call the whole
    out["bytes"] = np.maximum(own_bytes, c["bytes"].fillna(0).to_numpy()).astype(np.int64)
    group = np.where(own["group"].notna(), own["group"].to_numpy(object),
                     c["group"].to_numpy(object))
    out["group"] = pd.Series(group).fillna("").to_numpy(object)
    dim = np.where(own["dim"].notna(), own["dim"].to_numpy(object), c["dim"].to_numpy(object))
    out["dim"] = pd.Series(dim).fillna("").to_numpy(object)
    out["size"] = np.where(own["size"].notna(), own["size"].to_numpy(float),
                           c["size"].to_numpy(float))
    out["op"] = out["op"].astype(str)
    out["on_device"] = on_device
    return out


def _group_of(events: pd.DataFrame) -> pd.DataFrame:
    """``group`` (name, with its description) and ``size`` of events, from their detail."""
    if "detail" not in events:
        return pd.DataFrame({"group": None, "size": np.nan, "dim": None}, index=events.index)
    detail = events["detail"].to_numpy(object)
    # the patterns run once per distinct text (the events of a group repeat it), not per
    # event
    codes, uniq = pd.factorize(detail, use_na_sentinel=True)
    text = pd.Series([*np.asarray(uniq, dtype=object).tolist(), None], dtype=object)
    text = text.where(text.notna(), "").astype(str)
    name = text.str.extract(_GROUP)["group"]
    desc = text.str.extract(_DESC)["desc"]
    group = name.where(desc.isna(), name + " (" + desc + ")").to_numpy(object)
    size = pd.to_numeric(text.str.extract(_SIZE)["size"], errors="coerce").to_numpy(float)
    dim = text.str.extract(_DIM)["dim"].to_numpy(object)
    at = np.where(codes < 0, len(uniq), codes)

    def column(values: Array) -> Array:
        out: Array = values[at].astype(object)
        out[pd.isna(out)] = None
        return out

    return pd.DataFrame({"group": column(group), "size": size[at], "dim": column(dim)},
                        index=events.index)


def _hidden(ev: pd.DataFrame, timing: pd.DataFrame) -> Array:
    """Per timing event: ns of it during which its rank computed (compute kernels where the
    event is a device kernel, unblocked compute operators otherwise)."""
    out = np.zeros(len(timing), np.int64)
    cols = ["rank", "pid", "tid", "ts", "dur"]  # all that is read of them: no other copied
    worker, comm = workers(ev), communication(ev)
    dev_compute = ev.loc[worker & kernels(ev) & ~comm, cols]
    host = worker & counted(ev) & on_host(ev)
    host_compute = ev.loc[host & ev["phase"].isin(COMPUTE), cols]
    blocked = blocked_spans(ev.loc[host & comm, cols], host_compute,
                            functional_waits(ev), functional_issues(ev))
    ranks = timing["rank"].to_numpy()
    on_device = timing["on_device"].to_numpy(bool)
    ts, end = timing["ts"].to_numpy(np.int64), timing["end"].to_numpy(np.int64)
    for rank in np.unique(ranks):
        for dev, comp, blk in ((True, dev_compute, None), (False, host_compute, blocked)):
            sel = np.flatnonzero((ranks == rank) & (on_device == dev))
            if len(sel):
                out[sel] = _covered_within(ts[sel], end[sel], comp[comp["rank"] == rank],
                                           None if blk is None else blk[blk["rank"] == rank])
    return out


def _covered_within(s: Array, e: Array, comp: pd.DataFrame,
                    blocked: pd.DataFrame | None) -> Array:
    """Per interval [s, e): ns during which a ``comp`` event ran (less ``blocked`` calls)."""
    p_ts = comp["ts"].to_numpy(np.int64)
    p_end = p_ts + comp["dur"].to_numpy(np.int64)
    k_ts = np.zeros(0, np.int64) if blocked is None else blocked["ts"].to_numpy(np.int64)
    k_end = k_ts + (np.zeros(0, np.int64) if blocked is None
                    else blocked["dur"].to_numpy(np.int64))
    sweep = Sweep(s, e, p_ts, p_end, k_ts, k_end)
    if not len(sweep.length):
        return np.zeros(len(s), np.int64)
    busy = sweep.covered(p_ts, p_end, (k_ts, k_end))
    cum = np.r_[0, np.cumsum(np.where(busy, sweep.length, 0))]
    hidden: Array = (cum[np.searchsorted(sweep.points, e)]
                     - cum[np.searchsorted(sweep.points, s)]).astype(np.int64)
    return hidden
