"""The seed papers' sweeps in `opprof bench` (``--threads 1,2,4`` and ``--batch-size
16,32,64``): per framework, model, workers and mode, the time per mini-batch and samples/s
against the compute threads and against the batch size, and where each stops scaling. Pure
functions over the bench table (:func:`opprof.analysis.matrix.compare`).

* **Threads**: speed-up = step(t₀) / step(t) against the fewest threads swept; efficiency =
  speed-up ÷ (t / t₀).
* **Batch size**: speed-up = samples/s(b) / samples/s(b₀) against the smallest batch;
  efficiency = speed-up ÷ (b / b₀) — 1 when a larger batch costs proportionally more time,
  the bigger the speed-up the better the framework uses the larger batch.
* **Stops scaling**: going from one swept value to the next, the speed-up grows by less than
  :data:`MIN_GAIN` (10%): the first value where that happens is reported.

Times are the unprofiled step times (the headline, without the profiler's overhead), else
the profiled ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

#: A step to the next swept value that gains less than this speed-up has stopped scaling.
MIN_GAIN = 0.10
#: The sweep dimensions: their bench-table column and what they are called.
DIMENSIONS = {"threads": "threads", "batch_size": "batch size"}
SWEEP_COLUMNS = ["fw", "model", "workers", "mode", "threads", "batch_size", "step_ns",
                 "samples_per_s", "speedup", "efficiency"]


@dataclass(frozen=True)
class Plateau:
    """Where one framework's run stops scaling along one dimension."""

    fw: str
    model: str
    workers: int
    mode: str
    dimension: str  # "threads" or "batch_size"
    fixed: int | None  # the other dimension's value
    at: int | None  # the last value that still gained MIN_GAIN (None: the first one did not)
    next_value: int | None  # the value that gained less (None: it scaled all the way)
    gain: float | None  # the speed-up from ``at`` to ``next_value``

    def sentence(self) -> str:
        """One plain sentence."""
        what = DIMENSIONS[self.dimension]
        other = "batch_size" if self.dimension == "threads" else "threads"
        fixed = f", {DIMENSIONS[other]} {self.fixed}" if self.fixed is not None else ""
        head = f"{self.fw} {self.model} x{self.workers} {self.mode}{fixed}"
        if self.next_value is None:
            return f"{head}: still scaling at {what} {self.at} (every step gained ≥ " \
                   f"{MIN_GAIN:.0%})"
        return (f"{head}: stops scaling at {what} {self.at} ({self.at} → {self.next_value}: "
                f"{self.gain:.2f}x, under {1 + MIN_GAIN:.2f}x)")

    def to_dict(self) -> dict[str, object]:
        return {"fw": self.fw, "model": self.model, "workers": self.workers, "mode": self.mode,
                "dimension": self.dimension, "fixed": self.fixed, "stops_at": self.at,
                "next_value": self.next_value, "gain": self.gain, "sentence": self.sentence()}


def sweep(table: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """One row per run of a group swept along ``dimension`` (``threads`` or ``batch_size``;
    a group: fw, model, workers, mode and the other dimension's value) with its step time,
    samples/s, speed-up and efficiency (see the module docstring); empty when no group has
    two values."""
    other = "batch_size" if dimension == "threads" else "threads"
    if table.empty or dimension not in table:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    t = table.copy()
    t = t[t["status"].isin(("ok", "resumed"))]
    if other not in t:
        t[other] = None
    t["step"] = pd.to_numeric(t.get("unprofiled_step_ns"), errors="coerce").fillna(
        pd.to_numeric(t.get("step_ns"), errors="coerce"))
    t["sps"] = pd.to_numeric(t.get("samples_per_s"), errors="coerce")
    t = t[t[dimension].notna() & t["step"].notna()]
    keys = ["fw", "model", "workers", "mode", other]
    rows = []
    for _, g in t.groupby(keys, dropna=False, sort=False):
        if g[dimension].nunique() < 2:
            continue
        g = g.sort_values(dimension)
        v0, step0 = float(g[dimension].iloc[0]), float(g["step"].iloc[0])
        sps0 = g["sps"].iloc[0]
        for r in g.itertuples():
            v = float(getattr(r, dimension))
            if dimension == "threads":
                speedup = step0 / float(r.step) if r.step else None
            else:
                speedup = float(r.sps) / float(sps0) if sps0 and r.sps == r.sps else None
            rows.append({"fw": r.fw, "model": r.model, "workers": int(r.workers),
                         "mode": r.mode, "threads": _int(r.threads),
                         "batch_size": _int(r.batch_size),
                         "step_ns": float(r.step),
                         "samples_per_s": float(r.sps) if r.sps == r.sps else None,
                         "speedup": speedup,
                         "efficiency": speedup / (v / v0) if speedup is not None else None})
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def plateaus(sw: pd.DataFrame, dimension: str) -> list[Plateau]:
    """Where each swept group stops scaling along ``dimension`` (:func:`sweep`'s rows)."""
    other = "batch_size" if dimension == "threads" else "threads"
    out = []
    for key, g in sw.groupby(["fw", "model", "workers", "mode", other], dropna=False,
                             sort=False):
        g = g.sort_values(dimension)
        values = [int(v) for v in g[dimension]]
        speed = [float(s) if s is not None and s == s else None for s in g["speedup"]]
        fw, model, workers, mode, fixed = key
        at, nxt, gain = values[-1], None, None
        for i in range(len(values) - 1):
            a, b = speed[i], speed[i + 1]
            if a is None or b is None:
                continue
            if b / a < 1 + MIN_GAIN:
                at, nxt, gain = values[i], values[i + 1], b / a
                break
        out.append(Plateau(str(fw), str(model), int(workers), str(mode), dimension,
                           _int(fixed), at, nxt, gain))
    return out


def _int(v: object) -> int | None:
    try:
        return None if v is None or v != v else int(v)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
