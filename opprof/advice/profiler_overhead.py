"""The profile itself: the profiler's own overhead (profiled steps much slower than the
unprofiled ones) and a busy machine (the unprofiled steps vary, or drifted during the run), from
the run's timing quality (:mod:`opprof.analysis.noise`). These save no training time (their
saving is 0 and they rank last): they say how far the other savings, predicted on profiled
steps, can be trusted, and how to record a cleaner profile."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opprof.advice.base import Advice

if TYPE_CHECKING:
    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "profiler-overhead"
NEEDS: tuple[str, ...] = ("noise",)
#: Profiled / unprofiled step above which the overhead is worth a word (the report flags it
#: at opprof.analysis.noise.OVERHEAD_LIMIT).
OVERHEAD = 1.25


def advise(ev: Evidence) -> list[Advice]:
    """The measurement notes (see the module docstring)."""
    noise = ev.report.noise
    if noise is None:
        return []
    out = []
    if noise.overhead is not None and noise.overhead > OVERHEAD:
        memory = ev.meta.get("memory_sources") or []
        evidence: JSONObject = {
            "overhead": noise.overhead, "profiled_median_ns": noise.profiled_median_ns,
            "unprofiled_median_ns": noise.median_ns,
            "allocator_profiled": "kineto" in memory or "mxnet" in memory}
        action = ("read the savings as shares of the step (the profiled operators are "
                  "inflated); for a lighter profile record fewer details ("
                  + ("--no-profile-memory, " if evidence["allocator_profiled"] else "")
                  + "no stacks or shapes) and compare unprofiled step times (opprof diff)")
        profiled = (noise.profiled_median_ns or 0.0) / 1e6
        out.append(Advice(NAME, f"profiler overhead: the profiled steps take "
                                f"{noise.overhead:.2f}× the unprofiled ones "
                                f"({profiled:,.1f} vs {noise.median_ns / 1e6:,.1f} ms)",
                          action, 0.0, 0.0, "high", evidence,
                          "the unprofiled timed steps against the profiled ones",
                          kind="measurement"))
    if "noisy" in noise.flags:
        out.append(Advice(NAME, f"busy machine: the unprofiled steps vary by "
                                f"{(noise.spread or 0):.0%} (IQR / median)"
                                + (f" and drifted {noise.drift:+.0%} during the run"
                                   if noise.drift is not None else ""),
                          "rerun on a quiet machine before acting on small savings; the "
                          "confidence of every saving above is lowered one step",
                          0.0, 0.0, "high",
                          {"spread": noise.spread, "drift": noise.drift,
                           "samples": noise.samples},
                          "the unprofiled timed steps' spread and drift", kind="measurement"))
    return out
