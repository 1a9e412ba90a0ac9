"""The runner: the one recording protocol every profiled process follows, whatever drives its
steps — the built-in models of `record`, the startup hook of `run` (a framework's optimizer
step), or a script's own ``prof.step()`` (`opprof.profile()`).

The runner is told where each training step ends (:meth:`Runner.step`); everything else is
decided here, the same way for every framework:

1. ``warmup`` steps run unprofiled and untimed (compilation, caches, thread pools);
2. ``timing_steps`` steps run unprofiled and timed: their mean is ``unprofiled_step_ns``, the
   reference against which the profiler's own overhead is known;
3. the adapter's profiler starts (after its ``before_profile``: a barrier, the clock sync),
   sees ``profiler_warmup`` steps it does not record (torch's schedule; MXNet's graphs
   planned again without bulk execution), then ``steps``
   profiled steps, each between two step markers (``ProfilerStep#N``, ``opprof.step#N``,
   ``train N``); then it stops and writes this process's native trace, named by its rank.

4. ``timing_after`` more unprofiled timed steps (`record`; `run` when the script goes on):
   the unprofiled step time is measured on both sides of the profile, so a machine whose load
   changed during the run is seen (:mod:`opprof.analysis.noise`), not taken for the
   profiler's overhead; the adapter's ``settle_after`` first steps (MXNet: a CachedOp built
   again as the user had it; torch: the first, which pays the profiler's teardown) are not
   timed.

Every timed step's duration is kept (``timing_ns``, ``timing_after_ns``); the unprofiled step
time is their median. At every step boundary the process's :class:`~.config.Facts` go to its
status file (the progress channel, :mod:`.channel`), and so do its trace files and timings at
the end; the stage is ``write`` while the profiler writes. A process that ends early (an
exception, a signal, the end of the script) calls :meth:`Runner.close`: the profiled steps
that completed are written, the incomplete one is not; :func:`drive` does so for any
exception, and :func:`writing` tells a signal handler not to interrupt the write.

**Convergence** (`record --converge STEPS`, :class:`Convergence`): :func:`drive` goes on
training after the protocol until STEPS steps in all (the protocol's steps among them, so the
profiled steps are taken inside), keeping each step's loss and duration, and every
``eval_every`` steps the model's train and test accuracy (never inside the protocol's timed
or profiled steps: an evaluation due there runs right after them). The loss a step returns
is read after the step (outside the profiled steps: there it is kept and read after the
profile). ``time_ns`` is
the training time so far: the sum of the step durations (each ended by the adapter's
``sync``; the profiled ones are slower by the profiler's overhead), without the
evaluations, the profiler's start, stop and trace writing. The rows
go to the process's status at the end (``Facts.convergence``). It is the same for every
mode: only the step and the two readers come from the framework.

An adapter (:class:`Adapter`) holds only framework calls. Test-only fault injection is here
too, and only here (:func:`fault_point`, from ``$OPPROF_TEST_FAULT``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from typing import Protocol as TypingProtocol

from opprof.collectors.channel import Reporter
from opprof.collectors.config import Facts, FactsUpdate, Framework, Protocol, Role
from opprof.errors import first_line

if TYPE_CHECKING:
    from opprof.meta import CurveRow

#: What a training step returns (its loss, read by :class:`Convergence`), or the loss value a
#: framework's hook keeps (:class:`LossLog`).
Out = TypeVar("Out")

FAULT_ENV = "OPPROF_TEST_FAULT"
LABEL_ENV = "OPPROF_LABEL"


class Adapter(TypingProtocol):
    """The framework calls the runner needs (one class per framework)."""

    framework: Framework
    #: Step boundaries the profiler needs after starting before it records (torch: 1).
    profiler_warmup: int

    def version(self) -> str: ...

    def sync(self) -> None:
        """Wait for the work already queued (CUDA streams, MXNet's engine)."""

    def identity(self) -> tuple[Role, int | None]:
        """This process's role and rank as the framework sees it (at profile start)."""

    def before_profile(self) -> dict[str, Any]:
        """Meet the other processes (barrier, clock sync); facts to keep."""

    def start(self, folder: Path, role: Role, rank: int) -> None:
        """Start the profiler, open the marker of profiled step 0."""

    def boundary(self, index: int) -> None:
        """Profiled step ``index - 1`` ended and ``index`` begins."""

    def stop(self, complete: bool) -> list[Path]:
        """Close the last step (dropped when not ``complete``), stop, write the native
        trace(s) into the folder; their paths."""

    def after_profile(self) -> None:
        """Meet the other processes again so none tears down while another still writes."""

    def facts(self) -> dict[str, Any]:
        """What this process knows about its run (threads, parameters, model …)."""

    def release(self) -> None:
        """Drop the framework objects held (profiler, kvstore): the recording is over, and
        they must not outlive the framework's own shutdown."""


def env_identity() -> tuple[Role, int | None, str]:
    """Role, rank and label from the environment the launchers set (torchrun's ``RANK``,
    ``TF_CONFIG``'s task, ``DMLC_ROLE``), before any framework is asked. A process opprof
    started itself is named by ``$OPPROF_LABEL``."""
    role, rank, label = _env_identity()
    return role, rank, os.environ.get(LABEL_ENV) or label


def _env_identity() -> tuple[Role, int | None, str]:
    if os.environ.get("RANK", "").isdigit():
        rank = int(os.environ["RANK"])
        return Role.WORKER, rank, f"rank {rank}"
    tf_config = os.environ.get("TF_CONFIG")
    if tf_config:
        try:
            task = json.loads(tf_config).get("task", {})
            kind, index = str(task.get("type", "worker")), int(task.get("index", 0))
        except (ValueError, TypeError, AttributeError):
            kind, index = "worker", 0
        role = {"ps": Role.SERVER}.get(kind, Role.WORKER)
        return role, index, f"{kind} {index}"
    dmlc = os.environ.get("DMLC_ROLE")
    if dmlc in ("server", "scheduler"):
        return Role(dmlc), None, dmlc
    if dmlc == "worker":
        return Role.WORKER, None, f"worker (pid {os.getpid()})"
    return Role.WORKER, None, f"pid {os.getpid()}"


#: Test-only: what a fault does to the process it names (:func:`fault_point`).
FAULT_ACTIONS = ("exit", "hang", "pause", "kill", "stop", "fsize")
#: How long the ``pause`` fault sleeps before the process goes on.
FAULT_PAUSE_S = 30.0  # under the supervisor's HANG_MIN_S: a pause is no hang
#: The file size limit of the ``fsize`` fault: the next trace written is cut at this size.
FAULT_FSIZE = 64 * 1024


def fault_point(label: str, stage: str) -> None:
    """Test-only: fail here if ``$OPPROF_TEST_FAULT`` names this process (``{"who": "rank 1",
    "at": "warmup", "action": ...}``) and this stage: ``exit`` (code 3), ``hang`` (sleep
    forever), ``pause`` (sleep FAULT_PAUSE_S seconds, then go on: a window a test can act
    in), ``kill`` (a real SIGKILL to itself), ``stop`` (a real SIGSTOP: frozen), or
    ``fsize`` (a file size limit of FAULT_FSIZE bytes, so that the kernel kills the process
    with SIGXFSZ in the middle of writing its trace, leaving it half-written)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    fault = json.loads(spec)
    if fault.get("who") != label or fault.get("at", "warmup") != stage:
        return
    action = fault.get("action", "exit")
    if action == "hang":
        while True:
            time.sleep(3600)
    if action == "pause":
        time.sleep(FAULT_PAUSE_S)
        return
    if action in ("kill", "stop"):
        os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        return
    if action == "fsize":
        import resource

        sys.stdout.flush()
        sys.stderr.flush()
        resource.setrlimit(resource.RLIMIT_FSIZE, (FAULT_FSIZE, FAULT_FSIZE))
        # Python ignores SIGXFSZ (a write past the limit then fails with EFBIG, which a
        # framework's C++ writer may not check); the kernel's default kills the process.
        with contextlib.suppress(ValueError):  # not the main thread: EFBIG then
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        return
    os._exit(3)


_WRITING: list[int] = []  # pids whose runner is writing its trace now


def writing() -> bool:
    """Whether this process's runner is writing its trace (a SIGTERM handler then lets it
    finish: the supervisor kills what overstays)."""
    return os.getpid() in _WRITING


@contextlib.contextmanager
def _writing() -> Iterator[None]:
    _WRITING.append(os.getpid())
    try:
        yield
    finally:
        _WRITING.remove(os.getpid())


_PENDING: dict[int, BaseException] = {}  # pid -> the interrupt its signal handler raised


def pend(stop: BaseException) -> None:
    """Remember the interrupt a signal handler is about to raise: raised where Python ignores
    exceptions (an object's ``__del__``, such as MXNet's NDArray freeing its handle, or a
    weakref callback) it is only printed, so :func:`raise_pending` raises it again at the
    next step; one that arrives while the trace is written is raised there too."""
    _PENDING[os.getpid()] = stop


def pending() -> BaseException | None:
    """The interrupt :func:`pend` kept and no one has handled yet, if any."""
    return _PENDING.get(os.getpid())


def handled() -> None:
    """The interrupt reached a handler (:func:`drive` keeps the profiled steps): it is no
    longer pending."""
    _PENDING.pop(os.getpid(), None)


def raise_pending() -> None:
    """Raise the interrupt :func:`pend` kept, if any (once)."""
    stop = _PENDING.pop(os.getpid(), None)
    if stop is not None:
        raise stop


def reclaim_sigterm() -> None:
    """Install again the Python SIGTERM handler this process had (a `record` worker's): a
    library that set its own at the C level (TensorFlow's preemption notifier, when a
    multi-worker strategy starts) would otherwise swallow SIGTERM unseen by Python."""
    with contextlib.suppress(ValueError, TypeError):  # not the main thread; no handler
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):
            signal.signal(signal.SIGTERM, handler)


def median_ns(samples: list[int]) -> int | None:
    """The median of step durations (None for none)."""
    return int(statistics.median(samples)) if samples else None


class Runner:
    """One process's recording: count step boundaries, time, profile, report."""

    def __init__(self, adapter: Adapter, protocol: Protocol, folder: Path, *,
                 extra: dict[str, Any] | None = None) -> None:
        self.adapter, self.protocol, self.folder = adapter, protocol, Path(folder)
        role, rank, label = env_identity()
        self.reporter = Reporter(self.folder, Facts(
            pid=os.getpid(), host=socket.gethostname(), label=label, role=role, rank=rank,
            framework=str(adapter.framework), framework_version=adapter.version(),
            warmup=protocol.warmup, timing_steps=protocol.timing_steps,
            profiled_target=protocol.steps, extra=dict(extra or {})))
        self.n = -1  # boundaries seen; boundary 0 is the start of the first step
        self.marks: dict[int, int] = {}
        self.profiling = False
        self.finished = False
        #: `opprof run`: the loss of every step, kept by the framework's hook (:class:`LossLog`)
        self.loss_log: StepLosses | None = None
        self.progress: dict[str, list[int]] = {}
        self.before: list[int] = []  # unprofiled step durations before the profile (ns)
        self.after: list[int] = []  # and after it
        self._last = 0
        self._settle = 0  # steps after the profile left out of the timing

    # -- where the protocol stands

    @property
    def start_at(self) -> int:
        """The boundary at which the profiler starts."""
        return self.protocol.warmup + self.protocol.timing_steps

    @property
    def end_at(self) -> int:
        return self.start_at + self.adapter.profiler_warmup + self.protocol.steps

    @property
    def facts(self) -> Facts:
        return self.reporter.facts

    @property
    def label(self) -> str:
        return self.reporter.facts.label

    # -- driven from outside

    def begin(self) -> None:
        """The first step is about to start (when the driver knows; a hook does not)."""
        if self.n < 0:
            fault_point(self.label, "setup")
            self.n = 0
            self._at_boundary()

    def step(self) -> None:
        """A training step just ended."""
        if self.finished:
            return
        self.n = max(self.n, 0) + 1
        if self.n > self.end_at:
            self._after_boundary()
        else:
            self._at_boundary()

    def step_or_give_up(self) -> None:
        """:meth:`step` for a hook inside someone else's training: a failure of opprof's own
        (the profiler, the disk) ends this process's recording with one line on stderr and
        an error in its status, never the training."""
        try:
            self.step()
        except Exception as exc:  # noqa: BLE001 - the user's job goes on, unprofiled
            message = f"{type(exc).__name__}: {first_line(exc)}"
            print(f"opprof: profiling stopped in this process ({message}); training goes on",
                  file=sys.stderr)
            self.finished = True
            self.profiling = False
            with contextlib.suppress(Exception):
                self.reporter.update(error=message, ended=message)

    def close(self, reason: str) -> None:
        """The process ends before the protocol did: keep what was profiled, say why."""
        if self.finished:
            return
        self.finished = True
        if self.facts.stage == "done":  # profiled and written; the timing after was cut short
            self.reporter.update(timing_after_ns=list(self.after))
            return
        changes: FactsUpdate = {"ended": reason}
        if self.profiling:
            self.profiling = False
            self.reporter.update(stage="write", ended=reason)
            with _writing():
                files = self.adapter.stop(complete=False)
            changes["stage"] = "profile"  # written: no longer in the middle of it
            if self.facts.profiled_steps:
                changes["native"] = [str(p) for p in files]
            else:  # not one profiled step completed: nothing worth keeping
                for f in files:
                    f.unlink(missing_ok=True)
        # Said before the framework's objects are freed: freeing MXNet's dist kvstore waits
        # for its queued work and a barrier with the other workers, forever when a peer
        # stopped first in the middle of a step (ps-sync); the files are already written.
        self.reporter.update(**changes)
        self.adapter.release()

    # -- the protocol

    def _at_boundary(self) -> None:
        p, n = self.protocol, self.n
        stage, done, total = self._position(n)
        if done == 1:
            fault_point(self.label, stage)
        if n >= p.warmup:  # timed from here: the work queued so far must be done
            self.adapter.sync()
            self.marks[n] = time.perf_counter_ns()
        self.progress[stage] = [done, total]
        if n == p.warmup and p.timing_steps:
            self.progress["timing"] = [0, p.timing_steps]
        changes: FactsUpdate = {"stage": stage, "done": done, "total": total,
                                   "steps_seen": n, "extra": self._extra()}
        if n == self.start_at:
            self.facts.extra = changes["extra"]
            self._start_profile()
            return
        if self.profiling:
            index = n - self.start_at
            if n == self.end_at:
                changes.update(self._stop_profile())
            else:
                self.adapter.boundary(index)
                changes["profiled_steps"] = max(0, index - self.adapter.profiler_warmup)
        self.reporter.update(**changes)

    def _position(self, n: int) -> tuple[str, int, int]:
        """(stage, steps done in it, its length) once ``n`` steps have ended."""
        p, pw = self.protocol, self.adapter.profiler_warmup
        if n < p.warmup or (n == p.warmup and p.warmup):
            return "warmup", n, p.warmup
        if n <= self.start_at and p.timing_steps:
            return "timing", n - p.warmup, p.timing_steps
        return "profile", max(0, n - self.start_at - pw), p.steps

    def _extra(self) -> dict[str, Any]:
        return {**self.facts.extra, "progress": dict(self.progress)}

    def _after_boundary(self) -> None:
        """A step after the profile ended: timed, unprofiled (``timing_after``)."""
        self.adapter.sync()
        now = time.perf_counter_ns()
        if self._settle:  # a step that rebuilt what the profile changed: not timed
            self._settle -= 1
            self._last = now
            return
        self.after.append(now - self._last)
        self._last = now
        if len(self.after) >= self.protocol.timing_after:
            self.finished = True
            self.reporter.update(timing_after_ns=list(self.after),
                                 unprofiled_step_ns=median_ns(self.before + self.after))

    def _start_profile(self) -> None:
        p = self.protocol
        self.before = [self.marks[i + 1] - self.marks[i] for i in range(p.warmup, self.start_at)
                       if i in self.marks and i + 1 in self.marks]
        step_ns = median_ns(self.before)
        extra = {**self._extra(), **self.adapter.before_profile()}
        role, rank = self.adapter.identity()
        if rank is None:
            rank = self.facts.rank if self.facts.rank is not None else 0
        rank = self.reporter.claim(role, rank)
        label = os.environ.get(LABEL_ENV) or (
            f"rank {rank}" if role == Role.WORKER else f"{role} {rank}")
        self.progress["profile"] = [0, p.steps]
        self.reporter.update(role=role, rank=rank, label=label, unprofiled_step_ns=step_ns,
                             timing_ns=list(self.before),
                             stage="profile", done=0, total=p.steps, steps_seen=self.n,
                             extra={**extra, "progress": dict(self.progress)})
        self.adapter.start(self.folder, role, rank)
        self.profiling = True

    def _stop_profile(self) -> FactsUpdate:
        fault_point(self.label, "write")
        self.reporter.update(stage="write", profiled_steps=self.protocol.steps)
        with _writing():
            files = self.adapter.stop(complete=True)
        self.profiling = False
        self._settle = int(getattr(self.adapter, "settle_after", 0))
        first = self.start_at + self.adapter.profiler_warmup
        wall = self.marks[self.end_at] - self.marks[first]
        self.adapter.after_profile()
        self.finished = self.protocol.timing_after <= 0
        facts = self.adapter.facts()
        self.adapter.release()
        self._last = time.perf_counter_ns()  # the steps after are timed from here
        self.progress["profile"] = [self.protocol.steps, self.protocol.steps]
        return {"stage": "done", "done": 1, "total": 1, "native": [str(p) for p in files],
                "profiled_steps": self.protocol.steps, "profiled_wall_ns": wall,
                "threads": facts.pop("threads", None),
                "extra": {**self.facts.extra, **facts, "progress": dict(self.progress)}}


@dataclass
class Convergence(Generic[Out]):
    """A convergence run (see the module docstring): ``steps`` in all, an evaluation every
    ``eval_every`` (0: at the last step only); ``loss`` reads a step's return value as one
    float, ``accuracy`` gives the model's (train, test) accuracy now."""

    steps: int
    eval_every: int
    loss: Callable[[Out], float]
    accuracy: Callable[[], tuple[float, float]]


class Curve(Generic[Out]):
    """The convergence rows of one process as it trains (:class:`Convergence`)."""

    def __init__(self, spec: Convergence[Out]) -> None:
        self.spec = spec
        self.rows: list[CurveRow] = []
        self.elapsed = 0
        self._unread: list[tuple[int, Out]] = []  # (row index, step output) not read yet
        self._due = False  # an evaluation is due (deferred out of the protocol)

    def add(self, step: int, duration_ns: int, output: Out, profiling: bool,
            timing: bool) -> None:
        """Step ``step`` (1-based) took ``duration_ns`` and returned ``output``; the losses
        are read outside the ``profiling`` steps, evaluations outside the protocol's
        ``timing`` (timed or profiled) steps."""
        self.elapsed += duration_ns
        self.rows.append({"step": step, "time_ns": self.elapsed, "loss": None,
                          "train_accuracy": None, "test_accuracy": None})
        self._unread.append((len(self.rows) - 1, output))
        every = self.spec.eval_every
        self._due = self._due or bool(every and step % every == 0)
        if not profiling:
            self._settle(evaluate=not timing)

    def finish(self) -> list[CurveRow]:
        """The rows, every loss read and the last step evaluated."""
        if self.rows and self.rows[-1]["test_accuracy"] is None:
            self._due = True
        self._settle()
        return self.rows

    def _settle(self, evaluate: bool = True) -> None:
        for i, out in self._unread:
            self.rows[i]["loss"] = float(self.spec.loss(out))
        self._unread.clear()
        if self._due and evaluate:
            self._due = False
            train, test = self.spec.accuracy()
            self.rows[-1]["train_accuracy"] = float(train)
            self.rows[-1]["test_accuracy"] = float(test)


class StepLosses(TypingProtocol):
    """What the runner of `opprof run` keeps of a :class:`LossLog` (any framework's)."""

    steps: int

    def step_end(self, profiling: bool) -> None: ...

    def rows(self) -> list[CurveRow]: ...


class LossLog(Generic[Out]):
    """The loss of a user's own training steps (`opprof run`): a framework's hook calls
    :meth:`seen` with the scalar ``backward()`` ran on (the last one of a step counts) and
    :meth:`step_end` at each step end. Values are read (``read``: a list of them → floats,
    one device transfer for all) outside the profiled steps, at most every ``batch`` steps
    and at :meth:`rows`; ``time_ns`` is wall time since the first ``backward()``."""

    def __init__(self, read: Callable[[list[Out]], list[float]], batch: int = 100) -> None:
        self.read, self.batch = read, batch
        self.t0: int | None = None
        self.last: Out | None = None
        self.steps = 0
        self._rows: list[CurveRow] = []
        self._pending: list[tuple[int, Out]] = []

    def seen(self, loss: Out) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter_ns()
        self.last = loss

    def step_end(self, profiling: bool) -> None:
        if self.last is None:  # no backward() on a scalar in this step
            return
        self.steps += 1
        self._rows.append({"step": self.steps, "time_ns": time.perf_counter_ns() - (self.t0 or 0),
                           "loss": None, "train_accuracy": None, "test_accuracy": None})
        self._pending.append((len(self._rows) - 1, self.last))
        self.last = None
        if not profiling and len(self._pending) >= self.batch:
            self._settle()

    def rows(self) -> list[CurveRow]:
        """Every step's row, each loss read."""
        self._settle()
        return self._rows

    def _settle(self) -> None:
        if self._pending:
            values = self.read([v for _, v in self._pending])
            for (i, _), value in zip(self._pending, values, strict=True):
                self._rows[i]["loss"] = float(value)
            self._pending.clear()


def drive(runner: Runner, step: Callable[[], Out],
          convergence: Convergence[Out] | None = None) -> None:
    """Run ``step`` until the runner's protocol is done (the built-in models of `record`),
    and with ``convergence`` on until its steps are done too.
    Whatever ends it early (an error, a peer that died, SIGTERM: raised again after the step
    where a handler's exception was swallowed) first has the runner keep the profiled steps
    that completed."""
    curve = Curve(convergence) if convergence is not None else None
    try:
        runner.begin()
        if curve is None:
            while not runner.finished:
                step()
                runner.step()
                raise_pending()
            return
        done = 0
        while not runner.finished or done < curve.spec.steps:
            t0 = time.perf_counter_ns()
            out = step()
            runner.adapter.sync()
            done += 1
            curve.add(done, time.perf_counter_ns() - t0, out, runner.profiling,
                      timing=not runner.finished and done >= runner.protocol.warmup)
            runner.step()
            if done % 10 == 0 or done == curve.spec.steps:
                runner.reporter.update(converge=[done, curve.spec.steps])
            raise_pending()
        runner.reporter.update(convergence=curve.finish())
    except BaseException as exc:
        handled()
        why = str(exc) if isinstance(exc, KeyboardInterrupt) and str(exc) else (
            f"{type(exc).__name__}: {first_line(exc)}")
        try:
            runner.close(why)
        except Exception as inner:  # noqa: BLE001 - the first failure is the one to report
            print(f"opprof: could not keep the profiled steps ({type(inner).__name__}: "
                  f"{first_line(inner)})", file=sys.stderr)
        raise
