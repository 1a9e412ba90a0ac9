"""Pipeline bubble: in a pipeline-parallel job each stage idles while the pipeline fills and
drains — ``(p − 1)`` micro-batch slots of ``m + p − 1`` for GPipe and 1F1B. Evidence: the
pipeline analysis' rows (``report --by pipeline``: rank, step, stage, schedule,
microbatches, bubble_ns), the stages' count. Action: more micro-batches (each smaller), or an
interleaved schedule with ``v`` model chunks per stage. Saving: the bubble formula with the
measured bubble — ``m`` → ``2m`` micro-batches of half the size halve each slot, so the bubble
halves (``bubble × (1 − m / 2m)``); an interleaved schedule divides it by ``v`` — per step,
the mean over the stages (every stage waits for the slowest to drain).

Reads the ``pipeline`` table of the Round 4 contract; without it (an opprof whose report has
no pipeline analysis, or a job that is not pipeline-parallel) the rule does not run and the
advisory says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opprof.advice.base import Advice, Knob

if TYPE_CHECKING:
    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "pipeline-bubble"
NEEDS: tuple[str, ...] = ("pipeline",)
#: Model chunks per stage an interleaved schedule is advised with.
CHUNKS = 2


def advise(ev: Evidence) -> list[Advice]:
    """The pipeline-bubble advice (see the module docstring)."""
    pipe = ev.pipeline
    if pipe is None or "bubble_ns" not in pipe:
        return []
    step = ev.step_ns
    per_step = pipe.groupby("step")["bubble_ns"].mean()  # the stages' mean bubble per step
    bubble = float(per_step.mean())
    if bubble <= 0 or step <= 0:
        return []
    m = int(pipe["microbatches"].max()) if "microbatches" in pipe else 0
    stages = int(pipe["stage"].nunique()) if "stage" in pipe else int(pipe["rank"].nunique())
    schedule = str(pipe["schedule"].mode().iloc[0]) if "schedule" in pipe else ""
    interleaved = "interleav" in schedule.lower()
    more = bubble * 0.5  # m → 2m micro-batches of half the size: each slot halves
    chunked = bubble * (1.0 - 1.0 / CHUNKS)
    evidence: JSONObject = {"bubble_ns_per_step": bubble, "bubble_share": bubble / step,
                "stages": stages, "microbatches": m, "schedule": schedule}
    finding = (f"pipeline bubble: each stage idles {bubble / 1e6:,.1f} ms per step "
               f"({bubble / step:.0%}) while the {stages}-stage pipeline fills and drains "
               f"({schedule or 'schedule unknown'}, {m} micro-batches)")
    if more >= chunked or interleaved:
        action = (f"more micro-batches per step ({m} → {2 * m}, each half the size): the "
                  "fill and drain then take half as long")
        saving, how = more, f"bubble × (1 − {m}/{2 * m}) (each micro-batch slot halves)"
        knob = Knob("--microbatches", "microbatches", 2 * m) if m else None
    else:
        action = (f"an interleaved schedule ({CHUNKS} model chunks per stage, "
                  "ScheduleInterleaved1F1B): the bubble shrinks by the chunks")
        saving, how, knob = chunked, f"bubble × (1 − 1/{CHUNKS})", None
    return [Advice(NAME, finding, action, saving, saving / step, "medium", evidence, how, knob)]
