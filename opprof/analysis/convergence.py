"""Convergence beside speed (`record --converge`): the curve's summary, time and steps to a
test accuracy, and which of two runs reaches it first — split into step time and steps.

A job reaches a target when every worker's model has: per rank the first evaluation whose
test accuracy is at least the target, then the latest of the ranks (a ps-async worker that
trains worse holds the job back). ``time_ns`` is training time (runner.Curve), so time to
accuracy = steps needed × the mean step time up to there; A's time over B's is the product
of the two ratios, and each one's share of the difference is its share of the log ratio.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from opprof.trace import convergence_frame

if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject
    from opprof.meta import MetaMapping

#: Test accuracies reported (fractions).
TARGETS = (0.5, 0.7, 0.9)
#: The final loss is the mean of this many last steps (one step's loss is noisy).
FINAL_STEPS = 10


def reached(curve: pd.DataFrame, target: float) -> tuple[int, int] | None:
    """(time_ns, step) at which every rank's test accuracy first reached ``target``."""
    if curve.empty:
        return None
    hits = []
    for _, rows in curve.groupby("rank"):
        ok = rows[rows["test_accuracy"] >= target]
        if ok.empty:
            return None
        hits.append((int(ok["time_ns"].iloc[0]), int(ok["step"].iloc[0])))
    return max(hits)


def time_to_accuracy(curve: pd.DataFrame,
                     targets: tuple[float, ...] = TARGETS) -> dict[str, int]:
    """``{target: ns}`` for the targets reached (keys as ``"0.5"``)."""
    out = {}
    for t in targets:
        hit = reached(curve, t)
        if hit is not None:
            out[str(t)] = hit[0]
    return out


@dataclass(frozen=True)
class Summary:
    """A convergence curve in a few numbers (JSON's ``convergence_summary``): losses are the
    mean over ranks (``final_loss``: of the last :data:`FINAL_STEPS` steps), accuracies
    fractions, ``time_to_accuracy`` / ``steps_to_accuracy`` per target reached (``"0.5"``)."""

    steps: int
    ranks: int
    time_ns: int
    first_loss: float | None
    final_loss: float | None
    best_test_accuracy: float | None
    best_train_accuracy: float | None
    final_test_accuracy: float | None
    time_to_accuracy: dict[str, int]
    steps_to_accuracy: dict[str, int]

    def to_dict(self) -> JSONObject:
        return asdict(self)


@dataclass(frozen=True)
class Hit:
    """When one run first reached a target (every rank did): ns into training and step."""

    time_ns: int
    step: int


@dataclass(frozen=True)
class AtTarget:
    """Two runs at one target test accuracy: which reached it first (``a``, ``b`` or None)
    and how much of the difference is step time and how much steps needed (log shares);
    each run's best test accuracy (None: never evaluated)."""

    target: float
    a: Hit | None
    b: Hit | None
    first: str | None
    step_time_share: float | None
    steps_share: float | None
    a_best: float | None = None
    b_best: float | None = None

    def to_dict(self) -> JSONObject:
        """JSON form (the sentence in words is the renderer's:
        :func:`opprof.render.verdicts.target_sentence`)."""
        return {"target": self.target, "a": asdict(self.a) if self.a else None,
                "b": asdict(self.b) if self.b else None, "first": self.first,
                "step_time_share": self.step_time_share, "steps_share": self.steps_share}


@dataclass(frozen=True)
class Comparison:
    """Two runs' convergence (JSON's diff ``convergence``): per target, the first to reach
    it (the sentence naming the first target, 50%, and the highest both reach is the
    renderer's: :func:`opprof.render.verdicts.convergence_sentence`); without any
    accuracy evaluated, each run's final loss."""

    targets: list[AtTarget]
    first: str | None
    a_label: str = "A"
    b_label: str = "B"
    #: (label, final loss) of each run that has one, where no accuracy was evaluated
    final_losses: list[tuple[str, float]] = field(default_factory=list)

    @property
    def said(self) -> list[AtTarget]:
        """The targets a sentence names: the first, and the highest both runs reach."""
        if not self.targets:
            return []
        both = [c for c in self.targets if c.a and c.b]
        first = self.targets[0]
        return [first] + ([both[-1]] if both and both[-1] is not first else [])

    def to_dict(self) -> JSONObject:
        """JSON form, without the sentences (added by the JSON renderer)."""
        return {"targets": [t.to_dict() for t in self.targets], "first": self.first}


def summary(meta: MetaMapping) -> Summary | None:
    """The curve in a few numbers (None without a convergence table)."""
    curve = convergence_frame(meta)
    if curve.empty:
        return None
    last = curve.sort_values(["rank", "step"]).groupby("rank").tail(FINAL_STEPS)
    first = curve[curve["step"] == curve["step"].min()]
    evals = curve.dropna(subset=["test_accuracy"])
    steps_to = {}
    for t in TARGETS:
        hit = reached(curve, t)
        if hit is not None:
            steps_to[str(t)] = hit[1]
    return Summary(
        steps=int(curve["step"].max()), ranks=int(curve["rank"].nunique()),
        time_ns=int(curve.groupby("rank")["time_ns"].max().max()),
        first_loss=_num(first["loss"].mean()), final_loss=_num(last["loss"].mean()),
        best_test_accuracy=_num(evals["test_accuracy"].max()) if len(evals) else None,
        best_train_accuracy=_num(evals["train_accuracy"].max()) if len(evals) else None,
        final_test_accuracy=(_num(evals.sort_values("step").groupby("rank")
                                  ["test_accuracy"].last().min()) if len(evals) else None),
        time_to_accuracy=time_to_accuracy(curve), steps_to_accuracy=steps_to)


def compare(a_meta: MetaMapping, b_meta: MetaMapping, la: str,
            lb: str) -> Comparison | None:
    """Which run reaches each target test accuracy first, and how much of the difference is
    step time and how much steps needed (``targets``, one dict per target); the sentence
    names the first target (50%) and the highest both reach."""
    ca, cb = convergence_frame(a_meta), convergence_frame(b_meta)
    if ca.empty and cb.empty:
        return None
    if _best(ca) is None and _best(cb) is None:  # `opprof run`: the loss only
        fa, fb = summary(a_meta), summary(b_meta)
        losses = [(name, s.final_loss) for name, s in ((la, fa), (lb, fb))
                  if s is not None and s.final_loss is not None]
        return Comparison([], None, la, lb, losses)
    per = [_compare_at(ca, cb, t) for t in TARGETS]
    return Comparison(per, per[0].first, la, lb)


def _compare_at(ca: pd.DataFrame, cb: pd.DataFrame, target: float) -> AtTarget:
    ha, hb = reached(ca, target), reached(cb, target)
    best = {"a_best": _best(ca), "b_best": _best(cb)}
    if ha is None and hb is None:
        return AtTarget(target, None, None, None, None, None, **best)
    if ha is None or hb is None:
        return AtTarget(target, _side(ha), _side(hb), "b" if ha is None else "a", None, None,
                        **best)
    (ta, na), (tb, nb) = ha, hb
    sa, sb = ta / na, tb / nb
    first = "a" if ta <= tb else "b"
    log_t = math.log(ta / tb) if ta and tb else 0.0
    share_step = math.log(sa / sb) / log_t if log_t else None
    return AtTarget(target, _side(ha), _side(hb), first, share_step,
                    None if share_step is None else 1.0 - share_step, **best)


def _side(hit: tuple[int, int] | None) -> Hit | None:
    return None if hit is None else Hit(hit[0], hit[1])


def _best(curve: pd.DataFrame) -> float | None:
    acc = curve["test_accuracy"].dropna()
    return float(acc.max()) if len(acc) else None


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else float(v)
