"""Advice ranked by the time it saves: one small module per rule, each reading its evidence in
this trace, naming an action and predicting its saving with the model or the replay
(:mod:`opprof.model.knobs`); :func:`advise` runs every rule whose evidence the trace has and
ranks what they say. Nothing is advised without evidence in this trace, and a step where no
rule finds a saving of :data:`~opprof.advice.base.MIN_SHARE` of it or more is called healthy.

The rules (docs/advice.md): :mod:`.input_bound`, :mod:`.exposed_comm`,
:mod:`.pipeline_bubble`, :mod:`.launch_bound`, :mod:`.low_efficiency`, :mod:`.stragglers`,
:mod:`.memory_headroom`, :mod:`.profiler_overhead`. Each has ``NAME``, ``NEEDS`` (the
evidence it cannot run without) and ``advise(evidence) -> list[Advice]``."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from opprof.advice import (
    exposed_comm,
    input_bound,
    launch_bound,
    low_efficiency,
    memory_headroom,
    pipeline_bubble,
    profiler_overhead,
    stragglers,
)
from opprof.advice.base import MIN_SHARE, Advice, Advisory, lower
from opprof.advice.evidence import Evidence
from opprof.errors import OpprofError

if TYPE_CHECKING:
    from opprof.analysis.report import Report
    from opprof.model.whatif import Context
    from opprof.trace import Trace


class Rule(Protocol):
    """One rule module."""

    NAME: str
    NEEDS: tuple[str, ...]

    def advise(self, ev: Evidence) -> list[Advice]:
        """The rule's advice on this trace (empty: nothing found)."""
        ...


#: Every rule, in the order their advice is listed at equal saving.
RULES: tuple[Rule, ...] = (input_bound, exposed_comm, pipeline_bubble, launch_bound,
                           low_efficiency, stragglers, memory_headroom, profiler_overhead)


def advise(trace: Trace, report: Report, label: str = "",
           context: Context | None = None) -> Advisory:
    """Every rule's advice on ``trace`` (whose report is ``report``), ranked by saving
    (``context``: its what-if context, made already with the graph the report's critical path
    was computed from)."""
    ev = Evidence(trace, report, label, context)
    step = ev.step_ns
    if report.steps.empty or step <= 0:
        return Advisory(label, 0.0, [], not_checked={r.NAME: "the trace has no steps on a "
                                                             "worker rank" for r in RULES})
    try:
        ev.context  # noqa: B018 — the model's baseline: a trace it cannot read is said once
    except OpprofError as exc:
        return Advisory(label, step, [], not_checked={r.NAME: str(exc) for r in RULES})
    found: list[Advice] = []
    checked: list[str] = []
    skipped: dict[str, str] = {}
    for rule in RULES:
        why = next((w for w in (_missing(ev, need) for need in rule.NEEDS) if w), None)
        if why:
            skipped[rule.NAME] = why
            continue
        checked.append(rule.NAME)
        found.extend(rule.advise(ev))
    noise = report.noise
    if noise is not None and "noisy" in noise.flags:
        found = [a if a.kind != "training" else replace(a, confidence=lower(a.confidence))
                 for a in found]
    training = sorted((a for a in found if a.kind == "training"),
                      key=lambda a: -a.saving_ns)
    ranked = [a for a in training if a.saving_share >= MIN_SHARE]
    minor = [a for a in training if a.saving_share < MIN_SHARE]
    notes = [a for a in found if a.kind != "training"]
    return Advisory(label, step, [*ranked, *notes], minor, checked, skipped, _bound(ev))


def _missing(ev: Evidence, need: str) -> str | None:
    """Why the evidence ``need`` is missing from this trace (None: it is there)."""
    rep = ev.report
    if need == "gpu":
        return None if ev.gpu else "no GPU work in this trace"
    if need == "ranks":
        return None if rep.steps["rank"].nunique() >= 2 else "one worker rank"
    if need == "memory":
        return None if len(rep.memory.ranks) else "no memory samples in this trace"
    if need == "noise":
        return None if rep.noise is not None else "no unprofiled timing in this trace"
    if need == "pipeline":
        if not hasattr(rep, "pipeline"):
            return ("needs the pipeline analysis (report --by pipeline, the bubble per stage), "
                    "which this opprof does not have yet")
        return None if ev.pipeline is not None else "not a pipeline-parallel job"
    if need == "roofline":
        if not hasattr(rep, "efficiency"):
            return ("needs the efficiency analysis (FLOPs and the roofline per operator), "
                    "which this opprof does not have yet")
        return None if ev.roofline is not None else "no FLOPs for this trace (no shapes)"
    raise ValueError(f"unknown evidence {need!r}")


def _bound(ev: Evidence) -> str:
    """What the step spends most on: its largest phase and operator."""
    phases = ev.report.phases
    if phases.empty:
        return ""
    top = phases["ns_per_step"].idxmax()
    where = "device" if ev.gpu else "host"
    ops = ev.ops_per_step(where)
    ops = ops[ops.index != "other"]
    op = f"; the largest operator is {ops.index[0]} ({ops.iloc[0] / ev.step_ns:.0%})" \
        if len(ops) and ev.step_ns else ""
    return f"{top} holds {phases.loc[top, 'share']:.0%} of the step{op}"
