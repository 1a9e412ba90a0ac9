"""Compare opprof's totals with xprof's own framework_op_stats for one XPlane file.

framework_op_stats lists at most the 500 ops with the most time (fewer rows for a larger
profile), so the comparison is per op xprof lists (its ``operation`` is opprof's ``detail``,
its ``type`` the ``name``; type ``Dataset`` = the ``Iterator::*`` events) and per op type over
those ops. Its occurrence counts are compared only where asked: for some ops of larger models
xprof reports 1.5-2x the executions the trace holds, with the same total time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from opprof.trace import Trace


def assert_totals_match_xprof(trace: Trace, path: Path, *, rtol: float = 0.01,
                              counts: bool = True) -> int:
    """Assert per-op and per-type time (and counts) agree; return how many ops xprof lists."""
    from opprof.normalizers.xplane import framework_op_stats

    rank = next(r["rank"] for r in trace.meta["ranks"] if r["source"] == str(path))
    fos = framework_op_stats(path)
    fos = fos[fos["host_or_device"] == "Host"]
    ev = trace.events
    mine = ev[(ev["rank"] == rank) & ev["detail"].notna() & (ev["tid"] != -1)]
    names = mine["name"].astype(str)
    kind = np.where(names.str.startswith("Iterator::"), "Dataset", names)
    ours = mine.groupby([kind, mine["detail"].astype(str)])["dur"].agg(["size", "sum"])
    ours.index.names = ["type", "operation"]
    j = fos.set_index(["type", "operation"]).join(ours, how="left")
    missing = j.index[j["sum"].isna()].tolist()
    assert not missing, f"{path}: ops xprof lists but opprof lacks: {missing[:5]}"
    np.testing.assert_allclose(j["sum"] / 1000, j["total_us"], rtol=rtol)
    per_type = j.groupby(level="type")[["sum", "total_us", "size", "occurrences"]].sum()
    np.testing.assert_allclose(per_type["sum"] / 1000, per_type["total_us"], rtol=rtol)
    if counts:
        np.testing.assert_array_equal(per_type["size"], per_type["occurrences"])
    return len(fos)
