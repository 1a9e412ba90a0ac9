"""The advise pipeline: a trace read once, reported and advised (:func:`advise_trace`); and
`advise --verify`: the recorded run's actions applied by `opprof record` with their knobs,
beside the baseline recorded again, each predicted saving set beside the measured one
(:func:`verify`)."""

from __future__ import annotations

import os
import shlex
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opprof.advice import advise
from opprof.advice.base import Advice, Advisory, Knob, Verification, Verified
from opprof.errors import OpprofError
from opprof.kinds import Framework, Mode

if TYPE_CHECKING:
    from opprof.analysis.report import Report
    from opprof.collectors.config import RecordConfig
    from opprof.trace import Trace

#: Which frameworks (and modes) each record knob applies to.
KNOB_SCOPE: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "loader_workers": ((Framework.TORCH, Framework.MXNET), None),
    "bucket_mb": ((Framework.TORCH,), (Mode.ALLREDUCE, Mode.ZERO)),
    "batch_size": ((Framework.TORCH, Framework.TF, Framework.MXNET), None),
    "servers": ((Framework.MXNET, Framework.TF), (Mode.PS_SYNC, Mode.PS_ASYNC)),
    "microbatches": ((Framework.TORCH,), None),
}


def advise_trace(paths: Sequence[str | os.PathLike[str]]) -> tuple[Trace, Report, Advisory]:
    """Read the trace at ``paths`` once, report it and advise on it."""
    from opprof.analysis.report import build_report
    from opprof.loader import load

    trace = load(list(paths))
    report = build_report(trace)
    label = Path(paths[0]).name if paths else ""
    return trace, report, advise(trace, report, label)


def applicable(advice: Advice, options: RecordConfig) -> str | None:
    """Why ``advice`` cannot be applied to the recorded run (None: it can)."""
    knob = advice.knob
    if knob is None:
        return "no record option applies it"
    scope = KNOB_SCOPE.get(knob.field)
    if scope is None or not hasattr(options, knob.field):
        return f"`opprof record` has no {knob.option}"
    fws, modes = scope
    if options.fw not in fws:
        return f"{knob.option} does not apply to --fw {options.fw}"
    mode = options.mode or Mode.SINGLE
    if modes is not None and mode not in modes:
        return f"{knob.option} does not apply to --mode {mode}"
    return None


def verify(result: Advisory, options: RecordConfig, folder: Path, limit: int = 3,
           repeat: int = 1, say: Callable[[str], None] = lambda line: None) -> Verification:
    """Apply the first ``limit`` actions with a record knob (the ranked advice, then the minor
    findings) to the recorded run ``options``: record the baseline again, then each action
    with its knob, into ``folder`` — ``repeat`` rounds of them, one after another, so a change
    of the machine's load falls on every configuration alike; each predicted saving beside the
    achieved one (the median over the rounds of the unprofiled step time, per sample)."""
    from opprof.pipeline.record import record

    chosen: list[Advice] = []
    skipped: list[str] = []
    for a in [*result.advice, *result.minor]:
        if a.kind != "training":
            continue
        why = applicable(a, options)
        if why is not None:
            skipped.append(f"{a.rule}: {why}")
        elif len(chosen) < limit and not any(c.knob == a.knob for c in chosen):
            chosen.append(a)
    if not chosen:
        return Verification([], skipped, _load())
    folder.mkdir(parents=True, exist_ok=True)
    configs: list[tuple[str, Knob | None]] = [("base", None)]
    configs += [(f"{a.rule}-{a.knob.option.strip('-')}-{a.knob.value}", a.knob)
                for a in chosen if a.knob is not None]
    steps: dict[str, list[float]] = {name: [] for name, _ in configs}
    paths: dict[str, Path] = {}
    for r in range(repeat):
        for name, knob in configs:
            path = folder / (f"{name}.trace" if repeat == 1 else f"{name}-{r + 1}.trace")
            say(f"recording {'the baseline again' if knob is None else 'with ' + knob.text}"
                f"{f' (round {r + 1} of {repeat})' if repeat > 1 else ''}: {path}")
            change: dict[str, Any] = {knob.field: knob.value} if knob is not None else {}
            run = record(replace(options, command=_command(options.command, knob, path),
                                 **change), path)
            steps[name].append(_per_sample(run.meta, int(options.batch_size)))
            paths[name] = path
    base_step = statistics.median(steps["base"])
    out = [Verified(a.rule, a.action, a.knob, a.saving_ns, a.saving_share, base_step,
                    statistics.median(steps[name]), str(paths[name]), str(paths["base"]))
           for a, (name, _) in zip(chosen, configs[1:], strict=True) if a.knob is not None]
    return Verification(out, skipped, _load())


def _per_sample(meta: object, base_batch: int) -> float:
    """A run's unprofiled step time scaled to ``base_batch`` samples (its own batch in
    ``meta``); an error when the run kept no unprofiled timing."""
    from opprof.meta import TraceMeta

    m = TraceMeta.of(meta)  # type: ignore[arg-type]
    step = m.get("unprofiled_step_ns")
    if not step:
        raise OpprofError("advise --verify: a run kept no unprofiled step time")
    batch = int(m.get("batch_size") or base_batch)
    return float(step) * base_batch / batch


def _command(command: str, knob: Knob | None, output: Path) -> str:
    """The `opprof record` line a verification run is the run of: the original one with the
    knob's option (replacing its value there) and ``-o output``."""
    words = shlex.split(command)
    drop = {"-o", "--output", *([knob.option] if knob is not None else [])}
    kept: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        name = w.split("=", 1)[0]
        if name in drop:
            skip = "=" not in w
            continue
        kept.append(w)
    if knob is not None:
        kept += [knob.option] if knob.value is True else [knob.option, str(knob.value)]
    return shlex.join([*kept, "-o", str(output)])


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return ""
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"
