"""The run pipeline: any training command, run unchanged under a supervisor — every Python
process it starts loads opprof's startup hook (:mod:`opprof.collectors.inject`) — then what its
processes recorded normalized into one `.trace` (:func:`run`)."""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opprof.collectors import channel, inject
from opprof.collectors.config import Facts, Protocol
from opprof.collectors.launch import command_recording, partial_meta
from opprof.collectors.rss import sampling
from opprof.collectors.supervisor import Supervisor, describe_exit, shell_code
from opprof.errors import Interrupted, OpprofError
from opprof.kinds import Framework
from opprof.pipeline import cpus, host_memory, native_folder, save_recording
from opprof.trace import Trace

TIMED_OUT = 124  # what `timeout` returns


@dataclass(frozen=True)
class RunOptions:
    """What `opprof run` is asked for."""

    command: tuple[str, ...]
    fw: str = "auto"  # whose steps are counted (auto: any)
    steps: int = 5
    warmup: int = 2
    timing_steps: int = 3
    output: Path | None = None  # None: SCRIPT.trace
    timeout_s: float | None = None
    profile_memory: bool = True
    memory_interval_s: float = 0.02
    #: the command's stdout goes to opprof's stderr (a machine format owns stdout)
    stdout_to_stderr: bool = False

    @property
    def path(self) -> Path:
        """The `.trace` to write."""
        return self.output or Path(f"{script_name(self.command)}.trace")

    @property
    def native(self) -> Path:
        return native_folder(self.path)

    @property
    def protocol(self) -> Protocol:
        return Protocol(self.steps, self.warmup, self.timing_steps,
                        timing_after=self.timing_steps, profile_memory=self.profile_memory)


@dataclass
class Ran:
    """What became of the command: its exit code (None: stopped at --timeout), opprof's, one
    line per process that did not record all it should (``notes``), and the `.trace` (None:
    nothing was profiled, ``nothing`` says why)."""

    code: int | None
    exit_code: int
    trace: Trace | None = None
    notes: list[str] = field(default_factory=list)
    nothing: str = ""


def run(o: RunOptions, say: Callable[[str], None]) -> Ran:
    """Run ``o.command`` profiled; ``say`` shows a line while it runs (the time limit).
    Ctrl-C, SIGTERM or SIGHUP stop it: what its processes completed is written and
    :class:`Interrupted` says so."""
    native = o.native
    if native.exists():
        shutil.rmtree(native)
    native.mkdir(parents=True)
    env = inject.environment(native, o.fw, o.protocol)
    line = shlex.join(o.command)
    memory = host_memory()
    sup = Supervisor(native, "your command", timeout_s=o.timeout_s)
    # The command stays in opprof's process group (the terminal's Ctrl-C reaches it as usual).
    sup.start("the command", list(o.command), env=env, own_group=False, stdin=None,
              stdout=sys.stderr.fileno() if o.stdout_to_stderr else None)
    try:
        with sampling(sup, o.memory_interval_s):
            code = _wait(sup, say)
    except Interrupted as exc:
        _keep_interrupted(exc, o, line)
    rec = command_recording(native, line)
    statuses = channel.read_all(native)
    notes = outcomes(statuses, o.protocol, native)
    if code not in (0, None):
        notes.append(f"the command {describe_exit(code)}" + (
            "; what it recorded is kept and reported" if rec.native else ""))
    if not rec.native:
        shutil.rmtree(native, ignore_errors=True)
        why = ("no process of the command reached its profiled steps; nothing was recorded"
               if statuses else
               "no training step was seen in the command's Python processes (opprof counts "
               "torch optimizer steps, Keras optimizer updates, gluon Trainer steps and MXNet "
               "Module updates); nothing was recorded: mark the steps with opprof.profile() in "
               "the script")
        return Ran(code, exit_code(code) or 2, None, notes, why)
    meta = {**rec.meta, "native_dir": str(native), "memory_interval_s": o.memory_interval_s}
    meta.setdefault("cpus", cpus())
    if memory is not None:
        meta.setdefault("host_memory", memory)
    trace = save_recording([*rec.native, *rec.memory], meta, native, o.path)
    return Ran(code, exit_code(code) if code != 0 else 0, trace, notes)


def exit_code(code: int | None) -> int:
    """opprof's exit code for the command's: the same (a signal N: 128 + N, as a shell
    says); 124 when it was stopped at --timeout."""
    return TIMED_OUT if code is None else shell_code(code)


def _wait(sup: Supervisor, say: Callable[[str], None]) -> int | None:
    """The command's exit code (None: stopped at --timeout). Ctrl-C, SIGTERM or SIGHUP stop
    the command (the supervisor's interrupt: the command first gets the signal itself, then
    what is left is stopped within seconds) and raise Interrupted; a second stops it at
    once."""
    try:
        code: int | None = next(iter(sup.wait(fail_fast=False).values()))
        return code
    except OpprofError as exc:  # the time limit
        say(str(exc))
        return None


def _keep_interrupted(exc: Interrupted, o: RunOptions, line: str) -> None:
    """Write what an interrupted command's processes completed to the output (marked
    ``meta["partial"]``) and raise Interrupted with one line saying so."""
    native, output = o.native, o.path
    rec = command_recording(native, line)
    statuses = channel.read_all(native)
    if not rec.native:
        shutil.rmtree(native, ignore_errors=True)
        raise Interrupted(exc.sig, f"{exc.message}; nothing was profiled, nothing written"
                          ) from None
    meta = {**rec.meta, "native_dir": str(native), "memory_interval_s": o.memory_interval_s,
            "partial": partial_meta(statuses, f"interrupted by {exc.name}")}
    try:
        trace = save_recording([*rec.native, *rec.memory], meta, native, output,
                               skip_damaged=True)
        kept = (f"wrote {output} ({trace.meta.steps} complete step(s) "
                f"over {len(trace.ranks)} rank(s))")
    except OpprofError as error:
        kept = f"{output} not written ({error})"
    except (Interrupted, KeyboardInterrupt):
        kept = f"interrupted again while writing {output}: not written"
    raise Interrupted(exc.sig, f"{exc.message}; {kept}", native) from None


def outcomes(statuses: list[Facts], protocol: Protocol, folder: Path) -> list[str]:
    """One line for each process that did not record all its profiled steps, or that died
    (a fatal signal) after it had."""
    lines = []
    for s in statuses:
        settle = (" and 1 for torch's profiler to settle" if s.framework == Framework.TORCH
                  else "")
        who = f"{s.label} (pid {s.pid})" if not s.label.startswith("pid") else f"process {s.pid}"
        why = f" ({s.ended})" if s.ended and s.ended != "the process ended" else ""
        if s.stage in ("done", "serving"):  # a parameter server never reaches steps
            fault = channel.fault_of(folder, s.pid) if s.stage == "done" else ""
            if fault:
                lines.append(f"{who} died ({fault}) after its {s.profiled_steps} profiled "
                             "steps were written; its trace is whole")
            continue
        if s.native:
            # a job that simply ran out of steps: say how many the protocol takes
            parts = [f"{protocol.warmup} warm-up", f"{protocol.timing_steps} timed",
                     *(["1 for torch's profiler to settle"] if settle else []),
                     f"{s.profiled_target} profiled"]
            total = protocol.warmup + protocol.timing_steps + bool(settle) + s.profiled_target
            short = "" if why else (f"; the protocol takes {total} steps ({', '.join(parts)}): "
                                    "run more steps or lower --steps")
            lines.append(f"{who} ended during its profiled steps: {s.profiled_steps} of "
                         f"{s.profiled_target} recorded{why}{short}")
        elif s.ended:
            lines.append(f"{who} ended after {s.steps_seen} training step(s), before its "
                         f"profiled steps ({protocol.warmup} warm-up, {protocol.timing_steps} "
                         f"timed{settle} come first){why}; run more steps or lower --warmup / "
                         "--timing-steps")
        else:
            fault = channel.fault_of(folder, s.pid)
            how = f"died ({fault})" if fault else (
                "stopped reporting (killed, or exited without Python's shutdown)")
            lines.append(f"{who} {how} in {s.where}; nothing recorded for it")
    return lines


def script_name(command: tuple[str, ...]) -> str:
    """``train`` for ``python train.py …`` or ``torchrun … train.py``; ``mod`` for ``-m
    pkg.mod``; else ``run``."""
    for i, arg in enumerate(command):
        if arg.endswith(".py"):
            return Path(arg).stem
        if arg == "-m" and i + 1 < len(command) and command[i + 1] != "torch.distributed.run":
            return command[i + 1].rsplit(".", 1)[-1]
    return "run"
