"""Is a recorded run's timing trustworthy? The spread of its unprofiled steps, the drift of
the machine's speed during the run, and the profiler's overhead — and the flags a report, a
diff and the bench tables show when they are out of bounds. The thresholds live here, and
only here.

The runner times every unprofiled step (``--timing-steps`` of them just before the profiled
steps, and as many again just after, ``meta["unprofiled_samples_ns"]``, per rank). From them:

* **spread** = interquartile range / median of every worker's unprofiled step times (linear
  interpolation between order statistics). Above :data:`NOISE_SPREAD` the run is ``noisy``:
  steps of the same work took visibly different times, so a ratio between two runs smaller
  than that spread says nothing.
* **drift** = median after the profile / median before − 1. Beyond ±:data:`NOISE_DRIFT` the run
  is ``noisy`` too: the machine's speed changed during the run (another job started or
  stopped), so the profiled steps were measured on a different machine than the unprofiled
  ones.
* **overhead** = median profiled step (the trace's steps on worker ranks) / median unprofiled
  step. Above :data:`OVERHEAD_LIMIT` the run is flagged ``overhead``: the profiler itself
  slowed the steps enough that operator times are inflated. (When the run is also noisy, the
  ratio mixes overhead and the change of load; the drift tells which.)

A trace without unprofiled samples (a native trace from the user's own profiler, a `.trace`
recorded before these were kept) has no assessment; nothing is flagged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.meta import MetaMapping

#: Interquartile range / median of the unprofiled step times above which a run is noisy.
NOISE_SPREAD = 0.20
#: |median after / median before − 1| above which a run is noisy (the load changed).
NOISE_DRIFT = 0.20
#: Median profiled step / median unprofiled step above which the profiler's overhead is
#: flagged.
OVERHEAD_LIMIT = 1.5
LIMITS = {"spread": NOISE_SPREAD, "drift": NOISE_DRIFT, "overhead": OVERHEAD_LIMIT}


@dataclass(frozen=True)
class Noise:
    """A run's timing quality (see the module docstring); times in ns, ratios as fractions."""

    samples: int  # unprofiled timed steps, every worker's, before and after the profile
    median_ns: float
    q1_ns: float
    q3_ns: float
    min_ns: float
    max_ns: float
    spread: float | None  # IQR / median
    drift: float | None  # median after / median before − 1
    profiled_median_ns: float | None
    overhead: float | None  # median profiled / median unprofiled
    flags: list[str]  # ``noisy``, ``overhead``
    limits: dict[str, float] = field(default_factory=lambda: dict(LIMITS))

    def to_dict(self) -> dict[str, Any]:
        """The assessment as JSON's ``noise`` object (docs/json.md)."""
        return asdict(self)

    def flagged(self, *more: str) -> Noise:
        """The same assessment with the flags ``more`` added (once each)."""
        return replace(self, flags=[*self.flags, *(f for f in more if f not in self.flags)])


def samples(meta: MetaMapping) -> tuple[Array, Array]:
    """(before, after): every worker's unprofiled step durations (ns)."""
    per_rank = meta.get("unprofiled_samples_ns") or {}
    before = [v for r in per_rank.values() if isinstance(r, dict)
              for v in r.get("before") or [] if isinstance(v, (int, float))]
    after = [v for r in per_rank.values() if isinstance(r, dict)
             for v in r.get("after") or [] if isinstance(v, (int, float))]
    return np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)


def assess(meta: MetaMapping, steps: pd.DataFrame | None = None) -> Noise | None:
    """The run's timing quality (see the module docstring): sample count, median, quartiles,
    extremes, spread, drift, the profiled median and overhead, and ``flags`` (``noisy``,
    ``overhead``); None when the trace holds no unprofiled samples."""
    before, after = samples(meta)
    both = np.concatenate([before, after])
    both = both[both > 0]
    if len(both) == 0:
        return None
    med = float(np.median(both))
    q1, q3 = (float(q) for q in np.percentile(both, [25, 75]))
    spread = (q3 - q1) / med if med > 0 else None
    drift = (float(np.median(after)) / float(np.median(before)) - 1.0
             if len(before) and len(after) and np.median(before) > 0 else None)
    profiled = None
    if steps is not None and len(steps) and "dur_ns" in steps:
        profiled = float(np.median(steps["dur_ns"].to_numpy(np.float64)))
    overhead = profiled / med if profiled and med > 0 else None
    flags: list[str] = []
    if (spread is not None and spread > NOISE_SPREAD) or (
            drift is not None and abs(drift) > NOISE_DRIFT):
        flags.append("noisy")
    if overhead is not None and overhead > OVERHEAD_LIMIT:
        flags.append("overhead")
    return Noise(samples=int(len(both)), median_ns=med, q1_ns=q1, q3_ns=q3,
                 min_ns=float(both.min()), max_ns=float(both.max()), spread=spread, drift=drift,
                 profiled_median_ns=profiled, overhead=overhead, flags=flags)


def flags(noise: Noise | None) -> list[str]:
    """The flags of an assessment (none for None)."""
    return list(noise.flags) if noise else []
