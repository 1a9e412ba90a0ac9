"""The record pipeline: a built-in model trained under its framework's native profiler
(:func:`record`), its native traces normalized into a `.trace` (:func:`record_trace`, which
every run of `opprof bench` goes through too)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from opprof.collectors import Progress as ProgressFn
from opprof.collectors import RecordConfig, Rendezvous, no_progress
from opprof.collectors import record as collect
from opprof.collectors.launch import CONFIG_FILE, Recording
from opprof.collectors.rss import memory_files
from opprof.errors import Interrupted, OpprofError
from opprof.kinds import Device, Framework, Mode, framework_info
from opprof.pipeline import cpus, host_memory, native_folder, save_recording
from opprof.trace import Trace


@dataclass(frozen=True)
class RecordOptions:
    """What `opprof record` is asked for (its options; None: the default)."""

    fw: str
    model: str
    dataset: str = "synthetic-cifar10"
    batch_size: int = 32
    steps: int = 5
    warmup: int = 2
    timing_steps: int = 3
    workers: int = 1
    servers: int = 1
    mode: str | None = None  # None: single for one worker, else the framework's usual
    device: str = Device.CPU.value
    nsys: bool = False
    profile_memory: bool = True
    memory_interval_s: float = 0.02
    threads: int | None = None
    seed: int = 0
    loader_workers: int = 0
    bucket_mb: float | None = None  # None: DDP's own (25 MiB, the first 1 MiB)
    converge: int = 0
    eval_every: int = 0
    timeout_s: float = 600.0
    output: Path | None = None  # None: MODEL-FW.trace
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    cluster: str | None = None  # every worker's HOST:PORT, comma-separated
    command: str = ""  # the command line, kept in the trace

    @property
    def path(self) -> Path:
        """The `.trace` to write."""
        return self.output or Path(f"{self.model}-{self.fw}.trace")


def config(o: RecordOptions) -> RecordConfig:
    """The recording's configuration, with one clear error for what cannot be recorded."""
    if o.nsys:
        from opprof.collectors.gpu import require_nsys

        require_nsys()
    if o.device == Device.CUDA:
        from opprof.collectors.gpu import require_cuda

        require_cuda(o.fw)
    if o.nsys:
        raise OpprofError("--nsys: running the collector under Nsight Systems is not wired "
                          "yet; run your script under `nsys profile -t cuda,nvtx` and "
                          "`opprof import report.nsys-rep`")
    mode = o.mode
    if mode is None:
        mode = Mode.SINGLE if o.workers == 1 else framework_info(o.fw).default_mode
    if o.workers > 1 and mode == Mode.SINGLE:
        raise OpprofError("--mode single runs one worker; pick allreduce, fsdp, zero, ps-sync or "
                          "ps-async")
    rv = Rendezvous()  # its defaults, for the options not given
    rendezvous = Rendezvous(
        nnodes=rv.nnodes if o.nnodes is None else o.nnodes,
        node_rank=rv.node_rank if o.node_rank is None else o.node_rank,
        master_addr=rv.master_addr if o.master_addr is None else o.master_addr,
        master_port=rv.master_port if o.master_port is None else o.master_port,
        cluster=tuple(h.strip() for h in o.cluster.split(",") if h.strip())
        if o.cluster else rv.cluster)
    return RecordConfig(
        fw=Framework(o.fw), model=o.model, dataset=o.dataset, batch_size=o.batch_size,
        steps=o.steps, warmup=o.warmup, timing_steps=o.timing_steps, workers=o.workers,
        servers=o.servers, mode=Mode(mode), device=Device(o.device), seed=o.seed,
        timeout_s=o.timeout_s, profile_memory=o.profile_memory,
        memory_interval_s=o.memory_interval_s, threads=o.threads, converge=o.converge,
        eval_every=o.eval_every, command=o.command, rendezvous=rendezvous,
        loader_workers=o.loader_workers, bucket_mb=o.bucket_mb,
    )


def record(o: RecordOptions, progress: ProgressFn = no_progress) -> Trace:
    """Record what ``o`` asks for into ``o.path`` (native traces beside it); the Trace."""
    return record_trace(config(o), o.path, progress)


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
