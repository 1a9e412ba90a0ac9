"""`opprof run`: profile any training command, unchanged — every Python process it starts loads
opprof's startup hook (:mod:`opprof.collectors.inject`) — then normalize what its processes
recorded into one `.trace` and print the report.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import click

from opprof.analysis.report import build_report
from opprof.collectors import channel, inject
from opprof.collectors.config import FRAMEWORKS, Facts, Protocol
from opprof.collectors.jobs import command_recording, partial_meta
from opprof.collectors.memory import sampling
from opprof.collectors.supervisor import Supervisor, describe_exit, shell_code
from opprof.commands import echo_output, format_option, memory_options, top_option
from opprof.errors import Interrupted, OpprofError
from opprof.normalizers import normalize, write_folder_meta
from opprof.render import renderer
from opprof.trace import save

TIMED_OUT = 124  # what `timeout` returns


@click.command("run", context_settings={"ignore_unknown_options": True,
                                        "allow_interspersed_args": False})
@click.option("--fw", type=click.Choice(["auto", *FRAMEWORKS]), default="auto",
              show_default=True, help="Framework whose steps are counted (auto: any).")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Profiled steps per process.")
@click.option("--warmup", type=click.IntRange(min=1), default=2, show_default=True,
              help="Unprofiled steps first (at least 1: a step's start is seen when the "
                   "one before it ends).")
@click.option("--timing-steps", type=click.IntRange(min=0), default=3, show_default=True,
              help="Unprofiled timed steps after the warm-up (the profiler's overhead is "
                   "measured against them).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The .trace to write (default: SCRIPT.trace, after the command's script).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Seconds before the command is stopped (default: none).")
@memory_options
@top_option
@format_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def command(fw: str, steps: int, warmup: int, timing_steps: int, output: Path | None,
            timeout_s: float | None, profile_memory: bool, memory_interval_s: float,
            top: int | None, fmt: str, command: tuple[str, ...]) -> None:
    """Run COMMAND unchanged and profile the training steps of every Python process it
    starts (torch, TensorFlow/Keras or MXNet; detected when imported).

    Each process skips --warmup steps, times --timing-steps, profiles --steps with its
    framework's profiler and writes its native trace (named by its rank) into OUTPUT-STEM.native/.
    When COMMAND ends, they are merged into OUTPUT and reported. COMMAND's exit code is
    opprof's; what a failing command recorded is kept and reported.

    \b
    Example:
      opprof run -o mine.trace -- python train.py --epochs 1
      opprof run --steps 10 --warmup 3 -- torchrun --nproc-per-node 2 train_ddp.py
      opprof run --fw tf -- python keras_fit.py
    """
    protocol = Protocol(steps, warmup, timing_steps, timing_after=timing_steps,
                        profile_memory=profile_memory)
    output = output or Path(f"{_script_name(command)}.trace")
    native = output.with_name(output.name.removesuffix(".trace") + ".native")
    if native.exists():
        shutil.rmtree(native)
    native.mkdir(parents=True)
    env = inject.environment(native, fw, protocol)
    line = shlex.join(command)
    click.echo(f"opprof: running {line}; each training process: {warmup} warm-up and "
               f"{timing_steps} timed steps, then {steps} profiled (traces in {native}/)",
               err=True)
    sup = Supervisor(native, "your command", timeout_s=timeout_s)
    # The command stays in opprof's process group (the terminal's Ctrl-C reaches it as usual).
    # With a machine format on stdout, the command's own stdout goes to stderr.
    sup.start("the command", list(command), env=env, own_group=False, stdin=None,
              stdout=None if fmt == "rich" else sys.stderr.fileno())
    try:
        with sampling(sup, memory_interval_s):
            code = _wait(sup)
    except Interrupted as exc:
        _keep_interrupted(exc, native, line, output, memory_interval_s)
    rec = command_recording(native, line)
    statuses = channel.read_all(native)
    for message in _outcomes(statuses, protocol, native):
        click.echo(f"opprof: {message}", err=True)
    if code not in (0, None):
        click.echo(f"opprof: the command {describe_exit(code)}" + (
            "; what it recorded is kept and reported" if rec.native else ""), err=True)
    if not rec.native:
        shutil.rmtree(native, ignore_errors=True)
        click.echo("opprof: error: " + (
            "no process of the command reached its profiled steps; nothing was recorded"
            if statuses else
            "no training step was seen in the command's Python processes (opprof counts torch "
            "optimizer steps, Keras optimizer updates, gluon Trainer steps and MXNet Module "
            "updates); nothing was recorded: mark the steps with opprof.profile() in the "
            "script"), err=True)
        sys.exit(_exit_code(code) or 2)
    meta = {**rec.meta, "native_dir": str(native), "memory_interval_s": memory_interval_s}
    write_folder_meta(native, meta)  # `opprof import` of the folder reads it back
    trace = normalize([*rec.native, *rec.memory], meta)
    save(trace, output)
    click.echo(f"wrote {output} ({len(trace.events):,} events; native traces in {native})",
               err=True)
    echo_output(renderer(fmt).report(build_report(trace), by="phase", top=top), fmt)
    if code != 0:
        sys.exit(_exit_code(code))


def _exit_code(code: int | None) -> int:
    """opprof's exit code for the command's: the same (a signal N: 128 + N, as a shell
    says); 124 when it was stopped at --timeout."""
    return TIMED_OUT if code is None else shell_code(code)


def _wait(sup: Supervisor) -> int | None:
    """The command's exit code (None: stopped at --timeout). Ctrl-C, SIGTERM or SIGHUP stop
    the command (the supervisor's interrupt: the command first gets the signal itself, then
    what is left is stopped within seconds) and raise Interrupted; a second stops it at
    once."""
    try:
        return next(iter(sup.wait(fail_fast=False).values()))
    except OpprofError as exc:  # the time limit
        click.echo(f"opprof: {exc}", err=True)
        return None


def _keep_interrupted(exc: Interrupted, native: Path, line: str, output: Path,
                      memory_interval_s: float) -> None:
    """Write what an interrupted command's processes completed to ``output`` (marked
    ``meta["partial"]``) and raise Interrupted with one line saying so."""
    rec = command_recording(native, line)
    statuses = channel.read_all(native)
    if not rec.native:
        shutil.rmtree(native, ignore_errors=True)
        raise Interrupted(exc.sig, f"{exc.message}; nothing was profiled, nothing written"
                          ) from None
    meta = {**rec.meta, "native_dir": str(native), "memory_interval_s": memory_interval_s,
            "partial": partial_meta(statuses, f"interrupted by {exc.name}")}
    try:
        trace = normalize([*rec.native, *rec.memory], meta, skip_damaged=True)
        save(trace, output)
        kept = (f"wrote {output} ({len(trace.meta.get('step_bounds', []))} complete step(s) "
                f"over {len(trace.ranks)} rank(s))")
    except OpprofError as error:
        kept = f"{output} not written ({error})"
    except (Interrupted, KeyboardInterrupt):
        kept = f"interrupted again while writing {output}: not written"
    raise Interrupted(exc.sig, f"{exc.message}; {kept}", native) from None


def _outcomes(statuses: list[Facts], protocol: Protocol, folder: Path) -> list[str]:
    """One line for each process that did not record all its profiled steps, or that died
    (a fatal signal) after it had."""
    lines = []
    for s in statuses:
        settle = " and 1 for torch's profiler to settle" if s.framework == "torch" else ""
        who = f"{s.label} (pid {s.pid})" if not s.label.startswith("pid") else f"process {s.pid}"
        why = f" ({s.ended})" if s.ended and s.ended != "the process ended" else ""
        if s.stage in ("done", "serving"):  # a parameter server never reaches steps
            fault = channel.fault_of(folder, s.pid) if s.stage == "done" else ""
            if fault:
                lines.append(f"{who} died ({fault}) after its {s.profiled_steps} profiled "
                             "steps were written; its trace is whole")
            continue
        if s.native:
            lines.append(f"{who} ended during its profiled steps: {s.profiled_steps} of "
                         f"{s.profiled_target} recorded{why}")
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


def _script_name(command: tuple[str, ...]) -> str:
    """``train`` for ``python train.py …`` or ``torchrun … train.py``; ``mod`` for ``-m
    pkg.mod``; else ``run``."""
    for i, arg in enumerate(command):
        if arg.endswith(".py"):
            return Path(arg).stem
        if arg == "-m" and i + 1 < len(command) and command[i + 1] != "torch.distributed.run":
            return command[i + 1].rsplit(".", 1)[-1]
    return "run"
