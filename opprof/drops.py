"""Read warnings: the events a reader dropped or repaired, counted per kind, so that a report
says what it could not use (``meta["read_warnings"]``, one ⚠ line per kind).

A kind is a short phrase that reads after its count: ``events skipped: negative duration``,
``step markers unusable``, ``ranks unusable, file order used``. Counts add up across ranks
and files (:func:`merged`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from opprof.arrays import Array

KEY = "read_warnings"


def note(meta: dict[str, Any], kind: str, count: int) -> None:
    """Add ``count`` (when positive) to ``kind`` in ``meta``'s read warnings."""
    count = int(count)
    if count > 0:
        warnings = meta.setdefault(KEY, {})
        warnings[kind] = int(warnings.get(kind, 0)) + count


def skip(meta: dict[str, Any], bad: Array, why: str) -> Array:
    """Count the events of ``bad`` (a boolean mask) as skipped for ``why``; return the mask of
    the events kept."""
    bad = np.asarray(bad, bool)
    note(meta, f"events skipped: {why}", int(bad.sum()))
    return ~bad


def merged(warnings: Iterable[Mapping[str, int] | None]) -> dict[str, int]:
    """The sum of several read warnings, kind by kind."""
    out: dict[str, int] = {}
    for w in warnings:
        for kind, count in (w or {}).items():
            out[kind] = out.get(kind, 0) + int(count)
    return out


def lines(warnings: Mapping[str, int] | None) -> list[str]:
    """One ⚠ line per kind: ``⚠ 3 events skipped: negative duration``."""
    return [f"⚠ {count:,} {kind}" for kind, count in (warnings or {}).items() if count]


def describe(warnings: Mapping[str, int] | None) -> str:
    """Every kind on one line, for an error that refuses a file where nothing was usable."""
    return "; ".join(f"{count:,} {kind}" for kind, count in (warnings or {}).items()) or "none"


#: Events this far past the bulk of a trace's times (from the first quartile of the starts
#: to the third of the ends: robust to a few wild values whatever the trace's size), in
#: spans of the bulk, are outside the trace: a damaged or wrapped time, not a real event ...
SPAN_MARGIN = 20
#: ... and at least this many ns (an hour): ranks' clocks and a profiler's set-up differ.
SPAN_MARGIN_NS = 3600 * 10**9


def timeline_problems(ts: Array, dur: Array) -> tuple[Array, Array]:
    """(negative duration, outside the trace's span) masks of int64 ns starts and durations:
    the events that cannot be placed on a trace's timeline (see :data:`SPAN_MARGIN`)."""
    ts = np.asarray(ts, np.int64)
    dur = np.asarray(dur, np.int64)
    negative = dur < 0
    outside = np.zeros(len(ts), bool)
    ok = ~negative
    if ok.any():
        # an end past int64 (a damaged duration) would wrap round to a time before its start
        fits = dur <= np.iinfo(np.int64).max - np.maximum(ts, 0)
        end = ts + np.where(fits, np.maximum(dur, 0), 0)
        lo, hi = np.percentile(ts[ok], 25), np.percentile(end[ok], 75)
        margin = max(SPAN_MARGIN * (hi - lo), SPAN_MARGIN_NS)
        outside = ok & (~fits | (ts < lo - margin) | (end > hi + margin))
    return negative, outside
