"""Interval toolkit every analyzer shares: lane keys, union, cover, containment, the sweep.

Times are int64 nanoseconds; an interval is ``[start, end)``. Everything is vectorized
(sorting and ``searchsorted``), never a Python loop per interval.

- **Lane keys** (:func:`lane_keys`): many independent timelines (lanes: a thread, a rank)
  are laid end to end on one int64 axis, ``lane * width + (t - t0)``, so one sort and one
  ``searchsorted`` answer a question for every lane at once.
- **The sweep** (:class:`Sweep`): the elementary segments between all the boundaries of
  some interval sets; :meth:`Sweep.covered` says which segments a set of intervals covers
  (less another set: a call blocked inside it), :meth:`Sweep.total` adds up segment lengths
  per bin (per step), so unions, intersections and priorities are boolean algebra on
  segments.
- **Union** (:func:`union_length`, :func:`merge`), **labels by cover**
  (:func:`label_points`: which interval of its lane covers each point), **containment**
  (:func:`containing`: which interval of the same lane contains each inner interval) and
  **nesting** (:func:`nest`, :class:`Nesting`: depth and outermost enclosing interval,
  per lane), and **coverage** (:func:`coverage`: how much of a window a union covers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, overload

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from opprof.arrays import Array


def lane_keys(lanes: list[Array], times: list[Array]) -> list[Array]:
    """The same lanes and times as one sortable int64 key each (``lane * width + t - t0``),
    for several arrays sharing one axis. Keys keep the order and equality of (lane, time),
    which is all their users compare; when the lanes times the span would not fit in int64
    (times far apart), each time is replaced by its rank among all the times first, which
    keeps both."""
    present = [t for t in times if len(t)]
    if not present:
        return [np.zeros(len(t), np.int64) for t in times]
    t0 = min(int(t.min()) for t in present)
    width = max(int(t.max()) for t in present) - t0 + 2
    top = max((int(lane.max()) for lane in lanes if len(lane)), default=0) + 1
    if top * width >= np.iinfo(np.int64).max:
        uniq = np.unique(np.concatenate([np.asarray(t, np.int64) for t in present]))
        times = [np.searchsorted(uniq, np.asarray(t, np.int64)) for t in times]
        t0, width = 0, len(uniq) + 2
    return [np.asarray(lane, np.int64) * width + (np.asarray(t, np.int64) - t0)
            for lane, t in zip(lanes, times, strict=True)]


def merge(starts: Array, ends: Array) -> tuple[Array, Array]:
    """The union of intervals as disjoint, sorted intervals (touching ones joined)."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, np.int64)[order], np.asarray(ends, np.int64)[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    out_e = np.zeros(group[-1] + 1, np.int64)
    np.maximum.at(out_e, group, e)
    return s[new], out_e


def union_length(starts: Array, ends: Array) -> int:
    """Total length covered by the union of intervals."""
    s, e = merge(starts, ends)
    return int((e - s).sum())


class Sweep:
    """The elementary segments between every boundary of some intervals.

    ``Sweep(a_start, a_end, b_start, …)`` takes any arrays of boundaries; segment ``i`` is
    ``[points[i], points[i + 1])``."""

    def __init__(self, *boundaries: Array) -> None:
        arrays = [np.asarray(b, np.int64) for b in boundaries if len(b)]
        self.points = np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, np.int64)
        self.length = np.diff(self.points)
        self.start = self.points[:-1]

    def covered(self, starts: Array, ends: Array,
                minus: tuple[Array, Array] | None = None) -> Array:
        """Per segment: covered by at least one interval (all boundaries must be points of
        this sweep); ``minus`` intervals count against the cover (a compute operator is
        not running while it is blocked in a call it issued)."""
        n = len(self.points)
        if len(self.length) == 0:
            return np.zeros(0, bool)
        delta = (np.bincount(np.searchsorted(self.points, starts), minlength=n)
                 - np.bincount(np.searchsorted(self.points, ends), minlength=n))
        if minus is not None and len(minus[0]):
            delta -= np.bincount(np.searchsorted(self.points, minus[0]), minlength=n)
            delta += np.bincount(np.searchsorted(self.points, minus[1]), minlength=n)
        covered: Array = np.cumsum(delta)[:-1] > 0
        return covered

    def bins(self, b_start: Array, b_end: Array) -> Array:
        """Per segment: the index of the sorted, disjoint bin ``[b_start, b_end)`` holding
        it, or ``len(b_start)`` when none does."""
        idx = np.searchsorted(b_start, self.start, side="right") - 1
        inside = (idx >= 0) & (self.start < np.asarray(b_end)[np.maximum(idx, 0)])
        return np.where(inside, idx, len(b_start))

    @overload
    def total(self, mask: Array) -> int: ...

    @overload
    def total(self, mask: Array, bins: Array, n_bins: int) -> Array: ...

    def total(self, mask: Array, bins: Array | None = None,
              n_bins: int = 0) -> Array | int:
        """Length of the masked segments: one int, or int64 per bin (``bins`` from
        :meth:`bins`, ``n_bins`` bins)."""
        if bins is None:
            return int(self.length[mask].sum())
        tot = np.bincount(bins[mask], weights=self.length[mask], minlength=n_bins + 1)
        per_bin: Array = np.rint(tot[:n_bins]).astype(np.int64)
        return per_bin


def label_points(group: Array, t: Array, i_group: Array, i_start: Array,
                 i_end: Array, i_label: Array, default: str | int) -> Array:
    """For each point (group, t): the label of the latest-starting interval of the same
    group that covers it, or ``default``. Intervals of one group are assumed not to overlap."""
    n = len(t)
    out = np.full(n, default, dtype=object if isinstance(default, str) else np.int64)
    if len(i_start) == 0 or n == 0:
        return out
    key_i, end_i, key_p = lane_keys([i_group, i_group, group], [i_start, i_end, t])
    order = np.argsort(key_i, kind="stable")
    key_i, end_i = key_i[order], end_i[order]
    pos = np.searchsorted(key_i, key_p, side="right") - 1
    ok = pos >= 0
    ok[ok] = end_i[pos[ok]] > key_p[ok]
    out[ok] = np.asarray(i_label)[order][pos[ok]]
    return out


def containing(inner_lane: Array, inner_start: Array, inner_end: Array,
               outer_lane: Array, outer_start: Array,
               outer_end: Array) -> Array:
    """Per inner interval: the position of the outer interval of the same lane that contains
    it, or -1. Outer intervals of one lane must not overlap."""
    if len(inner_start) == 0 or len(outer_start) == 0:
        return np.full(len(inner_start), -1, np.int64)
    ko, ki = lane_keys([outer_lane, inner_lane], [outer_start, inner_start])
    order = np.argsort(ko, kind="stable")
    pos = np.searchsorted(ko[order], ki, side="right") - 1
    cand = order[np.maximum(pos, 0)]
    inside = (pos >= 0) & (outer_lane[cand] == inner_lane) & (outer_end[cand] >= inner_end)
    return np.where(inside, cand, -1)


def nest(lane: Array, start: Array, end: Array,
         is_op: Array) -> tuple[Array, Array]:
    """Per interval: nesting depth on its lane, and the index of its outermost enclosing
    ``is_op`` interval (itself when it is outermost; -1 when none encloses it).

    Doubled coordinates: a zero-length interval ends half a tick after it starts, so it
    nests inside an interval starting at the same instant but encloses nothing."""
    return Nesting(lane, start, end).nest(is_op)


class Nesting:
    """:func:`nest` for several sets of operators on the same intervals: the sorting that
    does not depend on which intervals are operators is done once."""

    def __init__(self, lane: Array, start: Array, end: Array) -> None:
        n = self.n = len(start)
        if n == 0:
            return
        t0 = start.min()
        s2 = 2 * (start - t0)
        e2 = 2 * (end - t0) + (end == start)
        ks, ke = lane_keys([lane, lane], [s2, e2])
        self.order = np.lexsort((-ke, ks))
        self.ks_o, self.ke_o = ks[self.order], ke[self.order]
        closed = np.searchsorted(np.sort(self.ke_o), self.ks_o, side="right")
        self.depth = np.empty(n, np.int64)
        self.depth[self.order] = np.arange(n) - closed

    def nest(self, is_op: Array) -> tuple[Array, Array]:
        """(depth, outermost enclosing ``is_op`` interval) per interval, as :func:`nest`."""
        n = self.n
        if n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        order, ks_o, ke_o = self.order, self.ks_o, self.ke_o
        op_o = is_op[order]
        before_ops = np.cumsum(op_o) - op_o
        op_closed = np.searchsorted(np.sort(ke_o[op_o]), ks_o, side="right")
        top = op_o & (before_ops - op_closed == 0)
        last_top = np.maximum.accumulate(np.where(top, np.arange(n), -1))
        safe = np.maximum(last_top, 0)
        encloses = (last_top >= 0) & ((ke_o[safe] > ks_o) | (last_top == np.arange(n)))
        anc_o = np.where(encloses, order[safe], -1)
        anc = np.empty(n, np.int64)
        anc[order] = anc_o
        return self.depth.copy(), anc


def lane_ids(rank: Array, pid: Array, tid: Array) -> Array:
    """One integer per distinct (rank, pid, tid), numbered in order of first appearance
    (what ``groupby(..., sort=False).ngroup()`` gives, without building groups)."""
    if len(rank) == 0:
        return np.zeros(0, np.int64)
    key = np.zeros(len(rank), np.int64)
    for part in (rank, pid, tid):
        codes, uniq = pd.factorize(part)
        key = key * len(uniq) + codes  # distinct combinations stay distinct
        key = pd.factorize(key)[0].astype(np.int64)  # renumber: never overflows
    return key


def coverage(starts: Array, ends: Array) -> Callable[[Array], Array]:
    """For any intervals: the function ``t ↦ length of their union before t`` (vectorized
    over t, float64), so the part of ``[a, b)`` they cover is ``f(b) − f(a)``."""
    s, e = merge(starts, ends)
    before = np.concatenate([[0], np.cumsum(e - s)]).astype(np.float64)

    def covered_before(t: Array) -> Array:
        t = np.asarray(t, np.int64)
        if not len(s):
            return np.zeros(t.shape, np.float64)
        k = np.searchsorted(s, t, side="right") - 1
        kk = np.maximum(k, 0)
        inside = np.clip(t - s[kk], 0, (e - s)[kk])
        return np.where(k >= 0, before[kk] + inside, 0.0)

    return covered_before
