"""The critical path of each step across ranks: a dependency graph built from the trace, the
step split by what bound it (``bound_by``), and a replay of the graph for what-ifs.

The graph (docs/critical-path.md). Nodes: on each host thread, the thread's time cut into
pieces, each owned by the innermost event covering it (markers are not nodes: time only a
marker covers is a gap between pieces); every GPU kernel, copy, memset and device
collective. Each node has a start vertex S and an end vertex E. Edges (``src → dst`` with a
lag: ``t(dst) ≥ t(src) + lag``):

- ``own``: S → E of the node, lag its duration (0 for a synchronizing call and a matched
  collective: they end when what they wait for ends);
- ``order``: the previous node on the same thread or GPU stream, E → S (lag: the measured
  gap on the rank's main thread, where the gap is the framework's own work; 0 elsewhere);
- ``launch``: the runtime call that launched a kernel or copy (the ``link`` correlation id),
  S → S (a blocking copy starts inside its call);
- ``sync``: a synchronizing runtime call (``*Synchronize``, blocking ``cudaMemcpy``) waits for
  the rank's device work that ended last before it returned, E(device) → E(call);
- ``collective``: the k-th call of the same collective in a step on every rank is one
  collective: each rank's call ends after every rank entered it, S(other rank) → E(call);
- ``thread``: on a host thread other than the main one, a node after a gap waits for the
  latest node that ended on another thread of the rank before it started, E → S.

Measured times satisfy every edge with its lag clipped to what was measured, and the edge
that set each vertex's time (the latest ``t(src) + lag``) is its binding predecessor; its lag
is then the measured difference, so replaying the graph with the measured durations gives
every measured time back exactly. The critical path of a step on a rank is the chain of
binding predecessors from the node that ended last in the step back to the step's start; each
nanosecond of the step goes to one ``bound_by`` category (:data:`BOUND_BY`), so they sum to
the step exactly (integer ns).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import step_breakdown
from opprof.analysis.ranks import collectives, match, synchronous
from opprof.filters import names_where, workers
from opprof.intervals import Nesting, containing, lane_ids, lane_keys
from opprof.kinds import ASYNC_TID, BACKEND_SPAN
from opprof.taxonomy import COMM_OPS
from opprof.trace import Trace, rank_slices

if TYPE_CHECKING:
    from opprof.arrays import Array

#: What bound each nanosecond of a step, in report order.
BOUND_BY = ("compute", "comm", "launch", "sync", "load", "idle")
COLUMNS = ["rank", "step", "step_ns", "path_ns", *BOUND_BY]
COMPUTE, COMM, LAUNCH, SYNC, LOAD, IDLE = range(6)
#: Edge types, in the order that breaks ties between equally late predecessors.
OWN, THREAD, LAUNCH_EDGE, ORDER, SYNC_EDGE, COLLECTIVE = range(6)
EDGE_NAMES = ("own", "thread", "launch", "order", "sync", "collective")
#: Host runtime calls that block until the device is done.
SYNC_CALL = re.compile(r"(?i).*synchroni[sz]e.*|(cuda|hip)Memcpy(2D|3D)?(_v\d+)?$"
                       r"|MXNDArrayWait(All|ToRead|ToWrite)")
_DEVICE_KINDS = ("kernel", "memcpy", "memset", "comm")


@dataclass
class Graph:
    """The dependency graph of a trace's worker ranks (vertex ``2i`` starts node ``i``,
    ``2i + 1`` ends it)."""

    rank: Array  # per node
    start: Array  # per node, ns
    end: Array
    op: Array  # canonical op (object), per node
    category: Array  # BOUND_BY code of the node's own time
    src: Array  # per edge: vertex
    dst: Array
    lag: Array  # int64: replay-exact lags
    kind: Array  # edge type
    binding: Array  # per vertex: the edge that set its time, or -1
    steps: pd.DataFrame  # rank, step, start, end, end_vertex, start_vertex
    main: Array  # per node: on its rank's main host thread
    on_device: Array  # per node: a GPU activity
    entry: Array  # per node: the node a collective call that ends with it began with
    #: built one rank at a time (``cross=False``): the rank's synchronous collective calls,
    #: whose cross-rank edges are left out (rank, step, name, seq, first node, last node)
    calls: pd.DataFrame | None = None
    #: per node: on the main thread after a gap in which a transfer in flight completed (the
    #: gap is comm: the thread waited for it); None: no such gap
    waits: Array | None = None
    #: :func:`replay` of the unedited graph, kept once made (the report's critical path and
    #: each what-if compare against it)
    replayed: pd.DataFrame | None = field(default=None, init=False, repr=False)

    @property
    def times(self) -> Array:
        """Measured time of every vertex."""
        t = np.empty(2 * len(self.start), np.int64)
        t[0::2], t[1::2] = self.start, self.end
        return t


def build_graph(trace: Trace, steps: pd.DataFrame | None = None, cross: bool = True) -> Graph:
    """The dependency graph of ``trace`` (all its worker ranks at once: collectives join
    them). ``cross=False``: the collective edges between ranks are left out and the calls
    that would have them are kept in ``Graph.calls`` (a graph built one rank at a time:
    :func:`rank_walk`)."""
    steps = step_breakdown(trace) if steps is None else steps
    ev = trace.events
    worker = workers(ev).to_numpy()
    ts = ev["ts"].to_numpy(np.int64)
    te = ts + ev["dur"].to_numpy(np.int64)
    kind = _strings(ev["kind"])
    is_cpu = _strings(ev["device"]) == "cpu"
    dev_rows = np.flatnonzero(worker & ~is_cpu & np.isin(kind, _DEVICE_KINDS))
    host_rows = np.flatnonzero(worker & is_cpu & (kind != "marker") & (te > ts))
    rank_all = ev["rank"].to_numpy(np.int64)
    pid, tid = ev["pid"].to_numpy(np.int64), ev["tid"].to_numpy(np.int64)
    op_all = _strings(ev["op"])
    is_sync_ev = names_where(ev, lambda name: SYNC_CALL.fullmatch(name) is not None
                             ).to_numpy(bool)
    counted = ev["counted"].to_numpy(bool)
    link = ev["link"].to_numpy(np.int64) if "link" in ev else np.full(len(ev), -1, np.int64)

    # host pieces
    lane_all = lane_ids(rank_all * 2 + (~is_cpu), pid, tid)
    hp = _host_pieces(lane_all[host_rows], ts[host_rows], te[host_rows])
    p_lane, p_s, p_e, p_own = hp
    p_row = host_rows[p_own]
    # the counted operator each piece lies in gives it its op and phase
    crow = host_rows[counted[host_rows]]
    pos = containing(p_lane, p_s, p_e, lane_all[crow], ts[crow], te[crow])
    anc = np.where(pos >= 0, crow[np.maximum(pos, 0)], p_row)
    n_host, n_dev = len(p_s), len(dev_rows)
    n = n_host + n_dev
    rank = np.concatenate([rank_all[p_row], rank_all[dev_rows]])
    lane = np.concatenate([p_lane, lane_all[dev_rows]])
    start = np.concatenate([p_s, ts[dev_rows]])
    end = np.concatenate([p_e, te[dev_rows]])
    row = np.concatenate([p_row, dev_rows])
    op = np.concatenate([op_all[anc], op_all[dev_rows]]).astype(object)
    on_dev = np.concatenate([np.zeros(n_host, bool), np.ones(n_dev, bool)])
    k = kind[row]
    # an operator's (a piece's: the counted operator it lies in) and an event's own kind
    comm_op, load_phase = _among(ev["op"], COMM_OPS), _among(ev["phase"], ("load", "h2d"))
    is_comm = np.concatenate([comm_op[anc], comm_op[dev_rows]]) | _among(ev["kind"],
                                                                          ("comm",))[row]
    is_load = np.concatenate([load_phase[anc], load_phase[dev_rows]]) | _among(
        ev["kind"], ("io",))[row]
    is_sync = ~on_dev & is_sync_ev[row]
    gpu_ranks = np.unique(rank[on_dev])
    host_bound = np.isin(rank, gpu_ranks)  # host time on a GPU rank delays launches
    category = np.full(n, COMPUTE, np.int64)
    category[~on_dev & host_bound] = LAUNCH
    category[~on_dev & (k == "runtime")] = LAUNCH
    category[is_load] = LOAD
    category[is_comm] = COMM
    category[is_sync] = SYNC

    # a point-to-point call in flight (gloo's isend / irecv on a lane of its own, from its
    # posting to its completion: normalizers.kineto.async_lanes) waits for its peer: its lane
    # is no rank's main thread, and it is no step's last work
    in_flight = np.zeros(n, bool)
    # (a profiler's own negative thread ids are no such lane: only a backend's span is)
    span = re.compile(BACKEND_SPAN)
    in_flight[:n_host] = (tid[p_row] <= ASYNC_TID) & names_where(
        ev, lambda name: span.match(name) is not None).to_numpy(bool)[p_row]
    # the main thread of each rank: the host lane busiest inside its steps
    main = _main_lanes(rank, lane, start, end, on_dev | in_flight)
    is_main = np.isin(lane, main)

    t = np.empty(2 * n, np.int64)
    t[0::2], t[1::2] = start, end
    src, dst, nat, etype = [], [], [], []

    def add(s: Array, d: Array, lag: Array | int, e: int) -> None:
        src.append(np.asarray(s, np.int64))
        dst.append(np.asarray(d, np.int64))
        nat.append(np.broadcast_to(np.asarray(lag, np.int64), len(s)).copy())
        etype.append(np.full(len(s), e, np.int64))

    idx = np.arange(n)
    own_lag = end - start
    # order on each thread / stream
    order = np.lexsort((end, start, lane))
    same = lane[order][1:] == lane[order][:-1]
    a, b = order[:-1][same], order[1:][same]
    gap = np.where(is_main[b] & ~on_dev[b], start[b] - end[a], 0)
    add(2 * a + 1, 2 * b, gap, ORDER)
    first_after_gap = np.ones(n, bool)
    first_after_gap[b] = start[b] > end[a]
    # a main-thread gap in which one of the rank's transfers in flight completed: the thread
    # waited for it (a pipeline stage's ``wait()`` on its receive), which is comm, not Python
    waits = np.zeros(n, bool)
    fl = idx[in_flight]
    after = is_main[b] & ~on_dev[b] & (start[b] > end[a])
    if len(fl) and after.any():
        kf, klo, khi = lane_keys([rank[fl], rank[b[after]], rank[b[after]]],
                                 [end[fl], end[a[after]], start[b[after]]])
        kf.sort()
        waits[b[after]] = (np.searchsorted(kf, khi, side="right")
                           > np.searchsorted(kf, klo, side="right"))
    # launch → kernel
    if n_dev and (link[dev_rows] >= 0).any():
        hl = host_rows[link[host_rows] >= 0]
        calls = pd.DataFrame({"rank": rank_all[hl], "link": link[hl], "row": hl,
                              "rt": kind[hl] != "runtime"})
        calls = calls.sort_values(["rt"], kind="stable").drop_duplicates(["rank", "link"])
        kern = pd.DataFrame({"rank": rank[n_host:], "link": link[dev_rows],
                             "node": idx[n_host:]})
        j = kern.merge(calls, on=["rank", "link"], how="inner")
        crow_ = j["row"].to_numpy(np.int64)
        call_piece = containing(lane_all[crow_], ts[crow_], ts[crow_] + 1, p_lane, p_s, p_e)
        ok = call_piece >= 0
        # from the call's start: a blocking copy runs inside its call
        add(2 * call_piece[ok], 2 * j["node"].to_numpy(np.int64)[ok], 0, LAUNCH_EDGE)
    # device work → the synchronizing call that waited for it
    sync_nodes = idx[is_sync & host_bound]
    if len(sync_nodes) and n_dev:
        dn = idx[on_dev]
        kd, ks = lane_keys([rank[dn], rank[sync_nodes]], [end[dn], end[sync_nodes]])
        o = np.argsort(kd, kind="stable")
        p = np.searchsorted(kd[o], ks, side="right") - 1
        cand = dn[o[np.maximum(p, 0)]]
        ok = (p >= 0) & (rank[cand] == rank[sync_nodes]) & (end[cand] > start[sync_nodes])
        add(2 * cand[ok] + 1, 2 * sync_nodes[ok] + 1, 0, SYNC_EDGE)
        own_lag[sync_nodes[ok]] = 0
    # collectives matched across ranks
    calls = _collective_calls(trace, steps, ev, host_rows, dev_rows, p_lane, p_s, p_e,
                              lane_all, ts, te, n_host, matched=cross)
    c_first, c_last = _pairs(calls) if cross else (np.zeros((0, 2), np.int64),) * 2
    entry = idx.copy()
    if not cross and len(calls):
        entry[calls["last"].to_numpy(np.int64)] = calls["first"].to_numpy(np.int64)
    if len(c_first):
        add(2 * c_first[:, 0], 2 * c_last[:, 1] + 1, 0, COLLECTIVE)
        own_lag[np.unique(c_last[:, 1])] = 0
        entry[c_last[:, 1]] = c_first[:, 1]
    # a CPU rank's waiting call (MXNet's WaitAll) waits for its other threads' work
    cpu_sync = idx[is_sync & ~host_bound]
    if len(cpu_sync):
        best = _latest_elsewhere(idx[~on_dev], cpu_sync, end[cpu_sync], rank, lane, start, end)
        ok = best >= 0
        add(2 * best[ok] + 1, 2 * cpu_sync[ok] + 1, 0, SYNC_EDGE)
        own_lag[cpu_sync[ok]] = 0
    # other host threads wait for what ended last elsewhere on the rank
    waiting = idx[~on_dev & ~is_main & first_after_gap]
    if len(waiting):
        best = _latest_elsewhere(idx[~on_dev], waiting, start[waiting], rank, lane, start, end)
        ok = best >= 0
        add(2 * best[ok] + 1, 2 * waiting[ok], 0, THREAD)
    add(2 * idx, 2 * idx + 1, own_lag, OWN)

    src_a, dst_a = np.concatenate(src), np.concatenate(dst)
    nat_a, type_a = np.concatenate(nat), np.concatenate(etype)
    keep = (src_a != dst_a) & (t[src_a] <= t[dst_a])  # a later event cannot have set it
    src_a, dst_a, nat_a, type_a = src_a[keep], dst_a[keep], nat_a[keep], type_a[keep]
    capped = np.minimum(t[src_a] + nat_a, t[dst_a])
    lag = np.minimum(nat_a, t[dst_a] - t[src_a])
    o = np.lexsort((type_a, capped, dst_a))
    last = np.ones(len(o), bool)
    last[:-1] = dst_a[o][1:] != dst_a[o][:-1]
    bind_edges = o[last]
    lag[bind_edges] = t[dst_a[bind_edges]] - t[src_a[bind_edges]]
    binding = np.full(2 * n, -1, np.int64)
    binding[dst_a[bind_edges]] = bind_edges
    g = Graph(rank, start, end, op, category, src_a, dst_a, lag, type_a, binding,
              pd.DataFrame(), is_main, on_dev, entry, None if cross else calls, waits)
    g.steps = _anchors(g, steps, is_main, in_flight)
    return g


def _strings(col: pd.Series) -> Array:
    """A column's values as Python strings (object array; a missing value is ``"nan"``, as
    ``astype(str)`` writes it), built from a categorical's few categories, not per row."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        plain: Array = col.astype(str).to_numpy(object)
        return plain
    names = np.append(col.cat.categories.astype(str).to_numpy(object), "nan")
    values: Array = names[col.cat.codes.to_numpy()]
    return values


def _among(col: pd.Series, values: Collection[str]) -> Array:
    """Per row: whether the column's value (as :func:`_strings` gives it) is one of
    ``values``; a categorical's categories tested, not every row."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return np.isin(_strings(col), list(values))
    names = np.append(col.cat.categories.astype(str).to_numpy(object), "nan")
    found: Array = np.isin(names, list(values))[col.cat.codes.to_numpy()]
    return found


def _host_pieces(lane: Array, s: Array, e: Array
                 ) -> tuple[Array, Array, Array, Array]:
    """Each host lane's time cut at every event boundary, each piece owned by the innermost
    event covering it (consecutive pieces of one owner merged): lane, start, end, owner."""
    if len(s) == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    depth = Nesting(lane, s, e).depth
    pts_lane = np.concatenate([lane, lane])
    pts_t = np.concatenate([s, e])
    (key,) = lane_keys([pts_lane], [pts_t])
    u, first = np.unique(key, return_index=True)
    u_lane, u_t = pts_lane[first], pts_t[first]
    seg = u_lane[1:] == u_lane[:-1]
    g_lane, g_s, g_e = u_lane[:-1][seg], u_t[:-1][seg], u_t[1:][seg]
    owner = np.full(len(g_s), -1, np.int64)
    ke, kg = lane_keys([lane, g_lane], [s, g_s])
    for d in range(int(depth.max()) + 1):
        at = np.flatnonzero(depth == d)
        o = at[np.argsort(ke[at], kind="stable")]
        p = np.searchsorted(ke[o], kg, side="right") - 1
        c = o[np.maximum(p, 0)]
        cover = (p >= 0) & (lane[c] == g_lane) & (e[c] > g_s)
        owner = np.where(cover, c, owner)
    keep = owner >= 0
    g_lane, g_s, g_e, owner = g_lane[keep], g_s[keep], g_e[keep], owner[keep]
    new = np.ones(len(g_s), bool)
    new[1:] = (owner[1:] != owner[:-1]) | (g_lane[1:] != g_lane[:-1]) | (g_s[1:] != g_e[:-1])
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(g_s) - 1]
    return g_lane[new], g_s[new], g_e[last], owner[new]


def _latest_elsewhere(pool: Array, query: Array, at: Array, rank: Array,
                     lane: Array, start: Array, end: Array) -> Array:
    """Per ``query`` node: the ``pool`` node of the same rank on another lane that ended last
    at or before ``at`` (and after the query node started), or -1."""
    best = np.full(len(query), -1, np.int64)
    best_t = np.full(len(query), np.iinfo(np.int64).min)
    for ln in np.unique(lane[pool]):
        mine = pool[lane[pool] == ln]
        mine = mine[np.argsort(end[mine], kind="stable")]
        sel = (rank[query] == rank[mine[0]]) & (lane[query] != ln)
        p = np.searchsorted(end[mine], at, side="right") - 1
        c = mine[np.maximum(p, 0)]
        better = sel & (p >= 0) & (end[c] > best_t)
        best = np.where(better, c, best)
        best_t = np.where(better, end[c], best_t)
    return best


def _main_lanes(rank: Array, lane: Array, start: Array, end: Array,
                skip: Array) -> Array:
    """The busiest host lane of each rank (of the nodes not ``skip``ped)."""
    df = pd.DataFrame({"rank": rank[~skip], "lane": lane[~skip],
                       "busy": (end - start)[~skip]})
    if df.empty:
        return np.zeros(0, np.int64)
    busy = df.groupby(["rank", "lane"])["busy"].sum().reset_index()
    return np.asarray(busy.loc[busy.groupby("rank")["busy"].idxmax(), "lane"], np.int64)


def _collective_calls(trace: Trace, steps: pd.DataFrame, ev: pd.DataFrame,
                      host_rows: Array, dev_rows: Array, p_lane: Array,
                      p_s: Array, p_e: Array, lane_all: Array, ts: Array,
                      te: Array, n_host: int, matched: bool = True) -> pd.DataFrame:
    """The synchronous collective calls with their first and last node (``rank, step,
    name, seq, first, last``): those matched across the trace's ranks (the k-th call of one
    collective in a step on all ranks), or (``matched=False``, one rank's graph) every call
    that may be."""
    cols = ["rank", "step", "name", "seq", "first", "last"]
    none = pd.DataFrame({c: np.zeros(0, np.int64) for c in cols})
    if not synchronous(trace.meta) or steps.empty:
        return none
    timing, _ = collectives(trace)
    if timing.empty:
        return none
    c = match(timing, steps[["rank", "step"]], True)
    if matched:
        c = c[c["matched"]]
    if c.empty:
        return none
    rows = ev.index.get_indexer(c["event"].to_numpy())
    dev_pos = pd.Series(np.arange(len(dev_rows)), index=dev_rows)
    on_dev = np.isin(rows, dev_rows)
    first = np.full(len(rows), -1, np.int64)
    last = np.full(len(rows), -1, np.int64)
    if on_dev.any():
        node = n_host + dev_pos.reindex(rows[on_dev]).to_numpy(np.int64)
        first[on_dev], last[on_dev] = node, node
    h = ~on_dev
    if h.any():
        r = rows[h]
        first[h] = containing(lane_all[r], ts[r], ts[r] + 1, p_lane, p_s, p_e)
        last[h] = containing(lane_all[r], te[r] - 1, te[r], p_lane, p_s, p_e)
    c = c.assign(first=first, last=last)
    c = c[(c["first"] >= 0) & (c["last"] >= 0)]
    return c[cols].reset_index(drop=True)


def _pairs(c: pd.DataFrame) -> tuple[Array, Array]:
    """(first node, last node) pairs: rows ``[j_first, i_last]`` for every two ranks i ≠ j
    of every matched collective."""
    pairs = c.merge(c, on=["step", "name", "seq"], suffixes=("_j", "_i"))
    pairs = pairs[pairs["rank_j"] != pairs["rank_i"]]
    f = np.column_stack([pairs["first_j"].to_numpy(np.int64), pairs["first_i"].to_numpy(
        np.int64)])
    la = np.column_stack([pairs["last_j"].to_numpy(np.int64), pairs["last_i"].to_numpy(
        np.int64)])
    return f, la


def _anchors(g: Graph, steps: pd.DataFrame, is_main: Array, in_flight: Array) -> pd.DataFrame:
    """Per (rank, step): the vertex that ended it (of the nodes started before its end, the
    one that ended last in it — the first, in start order, of the longest reaching — not a
    point-to-point call in flight, which waits for its peer, not for this rank's work) and the
    vertex its start hangs on (the last main-thread vertex at or before it)."""
    out = steps[["rank", "step", "start", "end"]].copy().reset_index(drop=True)
    endv = np.full(len(out), -1, np.int64)
    startv = np.full(len(out), -1, np.int64)
    t = g.times
    for r, rows in out.groupby("rank").groups.items():
        nodes = np.flatnonzero(g.rank == r)
        if (~in_flight[nodes]).any():
            nodes = nodes[~in_flight[nodes]]
        if not len(nodes):
            continue
        rows = np.asarray(rows)
        s0 = out["start"].to_numpy(np.int64)[rows]
        e0 = out["end"].to_numpy(np.int64)[rows]
        o = nodes[np.argsort(g.start[nodes], kind="stable")]
        reach = np.maximum.accumulate(g.end[o])  # the latest end of the nodes started so far
        k = np.searchsorted(g.start[o], e0, side="left")
        has = k > 0
        first = np.searchsorted(reach, reach[np.maximum(k - 1, 0)], side="left")
        endv[rows[has]] = 2 * o[first[has]] + 1
        mains = o[is_main[o]]
        if not len(mains):
            continue
        mv = np.concatenate([2 * mains, 2 * mains + 1])
        mv = mv[np.lexsort((mv, t[mv]))]
        j = np.searchsorted(t[mv], s0, side="right") - 1
        startv[rows] = np.where(j >= 0, mv[np.maximum(j, 0)], -1)
    out["end_vertex"] = endv
    out["start_vertex"] = startv
    return out


def critical_path(trace: Trace, steps: pd.DataFrame | None = None,
                  graph: Graph | None = None, order: Array | None = None) -> pd.DataFrame:
    """One row per (worker rank, step): ``step_ns``, ``path_ns`` (the busy length of the
    critical path inside the step: ``step_ns − idle``), the ``bound_by`` split
    (:data:`BOUND_BY`, integer ns summing to ``step_ns``) and ``replay_ns`` (the step
    replayed through the unedited graph; NaN where the graph cannot be ordered).

    Built one rank at a time (:func:`rank_walk`, then :func:`combine_walks`), as a report
    of a job does it in its workers; ``graph``: a whole-job graph already built (walked and
    replayed whole) and its topological ``order`` when known (:func:`graph_of`)."""
    if graph is not None:
        out = bound_by(graph)
        if order is None:
            order = topological_order(graph) if len(out) else None
        out["replay_ns"] = replay(graph, None, order)["replay_ns"].to_numpy() \
            if order is not None else np.nan
        return out
    ev = trace.events
    walks = []
    for rank, rows in rank_slices(ev):  # one rank's events at a time
        t = Trace(ev.iloc[rows].reset_index(drop=True), trace.meta)
        walks.append(rank_walk(t, None if steps is None else steps[steps["rank"] == rank]))
    return combine_walks(walks, synchronous(trace.meta))


@dataclass
class RankWalk:
    """The critical-path walks of one rank's steps, reduced to what crosses ranks: each
    step's walk cut into segments at the ends of its collective calls (where the binding
    predecessor may be another rank's entry), each segment's parts, and the calls' entry
    and exit times. Small: a few rows per collective call, whatever the rank's events."""

    #: rank, step, start, end, init (the segment from the step's end), replay_ok
    steps: pd.DataFrame
    #: per segment: the six parts (ns), the call it stops at (-1: the walk ends there), the
    #: cursor where it ends
    segments: Array
    #: rank, step, name, seq, s_first, s_last, e_last, own (segment after the call's own
    #: time), coll (segment from its entry); the row's position is the call's id
    calls: pd.DataFrame


_SEG_STOP, _SEG_CURSOR = len(BOUND_BY), len(BOUND_BY) + 1


def rank_walk(trace: Trace, steps: pd.DataFrame | None = None) -> RankWalk:
    """The walks of ``trace``'s steps (one rank, or ranks walked apart) through its own
    graph (:func:`build_graph` with ``cross=False``), cut at its collective calls."""
    steps = step_breakdown(trace) if steps is None else steps
    g = build_graph(trace, steps, cross=False) if len(steps) else None
    seg_cols = len(BOUND_BY) + 2
    empty_steps = pd.DataFrame({"rank": np.zeros(0, np.int64), "step": np.zeros(0, np.int64),
                                "start": np.zeros(0, np.int64), "end": np.zeros(0, np.int64),
                                "init": np.zeros(0, np.int64), "replay_ok": np.zeros(0, bool)})
    calls_cols = ["rank", "step", "name", "seq", "s_first", "s_last", "e_last", "own", "coll"]
    if g is None or not len(g.start):
        return RankWalk(empty_steps, np.zeros((0, seg_cols), np.int64),
                        pd.DataFrame(columns=calls_cols))
    calls = g.calls if g.calls is not None else pd.DataFrame(
        columns=["rank", "step", "name", "seq", "first", "last"])
    first = calls["first"].to_numpy(np.int64)
    last = calls["last"].to_numpy(np.int64)
    segs: list[list[int]] = []
    stop_at = {2 * int(v) + 1: i for i, v in enumerate(last.tolist())}

    replay_ok = _replays_exactly(g)
    cats = _move_categories(g)
    chains = _Chains(g, np.array(sorted(stop_at), np.int64), cats) if replay_ok else None
    # walked vertex by vertex without the chains: Python lists, quicker to index; with
    # them only a few vertices per walk are looked at
    arrays = (g.times, g.binding, g.src, cats)
    t, binding, src, cat = (arrays if chains is not None
                            else tuple(a.tolist() for a in arrays))

    def walk(v: int, start: int, end: int, parts: list[int]) -> int:
        """From vertex ``v`` (the cursor at its time, clamped to the step) back along
        binding predecessors until a call's end or the step's start: a segment's id."""
        cursor = max(min(t[v], end), start) if v >= 0 else end
        seen = set()
        while v >= 0 and cursor > start and v not in seen:
            if chains is not None and t[v] <= end:  # the rest lies inside the step
                stop, cursor = chains.walk(v, start, parts)
                segs.append([*parts, stop_at[stop] if stop >= 0 else -1, cursor])
                return len(segs) - 1
            if v in stop_at:
                segs.append([*parts, stop_at[v], cursor])
                return len(segs) - 1
            seen.add(v)
            e = binding[v]
            if e < 0:
                break
            u = src[e]
            new = max(min(t[u], cursor), start)
            parts[cat[v]] += cursor - new
            cursor = new
            v = u
        segs.append([*parts, -1, cursor])
        return len(segs) - 1

    rows = g.steps
    init = []
    for s in rows.itertuples(index=False):
        start, end, v = int(s.start), int(s.end), int(s.end_vertex)
        parts = [0] * len(BOUND_BY)
        if v >= 0:
            parts[IDLE] += end - max(min(end, t[v]), start)
        init.append(walk(v, start, end, parts))
    step_of = {(int(r), int(st)): (int(a), int(b)) for r, st, a, b in
               rows[["rank", "step", "start", "end"]].itertuples(index=False)}
    own, coll = [], []
    for r, st, f, la in zip(calls["rank"].tolist(), calls["step"].tolist(), first.tolist(),
                            last.tolist(), strict=True):
        start, end = step_of.get((int(r), int(st)), (0, -1))
        if end < start:  # a step with no walk
            own.append(-1)
            coll.append(-1)
            continue
        ve = 2 * la + 1
        cursor = max(min(t[ve], end), start)
        parts = [0] * len(BOUND_BY)
        new = max(min(t[2 * la], cursor), start)  # the call's own last piece
        parts[int(g.category[la])] += cursor - new
        own.append(walk(2 * la, start, end, parts) if new > start
                   else _ended(segs, parts, new))
        coll.append(walk(2 * f, start, end, [0] * len(BOUND_BY)))
    out_calls = pd.DataFrame({
        "rank": calls["rank"].to_numpy(np.int64), "step": calls["step"].to_numpy(np.int64),
        "name": calls["name"].astype(str).to_numpy(object),
        "seq": calls["seq"].to_numpy(np.int64),
        "s_first": g.start[first], "s_last": g.start[last], "e_last": g.end[last],
        "own": np.array(own, np.int64), "coll": np.array(coll, np.int64)})
    out_steps = rows[["rank", "step", "start", "end"]].copy().reset_index(drop=True)
    out_steps["init"] = np.array(init, np.int64)
    out_steps["replay_ok"] = replay_ok
    return RankWalk(out_steps, np.array(segs, np.int64).reshape(-1, seg_cols), out_calls)


class _Chains:
    """The binding predecessors of a graph's vertices as a forest, with what a walk down it
    needs in O(log n) per walk: per vertex its move's category, the sums of the moves'
    lengths per category from it to its root, its depth, the first call end at or below it,
    and jump pointers (``up[k][v]``: 2^k moves down) — all built by pointer doubling, no
    Python loop per vertex. Only for an acyclic graph (:func:`_replays_exactly`).

    A vertex past the root jumps to a sentinel (index ``n``, whose sums and depth are 0 and
    which jumps to itself), so each doubling is a gather and an add with no masks; the sums
    are kept one category per row, so each gather reads one contiguous column (a forest of
    470k vertices: 0.1 s where masked row gathers took 0.6 s)."""

    def __init__(self, g: Graph, stops: Array, cat: Array) -> None:
        t = g.times
        nv = len(t)
        self.t, self.n = t, nv
        b = g.binding
        has = b >= 0
        pred = np.full(nv, -1, np.int64)
        pred[has] = g.src[b[has]]
        self.cat = cat  # per vertex: its move's category (_move_categories)
        move = np.where(has, t - np.where(has, t[np.maximum(pred, 0)], 0), 0)
        sums = np.zeros((len(BOUND_BY), nv + 1), np.int64)  # one row per category
        sums[cat[has], np.flatnonzero(has)] = move[has]
        depth = np.append(has.astype(np.int64), 0)
        first_stop = np.full(nv + 1, -1, np.int64)
        first_stop[stops] = stops
        jump = np.append(np.where(has, pred, nv), nv)
        up = [jump[:nv]]
        while (jump[:nv] != nv).any():
            for row in sums:
                row += row[jump]
            depth += depth[jump]
            first_stop = np.where(first_stop >= 0, first_stop, first_stop[jump])
            jump = jump[jump]
            up.append(jump[:nv])
        self.sums, self.depth, self.first_stop, self.up = sums, depth, first_stop, up
        self.pred = pred

    def last_above(self, v: int, start: int) -> int:
        """The last vertex of ``v``'s chain (``v`` first) whose time is after ``start``
        (times never increase down a chain); ``v`` itself must be."""
        t, up, n = self.t, self.up, self.n
        for k in range(len(up) - 1, -1, -1):
            w = int(up[k][v])
            if w != n and t[w] > start:
                v = w
        return v

    def _add(self, parts: list[int], v: int, below: int) -> None:
        """Add the moves from ``v`` down to ``below`` (excluded; ``n``: to the root) to
        ``parts``, per category."""
        d = self.sums[:, v] - self.sums[:, below]
        for k in range(len(BOUND_BY)):
            parts[k] += int(d[k])

    def walk(self, v: int, start: int, parts: list[int]) -> tuple[int, int]:
        """From ``v`` (at or before the step's end) down the chain, adding each move's part
        inside the step to ``parts``, until a call's end (a stop: (its vertex, cursor)),
        the step's start or the chain's root ((-1, the cursor there))."""
        t = self.t
        if t[v] <= start:
            return -1, start
        x = self.last_above(v, start)  # every vertex from v to x is after the start
        c = int(self.first_stop[v])
        if c >= 0 and self.depth[c] >= self.depth[x]:  # a call's end comes first
            self._add(parts, v, c)
            return c, int(t[c])
        w = int(self.pred[x])
        self._add(parts, v, w if w >= 0 else x)
        if w < 0:  # the root: no binding predecessor
            return -1, int(t[x])
        parts[int(self.cat[x])] -= start - int(t[w])  # the last move, cut at the start
        return -1, start


def _ended(segs: list[list[int]], parts: list[int], cursor: int) -> int:
    segs.append([*parts, -1, cursor])
    return len(segs) - 1


def _replays_exactly(g: Graph) -> bool:
    """Whether replaying the unedited graph gives every measured time back — as it does by
    construction when the graph is acyclic (every vertex's time is then the latest
    ``t(src) + lag`` of its in-edges, the binding one exactly, and the replay is that
    recurrence's one solution): checked vectorized, the recurrence at every vertex and
    acyclicity among the edges whose ends share a time (no other edge can close a cycle:
    times never decrease along an edge)."""
    t = g.times
    nv = len(t)
    if not len(g.src):
        return True
    best = np.full(nv, np.iinfo(np.int64).min)
    np.maximum.at(best, g.dst, t[g.src] + g.lag)
    has_in = np.bincount(g.dst, minlength=nv) > 0
    if not (best[has_in] == t[has_in]).all():
        return False
    same = t[g.src] == t[g.dst]
    s, d = g.src[same], g.dst[same]
    alive = np.ones(len(s), bool)
    while alive.any():  # peel the sources off, level by level
        indeg = np.bincount(d[alive], minlength=nv)
        gone = alive & (indeg[s] == 0)
        if not gone.any():
            return False  # a cycle
        alive &= ~gone
    return True


def combine_walks(walks: list[RankWalk], synchronous: bool) -> pd.DataFrame:
    """The critical-path rows of every (rank, step) from the ranks' walks: a collective
    call whose last entrant (the latest other rank's entry before it ended) came at or
    after its own last piece began binds it to that rank — its transfer is ``comm``, the
    wait from its own entry ``sync``, and the walk goes on from its entry — else its own
    time binds it. Only the calls' entry and exit times cross ranks."""
    walks = [w for w in walks if len(w.steps)]
    if not walks:
        return pd.DataFrame(columns=[*COLUMNS, "replay_ns"])
    steps = pd.concat([w.steps for w in walks], ignore_index=True)
    offsets = np.cumsum([0] + [len(w.segments) for w in walks])
    segs = np.concatenate([w.segments for w in walks])
    calls = pd.concat([w.calls.assign(own=np.where(w.calls["own"] >= 0, w.calls["own"] + o, -1),
                                      coll=np.where(w.calls["coll"] >= 0,
                                                    w.calls["coll"] + o, -1))
                       for w, o in zip(walks, offsets, strict=False)], ignore_index=True)
    call_base = np.cumsum([0] + [len(w.calls) for w in walks])
    stop = segs[:, _SEG_STOP].copy()
    for w, o, cb in zip(walks, offsets, call_base, strict=False):  # call ids: job-wide
        part = stop[o:o + len(w.segments)]
        part[part >= 0] += cb
    init = np.concatenate([w.steps["init"].to_numpy(np.int64) + o
                           for w, o in zip(walks, offsets, strict=False)])
    last_entry = _last_entries(calls, steps, synchronous)
    s_first, s_last = calls["s_first"].tolist(), calls["s_last"].tolist()
    e_last, own, coll = calls["e_last"].tolist(), calls["own"].tolist(), calls["coll"].tolist()
    call_step = calls["step"].tolist()
    seg_parts = segs[:, :len(BOUND_BY)].tolist()
    seg_stop, seg_cursor = stop.tolist(), segs[:, _SEG_CURSOR].tolist()
    rows = []
    for (r, st, start, end, ok), sg in zip(
            steps[["rank", "step", "start", "end", "replay_ok"]].itertuples(index=False),
            init.tolist(), strict=True):
        start, end = int(start), int(end)
        parts = [0] * len(BOUND_BY)
        seen: set[int] = set()
        while True:
            for k, x in enumerate(seg_parts[sg]):
                parts[k] += x
            c = seg_stop[sg]
            if c < 0 or c in seen:
                parts[IDLE] += seg_cursor[sg] - start
                break
            seen.add(c)
            cursor = max(min(e_last[c], end), start)
            t_star = last_entry[c]
            bound = t_star is not None and t_star >= s_last[c] and coll[c] >= 0
            if bound:  # the transfer after the last entrant, the wait for it from the entry
                new = max(min(t_star, cursor), start)
                parts[COMM] += cursor - new
                cursor = max(min(s_first[c], new), start)
                parts[SYNC] += new - cursor
            if call_step[c] != st:
                # a call of another step still running when this one began (an asynchronous
                # all-reduce of the step before): its walks go on in that step, this one ends
                # at its start — after the call's own piece where no other rank bound it
                if not bound:
                    new = max(min(s_last[c], cursor), start)
                    parts[COMM] += cursor - new
                    cursor = new
                parts[IDLE] += cursor - start
                break
            if bound:
                sg = coll[c]
            elif own[c] >= 0:
                sg = own[c]
            else:
                parts[IDLE] += cursor - start
                break
        step_ns = end - start
        rows.append([int(r), int(st), step_ns, step_ns - parts[IDLE], *parts,
                     float(step_ns) if ok else np.nan])
    out = pd.DataFrame(rows, columns=[*COLUMNS, "replay_ns"])
    out[COLUMNS] = out[COLUMNS].astype(np.int64)
    return out.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def _last_entries(calls: pd.DataFrame, steps: pd.DataFrame, synchronous: bool
                  ) -> list[int | None]:
    """Per call: the latest entry (first node's start) of another rank's call of the same
    matched collective (the k-th call of one name in a step on every rank of the step) at
    or before this call's end; None where the call is not matched or none entered before."""
    n = len(calls)
    if not synchronous or not n:
        return [None] * n
    ranks_in_step = steps.groupby("step")["rank"].nunique()
    key = ["step", "name", "seq"]
    g = calls.groupby(key, sort=False)
    count = g["rank"].transform("nunique")
    need = calls["step"].map(ranks_in_step).fillna(0).astype(int)
    matched = ((count == need) & (need >= 2)).to_numpy(bool)
    out: list[int | None] = [None] * n
    sf_all = calls["s_first"].to_numpy(np.int64)
    el_all = calls["e_last"].to_numpy(np.int64)
    rk_all = calls["rank"].to_numpy(np.int64)
    for idx in g.indices.values():
        idx = idx[matched[idx]]
        if len(idx) < 2:
            continue
        sf, el, rk = sf_all[idx], el_all[idx], rk_all[idx]
        o = np.argsort(sf, kind="stable")
        sf_o, rk_o = sf[o], rk[o]
        for i in range(len(idx)):
            p = int(np.searchsorted(sf_o, el[i], side="right")) - 1
            while p >= 0 and rk_o[p] == rk[i]:
                p -= 1
            if p >= 0:
                out[int(idx[i])] = int(sf_o[p])
    return out


def bound_by(g: Graph) -> pd.DataFrame:
    """The bound-by split of every step of ``g``: each step walked back from its end along
    binding predecessors, each move's length (clamped to the step) added to its category; a
    collective call bound to another rank's entry adds its transfer to ``comm`` and the wait
    from its own entry to ``sync``, and the walk goes on from its entry. What each vertex's
    move is (where it goes, how far back in time it reaches, its category) is worked out for
    every vertex at once; the walk only lists the vertices it moves from (:func:`_walk`),
    and the moves' lengths are summed per category at once."""
    m = _Moves.of(g)
    t = g.times
    rows = []
    for s in g.steps.itertuples(index=False):
        start, end = int(s.start), int(s.end)
        parts = np.zeros(len(BOUND_BY), np.int64)
        cursor = end
        v = int(s.end_vertex)
        if v >= 0:
            cursor = max(min(cursor, int(t[v])), start)
            parts[IDLE] += end - cursor
            if cursor > start:
                cursor = m.add(parts, _walk(m.nxt, m.reach, v, start), cursor, start)
        parts[IDLE] += cursor - start
        step_ns = end - start
        rows.append([int(s.rank), int(s.step), step_ns, step_ns - int(parts[IDLE]),
                     *parts.tolist()])
    return pd.DataFrame(rows, columns=COLUMNS).astype(np.int64) if rows else \
        pd.DataFrame(columns=COLUMNS)


def _walk(nxt: list[int], reach: list[int], v: int, start: int) -> Array:
    """The vertices a step's walk moves from, from ``v`` on: each to ``nxt`` (-1: the walk
    ends there, without a move), until a move reaches back to ``start`` or a vertex comes
    again (a cycle of equal times: the walk ends before it)."""
    path: list[int] = []
    append = path.append
    for _ in repeat(None, len(nxt) + 1):
        u = nxt[v]
        if u < 0:
            break
        append(v)
        if reach[v] <= start:
            break
        v = u
    out = np.array(path, np.int64)
    if len(out) > len(nxt):  # a vertex came again: the walk up to its first return
        _, first = np.unique(out, return_index=True)
        seen = np.zeros(len(out), bool)
        seen[first] = True
        out = out[:int(np.argmin(seen))]
    return out


def _move_categories(g: Graph) -> Array:
    """Per vertex: the category (:data:`BOUND_BY`'s index) of the walk's move from it to its
    binding predecessor — a node's own time its category; a main-thread gap (the framework's
    own work) launch, or comm where a transfer in flight completed in it (``Graph.waits``);
    a launch edge launch; a synchronizing call's wait sync; anything else idle."""
    nv = len(g.times)
    b = g.binding
    has = b >= 0
    ek = np.full(nv, -1, np.int64)
    ek[has] = g.kind[b[has]]
    lag = np.zeros(nv, np.int64)
    lag[has] = g.lag[b[has]]
    node = np.arange(nv) >> 1
    cat = np.full(nv, IDLE, np.int64)
    own = ek == OWN
    cat[own] = g.category[node[own]]
    gap = (ek == ORDER) & g.main[node] & ~g.on_device[node] & (lag > 0)
    cat[gap | (ek == LAUNCH_EDGE)] = LAUNCH
    if g.waits is not None:
        cat[gap & g.waits[node]] = COMM
    cat[ek == SYNC_EDGE] = SYNC
    return cat


@dataclass
class _Moves:
    """Per vertex: where the walk moves from it (``nxt``: its binding predecessor, or a
    collective call's own entry when another rank's entry bound it; -1: none), how far back
    in time the move reaches (``reach``), its binding predecessor's time (``to``), its
    category (:data:`BOUND_BY`'s index; -1 for a call bound to another rank) and its own
    entry's time (``entry_t``)."""

    nxt: list[int]
    reach: list[int]
    to: Array
    cat: Array
    entry_t: Array

    @classmethod
    def of(cls, g: Graph) -> _Moves:
        """The moves of every vertex of ``g``."""
        t = g.times
        nv = len(t)
        has = g.binding >= 0
        b = np.where(has, g.binding, 0)
        pred = np.where(has, g.src[b], -1)
        ek = np.where(has, g.kind[b], -1)
        node = np.arange(nv) >> 1
        cat = _move_categories(g)
        cross = has & (ek == COLLECTIVE) & (g.rank[np.maximum(pred, 0) >> 1] != g.rank[node])
        cat[cross] = -1
        to = t[np.maximum(pred, 0)]
        entry_v = 2 * g.entry[node]
        entry_t = t[entry_v]
        nxt = np.where(cross, entry_v, pred)
        reach = np.where(cross, np.minimum(to, entry_t), to)
        return cls(nxt.tolist(), reach.tolist(), to, cat, entry_t)

    def add(self, parts: Array, path: Array, cursor: int, start: int) -> int:
        """Add the moves from the vertices of ``path`` (a walk from ``cursor`` on) to
        ``parts``; the walk's cursor after them. Each move takes the cursor back to its
        predecessor's time (a call bound to another rank: there, then to its own entry's),
        never forward, never before ``start``."""
        if not len(path):
            return cursor
        cat = self.cat[path]
        cross = cat < 0
        width = 1 + cross
        at = np.cumsum(width) - width
        times = np.empty(int(width.sum()), np.int64)
        cats = np.empty(len(times), np.int64)
        times[at] = self.to[path]
        cats[at] = np.where(cross, COMM, cat)
        times[at[cross] + 1] = self.entry_t[path[cross]]
        cats[at[cross] + 1] = SYNC
        cur = np.maximum(np.minimum.accumulate(np.concatenate([[cursor], times])), start)
        np.add.at(parts, cats, cur[:-1] - cur[1:])
        return int(cur[-1])


def graph_of(trace: Trace, steps: pd.DataFrame | None = None
             ) -> tuple[Graph, Array] | None:
    """The graph and a topological order of its vertices, or None where the trace gives no
    usable graph (no worker steps, or dependencies that contradict each other)."""
    steps = step_breakdown(trace) if steps is None else steps
    if steps.empty:
        return None
    g = build_graph(trace, steps)
    if not len(g.start) or (g.steps["end_vertex"] < 0).any():
        return None
    order = topological_order(g)
    return None if order is None else (g, order)


def topological_order(g: Graph) -> Array | None:
    """The vertices in an order that respects every edge (None: the graph has a cycle).

    The graph's edges never go back in time (:func:`build_graph` drops those), so the
    vertices sorted by time respect every edge but those between vertices of one instant;
    those few (an operator starting as the last ended) are ordered by their depth in the
    graph of ties, found by relaxing its edges a few times. A graph whose ties chain
    deeper than :data:`_TIE_ROUNDS`, or with an edge back in time, is ordered by Kahn's
    algorithm vertex by vertex."""
    t = g.times
    ts, td = t[g.src], t[g.dst]
    if (ts <= td).all():
        tie = ts == td
        src, dst = g.src[tie], g.dst[tie]
        level = np.zeros(len(t), np.int64)
        for _ in range(_TIE_ROUNDS):
            deeper = level[src] + 1 > level[dst]
            if not deeper.any():
                order: Array = np.lexsort((level, t))
                return order
            np.maximum.at(level, dst[deeper], level[src[deeper]] + 1)
    return _kahn_order(g)


#: How many rounds of relaxing the edges between vertices of one instant
#: :func:`topological_order` takes before it orders the graph vertex by vertex.
_TIE_ROUNDS = 64


def _kahn_order(g: Graph) -> Array | None:
    """A topological order by Kahn's algorithm (None: the graph has a cycle)."""
    nv = 2 * len(g.start)
    o = np.argsort(g.src, kind="stable")
    out_dst = g.dst[o].tolist()
    indptr = np.searchsorted(g.src[o], np.arange(nv + 1)).tolist()
    indeg = np.bincount(g.dst, minlength=nv).tolist()
    queue = deque(v for v in range(nv) if indeg[v] == 0)
    order = []
    while queue:
        v = queue.popleft()
        order.append(v)
        for k in range(indptr[v], indptr[v + 1]):
            w = out_dst[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                queue.append(w)
    return np.array(order, np.int64) if len(order) == nv else None


def replay(g: Graph, factor: Array | None = None,
           order: Array | None = None, edge_factor: Array | None = None) -> pd.DataFrame:
    """Replay the graph: each vertex at the latest ``t(src) + lag`` of its predecessors
    (sources at their measured times), with each node's own time (and a collective's
    transfer after the last rank entered it) × ``factor[node]`` and each edge's lag ×
    ``edge_factor[edge]`` when given. One row per (rank, step): ``step_ns`` (measured) and
    ``replay_ns``.

    Most vertices have one predecessor (a chain: the time is its predecessor's plus the
    lag); those are summed by pointer doubling down to their chain's first vertex of
    several predecessors or none (an anchor), and only the anchors with several (joins,
    a few percent) are taken one by one, in topological order. Unedited, a graph whose
    lags are exact (:func:`replays_measured`: as :func:`build_graph` makes them) replays
    every vertex at its measured time, which is then taken without the walk."""
    if factor is None and edge_factor is None and g.replayed is not None:
        return g.replayed.copy()
    order = topological_order(g) if order is None else order
    if order is None:
        raise ValueError("the dependency graph has a cycle")
    measured = g.times
    t0 = int(measured.min()) if len(measured) else 0
    if factor is None and edge_factor is None and replays_measured(g):
        t = (measured - t0).astype(np.float64)
    else:
        lag = g.lag.astype(np.float64)
        if factor is not None:
            own = (g.kind == OWN) | (g.kind == COLLECTIVE)
            lag[own] *= factor[g.dst[own] >> 1]
        if edge_factor is not None:
            lag *= edge_factor
        t = _replayed_times(g, lag, order, measured, t0)
    out = g.steps[["rank", "step"]].copy()
    out["step_ns"] = (g.steps["end"] - g.steps["start"]).to_numpy(np.int64)
    rep = []
    for s in g.steps.itertuples(index=False):
        ev_, sv = int(s.end_vertex), int(s.start_vertex)
        e = t[ev_] + (int(s.end) - int(measured[ev_])) if ev_ >= 0 else float(s.end - t0)
        b = t[sv] + (int(s.start) - int(measured[sv])) if sv >= 0 else float(s.start - t0)
        rep.append(e - b)
    out["replay_ns"] = np.array(rep, np.float64)
    out = out.reset_index(drop=True)
    if factor is None and edge_factor is None:
        g.replayed = out.copy()
    return out


def replays_measured(g: Graph) -> bool:
    """Whether the unedited graph replays every vertex at its measured time: no edge's lag
    longer than the time between its ends, and each vertex with a predecessor reached by
    one exactly (then, in topological order, each vertex is the latest of its predecessors'
    times plus lags: its own time). :func:`build_graph` makes its lags so (the binding
    edge's the time between its ends, the others capped by it)."""
    t = g.times
    gap = t[g.dst] - t[g.src]
    if (g.lag > gap).any():
        return False
    reached = np.zeros(len(t), bool)
    reached[g.dst] = True
    exact = np.zeros(len(t), bool)
    exact[g.dst[g.lag == gap]] = True
    return bool(np.array_equal(reached, exact))


def _replayed_times(g: Graph, lag: Array, order: Array, measured: Array, t0: int) -> Array:
    """Every vertex's replayed time (ns after ``t0``, float) with edge lags ``lag`` (see
    :func:`replay`)."""
    nv = 2 * len(g.start)
    t = (measured - t0).astype(np.float64)  # relative: float64 keeps the ns
    indeg = np.bincount(g.dst, minlength=nv)
    # each one-predecessor vertex → its anchor, and the lags summed on the way there
    to_single = np.flatnonzero(indeg[g.dst] == 1)
    anchor = np.arange(nv)
    acc = np.zeros(nv)
    anchor[g.dst[to_single]] = g.src[to_single]
    acc[g.dst[to_single]] = lag[to_single]
    while True:
        nxt = anchor[anchor]
        if np.array_equal(nxt, anchor):
            break
        acc += acc[anchor]
        anchor = nxt
    # the joins in topological order, each at the latest of its in-edges
    joins = order[indeg[order] >= 2]
    if len(joins):
        into = np.flatnonzero(indeg[g.dst] >= 2)
        into = into[np.argsort(g.dst[into], kind="stable")]
        first = np.searchsorted(g.dst[into], joins)
        last = np.searchsorted(g.dst[into], joins, side="right")
        src = g.src[into]
        via = anchor[src].tolist()
        plus = (acc[src] + lag[into]).tolist()
        tl = t.tolist()
        for v, a, b in zip(joins.tolist(), first.tolist(), last.tolist(), strict=True):
            best = tl[via[a]] + plus[a]
            for k in range(a + 1, b):
                x = tl[via[k]] + plus[k]
                if x > best:
                    best = x
            tl[v] = best
        t = np.array(tl)
    replayed: Array = t[anchor] + acc
    return replayed
