"""`opprof record`: train a model under a framework's native profiler, write a `.trace`,
print the report."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opprof.analysis.report import build_report
from opprof.collectors import (
    FRAMEWORKS,
    MODELS,
    MODES,
    RecordConfig,
    Rendezvous,
    no_progress,
    record,
)
from opprof.collectors import (
    Progress as ProgressFn,
)
from opprof.collectors.gpu import require_cuda, require_nsys
from opprof.collectors.jobs import CONFIG_FILE, Recording
from opprof.collectors.memory import memory_files
from opprof.commands import echo_output, format_option, memory_options, top_option
from opprof.errors import Interrupted, OpprofError
from opprof.kinds import Mode, framework_info
from opprof.normalizers import normalize, write_folder_meta
from opprof.render import renderer
from opprof.trace import Trace, save


@click.command("record")
@click.option("--fw", type=click.Choice(FRAMEWORKS), required=True, help="Framework to run.")
@click.option("--model", type=click.Choice(MODELS), required=True, help="Built-in model.")
@click.option("--dataset", default="synthetic-cifar10", show_default=True,
              help="synthetic-cifar10, cifar10, cifar100 (local python batches) or a PATH.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Profiled steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Unprofiled warm-up steps.")
@click.option("--timing-steps", type=click.IntRange(min=1), default=3, show_default=True,
              help="Unprofiled timed steps (the profiler's overhead is measured against them).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parameter servers (ps modes).")
@click.option("--mode", type=click.Choice(MODES), default=None,
              help="Distributed mode (default: single for 1 worker, else the framework's usual).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--nsys", is_flag=True,
              help="Also record under NVIDIA Nsight Systems (needs nsys on PATH).")
@memory_options
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Compute threads per worker (torch/OpenMP threads, TF intra- and inter-op "
                   "threads, MXNet's OpenMP). Default: one worker, the framework's (every "
                   "CPU); several, every framework the same: the host's CPUs split among the "
                   "processes that compute on it (MXNet's servers count). Give the same "
                   "number to a baseline that `opprof model` predicts from and to the runs it "
                   "checks against.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--converge", type=click.IntRange(min=0), default=0, show_default=True,
              help="Train STEPS steps in all (the profiled ones among them), keeping each "
                   "step's loss and time: the convergence table beside the breakdown.")
@click.option("--eval-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --converge: train and test accuracy every K steps (0: at the end).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds before a hung run is stopped.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The .trace to write (default MODEL-FW.trace).")
@click.option("--nnodes", type=click.IntRange(min=1), default=None,
              help="Hosts in a multi-host job (run the same command on each).")
@click.option("--node-rank", type=click.IntRange(min=0), default=None,
              help="This host's index in a multi-host job.")
@click.option("--master-addr", default=None, help="Rendezvous host (default 127.0.0.1).")
@click.option("--master-port", type=click.IntRange(0, 65535), default=None,
              help="Rendezvous port (default: a free one; needed with --nnodes > 1).")
@click.option("--cluster", default=None,
              help="Every worker's HOST:PORT, comma-separated (TensorFlow on several hosts; "
                   "--node-rank is this host's task index).")
@top_option
@format_option
def command(fw: str, model: str, dataset: str, batch_size: int, steps: int, warmup: int,
            timing_steps: int, workers: int, servers: int, mode: str | None, device: str,
            nsys: bool, profile_memory: bool, memory_interval_s: float,
            threads: int | None,
            seed: int, converge: int, eval_every: int, timeout_s: float,
            output: Path | None, nnodes: int | None,
            node_rank: int | None, master_addr: str | None, master_port: int | None,
            cluster: str | None, top: int | None, fmt: str) -> None:
    """Train MODEL with framework FW under its native profiler and report it.

    Native traces are kept in OUTPUT's folder as OUTPUT-STEM.native/.

    \b
    Example:
      opprof record --fw torch --model resnet18
      opprof record --fw mxnet --model resnet18 --workers 3 --mode ps-sync
      opprof record --fw torch --model resnet18 --workers 2 --mode fsdp
    """
    if nsys:
        require_nsys()
    if device == "cuda":
        require_cuda(fw)
    if nsys:
        raise OpprofError("--nsys: running the collector under Nsight Systems is not wired "
                          "yet; run your script under `nsys profile -t cuda,nvtx` and "
                          "`opprof import report.nsys-rep`")
    if mode is None:
        mode = Mode.SINGLE if workers == 1 else framework_info(fw).default_mode
    if workers > 1 and mode == Mode.SINGLE:
        raise OpprofError("--mode single runs one worker; pick allreduce, fsdp, zero, ps-sync or "
                          "ps-async")
    output = output or Path(f"{model}-{fw}.trace")
    given = {"nnodes": nnodes, "node_rank": node_rank, "master_addr": master_addr,
             "master_port": master_port,
             "cluster": tuple(h.strip() for h in cluster.split(",") if h.strip())
             if cluster else None}
    config = RecordConfig(
        fw=fw, model=model, dataset=dataset, batch_size=batch_size, steps=steps,
        warmup=warmup, timing_steps=timing_steps, workers=workers, servers=servers, mode=mode,
        device=device, seed=seed, timeout_s=timeout_s, profile_memory=profile_memory,
        memory_interval_s=memory_interval_s, threads=threads, converge=converge,
        eval_every=eval_every, command=shlex.join(["opprof", *sys.argv[1:]]),
        rendezvous=Rendezvous(**{k: v for k, v in given.items() if v is not None}),
    )
    with _progress() as progress:
        tasks: dict[str, int] = {}

        def report_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(f"{fw} {model}: {stage}", total=total)
            progress.update(tasks[stage], completed=done, total=total)

        trace = record_trace(config, output, report_progress)
    click.echo(f"wrote {output} ({len(trace.events):,} events; native traces in "
               f"{trace.meta['native_dir']})", err=True)
    echo_output(renderer(fmt).report(build_report(trace), by="phase", top=top), fmt)


def record_trace(config: RecordConfig, output: Path,
                 progress: ProgressFn = no_progress, *, keep_partial: bool = True) -> Trace:
    """Record one run (what `opprof record` and `opprof bench` both do): the collector writes
    native traces into OUTPUT-STEM.native/, they are normalized, saved to ``output`` and the
    Trace is returned.

    A run interrupted by a signal raises :class:`Interrupted`; with ``keep_partial`` the
    profiled steps its processes completed are first written to ``output`` (marked
    ``meta["partial"]``), as `perf` or `nsys` write what they recorded when stopped."""
    native_dir = output.with_name(output.name.removesuffix(".trace") + ".native")
    if native_dir.exists():
        shutil.rmtree(native_dir)
    native_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        recording = record(config, native_dir, progress)
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
    trace = _trace_of(recording, config, native_dir, t0)
    save(trace, output)
    return trace


def _trace_of(recording: Recording, config: RecordConfig, native_dir: Path,
              t0: float) -> Trace:
    meta = dict(recording.meta)
    meta.setdefault("cpus", _cpus())
    meta.setdefault("command", config.command)
    meta["record_wall_s"] = round(time.perf_counter() - t0, 3)
    meta["native_dir"] = str(native_dir)
    write_folder_meta(native_dir, meta)  # `opprof import` of the folder reads it back
    # A run cut short may hold a trace half-written by a process killed while writing it.
    return normalize([*recording.native, *recording.memory], meta,
                     skip_damaged="partial" in meta)


def _keep(partial: Recording, config: RecordConfig, output: Path, native_dir: Path,
          t0: float) -> str:
    """Write the completed steps of an interrupted run to ``output``; what became of it, in
    words. A second signal while writing leaves ``output`` unwritten (atomic) and the native
    traces in place."""
    # the memory samples are written when the sampler stops, after the partial recording
    partial.memory = partial.memory or memory_files(native_dir)
    try:
        trace = _trace_of(partial, config, native_dir, t0)
        save(trace, output)
    except OpprofError as exc:
        return f"{output} not written ({exc})"
    except (Interrupted, KeyboardInterrupt):
        return f"interrupted again while writing {output}: not written"
    steps = len(trace.meta.get("step_bounds", []))
    damaged = trace.meta.get("damaged_files", [])
    left = (f", leaving out {len(damaged)} damaged file(s): "
            + ", ".join(f"{Path(d['path']).name} ({d['problem']})" for d in damaged)
            if damaged else "")
    return f"wrote {output} ({steps} complete step(s) over {len(trace.ranks)} rank(s){left})"


def _cpus() -> int | None:
    """CPUs this process may run on (the recording host's, for the model's resource check)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)
