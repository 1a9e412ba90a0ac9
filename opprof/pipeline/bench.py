"""The bench pipeline: record a matrix of frameworks × models × workers × modes and compare
them (`opprof bench`); the bench folder's bench.json is written and read back here.

Every valid combination is recorded exactly as `opprof record` records it
(:func:`opprof.pipeline.record.record_trace`), each in its own subprocess so a framework that
crashes cannot take the matrix down; a failed run is a row with its error line. Combinations
a framework does not support (torch has no parameter server; 1 worker is ``single`` mode), and
frameworks whose collector does not import, are skipped with the reason. The comparison:
samples/s and step time per run, the phase breakdown, scaling efficiency
``throughput_N / (N × throughput_1)`` against the same framework and model on one worker,
and the canonical operators with the largest cross-framework time ratios for the same model,
batch size and worker count (the research's "convolution_backward 7.67x" table).

Noise: every run's timing is assessed (:mod:`opprof.analysis.noise`) and a noisy run, or one
the profiler slowed down, is flagged in the tables; ``--repeat K`` records each combination K
times (``NAME-r1.trace`` …) and reports the median with its spread.

Interrupts: Ctrl-C or SIGTERM stops the run being recorded (its processes within seconds),
marks it ``interrupted``, writes bench.md/.csv/.json for what is done and exits 130 / 143;
``--resume`` records the interrupted run and the rest.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from opprof.analysis.matrix import (
    Bench,
    BenchPrediction,
    Run,
    combine_repeats,
    compare,
    summarize,
)
from opprof.collectors.config import RecordConfig
from opprof.collectors.supervisor import Supervisor
from opprof.errors import ErrorKind, Interrupted, OpprofError, raise_on_signals, signal_name
from opprof.files import write_atomic
from opprof.invocation import set_invocation
from opprof.kinds import DONE, FRAMEWORK_INFO, Framework, Mode, RunStatus, framework_info
from opprof.model.benchpredict import prediction
from opprof.model.commmodel import Network
from opprof.pipeline.calibrate import read_network
from opprof.trace import TraceFile, read_parquet

if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject

#: Modes per framework.
KNOWN_MODES = {fw.value: tuple(m.value for m in info.modes) for fw, info in FRAMEWORK_INFO.items()}
PROBE_TIMEOUT_S = 300
RUN_MARGIN_S = 180  # start-up and normalization on top of the recording's own --timeout


@dataclass(frozen=True)
class BenchOptions:
    """What `opprof bench` is asked for: the matrix, each run's settings, the folder."""

    fws: tuple[str, ...]
    models: tuple[str, ...]
    workers: tuple[int, ...]
    modes: tuple[str, ...]
    steps: int = 20
    batch_size: int = 32
    warmup: int = 2
    timing_steps: int = 3
    servers: int = 1
    dataset: str = "synthetic-cifar10"
    timeout_s: float = 600.0
    output: Path = Path("bench")
    resume: bool = False
    repeat: int = 1
    top: int = 10
    threads: int | None = None
    converge: int = 0
    eval_every: int = 0
    network: Path | None = None  # α–β from `opprof calibrate` (None: each run's own)
    #: Sweeps (`--batch-size 16,64`, `--threads 1,2`): every value is a dimension of the
    #: matrix; one value (or none) is the setting of every run.
    batch_sizes: tuple[int, ...] = ()
    thread_counts: tuple[int, ...] = ()


def bench(o: BenchOptions, say: Callable[[str], None], show: Callable[[str], None]) -> list[Run]:
    """Record every valid combination of ``o`` and compare them: bench.md/.csv/.json,
    bench.html and figures/ in ``o.output``. ``say`` gets the progress lines, ``show`` the
    tables."""
    fws, models, workers, modes = list(o.fws), list(o.models), list(o.workers), list(o.modes)
    output, resume, repeat, top = o.output, o.resume, o.repeat, o.top
    output.mkdir(parents=True, exist_ok=True)
    base = RecordConfig(fw=Framework.TORCH, model="lenet5", dataset=o.dataset,
                        batch_size=o.batch_size, steps=o.steps, warmup=o.warmup,
                        timing_steps=o.timing_steps, servers=o.servers, timeout_s=o.timeout_s,
                        threads=o.threads, converge=o.converge, eval_every=o.eval_every)
    net = read_network(o.network)  # a bad file fails before anything is recorded

    def known(fw: str) -> tuple[tuple[str, ...] | None, str]:
        return KNOWN_MODES.get(fw, (Mode.SINGLE.value,)), ""

    # Import each framework's collector (in a subprocess, seconds) only where there is
    # something to record: a resumed matrix that is complete needs none.
    sweep: dict[str, list[int | None]] = {
        "batch_sizes": list(o.batch_sizes) if len(o.batch_sizes) > 1 else [None],
        "thread_counts": list(o.thread_counts) if len(o.thread_counts) > 1 else [None]}
    guess = plan(fws, models, workers, modes, {fw: known(fw) for fw in fws}, **sweep)
    kept = {(r.name, k) for r in guess if resume and r.status == RunStatus.PLANNED
            for k in range(1, repeat + 1) if _loadable(trace_path(output, r, k, repeat))}
    needed = {r.fw for r in guess if r.status == RunStatus.PLANNED
              and any((r.name, k) not in kept for k in range(1, repeat + 1))}
    runs = plan(fws, models, workers, modes,
                {fw: probe(fw) if fw in needed else known(fw) for fw in fws}, **sweep)
    todo = [r for r in runs if r.status == RunStatus.PLANNED]
    try:
        for i, run in enumerate(todo, 1):
            _record_cell(run, f"[{i}/{len(todo)}]", base, output, repeat, kept, say)
    except Interrupted as exc:
        for run in todo:
            if run.status == RunStatus.PLANNED:
                run.status, run.reason = RunStatus.NOT_RUN, f"bench interrupted by {exc.name}"
        _finish(runs, base, output, repeat, top, net, say, show, quiet=True)
        cut = next((r for r in todo if r.status == RunStatus.INTERRUPTED), None)
        done = sum(r.status in DONE for r in todo)
        raise Interrupted(exc.sig, (
            f"bench: interrupted by {exc.name}"
            + (f" while recording {cut.fw} {cut.model} x{cut.workers} {cut.mode} (marked "
               "interrupted)" if cut else "")
            + f"; {done} of {len(todo)} run(s) complete; wrote {output}/bench.md, bench.csv, "
            "bench.json; the same command with --resume records the rest")) from None
    _finish(runs, base, output, repeat, top, net, say, show)
    return runs




def _record_cell(run: Run, head: str, base: RecordConfig, output: Path, repeat: int,
                 kept: set[tuple[str, int]], say: Callable[[str], None]) -> None:
    """Record (or keep) the ``repeat`` repetitions of one combination; its status."""
    head = (f"{head} {run.fw} {run.model} x{run.workers} {run.mode}"
            + (f" batch {run.batch_size}" if run.batch_size is not None else "")
            + (f" threads {run.threads}" if run.threads is not None else ""))
    statuses: list[str] = []
    reasons: list[str] = []
    wall = 0.0
    for k in range(1, repeat + 1):
        path = trace_path(output, run, k, repeat)
        tag = f"{head}" + (f" (repeat {k}/{repeat})" if repeat > 1 else "")
        if (run.name, k) in kept:
            statuses.append(RunStatus.RESUMED)
            say(f"{tag}: kept {path}")
            continue
        say(f"{tag}: recording …")
        status, reason, took = execute(run, base, output, k, repeat)
        wall += took
        statuses.append(status)
        say(f"{tag}: {status} in {took:.1f} s" + (f" — {reason}" if reason else ""))
        if status != RunStatus.OK:
            reasons.append(reason if repeat == 1 else f"repeat {k}: {reason}")
    run.wall_s = wall
    run.status = (RunStatus.FAILED if RunStatus.FAILED in statuses else RunStatus.RESUMED
                  if all(s == RunStatus.RESUMED for s in statuses) else RunStatus.OK)
    run.reason = "; ".join(reasons)


def _finish(runs: list[Run], base: RecordConfig, output: Path, repeat: int, top: int,
            network: Network | None, say: Callable[[str], None], show: Callable[[str], None],
            quiet: bool = False) -> None:
    """Summarize the recorded runs, write bench.md/.csv/.json, print the tables."""
    from opprof.flops.peaks import PeakOptions, calibration_path, read_calibration

    # a CPU run's MFU is against this host's measured peak, where `calibrate --peak` kept one
    peak = PeakOptions(calibration=calibration_path()
                       if read_calibration(calibration_path()) is not None else None)
    for run in runs:
        if run.status in DONE:
            try:
                run.summary = combine_repeats([
                    summarize(read_parquet(trace_path(output, run, k, repeat)), peak)
                    for k in range(1, repeat + 1)])
            except OpprofError as exc:
                run.status, run.reason = RunStatus.FAILED, str(exc)
    add_predictions(runs, output, network, repeat)
    table, ratios = compare(runs, top)
    config = {k: v for k, v in asdict(base).items()
              if k not in ("fw", "model", "rendezvous")}
    config["repeat"] = repeat
    swept = sweep_results(table)
    write_outputs(output, runs, table, ratios, config, swept)
    from opprof.render.console import bench_tables, render, sweep_tables

    show(render(*bench_tables(table, ratios), *sweep_tables(swept), width=150).rstrip("\n"))
    traces = sum(r.status in DONE for r in runs) * repeat
    if not quiet:
        visual = write_visuals(output, say)
        say(f"wrote {output}/bench.md, bench.csv, bench.json{visual} and {traces} trace(s)")


def write_visuals(folder: Path, say: Callable[[str], None]) -> str:
    """bench.html and figures/NAME.svg|png (opprof.render.html, opprof.render.figures) from
    the bench.json just written; a figure without data (no multi-worker run for ``scaling``)
    is left out with a line saying why. Returns what was written, for the last line."""
    try:
        from opprof.render import figures, html
    except ImportError as exc:
        say(f"no bench.html or figures: {exc} (pip install 'opprof[plot]')")
        return ""
    b = read_bench(folder)
    write_atomic(folder / "bench.html", html.bench(b))
    made = []
    sweeps = tuple(f for f, dim in figures.SWEEP_FIGURES.items() if len(b.sweeps.get(dim, [])))
    for name in figures.BENCH_FIGURES + (("convergence",) if b.curves else ()) + sweeps:
        try:
            fig = figures.make(name, b)
        except OpprofError as exc:
            say(f"figure {name}: {exc}")
            continue
        for suffix in (".svg", ".png"):
            figures.save(fig, folder / "figures" / f"{name}{suffix}")
        made.append(name)
    return (", bench.html" + (f", figures/{{{','.join(made)}}}.svg|png" if made else ""))


def trace_path(folder: Path, run: Run, k: int = 1, repeat: int = 1) -> Path:
    """The trace of repetition ``k`` of ``run``: NAME.trace, or NAME-rK.trace when each
    combination is recorded several times."""
    return folder / (f"{run.name}.trace" if repeat == 1 else f"{run.name}-r{k}.trace")


def add_predictions(runs: list[Run], folder: Path, network: Network | None,
                    repeat: int = 1) -> None:
    """For each recorded multi-worker run: the model's prediction from the same framework and
    model's 1-worker run, into its summary (:func:`opprof.model.benchpredict.prediction`); with
    ``--repeat``, from and against each combination's median repetition."""

    def trace_of(r: Run) -> Path:
        median = r.summary.median_repeat if r.summary is not None else None
        return trace_path(folder, r, int(median or 1), repeat)

    singles = {(r.fw, r.model, r.point): r for r in runs
               if r.mode == Mode.SINGLE and r.status in DONE}
    for r in runs:
        one = singles.get((r.fw, r.model, r.point))
        if r.workers < 2 or r.status not in DONE or one is None or r.summary is None:
            continue
        try:
            r.summary.prediction = prediction(read_parquet(trace_of(one)),
                                              read_parquet(trace_of(r)), network)
        except OpprofError as exc:
            r.summary.prediction = BenchPrediction(note=str(exc))


def probe(fw: str) -> tuple[tuple[str, ...] | None, str]:
    """(modes the framework's collector records, why not when None): the framework is
    imported in a subprocess, so a broken framework install cannot crash the bench."""
    info = framework_info(fw)
    missing = [m for m in info.requires if importlib.util.find_spec(m) is None]
    if missing:
        return None, f"--fw {fw} needs {', '.join(missing)}, which is not installed"
    name = info.requires[0]
    try:
        res = subprocess.run([sys.executable, "-c", info.probe], capture_output=True, text=True,
                             timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL,
                             env={**os.environ, **dict(info.env)})
    except subprocess.TimeoutExpired:
        return None, f"importing {name} took over {PROBE_TIMEOUT_S} s"
    if res.returncode != 0:
        return None, f"{name} does not import: {_last_line(res.stderr)}"
    return KNOWN_MODES[fw], ""


def plan(fws: list[str], models: list[str], workers: list[int], modes: list[str],
         support: dict[str, tuple[tuple[str, ...] | None, str]],
         batch_sizes: list[int | None] | None = None,
         thread_counts: list[int | None] | None = None) -> list[Run]:
    """Every combination in order; a worker count of 1 is one ``single`` run; unsupported
    ones are ``skipped`` with the reason. ``batch_sizes`` and ``thread_counts`` are sweeps
    (``[None]``: not swept)."""
    runs: list[Run] = []
    for fw, model, n, b, t in itertools.product(fws, models, workers, batch_sizes or [None],
                                                thread_counts or [None]):
        supported, why = support[fw]
        for mode in ([Mode.SINGLE.value] if n == 1 else modes):
            run = Run(fw, model, n, mode, batch_size=b, threads=t)
            if supported is None:
                run.status, run.reason = RunStatus.SKIPPED, why
            elif mode not in supported:
                run.status = RunStatus.SKIPPED
                run.reason = (f"{fw} has no {mode} mode (it records "
                              f"{', '.join(m for m in supported)})")
            runs.append(run)
    return runs


def execute(run: Run, base: RecordConfig, folder: Path, k: int = 1,
            repeat: int = 1) -> tuple[str, str, float]:
    """Record repetition ``k`` of one run in a subprocess (``python -m opprof.pipeline.bench``)
    under the supervisor; its output goes to ``logs/NAME.log``. (status, error line,
    seconds). An interrupt stops it (:class:`Interrupted` propagates, ``run`` marked
    ``interrupted``)."""
    config = base.replace(fw=run.fw, model=run.model, workers=run.workers, mode=run.mode,
                          command=f"opprof bench ({run.name})")
    if run.batch_size is not None:
        config = config.replace(batch_size=run.batch_size)
    if run.threads is not None:
        config = config.replace(threads=run.threads)
    trace = trace_path(folder, run, k, repeat)
    trace.unlink(missing_ok=True)
    log = folder / "logs" / f"{trace.stem}.log"
    log.parent.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "opprof.pipeline.bench", config.to_json(), str(trace)]
    limit = base.timeout_s + RUN_MARGIN_S
    t0 = time.monotonic()
    with Supervisor(log.parent, f"bench {run.name}", timeout_s=limit) as sup:
        child = sup.start(trace.stem, cmd, log=log)
        try:
            sup.wait(fail_fast=False)
            code = child.code
        except Interrupted:
            run.status = RunStatus.INTERRUPTED
            run.reason = f"interrupted (log: {log})"
            raise
        except OpprofError:  # past the time limit: the supervisor stopped it
            code = None
    took = time.monotonic() - t0
    if code == 0 and _loadable(trace):
        return RunStatus.OK, "", took
    if code is None:
        return RunStatus.FAILED, f"no result within {limit:g} s; stopped", took
    text = log.read_text(errors="replace")
    how = f"killed by {signal_name(-code)}" if code < 0 else f"exit {code}"
    return RunStatus.FAILED, f"{_error_line(text) or how} (log: {log})", took


def _loadable(path: Path) -> bool:
    """Whether ``path`` is a complete opprof trace (not one cut short: ``meta["partial"]``)."""
    try:
        return "partial" not in TraceFile(path).meta
    except (OpprofError, OSError):
        return False


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _error_line(text: str) -> str:
    mine = [ln for ln in text.splitlines() if ln.startswith("opprof: error: ")]
    return mine[-1].removeprefix("opprof: error: ") if mine else _last_line(text)


def sweep_results(table: pd.DataFrame) -> dict[str, object]:
    """The sweeps of a bench table (:mod:`opprof.analysis.sweeps`): per dimension swept its
    rows, and where each run stops scaling."""
    from opprof.analysis.sweeps import DIMENSIONS, plateaus, sweep

    out: dict[str, object] = {}
    stops = []
    for dim in DIMENSIONS:
        sw = sweep(table, dim)
        if len(sw):
            out[dim] = sw
            stops += [p.to_dict() for p in plateaus(sw, dim)]
    if stops:
        out["stops"] = stops
    return out


def write_outputs(folder: Path, runs: list[Run], table: pd.DataFrame, ratios: pd.DataFrame,
                  config: JSONObject, swept: dict[str, object] | None = None) -> None:
    """bench.json (everything), bench.csv (one row per run), bench.md (both tables); read
    back by :func:`read_bench`."""
    from opprof.render.jsonvalues import records
    from opprof.render.mdfmt import md_table

    doc: dict[str, object] = {"config": config, "runs": records(table),
                              "op_ratios": records(ratios)}
    curves = {r.name: r.summary.curves or [r.summary.curve] for r in runs
              if r.summary is not None and r.summary.curve}
    if curves:  # `--converge`: each run's curve (every repetition's), thinned
        doc["curves"] = curves
    if swept:  # `--threads 1,2` / `--batch-size 16,64`: the sweeps, where each stops scaling
        doc["sweeps"] = {k: records(v) if isinstance(v, pd.DataFrame) else v
                         for k, v in swept.items()}
    write_atomic(folder / "bench.json", json.dumps(doc, indent=2, default=str) + "\n")
    write_atomic(folder / "bench.csv", table.to_csv(index=False))
    md = ["## opprof bench", "", "### Runs (times in ms per step)", "", md_table(table), "",
          "### Operators with the largest cross-framework ratios", "",
          md_table(ratios) if len(ratios) else "(needs two frameworks recorded with the same "
          "model, batch size and workers)", ""]
    for dim, title in (("threads", "threads"), ("batch_size", "batch size")):
        frame = (swept or {}).get(dim)
        if isinstance(frame, pd.DataFrame) and len(frame):
            md += [f"### Time per mini-batch against the {title}", "", md_table(frame), ""]
    stops = (swept or {}).get("stops")
    if isinstance(stops, list) and stops:
        md += ["### Where each stops scaling", ""] + [f"- {s['sentence']}" for s in stops] + [""]
    write_atomic(folder / "bench.md", "\n".join(md))


def is_bench(path: Path) -> bool:
    """Whether ``path`` is a bench folder or a bench.json."""
    return (path.is_dir() and (path / "bench.json").is_file()) or path.name == "bench.json"


def read_bench(path: Path) -> Bench:
    """The bench.json of a bench folder (or the file itself), as :func:`write_outputs`
    wrote it."""
    f = path / "bench.json" if path.is_dir() else path
    try:
        doc = json.loads(f.read_text())
        table, ratios = pd.DataFrame(doc["runs"]), pd.DataFrame(doc.get("op_ratios") or [])
    except FileNotFoundError:
        raise OpprofError("no bench.json here (a folder written by `opprof bench`)",
                          path=path, kind=ErrorKind.NOT_A_TRACE) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise OpprofError(f"not a bench.json written by `opprof bench` ({exc})",
                          path=f, kind=ErrorKind.NOT_A_TRACE) from None
    sweeps = {k: pd.DataFrame(v) for k, v in (doc.get("sweeps") or {}).items()
              if k != "stops" and isinstance(v, list)}
    return Bench(table, ratios, doc.get("config") or {}, path, doc.get("curves") or {},
                 sweeps)


def _run_one(argv: list[str]) -> None:
    """Subprocess entry: record one combination through `opprof record`'s code path."""
    from opprof.pipeline.record import record_trace

    raise_on_signals()
    config = RecordConfig.from_json(argv[0])
    set_invocation(config.command)  # "opprof bench (NAME)", the run's `command` too
    try:
        trace = record_trace(config, Path(argv[1]), keep_partial=False)
    except (OpprofError, Interrupted) as exc:
        print(f"opprof: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    print(f"wrote {argv[1]} ({len(trace.events):,} events)", flush=True)


if __name__ == "__main__":
    _run_one(sys.argv[1:])
