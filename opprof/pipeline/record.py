"""The record pipeline: a built-in model trained under its framework's native profiler
(:func:`record`), its native traces normalized into a `.trace` (:func:`record_trace`, which
every run of `opprof bench` goes through too)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from opprof.collectors import Progress as ProgressFn
from opprof.collectors import RecordConfig, no_progress
from opprof.collectors import record as collect
from opprof.collectors.launch import CONFIG_FILE, Recording
from opprof.collectors.rss import memory_files
from opprof.errors import Interrupted, OpprofError
from opprof.kinds import Device, Mode
from opprof.pipeline import cpus, host_memory, native_folder, save_recording
from opprof.trace import Trace


def default_output(config: RecordConfig) -> Path:
    """Where `opprof record` writes when no ``-o`` is given: MODEL-FW.trace."""
    return Path(f"{config.model}-{config.fw}.trace")


def check(config: RecordConfig) -> None:
    """One clear error for what cannot be recorded (before anything starts)."""
    if config.nsys:
        from opprof.collectors.gpu import require_nsys

        require_nsys()
    if config.device == Device.CUDA:
        from opprof.collectors.gpu import require_cuda

        require_cuda(config.fw)
    if config.nsys:
        raise OpprofError("--nsys: running the collector under Nsight Systems is not wired "
                          "yet; run your script under `nsys profile -t cuda,nvtx` and "
                          "`opprof import report.nsys-rep`")
    if config.workers > 1 and config.mode == Mode.SINGLE:
        raise OpprofError("--mode single runs one worker; pick allreduce, fsdp, zero, ps-sync or "
                          "ps-async")


def record(config: RecordConfig, output: Path,
           progress: ProgressFn = no_progress) -> Trace:
    """Record what ``config`` asks for (`opprof record`'s options) into ``output`` (native
    traces beside it); the Trace."""
    check(config)
    return record_trace(config, output, progress)


def record_trace(config: RecordConfig, output: Path,
                 progress: ProgressFn = no_progress, *, keep_partial: bool = True) -> Trace:
    """Record one run (what `opprof record` and `opprof bench` both do): the collector writes
    native traces into OUTPUT-STEM.native/, they are normalized, saved to ``output`` and the
    Trace is returned.

    A run interrupted by a signal raises :class:`Interrupted`; with ``keep_partial`` the
    profiled steps its processes completed are first written to ``output`` (marked
    ``meta["partial"]``), as `perf` or `nsys` write what they recorded when stopped."""
    native_dir = native_folder(output)
    if native_dir.exists():
        shutil.rmtree(native_dir)
    native_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    memory = host_memory()
    try:
        recording = collect(config, native_dir, progress)
    except Interrupted as exc:
        partial = getattr(exc, "recording", None)
        if not keep_partial or partial is None:
            raise
        kept = _keep(partial, config, output, native_dir, t0)
        raise Interrupted(exc.sig, f"{exc.message}; {kept}", exc.folder) from None
    except BaseException:
        if not any(f.is_file() and f.name != CONFIG_FILE for f in native_dir.rglob("*")):
            shutil.rmtree(native_dir)  # refused before writing anything: leave no trace
        raise
    if memory is not None:
        recording.meta.setdefault("host_memory", memory)
    return _trace_of(recording, config, native_dir, t0, output)


def _trace_of(recording: Recording, config: RecordConfig, native_dir: Path,
              t0: float, output: Path) -> Trace:
    meta = dict(recording.meta)
    meta.setdefault("cpus", cpus())
    meta.setdefault("command", config.command)
    meta["record_wall_s"] = round(time.perf_counter() - t0, 3)
    meta["native_dir"] = str(native_dir)
    # A run cut short may hold a trace half-written by a process killed while writing it.
    return save_recording([*recording.native, *recording.memory], meta, native_dir, output,
                          skip_damaged="partial" in meta)


def _keep(partial: Recording, config: RecordConfig, output: Path, native_dir: Path,
          t0: float) -> str:
    """Write the completed steps of an interrupted run to ``output``; what became of it, in
    words. A second signal while writing leaves ``output`` unwritten (atomic) and the native
    traces in place."""
    # the memory samples are written when the sampler stops, after the partial recording
    partial.memory = partial.memory or memory_files(native_dir)
    try:
        trace = _trace_of(partial, config, native_dir, t0, output)
    except OpprofError as exc:
        return f"{output} not written ({exc})"
    except (Interrupted, KeyboardInterrupt):
        return f"interrupted again while writing {output}: not written"
    steps = trace.meta.steps
    damaged = trace.meta.get("damaged_files", [])
    left = (f", leaving out {len(damaged)} damaged file(s): "
            + ", ".join(f"{Path(d['path']).name} ({d['problem']})" for d in damaged)
            if damaged else "")
    return f"wrote {output} ({steps} complete step(s) over {len(trace.ranks)} rank(s){left})"
