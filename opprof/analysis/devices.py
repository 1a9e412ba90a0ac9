"""GPU timeline per device: compute / communication / memcpy / idle, summing to the span.

Per (rank, device) — every device other than ``cpu`` that ran kernels, copies or memsets —
the *span* runs from the first device event's start to the last one's end, the convention
of Holistic Trace Analysis' temporal breakdown, so the two can be compared. Every instant
of the span goes to exactly one category, by priority:

1. ``comm``: a communication kernel runs (kernel whose op is a collective: NCCL/RCCL kernels by
   name, or kernels launched by a collective);
2. ``compute``: any other kernel runs;
3. ``memcpy``: a memcpy or memset runs (copies and sets; ``memcpy_ns`` includes memsets);
4. ``idle``: nothing runs on the device.

So ``compute_ns + comm_ns + memcpy_ns + idle_ns == span_ns`` exactly. Beside it:
``busy_<category>_ns`` is each category's own union (they overlap when streams run
concurrently), ``sum_<category>_ns`` the plain sum of event durations (what per-kernel
tables add up), ``comm_overlap_ns`` the time communication and compute kernels ran at the
same time (on separate streams), and ``comm_overlap`` that over ``busy_comm_ns``.

Idle time is split by what the device waited for, where the trace allows: each idle gap
(a maximal stretch with nothing running) ends when the next device event starts. When the
host call that launched that event (matched by ``link``) *started after the gap began*, the
device was waiting on the host (``idle_host_ns``): the work had not even been requested.
When the call started before the gap — the work was queued yet did not run — the device
waited on something else (a stream or event dependency, another kernel, another GPU:
``idle_other_ns``). Gaps whose next event has no known launching call (no ``link`` column
in the events table, or a kernel without a recorded API call) are ``idle_unattributed_ns``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.filters import device_work
from opprof.intervals import Sweep
from opprof.taxonomy import COMM_OPS
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array

CATEGORIES = ("comm", "compute", "memcpy")  # priority order; idle is the rest
COLUMNS = [
    "rank", "device", "span_ns", "compute_ns", "comm_ns", "memcpy_ns", "idle_ns",
    "compute_share", "comm_share", "memcpy_share", "idle_share",
    "busy_compute_ns", "busy_comm_ns", "busy_memcpy_ns",
    "sum_compute_ns", "sum_comm_ns", "sum_memcpy_ns",
    "comm_overlap_ns", "comm_overlap", "idle_host_ns", "idle_other_ns", "idle_unattributed_ns",
    "idle_gaps", "kernels", "memcpys", "memsets", "streams", "start", "end", "left_out",
]
SPANS = ("steps", "trace")


def device_breakdown(trace: Trace, span: str = "steps") -> pd.DataFrame:
    """One row per (rank, device) with the GPU time split (``COLUMNS``).

    ``span="steps"`` (the default) keeps the device events launched before the rank's last
    profiled step began — the complete steps, as Holistic Trace Analysis does (the last
    iteration is usually cut short by the profiler stopping, and its tail of idle time is
    not the job's); ``left_out`` counts the events past that point. Events whose launching
    call is unknown are kept when they themselves start before it. A rank with fewer than
    two steps keeps everything. ``span="trace"`` keeps every device event."""
    if span not in SPANS:
        raise ValueError(f"span must be one of {SPANS}, not {span!r}")
    ev = trace.events
    dev = ev.loc[device_work(ev), ["rank", "device", "ts", "dur", "kind", "op", "tid",
                                   *(["link"] if "link" in ev else [])]]  # no other copied
    if dev.empty:
        return pd.DataFrame(columns=COLUMNS)
    launch_ts = launch_times(ev, dev)
    left_out = np.zeros(len(dev), bool)
    if span == "steps":
        cutoff = _last_step_starts(trace, dev["rank"].to_numpy(np.int64))
        when = np.where(launch_ts >= 0, launch_ts, dev["ts"].to_numpy(np.int64))
        left_out = when >= cutoff
    device = dev["device"].astype(str)
    counts = pd.Series(left_out).groupby([dev["rank"].to_numpy(), device.to_numpy()]).sum()
    keep = ~left_out
    dev, launch_ts, device = dev[keep], launch_ts[keep], device[keep]
    if dev.empty:
        return pd.DataFrame(columns=COLUMNS)
    cat = np.where(dev["kind"].to_numpy() != "kernel", 2,
                   np.where(dev["op"].isin(COMM_OPS).to_numpy(), 0, 1))
    rows = []
    keys = pd.DataFrame({"rank": dev["rank"].to_numpy(), "device": device})
    for (rank, device), idx in keys.groupby(["rank", "device"], sort=True).indices.items():
        sub = dev.iloc[idx]
        row = asdict(_one_device(sub["ts"].to_numpy(np.int64), sub["dur"].to_numpy(np.int64),
                                 cat[idx], launch_ts[idx]))
        kinds = sub["kind"].astype(str).to_numpy()
        row.update(rank=int(rank), device=device, kernels=int((kinds == "kernel").sum()),
                   memcpys=int((kinds == "memcpy").sum()),
                   memsets=int((kinds == "memset").sum()),
                   streams=int(sub["tid"].nunique()),
                   left_out=int(counts.get((rank, device), 0)))
        rows.append(row)
    return pd.DataFrame(rows)[COLUMNS]


def _last_step_starts(trace: Trace, rank: Array) -> Array:
    """Per event rank: when its last step began (int64 max for a rank with fewer than two
    steps: nothing is left out)."""
    b = trace.step_bounds()
    g = b.groupby("rank")["start"]
    n, last = g.size(), g.max()
    out = np.full(len(rank), np.iinfo(np.int64).max, np.int64)
    for r in n.index[n.to_numpy() >= 2]:
        out[rank == r] = int(last[r])
    return out


def launch_times(ev: pd.DataFrame, dev: pd.DataFrame) -> Array:
    """Start of the host call that launched each device event (-1 when unknown)."""
    out = np.full(len(dev), -1, dtype=np.int64)
    if "link" not in ev.columns:
        return out
    host = ev.loc[(ev["device"] == "cpu") & (ev["link"] >= 0), ["rank", "link", "ts"]]
    if host.empty:
        return out
    key_h = pd.Index(host["rank"].to_numpy(np.int64) * (1 << 40)
                     + host["link"].to_numpy(np.int64))
    first = ~key_h.duplicated(keep="first")
    key_h, ts_h = key_h[first], host["ts"].to_numpy(np.int64)[first]
    link = dev["link"].to_numpy(np.int64)
    pos = key_h.get_indexer(dev["rank"].to_numpy(np.int64) * (1 << 40) + link)
    ok = (pos >= 0) & (link >= 0)
    out[ok] = ts_h[pos[ok]]
    return out


@dataclass
class IdleCauses:
    """What a device's idle gaps waited for (ns; see the module docstring), and how many
    gaps there were."""

    idle_host_ns: int = 0
    idle_other_ns: int = 0
    idle_unattributed_ns: int = 0
    idle_gaps: int = 0


@dataclass
class DeviceTimes(IdleCauses):
    """One device's span split by category (:func:`_one_device`; ``COLUMNS`` but the rank,
    the device and the counts): ns, shares of the span, each category's own union and plain
    sum, the communication's overlap with compute, and the idle gaps' causes."""

    span_ns: int = 0
    start: int = 0
    end: int = 0
    compute_ns: int = 0
    comm_ns: int = 0
    memcpy_ns: int = 0
    idle_ns: int = 0
    compute_share: float = 0.0
    comm_share: float = 0.0
    memcpy_share: float = 0.0
    idle_share: float = 0.0
    busy_compute_ns: int = 0
    busy_comm_ns: int = 0
    busy_memcpy_ns: int = 0
    sum_compute_ns: int = 0
    sum_comm_ns: int = 0
    sum_memcpy_ns: int = 0
    comm_overlap_ns: int = 0
    comm_overlap: float | None = None  # over busy_comm_ns (None: no communication)


def _one_device(ts: Array, dur: Array, cat: Array, launch: Array) -> DeviceTimes:
    end = ts + dur
    start_all, end_all = int(ts.min()), int(end.max())
    sweep = Sweep(ts, end)
    pts, seg = sweep.points, sweep.length
    cov = {c: sweep.covered(ts[cat == i], end[cat == i]) for i, c in enumerate(CATEGORIES)}
    taken = np.zeros(len(seg), bool)
    own, busy, total = {}, {}, {}
    for c in CATEGORIES:
        mine = cov[c] & ~taken
        own[c] = int(seg[mine].sum())
        taken |= mine
        busy[c] = int(seg[cov[c]].sum())
        total[c] = int(dur[cat == CATEGORIES.index(c)].sum())
    idle = ~taken
    own["idle"] = int(seg[idle].sum())
    span_ns = end_all - start_all
    span = max(span_ns, 1)
    overlap = int(seg[cov["comm"] & cov["compute"]].sum())
    causes = _idle_causes(pts, seg, idle, ts, dur, launch)
    return DeviceTimes(
        span_ns=span_ns, start=start_all, end=end_all,
        compute_ns=own["compute"], comm_ns=own["comm"], memcpy_ns=own["memcpy"],
        idle_ns=own["idle"], compute_share=own["compute"] / span,
        comm_share=own["comm"] / span, memcpy_share=own["memcpy"] / span,
        idle_share=own["idle"] / span, busy_compute_ns=busy["compute"],
        busy_comm_ns=busy["comm"], busy_memcpy_ns=busy["memcpy"],
        sum_compute_ns=total["compute"], sum_comm_ns=total["comm"],
        sum_memcpy_ns=total["memcpy"], comm_overlap_ns=overlap,
        comm_overlap=overlap / busy["comm"] if busy["comm"] else None,
        idle_host_ns=causes.idle_host_ns, idle_other_ns=causes.idle_other_ns,
        idle_unattributed_ns=causes.idle_unattributed_ns, idle_gaps=causes.idle_gaps)


def _idle_causes(pts: Array, seg: Array, idle: Array, ts: Array, dur: Array,
                 launch: Array) -> IdleCauses:
    """Split idle gaps into host / other / unattributed by the next event's launch time."""
    res = IdleCauses()
    if not idle.any():
        return res
    # maximal idle runs: consecutive idle segments (zero-length events may split a run)
    starts = idle & ~np.concatenate([[False], idle[:-1]])
    run = np.cumsum(starts)[idle] - 1
    g0 = pts[:-1][starts]
    g1 = np.zeros(len(g0), np.int64)
    np.maximum.at(g1, run, pts[1:][idle])
    length = np.bincount(run, weights=seg[idle], minlength=len(g0)).astype(np.int64)
    # next event with a duration that starts at or after the gap's end
    real = dur > 0
    order = np.argsort(ts[real], kind="stable")
    ts_sorted, launch_sorted = ts[real][order], launch[real][order]
    nxt = np.searchsorted(ts_sorted, g1, side="left")
    has = nxt < len(ts_sorted)
    lt = np.where(has, launch_sorted[np.minimum(nxt, len(ts_sorted) - 1)], -1)
    known = lt >= 0
    host = known & (lt >= g0)
    res.idle_host_ns = int(length[host].sum())
    res.idle_other_ns = int(length[known & ~host].sum())
    res.idle_unattributed_ns = int(length[~known].sum())
    res.idle_gaps = int(len(g0))
    return res
