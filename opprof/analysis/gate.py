"""The regression gate of `opprof diff BASE NEW --fail-above 5%`: is NEW slower than BASE
beyond a threshold *and* beyond the noise of both runs?

Each check compares two samples of per-step times, BASE's and NEW's:

* the **step**: every unprofiled timed step the runner kept (``meta["unprofiled_samples_ns"]``,
  before and after the profile, per rank; :mod:`opprof.analysis.noise`) — the run without the
  profiler. In a synchronous job the ranks' i-th timed steps are one step of the job, so the
  sample is their mean per index (ranks of one step are not independent draws); in an
  asynchronous one every rank's steps are pooled. A trace without unprofiled samples (a native
  trace, `opprof.profile()` without timing steps) falls back on its profiled steps, and says so;
* a **phase** (``--fail-on comm:+10%``): its wall time in each profiled step (the breakdown,
  mean over the ranks of a step);
* an **operator** (``--fail-on convolution_backward:+20%``): its host time in each profiled
  step (device time where the trace has GPU kernels), summed over the step's events.

The **margin** NEW may be slower by is the threshold (X% of BASE's median, or X ms), or the runs'
**noise** where that is larger: the larger of the two samples' interquartile range / median (a
run whose steps vary by 30% among themselves cannot show a 5% regression; the machine's load
that makes them vary also differs from one run to the next). The test is the one-sided
**Mann–Whitney U** test of NEW against BASE shifted by the margin (each BASE sample × (1 +
margin / BASE's median)): the null hypothesis is "NEW is at most the margin slower than BASE",
rejected at ``alpha`` (0.05) when NEW's samples lie above BASE's shifted ones more often than
chance allows. It assumes nothing about the shape of the times (a busy machine's steps are
skewed), and it is exact for small samples (the distribution of U enumerated, no ties) — six
timed steps per run give a smallest p of 1/924. A check **fails** when NEW's median is slower
than BASE's by more than the margin *and* the test rejects. The gate fails when any check
fails.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from opprof.analysis.ranks import synchronous
from opprof.errors import OpprofError
from opprof.taxonomy import CANONICAL_OPS, PHASES

if TYPE_CHECKING:
    import pandas as pd

    from opprof.analysis.report import Report
    from opprof.arrays import Array
    from opprof.jsontypes import JSONObject
    from opprof.meta import MetaMapping
    from opprof.trace import Trace

#: The significance level a check must reach to fail.
ALPHA = 0.05
TEST = ("Mann-Whitney U (one-sided: NEW's steps vs BASE's shifted by the margin, the threshold "
        "or the runs' noise, the larger)")
#: Samples up to which the U distribution is enumerated exactly (no ties); beyond, the normal
#: approximation with the tie correction and a continuity correction.
EXACT_MAX = 60

_SPEC = re.compile(r"^\s*\+?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>%|ms|s|us|µs|ns)\s*$")
_UNIT_NS = {"ms": 1e6, "s": 1e9, "us": 1e3, "µs": 1e3, "ns": 1.0}


@dataclass(frozen=True)
class Threshold:
    """How much slower NEW may be: ``relative`` (0.05 for 5%) or ``absolute_ns``."""

    target: str  # "step", a phase or a canonical operator
    relative: float | None = None
    absolute_ns: float | None = None

    @property
    def text(self) -> str:
        """``+5%`` / ``+10 ms``."""
        if self.relative is not None:
            return f"+{self.relative * 100:g}%"
        return f"+{(self.absolute_ns or 0.0) / 1e6:g} ms"

    def margin_ns(self, base_ns: float, noise: float = 0.0) -> float:
        """How much slower than ``base_ns`` NEW may be: the threshold, or the runs' noise
        (a relative spread) where that is larger."""
        own = base_ns * self.relative if self.relative is not None else float(
            self.absolute_ns or 0.0)
        return max(own, base_ns * noise)


def parse_amount(text: str, target: str = "step") -> Threshold:
    """``5%`` / ``+10%`` / ``20ms`` / ``+1.5 s`` → a :class:`Threshold` on ``target``."""
    m = _SPEC.match(text)
    if not m:
        raise OpprofError(f"{text!r}: give a threshold such as 5% or 10ms")
    value = float(m["num"])
    if m["unit"] == "%":
        return Threshold(target, relative=value / 100.0)
    return Threshold(target, absolute_ns=value * _UNIT_NS[m["unit"]])


def parse_fail_on(spec: str) -> Threshold:
    """``comm:+10%`` / ``convolution_backward:+20%`` / ``step:+5ms`` → a :class:`Threshold`
    (the target a phase, a canonical operator or ``step``)."""
    target, sep, amount = spec.rpartition(":")
    target = target.strip()
    if not sep or not target:
        raise OpprofError(f"--fail-on {spec}: give TARGET:+X% or TARGET:+Xms (a phase, a "
                          "canonical operator or step)")
    if target not in ("step", *PHASES) and target not in CANONICAL_OPS:
        raise OpprofError(f"--fail-on {spec}: {target} is neither step, a phase "
                          f"({', '.join(PHASES)}) nor a canonical operator (docs/taxonomy.md)")
    try:
        return parse_amount(amount, target)
    except OpprofError as exc:
        raise OpprofError(f"--fail-on {spec}: {exc}") from None


@dataclass(frozen=True)
class Check:
    """One gate check: the two samples' medians, the slowdown and the test."""

    target: str
    source: str  # "unprofiled steps" / "profiled steps"
    threshold: Threshold
    base_samples: int
    new_samples: int
    base_median_ns: float
    new_median_ns: float
    p_value: float | None
    #: the runs' noise: the larger of the two samples' interquartile range / median
    noise: float
    #: what NEW's median must exceed BASE's by: the threshold or the noise, the larger (ns)
    margin_ns: float
    alpha: float = ALPHA

    @property
    def exceeded(self) -> bool:
        """NEW's median is slower than BASE's by more than the margin."""
        return self.delta_ns > self.margin_ns

    @property
    def noise_bound(self) -> bool:
        """The runs' noise, not the threshold, set the margin."""
        own = (self.base_median_ns * self.threshold.relative if self.threshold.relative
               is not None else float(self.threshold.absolute_ns or 0.0))
        return self.margin_ns > own

    @property
    def delta_ns(self) -> float:
        """NEW's median minus BASE's."""
        return self.new_median_ns - self.base_median_ns

    @property
    def delta(self) -> float | None:
        """NEW's median / BASE's − 1."""
        return self.new_median_ns / self.base_median_ns - 1.0 if self.base_median_ns else None

    @property
    def significant(self) -> bool:
        """The test rejects "NEW at most the threshold slower" at ``alpha``."""
        return self.p_value is not None and self.p_value < self.alpha

    @property
    def verdict(self) -> str:
        """``fail`` (beyond the threshold and significant) or ``pass``."""
        return "fail" if self.exceeded and self.significant else "pass"

    def to_dict(self) -> JSONObject:
        """JSON form (one of ``gate.checks``)."""
        return {"target": self.target, "verdict": self.verdict, "threshold": self.threshold.text,
                "delta": self.delta, "delta_ns": self.delta_ns, "p_value": self.p_value,
                "source": self.source, "base_median_ns": self.base_median_ns,
                "new_median_ns": self.new_median_ns,
                "samples": {"base": self.base_samples, "new": self.new_samples},
                "noise": self.noise, "margin_ns": self.margin_ns,
                "beyond_threshold": self.exceeded, "significant": self.significant}


@dataclass(frozen=True)
class Gate:
    """The gate's verdict over its checks (the first is the headline)."""

    checks: list[Check]
    alpha: float = ALPHA
    test: str = TEST
    #: The sides that ran on a busy machine (noise ``noisy``): (BASE or NEW, the spread of
    #: its unprofiled steps, their drift or None); said in words by the renderers
    #: (:func:`opprof.render.verdicts.gate_notes`).
    busy: list[tuple[str, float, float | None]] = field(default_factory=list)
    #: The sides whose step was compared on profiled steps (they kept no unprofiled timing).
    profiled_only: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``fail`` when any check fails, else ``pass``."""
        return "fail" if any(c.verdict == "fail" for c in self.checks) else "pass"

    @property
    def failed(self) -> list[Check]:
        """The checks that failed."""
        return [c for c in self.checks if c.verdict == "fail"]

    @property
    def headline(self) -> Check:
        """The check the one-line verdict names: the first that failed, else the first."""
        return (self.failed or self.checks)[0]

    def to_dict(self) -> JSONObject:
        """JSON ``gate``: the headline check's ``threshold``, ``delta``, ``p_value`` … beside
        the verdict, and every check."""
        h = self.headline
        return {"verdict": self.verdict, "target": h.target, "threshold": h.threshold.text,
                "delta": h.delta, "delta_ns": h.delta_ns, "p_value": h.p_value,
                "test": self.test, "alpha": self.alpha, "source": h.source,
                "base_median_ns": h.base_median_ns, "new_median_ns": h.new_median_ns,
                "samples": {"base": h.base_samples, "new": h.new_samples},
                "noise": h.noise, "margin_ns": h.margin_ns,
                "checks": [c.to_dict() for c in self.checks]}


# ------------------------------------------------------------------ the test


def mann_whitney_greater(x: Array, y: Array) -> float | None:
    """One-sided p-value of the Mann–Whitney U test that ``x`` tends to exceed ``y`` (None:
    an empty sample). Exact (the U distribution enumerated) when both samples are small and
    there are no ties; else the normal approximation with the tie and continuity
    corrections."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    n, m = len(x), len(y)
    if not n or not m:
        return None
    both = np.concatenate([x, y])
    ranks = _ranks(both)
    u = float(ranks[:n].sum() - n * (n + 1) / 2.0)  # pairs (x_i > y_j), ties counting ½
    ties = len(np.unique(both)) < len(both)
    if not ties and n + m <= EXACT_MAX:
        counts = _u_counts(n, m)
        k = math.ceil(u - 1e-9)  # P(U ≥ u)
        return float(counts[k:].sum() / counts.sum())
    _, t = np.unique(both, return_counts=True)
    total = n + m
    var = n * m / 12.0 * ((total + 1) - float(np.sum(t ** 3 - t)) / (total * (total - 1)))
    if var <= 0:
        return 1.0 if u <= n * m / 2.0 else 0.0
    z = (u - n * m / 2.0 - 0.5) / math.sqrt(var)
    return float(0.5 * math.erfc(z / math.sqrt(2.0)))


def _ranks(v: Array) -> Array:
    """Ranks 1..n, ties given their mean rank."""
    order = np.argsort(v, kind="mergesort")
    sorted_v = v[order]
    first = np.r_[True, sorted_v[1:] != sorted_v[:-1]]
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(v)]
    mean_rank = (starts + ends + 1) / 2.0  # ranks start..end-1 (0-based) → mean, 1-based
    out = np.empty(len(v))
    out[order] = mean_rank[group]
    return out


def _u_counts(n: int, m: int) -> Array:
    """How many of the C(n+m, n) arrangements give each U = 0..n·m (no ties)."""
    # f[i][j] over U: arrangements of i x's and j y's; the recurrence on the largest element
    table: dict[tuple[int, int], Array] = {}

    def f(i: int, j: int) -> Array:
        if i == 0 or j == 0:
            return np.ones(1, np.float64)
        key = (i, j)
        if key not in table:
            a = f(i - 1, j)  # the largest is an x: it beats all j y's
            b = f(i, j - 1)  # the largest is a y
            out = np.zeros(i * j + 1, np.float64)
            out[j:j + len(a)] += a
            out[:len(b)] += b
            table[key] = out
        return table[key]

    return f(n, m)


# ------------------------------------------------------------------ the samples


def unprofiled_samples(meta: MetaMapping) -> Array:
    """The run's unprofiled step times, one per step of the job (see the module docstring);
    empty when the trace kept none."""
    per_rank = meta.get("unprofiled_samples_ns") or {}
    series = []
    for r in per_rank.values():
        if isinstance(r, dict):
            v = [float(x) for part in ("before", "after") for x in (r.get(part) or [])
                 if isinstance(x, (int, float)) and x > 0]
            if v:
                series.append(v)
    if not series:
        return np.zeros(0)
    if len(series) > 1 and synchronous(meta):
        n = min(len(s) for s in series)
        out: Array = np.mean([s[:n] for s in series], axis=0)
        return out
    return np.asarray([x for s in series for x in s], np.float64)


def per_step(rows: pd.DataFrame, column: str, synchronous: bool) -> Array:
    """One value per step of ``column`` from per (rank, step) rows: the ranks' mean per step
    in a synchronous job, every (rank, step) otherwise."""
    if rows.empty or column not in rows:
        return np.zeros(0)
    if synchronous and rows["rank"].nunique() > 1:
        out: Array = rows.groupby("step")[column].mean().to_numpy(np.float64)
        return out
    values: Array = rows[column].to_numpy(np.float64)
    return values


def check(threshold: Threshold, base: Array, new: Array, source: str,
          alpha: float = ALPHA) -> Check:
    """One check of NEW's samples against BASE's (see the module docstring)."""
    if not len(base) or not len(new):
        raise OpprofError(f"--fail-on {threshold.target}: "
                          f"{'BASE' if not len(base) else 'NEW'} has no {source} to compare")
    b, n = float(np.median(base)), float(np.median(new))
    noise = max(spread(base), spread(new))
    margin = threshold.margin_ns(b, noise)
    shifted = base * (1.0 + margin / b) if b > 0 else base + margin
    p = mann_whitney_greater(new, shifted)
    return Check(threshold.target, source, threshold, len(base), len(new), b, n, p, noise,
                 margin, alpha)


def spread(x: Array) -> float:
    """Interquartile range / median (linear interpolation; 0 for fewer than 2 samples)."""
    if len(x) < 2:
        return 0.0
    q1, med, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))
    return (q3 - q1) / med if med > 0 else 0.0


def op_per_step(trace: Trace, op: str) -> pd.DataFrame:
    """Per (worker rank, step): the time of canonical operator ``op`` in it (``ns``), its
    device time where the trace has GPU work, else its host operators' own time; every
    (rank, step) of the trace, 0 where the operator did not run."""
    import pandas as pd

    from opprof.analysis.ops import op_events, own_durations
    from opprof.filters import device_work

    ev = trace.events
    where = "device" if bool(device_work(ev).any()) else "host"
    sel = op_events(trace, where)
    dur = own_durations(sel) if where == "host" else sel["dur"].to_numpy(np.int64)
    df = pd.DataFrame({"rank": sel["rank"].to_numpy(np.int64),
                       "step": sel["step"].to_numpy(np.int64), "ns": dur,
                       "op": sel["op"].astype(object).to_numpy()})
    got = df[df["op"] == op].groupby(["rank", "step"])["ns"].sum()
    bounds = trace.step_bounds()
    keys = bounds[bounds["rank"].isin(trace.ranks)][["rank", "step"]].drop_duplicates()
    keys = keys.astype(np.int64)
    out = keys.merge(got.rename("ns").reset_index(), on=["rank", "step"], how="left")
    return out.fillna({"ns": 0.0})


def gate(base: Report, new: Report, thresholds: list[Threshold], alpha: float = ALPHA,
         base_trace: Trace | None = None, new_trace: Trace | None = None) -> Gate:
    """Check NEW against BASE for every threshold (``step``: the unprofiled steps, else the
    profiled ones; a phase: its wall time per profiled step; an operator: its time per
    profiled step, from the traces)."""
    checks = []
    busy = [(side, r.noise.spread or 0.0, r.noise.drift)
            for side, r in (("BASE", base), ("NEW", new))
            if r.noise is not None and "noisy" in r.noise.flags]
    profiled_only: list[str] = []
    for t in thresholds:
        if t.target == "step":
            b, n = unprofiled_samples(base.meta), unprofiled_samples(new.meta)
            source = "unprofiled steps"
            if not len(b) or not len(n):
                b = per_step(base.steps, "dur_ns", synchronous(base.meta))
                n = per_step(new.steps, "dur_ns", synchronous(new.meta))
                source = "profiled steps"
                profiled_only = [side for side, r in (("BASE", base), ("NEW", new))
                                 if not len(unprofiled_samples(r.meta))]
        elif t.target in PHASES:
            b = per_step(base.steps, t.target, synchronous(base.meta))
            n = per_step(new.steps, t.target, synchronous(new.meta))
            source = "profiled steps (wall time of the phase)"
        else:
            if base_trace is None or new_trace is None:
                raise OpprofError(f"--fail-on {t.target}: an operator gate needs the traces")
            b = per_step(op_per_step(base_trace, t.target), "ns", synchronous(base.meta))
            n = per_step(op_per_step(new_trace, t.target), "ns", synchronous(new.meta))
            source = "profiled steps (time of the operator)"
        checks.append(check(t, b, n, source, alpha))
    return Gate(checks, alpha, busy=busy, profiled_only=profiled_only)
