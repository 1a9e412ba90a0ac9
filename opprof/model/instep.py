"""What a blocking collective costs inside a model-parallel step, per call: fitted from
`opprof calibrate`'s in-step calls (``info["in_step"]`` of its network file) and read back by
the tensor- and pipeline-parallel models (:mod:`opprof.model.fromsingle`).

A collective that a step blocks in (tensor parallel's all-reduce of an activation, a
pipeline's send and receive of one) costs more than the same collective called back to back
after a barrier (the α–β fit of :mod:`opprof.model.commmodel`): it follows a burst of compute
on every rank, so the ranks arrive apart (the first one waits), gloo's thread sleeps and must be
woken, the buffers are cold. `opprof calibrate --fw torch` times such calls
(``collectors/netbench.py``: a compute burst, then the call, per message size and burst length,
each call's enter and exit on the host's clock) and :func:`fit_in_step` keeps, per kind
(``all_reduce``, ``p2p``):

- ``after_ns``: per message size, the median time a call took after the last rank entered
  it (exit − the latest enter, over calls, bursts and ranks; ``mean_ns`` beside it), and
  ``after_fit``, the least-squares line ``ns + per_byte × n`` over those sizes (both at least
  0): the sizes a step sends cost nearly the same (waking gloo's thread dominates), so the
  model reads the line over all the sizes' calls. The median, not the mean: the time is
  heavy-tailed (a wake-up that waits for the scheduler's tick, 4 ms), and the tail is
  calibrate's more than a step's — on this 2-core host a tensor-parallel job's own 64 KiB
  all-reduces took 1.25 ms each after the last rank (the mean over its steps), calibrate's the
  same calls 1.3 ms in the median and 2.0–6.6 ms in the mean, from one calibration to the
  next;
- ``wait_ns`` and ``wait_per_burst``: the mean wait of a rank for the last one to enter
  (latest enter − its enter), fitted as ``wait_ns + wait_per_burst × burst`` over the bursts
  (least squares, both at least 0): ranks doing the same work drift apart in proportion to it.

and, from the synthetic pipeline (``in_step_pipeline``: a GPipe step of two stages, the
transfers made while both ranks compute), ``pipeline``: its period, its bursts, and
``handoff_ns``, the cost of one activation or gradient that makes the schedule of those
bursts (:func:`opprof.model.ppsplit.simulate`) last the measured period (:func:`handoff_for`).
On a host whose cores the stages' main threads fill, that is far more than a send and
receive after a barrier: the receiver's wake-up and gloo's own threads queue behind the
computing ones (on this 2-core host 2–3.3 ms a hand-off, against 0.5–1 ms for the p2p
calls). It is measured at three settings of a micro-batch's compute (0.6–5.8 ms on this host)
and kept as their median: it did not follow the compute in that range, and a setting that met
a passing load (6–10 ms) does not move the median. The pipeline model
(:mod:`opprof.model.fromsingle`) takes it as each transfer's cost (:func:`pipeline_handoff`).

The model's cost of one call (:meth:`InStep.call_ns`) is ``after(n) + wait(burst)``: ``after``
on the line (a file without it: linear between the measured sizes, flat below the smallest,
the last two sizes' slope beyond the largest), moved to another number of ranks by the ring
all-reduce's α–β ratio (``network.cost_ns``); ``wait`` scaled by E[max of N normals] over
that at the calibrated workers. A network file without ``in_step`` (written before) gives
None: the models keep the α–β cost and their own wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.model.step import expected_max_normal

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.model.commmodel import Network

#: The kinds of in-step call (the ``kind`` of calibrate's samples without ``in_step_``).
KINDS = ("all_reduce", "p2p")


def fit_in_step(samples: pd.DataFrame, workers: int) -> dict[str, Any]:
    """``info["in_step"]`` of a network file from calibrate's in-step samples (columns
    ``kind`` (``in_step_all_reduce``, ``in_step_p2p``), ``rank``, ``bytes``, ``burst_ns``,
    ``call``, ``enter``, ``exit``; a p2p sample also its ``pair``): see the module
    docstring. Empty when there are none."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        d = samples[samples["kind"] == f"in_step_{kind}"]
        if d.empty:
            continue
        keys = ["bytes", "burst_ns", "call"] + (["pair"] if kind == "p2p" else [])
        last = d.groupby(keys)["enter"].transform("max")
        d = d.assign(after=(d["exit"] - last).astype(float),
                     wait=(last - d["enter"]).astype(float))
        per_size = d.groupby("bytes")["after"].agg(["median", "mean", "size"])
        bursts = d.groupby("burst_ns")["wait"].mean()
        w0, w1 = _line(bursts.index.to_numpy(np.float64), bursts.to_numpy(np.float64))
        a0, a1 = _line(per_size.index.to_numpy(np.float64),
                       per_size["median"].to_numpy(np.float64))
        out[kind] = {"after_ns": [{"bytes": int(b), "ns": max(float(r["median"]), 0.0),
                                   "mean_ns": float(r["mean"]), "calls": int(r["size"])}
                                  for b, r in per_size.iterrows()],
                     "after_fit": {"ns": a0, "per_byte": a1},
                     "wait_ns": w0, "wait_per_burst": w1,
                     "waits": [{"burst_ns": float(b), "ns": float(w)}
                               for b, w in bursts.items()],
                     "calls": int(len(d))}
    pipe = _fit_pipeline(samples[samples["kind"] == "in_step_pipeline"])
    if pipe:
        out["pipeline"] = pipe
    if out:
        out["workers"] = int(workers)
    return out


def _fit_pipeline(d: pd.DataFrame) -> dict[str, Any]:
    """``in_step["pipeline"]`` from the synthetic pipeline's steps (module docstring): per
    pair and setting, the period (stage 0's steps end to end), each stage's mean forward and
    backward burst, the schedule's period with no hand-off cost and the hand-off cost that
    gives the measured period (:func:`handoff_for`); per setting the mean over pairs
    (``settings``, ordered by the bursts' mean), and their median (``handoff_ns``: a setting
    that met a passing load does not move it). Empty without samples."""
    from opprof.model.ppsplit import StageTimes, simulate

    if d.empty:
        return {}
    fits = []
    for (_, burst), g in d.groupby(["pair", "burst_ns"]):
        first = g[g["stage"] == 0].sort_values("round")
        if len(first) < 2 or g["stage"].nunique() != 2:
            continue
        period = float(np.mean(np.diff(first["exit"].to_numpy(np.float64))))
        per = g.groupby("stage")[["forward_ns", "backward_ns"]].mean().sort_index()
        m = int(g["microbatches"].iloc[0])
        times = [StageTimes(float(r["forward_ns"]), float(r["backward_ns"]), 0.0, 0.0)
                 for _, r in per.iterrows()]
        fits.append({"burst_ns": float(burst),
                     "compute_ns": float((per["forward_ns"] + per["backward_ns"]).mean() / 2),
                     "period_ns": period, "ideal_ns": simulate(times, m, [0.0], [0.0]).step_ns,
                     "handoff_ns": handoff_for(times, m, period), "steps": int(len(first))})
    if not fits:
        return {}
    f = pd.DataFrame(fits).groupby("burst_ns").mean().sort_values("compute_ns")
    return {"microbatches": int(d["microbatches"].iloc[0]), "bytes": int(d["bytes"].iloc[0]),
            "pairs": int(d["pair"].nunique()),
            "handoff_ns": float(f["handoff_ns"].median()),
            "settings": [{"burst_ns": int(b), "compute_ns": float(r["compute_ns"]),
                          "period_ns": float(r["period_ns"]), "ideal_ns": float(r["ideal_ns"]),
                          "handoff_ns": float(r["handoff_ns"]), "steps": int(r["steps"])}
                         for b, r in f.iterrows()]}


def handoff_for(times: list[Any], m: int, period_ns: float) -> float:
    """The hand-off cost ``x`` (ns, ≥ 0) with which a GPipe schedule of ``times``' stages
    and ``m`` micro-batches (:func:`opprof.model.ppsplit.simulate`, every activation and
    gradient costing ``x``) lasts ``period_ns``: bisection (the period grows with ``x``)."""
    from opprof.model.ppsplit import simulate

    def period(x: float) -> float:
        xs = [x] * (len(times) - 1)
        return simulate(times, m, xs, xs).step_ns

    if period(0.0) >= period_ns:
        return 0.0
    lo, hi = 0.0, max(period_ns, 1.0)
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if period(mid) < period_ns else (lo, mid)
    return (lo + hi) / 2.0


def _line(x: Array, y: Array) -> tuple[float, float]:
    """Least squares y ≈ a + b·x with a, b ≥ 0 (one point: b = 0)."""
    if len(x) < 2 or float(np.ptp(x)) == 0.0:
        return max(float(np.mean(y)) if len(y) else 0.0, 0.0), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return max(float(np.mean(y)), 0.0), 0.0
    if a < 0:
        return 0.0, max(float(np.dot(x, y) / np.dot(x, x)), 0.0)
    return float(a), float(b)


@dataclass(frozen=True)
class InStep:
    """One kind's in-step cost (module docstring), with the network it came with."""

    kind: str
    sizes: Array
    after: Array
    wait_ns: float
    wait_per_burst: float
    workers: int
    network: Network
    #: ``after_fit``: (ns, ns per byte) of the line over the sizes (None: a file without it)
    line: tuple[float, float] | None = None

    def after_ns(self, nbytes: float, workers: int) -> float:
        """One call's time after the last of ``workers`` ranks entered it."""
        if workers <= 1:
            return 0.0
        x, y = self.sizes, self.after
        n = float(nbytes)
        if self.line is not None:
            own = self.line[0] + self.line[1] * n
        elif n > x[-1] and len(x) >= 2:
            slope = max(0.0, float((y[-1] - y[-2]) / (x[-1] - x[-2])))
            own = float(y[-1] + (n - x[-1]) * slope)
        else:
            own = float(np.interp(n, x, y))
        if workers == self.workers or self.kind == "p2p":
            return own
        at = float(np.asarray(self.network.cost_ns(n, workers)).reshape(-1)[0])
        ref = float(np.asarray(self.network.cost_ns(n, self.workers)).reshape(-1)[0])
        return own * at / ref if ref > 0 else own

    def wait(self, burst_ns: float, workers: int) -> float:
        """A rank's mean wait for the last of ``workers`` to enter after ``burst_ns`` of
        compute on each."""
        if workers <= 1:
            return 0.0
        scale = expected_max_normal(workers) / max(expected_max_normal(self.workers), 1e-12)
        return (self.wait_ns + self.wait_per_burst * max(float(burst_ns), 0.0)) * scale

    def call_ns(self, nbytes: float, burst_ns: float, workers: int) -> float:
        """One call's exposed time on a rank: after the last rank entered, and the wait."""
        return self.after_ns(nbytes, workers) + self.wait(burst_ns, workers)


def in_step_of(network: Network, kind: str) -> InStep | None:
    """The network's in-step cost of ``kind`` (None: the file has none, e.g. one written
    before calibrate measured it, or a network fitted from a trace)."""
    doc = network.info.get("in_step") if isinstance(network.info, dict) else None
    if not isinstance(doc, dict):
        return None
    d = doc.get(kind)
    if not isinstance(d, dict) or not d.get("after_ns"):
        return None
    pts = sorted((float(r["bytes"]), float(r["ns"])) for r in d["after_ns"]
                 if r.get("bytes") and r.get("ns") is not None)
    if not pts:
        return None
    fit = d.get("after_fit")
    line = (float(fit.get("ns") or 0.0), float(fit.get("per_byte") or 0.0)) \
        if isinstance(fit, dict) else None
    return InStep(kind, np.array([p[0] for p in pts]), np.array([p[1] for p in pts]),
                  float(d.get("wait_ns") or 0.0), float(d.get("wait_per_burst") or 0.0),
                  int(doc.get("workers") or network.workers or 2), network, line)


@dataclass(frozen=True)
class Handoff:
    """The synthetic pipeline's hand-off (module docstring): its cost (the median over the
    settings) at ``bytes``."""

    ns: float
    bytes: int


def pipeline_handoff(network: Network) -> Handoff | None:
    """The network's pipeline hand-off (None: a file without one — written before calibrate
    measured it, fewer than 2 workers, or a network fitted from a trace)."""
    doc = network.info.get("in_step") if isinstance(network.info, dict) else None
    d = doc.get("pipeline") if isinstance(doc, dict) else None
    if not isinstance(d, dict):
        return None
    rows = d.get("settings")
    if not isinstance(rows, list) or not rows:
        return None
    return Handoff(max(float(np.median([float(r["handoff_ns"]) for r in rows])), 0.0),
                   int(d.get("bytes") or 0))
