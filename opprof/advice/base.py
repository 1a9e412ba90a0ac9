"""The types of advice: one :class:`Advice` (a finding in this trace, the action that fixes it,
its predicted saving and the evidence), the :class:`Knob` `advise --verify` turns to check it,
and the :class:`Advisory` of a trace (every rule's advice ranked by saving, what was not
checked and why)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opprof.jsontypes import JSON, JSONObject

#: How sure a prediction is: ``high`` (the model removes exactly the time the trace shows),
#: ``medium`` (a model of the change: overlap, a schedule, a rank at the median speed),
#: ``low`` (an upper bound, or a model with an assumption the trace cannot check).
CONFIDENCE = ("high", "medium", "low")
#: Below this share of the step a saving is no advice (a healthy step has none above it).
MIN_SHARE = 0.02


def lower(confidence: str) -> str:
    """One step less sure (``low`` stays ``low``)."""
    i = CONFIDENCE.index(confidence) if confidence in CONFIDENCE else len(CONFIDENCE) - 1
    return CONFIDENCE[min(i + 1, len(CONFIDENCE) - 1)]


@dataclass(frozen=True)
class Knob:
    """What `opprof advise --verify` changes in a recorded run to apply an action: an
    `opprof record` option (``option``, e.g. ``--loader-workers``), its field of
    :class:`~opprof.collectors.config.RecordConfig` and the value."""

    option: str
    field: str
    value: int | float | str | bool

    @property
    def text(self) -> str:
        """``--loader-workers 2``."""
        return self.option if self.value is True else f"{self.option} {self.value}"

    def to_dict(self) -> JSONObject:
        """JSON form."""
        return {"option": self.option, "value": self.value}


@dataclass(frozen=True)
class Advice:
    """One piece of advice: what the trace shows (``finding``), what to do (``action``), what
    it saves per step (``saving_ns``, ``saving_share`` of the measured step) as the model or
    the replay predicts it (``model``), how sure that is, and the figures it rests on."""

    rule: str
    finding: str
    action: str
    saving_ns: float
    saving_share: float
    confidence: str
    evidence: dict[str, JSON]
    model: str
    knob: Knob | None = None
    #: ``training`` (a change to the job) or ``measurement`` (about the profile itself: it
    #: saves no training time, so it ranks last).
    kind: str = "training"

    def to_dict(self) -> JSONObject:
        """JSON form: the contract's keys (finding, action, saving_ns, saving_share,
        confidence, evidence) and the rule, model, knob and kind."""
        return {"finding": self.finding, "action": self.action,
                "saving_ns": round(self.saving_ns, 1), "saving_share": self.saving_share,
                "confidence": self.confidence, "evidence": self.evidence, "rule": self.rule,
                "model": self.model, "knob": self.knob.to_dict() if self.knob else None,
                "kind": self.kind}


@dataclass(frozen=True)
class Advisory:
    """The advice on one trace: ``advice`` ranked by saving (largest first; the measurement
    notes last), ``minor`` (findings whose saving is under :data:`MIN_SHARE` of the step),
    the rules ``checked`` and those ``not_checked`` with the reason."""

    label: str
    step_ns: float
    advice: list[Advice]
    minor: list[Advice] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    not_checked: dict[str, str] = field(default_factory=dict)
    #: what bound the step where nothing is advised (the largest phase and operator)
    bound: str = ""

    @property
    def healthy(self) -> bool:
        """No rule found a saving of :data:`MIN_SHARE` of the step or more."""
        return not any(a.kind == "training" for a in self.advice)

    def to_dict(self) -> JSONObject:
        """JSON: ``advice`` (the contract's list, by saving), ``healthy``, ``step_ns``,
        ``minor``, ``checked``, ``not_checked``, ``bound``."""
        return {"advice": [a.to_dict() for a in self.advice], "healthy": self.healthy,
                "step_ns": self.step_ns, "label": self.label, "bound": self.bound,
                "minor": [a.to_dict() for a in self.minor], "checked": list(self.checked),
                "not_checked": dict(self.not_checked)}


@dataclass(frozen=True)
class Verified:
    """One action applied by `opprof advise --verify`: the run recorded again with its knob,
    beside the baseline recorded again, and the saving the advice predicted beside the one
    measured (unprofiled step time per sample: a knob that changes the batch compares per
    sample)."""

    rule: str
    action: str
    knob: Knob
    predicted_ns: float
    predicted_share: float
    base_step_ns: float  # the baseline's unprofiled step (per its batch)
    new_step_ns: float  # the run with the knob: unprofiled step × base batch / its batch
    trace: str
    base_trace: str

    @property
    def achieved_share(self) -> float:
        """1 − new / base (per sample)."""
        return 1.0 - self.new_step_ns / self.base_step_ns if self.base_step_ns else 0.0

    @property
    def achieved_ns(self) -> float:
        """Base minus new, ns per step of the base's batch."""
        return self.base_step_ns - self.new_step_ns

    @property
    def error(self) -> float:
        """Achieved minus predicted saving, in shares of the step (points)."""
        return self.achieved_share - self.predicted_share

    def to_dict(self) -> JSONObject:
        """JSON form (one of ``verify.actions``)."""
        return {"rule": self.rule, "action": self.action, "knob": self.knob.to_dict(),
                "predicted_saving_ns": self.predicted_ns,
                "predicted_saving_share": self.predicted_share,
                "achieved_saving_ns": self.achieved_ns,
                "achieved_saving_share": self.achieved_share, "error": self.error,
                "base_step_ns": self.base_step_ns, "new_step_ns": self.new_step_ns,
                "trace": self.trace, "base_trace": self.base_trace}


@dataclass(frozen=True)
class Verification:
    """What `advise --verify` ran: each applied action's predicted vs achieved saving, the
    advice it could not apply (and why), the machine's load while it ran."""

    actions: list[Verified]
    not_applied: list[str] = field(default_factory=list)
    load: str = ""  # the host's load average while the runs ran (1, 5, 15 min)

    def to_dict(self) -> JSONObject:
        """JSON ``verify``."""
        return {"actions": [v.to_dict() for v in self.actions],
                "not_applied": list(self.not_applied), "load": self.load}


@dataclass(frozen=True)
class AdviseResult:
    """`opprof advise`: the advisory of a trace and, with ``--verify``, its check."""

    advisory: Advisory
    verification: Verification | None = None

    def to_dict(self) -> JSONObject:
        """JSON: the advisory's keys, and ``verify`` when the actions were checked."""
        out = self.advisory.to_dict()
        if self.verification is not None:
            out["verify"] = self.verification.to_dict()
        return out
