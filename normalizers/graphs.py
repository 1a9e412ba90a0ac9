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
  the whole span as the graph's phase.

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

_BACKWARD = PHASES.index("backward")
_INTRINSIC = [PHASES.index(p) for p in INTRINSIC_PHASES]
_OP = {o: i for i, o in enumerate(CANONICAL_OPS)}
#: Each op's twin inside a backward graph (``fully_connected`` → ``fully_connected_backward``).
BACKWARD_TWIN = np.array([i if o.endswith("_backward") else _OP.get(f"{o}_backward", i)
                          for i, o in enumerate(CANONICAL_OPS)], dtype=np.int64)
#: The suffix of the name of a graph's own-time events.
OWN_TIME = " (own time)"
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
               anc: np.ndarray, operators: np.ndarray) -> None:
        """Give graphs and the outermost operators inside them their phase, and backward
        twins inside backward graphs (in place; ``operators``: host operators that are not
        containers, ``anc`` their outermost enclosing operator)."""
        for lv in range(int(self.level.max()) + 1):
            sel = self.idx[self.level == lv]
            parent = self.inner[sel]
            take = (parent >= 0) & (row_phase[sel] < 0)
            phase[sel[take]] = phase[parent[take]]
        n = len(op)
        child = np.flatnonzero(operators & (self.inner >= 0) & (anc == np.arange(n))
                               & ~np.isin(row_phase, _INTRINSIC))
        phase[child] = phase[self.inner[child]]
        inside = np.zeros(n, bool)
        inside[child] = True
        inside[self.idx] = True
        twin = inside & (phase == _BACKWARD) & (op >= 0)
        op[twin] = BACKWARD_TWIN[op[twin]]

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
        return pd.DataFrame({
            "rank": src["rank"].to_numpy(), "role": src["role"].astype(object).to_numpy(),
            "pid": src["pid"].to_numpy(), "tid": src["tid"].to_numpy(),
            "device": src["device"].astype(object).to_numpy(),
            "ts": starts - base[gpos], "dur": ends - starts,
            "name": src["name"].astype(str).str.replace(_FX_CALL, r"CompiledFxGraph \1…",
                                                        regex=True).to_numpy(object) + OWN_TIME,
            "kind": "cpu_op", "op": src["op"].astype(object).to_numpy(),
            "phase": src["phase"].astype(object).to_numpy(),
            "step": src["step"].to_numpy(np.int32),
            "depth": (src["depth"].to_numpy(np.int64) + 1).astype(np.int16),
            "counted": np.ones(k, bool), "bytes": np.zeros(k, np.int64),
            "detail": "time of the compiled graph that no operator inside it covers",
            "link": np.full(k, -1, np.int64),
        })
