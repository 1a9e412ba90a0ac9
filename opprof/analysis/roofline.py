"""The roofline of each operator: its arithmetic intensity, what it achieved, and what bound it.

For one row of work (a canonical operator and phase, or one GPU kernel): ``intensity`` =
FLOPs / bytes; achieved FLOP/s and bytes/s over its time (its kernels' time on a GPU trace, its
host time on a CPU trace); the roofline at that intensity is ``min(peak FLOP/s, intensity ×
peak bytes/s)`` and ``roofline_share`` the part of it achieved. ``bound``:

* ``compute``: the intensity is at or past the ridge (peak FLOP/s / peak bytes/s) — more FLOP/s
  would need a faster processor;
* ``memory``: below the ridge — the bytes it moves bound it;
* ``latency-overhead``: it achieves under :data:`LATENCY_SHARE` of its roofline — neither
  limit holds it: launch latency, synchronization, dispatch or Python overhead, many tiny calls.

The peak of a row is the matmul rate of its precision for matmul-like work (model FLOPs), the
vector rate otherwise. A row whose FLOPs or bytes are unknown has no intensity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from opprof.flops.peaks import Peak

#: Below this share of its roofline an operator is latency- or overhead-bound.
LATENCY_SHARE = 0.10
COLUMNS = ["op", "phase", "flops", "bytes", "intensity", "achieved_flops_per_s",
           "achieved_bytes_per_s", "roofline_share", "bound"]


def roofline(work: pd.DataFrame, peak: Peak, n_steps: int) -> pd.DataFrame:
    """Roofline rows of ``work`` (one row each: ``flops``, ``model_flops``, ``mem_bytes``,
    ``time_ns``, ``precision``, and its keys), FLOPs and bytes per step (of ``n_steps``),
    largest time first. Keeps ``work``'s other columns (``op``, ``phase``, ``kernel`` …) and
    adds ``time_ns_per_step``, ``peak_flops_per_s``."""
    if work.empty:
        return pd.DataFrame(columns=[*COLUMNS, "time_ns_per_step", "peak_flops_per_s"])
    w = work[work["flops"].notna() | work["mem_bytes"].notna()].copy()
    if w.empty:
        return pd.DataFrame(columns=[*COLUMNS, "time_ns_per_step", "peak_flops_per_s"])
    steps = max(n_steps, 1)
    t = w["time_ns"].to_numpy(np.float64) / 1e9
    flops = w["flops"].to_numpy(np.float64)
    nbytes = w["mem_bytes"].to_numpy(np.float64)
    matmul = w["model_flops"].fillna(0).to_numpy(np.float64) > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(nbytes > 0, flops / nbytes, np.nan)
        achieved_f = np.where(t > 0, flops / t, np.nan)
        achieved_b = np.where(t > 0, nbytes / t, np.nan)
    prec = w["precision"].astype(object).fillna("").to_numpy(object)
    peak_f = np.array([(peak.matmul_rate(p) if m else peak.vector_flops_per_s) or np.nan
                       for p, m in zip(prec, matmul, strict=True)], np.float64)
    peak_b = peak.bytes_per_s or np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        roof = np.minimum(peak_f, intensity * peak_b)
        # where only one side is known, that side bounds it
        roof = np.where(np.isnan(roof) & ~np.isnan(peak_f) & (flops > 0), peak_f, roof)
        roof = np.where(np.isnan(roof) & ~np.isnan(intensity) & (flops == 0),
                        np.nan, roof)
        share = np.where(flops > 0, achieved_f / roof, np.nan)
        share = np.where((flops == 0) & (nbytes > 0), achieved_b / peak_b, share)
        ridge = peak_f / peak_b
    bound = np.full(len(w), "", dtype=object)
    known = ~np.isnan(intensity)
    bound[known] = np.where(intensity[known] >= ridge[known], "compute", "memory")
    bound[known & np.isnan(ridge)] = ""
    bound[(flops == 0) & (nbytes > 0)] = "memory"
    bound[~np.isnan(share) & (share < LATENCY_SHARE)] = "latency-overhead"
    w["flops"] = flops / steps
    w["bytes"] = nbytes / steps
    w["intensity"] = intensity
    w["achieved_flops_per_s"] = achieved_f
    w["achieved_bytes_per_s"] = achieved_b
    w["roofline_share"] = share
    w["bound"] = bound
    w["time_ns_per_step"] = w["time_ns"] / steps
    w["peak_flops_per_s"] = peak_f
    keys = [c for c in w.columns if c not in COLUMNS and c not in (
        "time_ns", "mem_bytes", "time_ns_per_step", "peak_flops_per_s")]
    order = [c for c in ("kernel", "op", "phase") if c in w.columns]
    rest = [c for c in keys if c not in order]
    cols = order + [c for c in COLUMNS if c not in order] + ["time_ns_per_step",
                                                             "peak_flops_per_s"] + rest
    return w.sort_values("time_ns", ascending=False, kind="stable")[cols].reset_index(drop=True)
