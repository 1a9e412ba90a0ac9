"""Compiled-graph containers in the event table (torch.compile's regions and graphs).

A *container* is an event whose mapping row says ``container`` (``Torch-Compiled Region``,
``CompiledFunction``, ``CompiledFunctionBackward``, the FX graph call): not an operator that
swallows what it encloses, but a region whose operators keep their own op
(``aten::addmm`` there is ``fully_connected``). What :func:`.events.finish` does with
them, through :class:`Graphs`:

* an operator inside a graph that no row maps (an inductor wrapper's own call) is the graph's
  time: it takes the graph's op (``fused``); the fused kernels themselves map to ``fused``;
* a graph has the phase its row gives (``CompiledFunction`` forward,
  ``CompiledFunctionBackward`` backward), else its enclosing graph's (the FX graph call);
  the operators inside take it, unless their own row phase is intrinsic (comm, update …);
* inside a backward graph every operator is the backward of its op (``aten::mm`` there is
  ``fully_connected_backward``, ``fused`` is ``fused_backward``);
* the time of a graph that nothing inside covers — the graph's own Python and runtime
  wrappers between its kernels — becomes counted events named ``<graph> (own time)`` with the
  graph's op and phase, one per uncovered interval (:meth:`Graphs.own_time`; an FX graph
  call's is ``CompiledFxGraph <first 8 characters of its hash>… (own time)``). So a graph's
  span is its operators plus its own time, each counted once, and the phase breakdown sees
  the whole span as the graph's phase. Where the graph's thread is blocked in
  ``loss.backward()`` while the autograd engine runs the backward graph on a thread of its
  own (CUDA training with the whole step compiled), that time is no operator of the graph's:
  it is a backward marker ``<graph> (waiting for backward)``, and the backward operators on
  the engine's thread win it;
* a graph outside any autograd wrapper that starts after its step's backward ended (the
  optimizer step compiled with the rest of the training step, whose ``Optimizer.step``
  range Dynamo drops) is update, on a rank without phase markers.

A container inside an ordinary operator is part of that operator (a compiled optimizer step
inside ``Optimizer.step#…`` is ``weights_update``). Everything is vectorized; the only loop
is over nesting levels of containers (a handful).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from opprof.intervals import Nesting, containing, merge
from opprof.taxonomy import CANONICAL_OPS, INTRINSIC_PHASES, PHASES

_FORWARD, _BACKWARD, _UPDATE = (PHASES.index(p) for p in ("forward", "backward", "update"))
_INTRINSIC = [PHASES.index(p) for p in INTRINSIC_PHASES]
_OP = {o: i for i, o in enumerate(CANONICAL_OPS)}
#: Each op's twin inside a backward graph (``fully_connected`` → ``fully_connected_backward``).
BACKWARD_TWIN = np.array([i if o.endswith("_backward") else _OP.get(f"{o}_backward", i)
                          for i, o in enumerate(CANONICAL_OPS)], dtype=np.int64)
#: The suffix of the name of a graph's own-time events.
OWN_TIME = " (own time)"
#: The suffix of a graph's time spent waiting for the autograd engine's backward (a marker).
WAITING = " (waiting for backward)"
#: An FX graph call; its own time is named by the first characters of the graph's hash.
_FX_CALL = r"^## Call CompiledFxGraph (\w{8})\w* ##$"


@dataclass
class Graphs:
    """The containers of one event table: ``idx`` their event indices, ``level`` their
    nesting level among containers, ``inner`` per event the innermost container enclosing
    it (for a container: the one enclosing it), -1 for none; ``ops`` the host operators
    (containers included)."""

    idx: np.ndarray
    level: np.ndarray
    inner: np.ndarray
    ops: np.ndarray
    ts: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, lane: np.ndarray, ts: np.ndarray, end: np.ndarray, container: np.ndarray,
           ops: np.ndarray) -> Graphs:
        """Find the containers' nesting (``container``: which events are containers)."""
        n = len(ts)
        idx = np.flatnonzero(container)
        inner = np.full(n, -1, np.int64)
        if not len(idx):
            return cls(idx, np.zeros(0, np.int64), inner, ops, ts, end)
        level = Nesting(lane[idx], ts[idx], end[idx]).depth
        level_of = np.full(n, -1, np.int64)
        level_of[idx] = level
        for lv in range(int(level.max()) + 1):  # containers of one level do not overlap
            sel = idx[level == lv]
            pos = containing(lane, ts, end, lane[sel], ts[sel], end[sel])
            hit = (pos >= 0) & ((level_of < 0) | (level_of > lv))
            inner[hit] = sel[pos[hit]]
        return cls(idx, level, inner, ops, ts, end)

    def settle(self, op: np.ndarray, phase: np.ndarray, row_phase: np.ndarray,
               anc: np.ndarray, operators: np.ndarray,
               after_backward: np.ndarray | None = None) -> None:
        """Give graphs and the outermost operators inside them their phase, and backward
        twins inside backward graphs (in place; ``operators``: host operators that are not
        containers, ``anc`` their outermost enclosing operator). ``after_backward`` marks the
        graphs outside any autograd wrapper that start after their step's backward ended on a
        rank without phase markers: the optimizer step compiled with the rest of the training
        step (Dynamo drops its ``Optimizer.step`` range), so update."""
        for lv in range(int(self.level.max()) + 1):
            sel = self.idx[self.level == lv]
            parent = self.inner[sel]
            take = (parent >= 0) & (row_phase[sel] < 0)
            phase[sel[take]] = phase[parent[take]]
            if after_backward is not None:
                phase[sel[after_backward[sel] & (phase[sel] == _FORWARD)]] = _UPDATE
        n = len(op)
        child = np.flatnonzero(operators & (self.inner >= 0) & (anc == np.arange(n))
                               & ~np.isin(row_phase, _INTRINSIC))
        phase[child] = phase[self.inner[child]]
        inside = np.zeros(n, bool)
        inside[child] = True
        inside[self.idx] = True
        twin = inside & (phase == _BACKWARD) & (op >= 0)
        op[twin] = BACKWARD_TWIN[op[twin]]

    def after_backward(self, autograd: np.ndarray, rank: np.ndarray, step: np.ndarray,
                       phase: np.ndarray, host_ops: np.ndarray, unmarked: np.ndarray
                       ) -> np.ndarray:
        """Per event: a graph outside any autograd wrapper (``autograd``: the
        ``CompiledFunction`` / ``CompiledFunctionBackward`` events) on a rank without phase
        markers that starts at or after the end of its step's last backward host operator
        (``host_ops`` whose own row's ``phase`` is backward): see :meth:`settle`."""
        n = len(step)
        out = np.zeros(n, bool)
        idx = self.idx
        under = autograd.copy()
        for lv in range(int(self.level.max()) + 1):
            sel = idx[self.level == lv]
            parent = self.inner[sel]
            under[sel] |= np.where(parent >= 0, under[np.maximum(parent, 0)], False)
        back = host_ops & (phase == _BACKWARD) & (step >= 0)
        cand = idx[~under[idx] & unmarked[idx] & (step[idx] >= 0)]
        if not back.any() or not len(cand):
            return out
        last = pd.Series(self.end[back]).groupby([rank[back], step[back]]).max()
        pos = last.index.get_indexer(pd.MultiIndex.from_arrays([rank[cand], step[cand]]))
        ok = pos >= 0
        ended = np.where(ok, last.to_numpy(np.int64)[np.maximum(pos, 0)], np.iinfo(np.int64).max)
        out[cand[ok & (self.ts[cand] >= ended)]] = True
        return out

    def own_time(self, events: pd.DataFrame) -> pd.DataFrame:
        """The time of each graph that no host operator inside it covers, as counted events
        (one per uncovered interval) with the graph's rank, lane, op, phase and step."""
        idx = self.idx
        pos_of = np.full(len(self.ts), -1, np.int64)
        pos_of[idx] = np.arange(len(idx))
        members = np.flatnonzero(self.ops & (self.inner >= 0))
        g = pos_of[self.inner[members]]
        t0 = int(self.ts[idx].min())
        width = int(self.end[idx].max()) - t0 + 2
        base = np.arange(len(idx), dtype=np.int64) * width - t0
        ms, me = merge(base[g] + self.ts[members], base[g] + self.end[members])
        starts = np.sort(np.r_[base + self.ts[idx], me])
        ends = np.sort(np.r_[ms, base + self.end[idx]])
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        gpos = starts // width
        src = events.iloc[idx[gpos]].reset_index(drop=True)
        k = len(src)
        own_phase = src["phase"].astype(object).to_numpy().copy()
        waits = _waiting_for_backward(events, src["rank"].to_numpy(np.int64),
                                      src["tid"].to_numpy(np.int64), starts - base[gpos],
                                      ends - base[gpos])
        own_phase[waits] = "backward"
        own_op = src["op"].astype(object).to_numpy().copy()
        own_op[waits] = None
        return pd.DataFrame({
            "rank": src["rank"].to_numpy(), "role": src["role"].astype(object).to_numpy(),
            "pid": src["pid"].to_numpy(), "tid": src["tid"].to_numpy(),
            "device": src["device"].astype(object).to_numpy(),
            "ts": starts - base[gpos], "dur": ends - starts,
            "name": src["name"].astype(object).str.replace(_FX_CALL, r"CompiledFxGraph \1…",
                                                        regex=True).to_numpy(object)
            + np.where(waits, WAITING, OWN_TIME),
            "kind": np.where(waits, "marker", "cpu_op"), "op": own_op,
            "phase": own_phase,
            "step": src["step"].to_numpy(np.int32),
            "depth": (src["depth"].to_numpy(np.int64) + 1).astype(np.int16),
            "counted": ~waits, "bytes": np.zeros(k, np.int64),
            "detail": np.where(waits, "the graph's thread waits for the backward pass that the "
                               "autograd engine runs on its own thread",
                               "time of the compiled graph that no operator inside it covers"),
            "link": np.full(k, -1, np.int64),
        })


def _waiting_for_backward(events: pd.DataFrame, rank: np.ndarray, tid: np.ndarray,
                          start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per own-time interval (rank, lane's tid, start, end): whether a backward operator of
    another thread of the rank starts inside it — the graph's thread is blocked in
    ``loss.backward()`` while the autograd engine runs the backward graph on its own thread
    (on a GPU; a whole training step compiled), so that time is backward, not the graph's."""
    ev = events
    back = (ev["counted"].to_numpy(bool) & ev["device"].eq("cpu").to_numpy(bool)
            & ev["phase"].eq("backward").to_numpy(bool))
    out = np.zeros(len(start), bool)
    if not back.any() or not len(start):
        return out
    b_rank = ev["rank"].to_numpy(np.int64)[back]
    b_tid = ev["tid"].to_numpy(np.int64)[back]
    b_ts = ev["ts"].to_numpy(np.int64)[back]
    t0 = int(min(b_ts.min(), start.min()))
    width = int(max(b_ts.max(), end.max()) - t0) + 2
    key = b_rank * width + (b_ts - t0)
    order = np.argsort(key, kind="stable")
    key, b_tid = key[order], b_tid[order]
    lo = np.searchsorted(key, rank * width + (start - t0), side="left")
    hi = np.searchsorted(key, rank * width + (end - t0), side="left")
    # the first backward operator starting inside, on another thread (one lookup: a graph's
    # own lane runs no operator inside its own time)
    first = np.minimum(lo, len(key) - 1)
    return (hi > lo) & (b_tid[first] != tid)
