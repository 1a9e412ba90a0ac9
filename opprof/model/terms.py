"""The iteration model's terms, per rank and step: t_io, t_h2d, t_f, t_b, t_u, t_comm, other.

The research models one training iteration as ``t_iter = t_io + t_h2d + t_f + t_b + t_u +
t_comm``. Measured, the terms are the wall-time phases of :func:`step_breakdown` — every
instant of a step belongs to exactly one phase — so for every (rank, step)::

    t_io + t_h2d + t_f + t_b + t_u + t_comm + other == dur_ns        (exactly, in ns)

with ``t_io`` = load, ``t_h2d`` = h2d, ``t_f`` = forward, ``t_b`` = backward, ``t_u`` = update,
``t_comm`` = the communication *exposed* on the critical path (comm no compute ran beside)
and ``other`` = time nothing covers. Beside them, ``comm_busy_ns`` is all the time a
collective ran (the union of comm events and markers; on a GPU rank, of its comm kernels)
and ``comm_hidden_ns`` the part of it hidden behind compute (kernels, on a GPU rank);
``io_busy_ns`` likewise for loading (larger than ``t_io`` when a prefetching input pipeline
loads during compute).

The summary is the mean over all (rank, step) rows (what the model predicts: the step of a
typical worker), with the spread of each term: standard deviation, min, median, max and the
coefficient of variation, over steps and over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import step_breakdown
from opprof.trace import Trace

#: Term → the wall-time phase it is.
PHASE_OF = {"t_io": "load", "t_h2d": "h2d", "t_f": "forward", "t_b": "backward",
            "t_u": "update", "t_comm": "comm", "other": "other"}
TERMS = tuple(PHASE_OF)
TERM_OF = {p: t for t, p in PHASE_OF.items()}
EXTRA = ("comm_busy_ns", "comm_hidden_ns", "io_busy_ns")
SPREAD_COLUMNS = ["term", "mean_ns", "std_ns", "min_ns", "p50_ns", "max_ns", "cv",
                  "rank_min_ns", "rank_max_ns"]


@dataclass
class Terms:
    """The terms of one trace: ``per_step`` has one row per (rank, step) with ``dur_ns``,
    every term (ints summing to ``dur_ns``) and ``EXTRA``; ``spread`` one row per term."""

    per_step: pd.DataFrame
    spread: pd.DataFrame
    per_rank: pd.DataFrame

    @property
    def steps(self) -> int:
        """Number of (rank, step) rows."""
        return len(self.per_step)

    @property
    def step_ns(self) -> float:
        """Mean measured step time (ns)."""
        return float(self.per_step["dur_ns"].mean()) if self.steps else 0.0

    def mean(self) -> dict[str, float]:
        """Mean ns per step of every term (they sum to :attr:`step_ns`)."""
        if not self.steps:
            return {t: 0.0 for t in TERMS}
        return {t: float(self.per_step[t].mean()) for t in TERMS}

    def extra(self) -> dict[str, float]:
        """Mean ns per step of comm busy / hidden and io busy."""
        if not self.steps:
            return {k: 0.0 for k in EXTRA}
        return {k: float(self.per_step[k].mean()) for k in EXTRA}


def terms(trace: Trace, steps: pd.DataFrame | None = None) -> Terms:
    """The terms of every worker (rank, step) of ``trace`` (``steps``: its step_breakdown,
    if already made)."""
    steps = step_breakdown(trace) if steps is None else steps
    return terms_from_steps(steps)


def terms_from_steps(steps: pd.DataFrame) -> Terms:
    """:func:`terms` from a step_breakdown table."""
    cols = ["rank", "step", "dur_ns", *TERMS, *EXTRA]
    if steps.empty:
        empty = pd.DataFrame(columns=cols)
        return Terms(empty, pd.DataFrame(columns=SPREAD_COLUMNS), pd.DataFrame(columns=cols[:1]))
    out = pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(),
                        "dur_ns": steps["dur_ns"].to_numpy(np.int64)})
    for t, p in PHASE_OF.items():
        out[t] = steps[p].to_numpy(np.int64)
    # on a GPU rank, the device's comm kernels (opprof.analysis.breakdown)
    device = steps["comm_on_device"].to_numpy(bool) if "comm_on_device" in steps else False
    out["comm_busy_ns"] = np.where(device, steps.get("comm_time_ns", 0),
                                   steps["busy_comm"]).astype(np.int64)
    out["comm_hidden_ns"] = steps["comm_overlap_ns"].to_numpy(np.int64)
    out["io_busy_ns"] = steps["busy_load"].to_numpy(np.int64)
    per_rank = out.groupby("rank")[["dur_ns", *TERMS, *EXTRA]].mean().reset_index()
    return Terms(out, _spread(out, per_rank), per_rank)


def _spread(rows: pd.DataFrame, per_rank: pd.DataFrame) -> pd.DataFrame:
    """Per term (and the step): mean, std, min, median, max over (rank, step) rows, the
    coefficient of variation, and the smallest and largest per-rank mean."""
    out = []
    for t in (*TERMS, "dur_ns", *EXTRA):
        v = rows[t].to_numpy(np.float64)
        r = per_rank[t].to_numpy(np.float64)
        mean = float(v.mean())
        std = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        name = "step" if t == "dur_ns" else t.removesuffix("_ns")
        out.append({"term": name, "mean_ns": mean, "std_ns": std,
                    "min_ns": float(v.min()), "p50_ns": float(np.median(v)),
                    "max_ns": float(v.max()), "cv": std / mean if mean else float("nan"),
                    "rank_min_ns": float(r.min()), "rank_max_ns": float(r.max())})
    return pd.DataFrame(out, columns=SPREAD_COLUMNS)
