"""Optimizer steps that run their closure (``optimizer.step(closure)``): the closure's forward
and backward taken out of the step, so that only the optimizer's own work is ``update``.

torch records an optimizer's step as one range, ``Optimizer.step#SGD.step``, around
everything its ``step`` does. Given a closure — Lightning's automatic optimization passes
one that runs ``training_step``, ``zero_grad`` and ``backward`` (and clips the gradients), as
LBFGS' users do — the step calls it first, so the range holds the whole training step and,
being an operator (``weights_update``), would swallow every operator in it as update.

Each call of the closure is found:

* **marked**: ``opprof run`` puts a range ``opprof.closure#<optimizer>`` around each call of
  the closure a step is given (:func:`opprof.collectors.torch._marked_closure`);
* **unmarked** (a trace of your own, such as Lightning's ``PyTorchProfiler``): a step that
  holds backward operators on its own thread (autograd's ``evaluate_function``: the CPU runs
  the backward on the calling thread) ran one closure, from the step's start to the end of
  its last backward operator (LBFGS' work between its evaluations is then not told apart,
  and where the backward runs on a thread of its own — CUDA — the step is left whole).

A step with closures is replaced by its *pieces* outside them, events of the same name on
the same lane (``detail``: :data:`PIECE`) — the time before the first call (pre-hooks),
between calls (as LBFGS does) and after the last (the update itself) — each the optimizer's
(``weights_update``, update).
What ran inside a closure is then nested in no step and is classified as in any loop (its
forward operators forward, autograd's backward; Lightning's gradient clipping, run by the
closure after ``backward()``, takes the phase of the update it leads to, as
``clip_grad_norm_`` does between ``backward()`` and ``step()`` in a plain loop). A step's
``count`` is so its number of pieces (two per step for one closure). An optimizer wrapping
another (ZeRO around SGD) has both its steps split.

Vectorized: sorts and ``searchsorted`` over the steps and closures of all lanes at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.filters import on_host
from opprof.intervals import containing, lane_ids, lane_keys

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.taxonomy import MappingTable

#: torch's range around an optimizer's step.
STEP = r"Optimizer\.step#.*"
#: opprof's range around a call of a step's closure (``opprof.collectors.torch.CLOSURE``).
CLOSURE = r"opprof\.closure#.*"
#: The ``detail`` of a piece of a step.
PIECE = "the optimizer's own part of its step (outside the closure's calls)"


def split_closures(raw: pd.DataFrame, table: MappingTable) -> pd.DataFrame:
    """``raw`` (a Kineto rank's raw events, :mod:`.events`) with every host optimizer step
    that ran a closure replaced by its pieces outside the closure's calls. ``table``: the
    format's mapping table (the names' row phases find unmarked closures)."""
    names = raw["name"]
    cats = pd.Index(names.cat.categories.astype(str))
    codes = names.cat.codes.to_numpy()
    host = on_host(raw).to_numpy(bool)
    is_step = np.append(cats.str.fullmatch(STEP), False)[codes] & host
    if not is_step.any():
        return raw
    is_closure = np.append(cats.str.fullmatch(CLOSURE), False)[codes] & host
    lane = lane_ids(raw["rank"].to_numpy(np.int64), raw["pid"].to_numpy(np.int64),
                    raw["tid"].to_numpy(np.int64))
    ts = raw["ts"].to_numpy(np.int64)
    end = ts + raw["dur"].to_numpy(np.int64)
    steps = np.flatnonzero(is_step)
    c_lane, c_start, c_end = lane[is_closure], ts[is_closure], end[is_closure]
    outer = _outermost(lane[steps], ts[steps], end[steps])
    o_lane, o_start, o_end = lane[steps][outer], ts[steps][outer], end[steps][outer]
    # steps with no marked closure inside: an unmarked one, if backward ran inside them
    marked = containing(c_lane, c_start, c_end, o_lane, o_start, o_end)
    bare = np.ones(len(o_start), bool)
    bare[marked[marked >= 0]] = False
    if bare.any():
        phase_of = table.classify(cats)["phase"].reindex(cats).fillna("")
        row_phase = np.append(phase_of.to_numpy(object), "")[codes]
        i_lane, i_start, i_end = _unmarked(lane, ts, end, host & ~is_step, row_phase,
                                           o_lane[bare], o_start[bare], o_end[bare])
        c_lane, c_start, c_end = (np.r_[c_lane, i_lane], np.r_[c_start, i_start],
                                  np.r_[c_end, i_end])
    if not len(c_start):
        return raw
    return _pieces(raw, steps, lane[steps], ts[steps], end[steps], c_lane, c_start, c_end)


def _outermost(lane: Array, start: Array, end: Array) -> Array:
    """Which intervals no other of their lane encloses (the first of identical ones)."""
    order = np.lexsort((-end, start, lane))
    lane_o, end_o = lane[order], end[order]
    reach = pd.Series(end_o).groupby(lane_o, sort=False).cummax()
    before = reach.groupby(lane_o, sort=False).shift(1).to_numpy(dtype=float)
    out = np.empty(len(start), bool)
    out[order] = np.isnan(before) | (end_o > before)
    return out


def _unmarked(lane: Array, ts: Array, end: Array, candidate: Array,
              row_phase: Array, s_lane: Array, s_start: Array,
              s_end: Array) -> tuple[Array, Array, Array]:
    """The closure each step (non-overlapping per lane) ran, where it holds backward
    operators on its lane: from the step's start to the end of its last backward operator.
    Returns the closures' lane, start, end."""
    idx = np.flatnonzero(candidate & (row_phase == "backward"))
    where = containing(lane[idx], ts[idx], end[idx], s_lane, s_start, s_end)
    inside = where >= 0
    if not inside.any():
        return (np.zeros(0, np.int64),) * 3
    last = pd.Series(end[idx[inside]]).groupby(where[inside]).max()
    found = last.index.to_numpy(np.int64)
    return s_lane[found], s_start[found], last.to_numpy(np.int64)


def _pieces(raw: pd.DataFrame, steps: Array, s_lane: Array, s_start: Array,
            s_end: Array, c_lane: Array, c_start: Array,
            c_end: Array) -> pd.DataFrame:
    """``raw`` with each step that encloses closures (on its lane; closures of a lane do not
    overlap) replaced by the intervals of the step outside them."""
    order = np.lexsort((c_start, c_lane))
    c_lane, c_start, c_end = c_lane[order], c_start[order], c_end[order]
    k_start, k_end, s_from, s_to = lane_keys([c_lane, c_lane, s_lane, s_lane],
                                             [c_start, c_end, s_start, s_end])
    # the closures of a step: those starting at or after it starts and ending by its end,
    # contiguous once sorted
    lo = np.searchsorted(k_start, s_from, side="left")
    hi = np.searchsorted(k_end, s_to, side="right")
    count = np.maximum(hi - lo, 0)
    has = count > 0
    if not has.any():
        return raw
    steps, lo, count = steps[has], lo[has], count[has]
    s_start, s_end = s_start[has], s_end[has]
    # per step: count + 1 pieces, [start, c0) [c0 end, c1) … [c_last end, end)
    pieces = count + 1
    owner = np.repeat(np.arange(len(steps)), pieces)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    first, last = k == 0, k == np.repeat(count, pieces)
    closure_before = np.repeat(lo, pieces) + k - 1
    closure_after = np.repeat(lo, pieces) + k
    p_start = np.where(first, s_start[owner], c_end[np.clip(closure_before, 0, None)])
    p_end = np.where(last, s_end[owner], c_start[np.clip(closure_after, 0,
                                                          len(c_start) - 1)])
    keep = p_end > p_start
    src = steps[owner][keep]
    out = raw.iloc[src].copy()
    out["ts"] = p_start[keep]
    out["dur"] = (p_end - p_start)[keep]
    out["detail"] = PIECE
    if "link" in out:  # a correlation id stays with one piece: the last (the update)
        out["link"] = np.where(last[keep], out["link"].to_numpy(np.int64), -1)
    rest = np.ones(len(raw), bool)
    rest[steps] = False
    return pd.concat([raw[rest], out], ignore_index=True)
