"""Read warnings: the events a reader dropped or repaired, counted per kind, so that a report
says what it could not use (``meta["read_warnings"]``, one ⚠ line per kind).

A kind is a short phrase that reads after its count: ``events skipped: negative duration``,
``step markers unusable``, ``ranks unusable, file order used``. Counts add up across ranks
and files (:func:`merged`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

KEY = "read_warnings"


def note(meta: dict, kind: str, count: int) -> None:
    """Add ``count`` (when positive) to ``kind`` in ``meta``'s read warnings."""
    count = int(count)
    if count > 0:
        warnings = meta.setdefault(KEY, {})
        warnings[kind] = int(warnings.get(kind, 0)) + count


def skip(meta: dict, bad: np.ndarray, why: str) -> np.ndarray:
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
