"""Import and report a job rank by rank: a few ranks' events in memory at a time, the ranks
spread over local processes or a Dask cluster (``opprof.parallel``).

A job is what a command takes as TRACE or NATIVE: an opprof `.trace` (one row group per
rank, read rank by rank; several: the hosts of one job, :mod:`opprof.merge`), native Kineto
traces (one file per rank, each normalized on its
own), or any other native format (MXNet, TensorFlow XPlane, nsys, nvprof: normalized
whole — their ranks depend on each other — then analyzed rank by rank).

Per rank, a worker reads or normalizes the rank's events and reduces them to a small
:class:`~opprof.analysis.report.RankPart` (report) or an Arrow table (import); this process
combines the parts (collective matching across ranks works on small per-rank tables) or
writes the tables as the ranks' row groups of the `.trace`. Results equal those of
``opprof.load`` + ``build_report`` on the whole job.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from opprof import drops, parallel
from opprof.errors import ErrorKind, OpprofError
from opprof.strings import plain_strings

if TYPE_CHECKING:
    import pyarrow as pa

    from opprof.analysis.report import RankPart, Report
    from opprof.flops.peaks import PeakOptions
    from opprof.jsontypes import JSONObject
    from opprof.meta import MetaMapping
    from opprof.normalizers.formats import Format, RankFormat
    from opprof.preread import Ahead
    from opprof.trace import Trace

_PARQUET_MAGIC = b"PAR1"


@dataclass(frozen=True)
class Task:
    """Some ranks' events, as a worker finds them: rank ``rank`` of the `.trace` at ``path``
    (kind ``trace``), or the native JSON file ``path``, the ``index``-th of the job (kind
    ``json``; ``rank`` forces its rank)."""

    kind: str
    path: str
    index: int = 0
    rank: int | None = None
    named: bool = True
    meta: JSONObject = field(default_factory=dict)
    memory: tuple[str, ...] = ()  # opprof's sampled memory files of the job (normalizers.sampled)


@dataclass
class Outcome:
    """What a worker sends back: per rank parts or tables, and the file's facts."""

    parts: list[RankPart] = field(default_factory=list)
    tables: list[tuple[int, pa.Table]] = field(default_factory=list)
    info: dict[str, Any] | None = None
    declared: int | None = None
    rank: int | None = None
    fmt: RankFormat | None = None  # the format of the rank read (one rank per file)
    other_format: bool = False  # a JSON file of a whole-job format: normalize the job whole
    #: that file's (format, decoded document): the whole job is normalized from it
    decoded: tuple[Format, object] | None = None
    skipped: bool = False  # a JSON file found in a folder that is no trace
    damaged: OpprofError | None = None  # a file found in a folder that cannot be read
    path: str | None = None  # the file read (a native JSON file's task)
    events: int = 0
    warnings: dict[str, int] = field(default_factory=dict)  # what reading a .trace rank dropped


@dataclass
class Plan:
    """How a job's ranks are read: ``tasks`` for workers, or ``whole`` (normalize all)."""

    paths: list[Path]
    tasks: list[Task]
    whole: bool
    meta: MetaMapping
    input_bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    damaged: list[OpprofError] = field(default_factory=list)
    format: RankFormat | None = None  # the format of the ranks read one by one


def plan(paths: Sequence[str | os.PathLike[str]], meta: JSONObject | None = None) -> Plan:
    """Decide how to read the job at ``paths`` (validating them as ``opprof.load`` does)."""
    from opprof.loader import existing_paths, is_opprof_trace, opprof_traces_in

    files = opprof_traces_in(existing_paths(paths))
    if len(files) == 1 and is_opprof_trace(files[0]):
        from opprof.trace import TraceFile

        tf = TraceFile(files[0])
        size = files[0].stat().st_size * 8  # zstd-compressed columns: about 8x in memory
        if not tf.by_rank or len(tf.row_groups or {}) <= 1:
            return Plan(files, [], True, tf.meta, size)
        tasks = [Task("trace", str(files[0]), i, r) for i, r in enumerate(tf.ranks)]
        return Plan(files, tasks, False, tf.meta, size)
    traces = [is_opprof_trace(f) for f in files]
    if len(files) > 1 and all(traces):  # the hosts of one job: rank by rank, file by file
        from opprof.merge import job_meta
        from opprof.trace import TraceFile

        tfs = [TraceFile(f) for f in files]
        meta = job_meta(tfs)
        size = sum(f.stat().st_size * 8 for f in files)
        if not all(tf.by_rank for tf in tfs):
            return Plan(files, [], True, meta, size)
        tasks = [Task("trace", str(tf.path), i, r)
                 for tf in tfs for i, r in enumerate(tf.ranks)]
        return Plan(files, tasks, False, meta, size)
    if any(traces):
        raise OpprofError("give opprof .trace files (one per host of a job), or native traces "
                          "to normalize, not both")
    from opprof.normalizers import expand, file_format, folder_meta, head_bytes, split_memory

    meta = {**folder_meta(files), **(meta or {})}
    listed, memory = split_memory(expand(files))
    if not listed:
        raise OpprofError("only sampled memory files, no trace to attach them to",
                          path=files[0], kind=ErrorKind.NO_EVENTS)
    json_tasks: list[Task] = []
    size = 0
    for i, (f, named) in enumerate(listed):
        try:
            head = head_bytes(f)
        except OpprofError:
            if named:
                raise
            return Plan(files, [], True, meta or {}, size)  # normalize() says what it skips
        size += f.stat().st_size * (10 if head.startswith(b"\x1f\x8b") else 1)
        if head.startswith(_PARQUET_MAGIC) or file_format(f, head) is not None:
            return Plan(files, [], True, meta or {}, size)
        json_tasks.append(Task("json", str(f), i, None, named, meta or {},
                               tuple(str(m) for m in memory)))
    return Plan(files, json_tasks, False, meta or {}, size)


def read_task(task: Task, detail: bool = True,
              ahead: Ahead | None = None) -> tuple[list[Trace], Outcome]:
    """(per-rank Traces, outcome facts) of one task, in whichever process runs it (``ahead``:
    in this process, what the command started reading before)."""
    if task.kind == "trace":
        from opprof.trace import TraceFile

        tf = TraceFile(task.path)
        assert task.rank is not None  # a .trace task names its rank
        tr = tf.read_rank(task.rank, detail)
        return [tr], Outcome(rank=task.rank, events=len(tr.events),
                             warnings=tf.found.get("read_warnings", {}))
    from opprof.normalizers import read_native, sampled
    from opprof.normalizers.formats import by_rank

    path = Path(task.path)
    got = read_native(path, task.meta, index=task.index, rank=task.rank, detail=detail,
                      ahead=ahead)
    if got.trace is None or got.info is None:
        if got.fmt is not None:  # normalized whole, from this document
            return [], Outcome(other_format=True, decoded=(got.fmt, got.doc), path=task.path)
        if task.named:
            return [], Outcome(other_format=True)  # normalized whole (its error shown)
        return [], Outcome(skipped=True)  # a sidecar JSON in a folder, as normalize skips
    trace, info, declared, rank, fmt = got.trace, got.info, got.declared, got.rank, got.fmt
    del got
    if task.memory:  # only this rank's own file: no rank is made for another process
        trace = sampled.attach(trace, [Path(m) for m in task.memory], new_ranks=False)
        info["memory_sources"] = trace.meta.get("memory_sources", [])
        if trace.meta.get("memory_skipped"):  # as a whole-job read says it
            info["memory_skipped"] = trace.meta["memory_skipped"]
    return [trace], Outcome(info=info, declared=declared, rank=rank, events=len(trace.events),
                            fmt=by_rank(fmt))


def _read_or_skip(task: Task, detail: bool = True,
                  ahead: Ahead | None = None) -> tuple[list[Trace], Outcome]:
    """:func:`read_task`; a damaged file found in a folder is skipped, its problem kept."""
    try:
        return read_task(task, detail, ahead)
    except OpprofError as exc:
        if task.named:
            raise
        from opprof.normalizers import about_file

        return [], Outcome(skipped=True, damaged=about_file(task.path, exc))


def analyze_task(args: tuple[Task, str, bool], ahead: Ahead | None = None) -> Outcome:
    """Worker: read one task's ranks and reduce each to its RankPart (with its critical-path
    walks when asked: the rank's graph is built and walked here, only the walks' small
    tables come back; ``ahead``: in this process, what the command started reading before)."""
    from opprof.analysis.report import analyze

    task, device_span, critical = args
    traces, out = _read_or_skip(task, detail=False, ahead=ahead)
    with plain_strings():  # (a Kineto trace was read so too: normalizers.kineto.rank_trace)
        out.parts = [analyze(t, device_span, critical=critical) for t in traces]
    return out


def import_task(task: Task) -> Outcome:
    """Worker: read one task's ranks as Arrow tables (the `.trace` row groups)."""
    from opprof.trace import to_arrow

    traces, out = _read_or_skip(task)
    out.tables = [(int(t.events["rank"].iloc[0]) if len(t.events) else out.rank or 0,
                   to_arrow(t.events)) for t in traces]
    return out


#: What a worker is given: a task, or a task and the report's device span.
TaskArg = TypeVar("TaskArg", Task, tuple[Task, str, bool])
R = TypeVar("R")


def run_tasks(p: Plan, fn: Callable[[TaskArg], Outcome], args: list[TaskArg],
              engine: parallel.Engine,
              take: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
    """Run the tasks, then re-run the JSON files whose rank another file already took (so
    ranks are assigned as a whole-job import assigns them). ``take(i, outcome)``, if given,
    sees each outcome of task ``i`` as it arrives (a re-run's replaces the first)."""
    def arrived(i: int, o: Outcome) -> Outcome:
        if take is not None and not o.skipped and not o.other_format:
            take(i, o)
        return o

    outs = [arrived(i, o) for i, o in enumerate(
        progress(parallel.run_ordered(engine, fn, args), len(args), engine))]
    kept = [i for i, o in enumerate(outs) if not o.skipped]
    p.skipped = [p.tasks[i].path for i, o in enumerate(outs) if o.skipped and not o.damaged]
    p.damaged = [o.damaged for o in outs if o.damaged]
    names = {o.fmt.name for o in outs if o.fmt is not None}
    if len(names) > 1:  # files of several formats: normalized whole, which says so
        for o in outs:
            o.other_format = True
    fmt = p.format = next((o.fmt for o in outs if o.fmt is not None), None)
    if fmt is not None and not any(o.other_format for o in outs):
        # a file that states no rank is the next one among the traces read (sidecar JSON
        # files found beside it do not count), as a whole-job import numbers them
        declared = [outs[i].declared for i in kept]
        final = fmt.plan([d if d is not None and d >= 0 else pos
                          for pos, d in enumerate(declared)])
        redo = [i for i, r in zip(kept, final, strict=True) if outs[i].rank != r]
        fixed = [_with_rank(args[i], r) for i, r in zip(kept, final, strict=True)
                 if outs[i].rank != r]
        for i, o in zip(redo, parallel.run_ordered(engine, fn, fixed), strict=True):
            outs[i] = arrived(i, o)
    return [outs[i] for i in kept]


def progress(results: Iterable[R], total: int, engine: parallel.Engine) -> Iterator[R]:
    """Pass results through, showing ``rank k/N`` on stderr when it is a terminal and the
    job has a few ranks."""
    import sys

    show = total >= 4 and sys.stderr.isatty()
    for k, r in enumerate(results, 1):
        if show:
            sys.stderr.write(f"\ropprof: {k}/{total} ranks ({engine.describe()})")
            sys.stderr.flush()
        yield r
    if show:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _with_rank(arg: TaskArg, rank: int) -> TaskArg:
    if isinstance(arg, Task):
        return Task(arg.kind, arg.path, arg.index, rank, arg.named, arg.meta, arg.memory)
    t, span, critical = arg
    return (Task(t.kind, t.path, t.index, rank, t.named, t.meta, t.memory), span, critical)


def _decoded(p: Plan, outs: list[Outcome]) -> Ahead | None:
    """The documents the tasks decoded of a whole-job format's files, for the reader that
    normalizes the job whole (so that no file is read twice)."""
    from opprof.gunzip import file_identity
    from opprof.preread import Ahead

    docs: dict[Any, object] = {}
    for o in outs:
        ident = file_identity(o.path) if o.decoded is not None and o.path else None
        if ident is not None:
            docs[ident] = o.decoded
    return Ahead(documents=docs) if docs else None


def combined_meta(p: Plan, outs: list[Outcome]) -> MetaMapping:
    if p.tasks and p.tasks[0].kind == "json":
        from opprof.normalizers import damaged_files, nothing_read

        if not outs or p.format is None:
            raise nothing_read(p.paths, len(p.skipped), p.damaged)
        meta: dict[str, Any] = p.format.job_meta([o.info for o in outs if o.info is not None],
                                                 p.meta)
        if p.skipped:
            meta["skipped_files"] = p.skipped
        if p.damaged:
            meta["damaged_files"] = damaged_files(p.damaged)
        return meta
    found = drops.merged(o.warnings for o in outs)
    if found:
        return {**p.meta, drops.KEY: drops.merged([p.meta.get(drops.KEY), found])}
    return p.meta


def report(paths: Sequence[str | os.PathLike[str]], *, device_span: str = "steps",
           scheduler: str | None = None, jobs: int | None = None, critical: bool = False,
           peak: PeakOptions | None = None, ahead: Ahead | None = None) -> Report:
    """The Report of a job, computed rank by rank (see the module docstring), each file
    read once; ``critical``: with each step's critical path (``Report.critical``), each
    rank's graph built and walked where the rank is read, only the collective calls'
    entries and exits combined; ``peak``: the user's figures of the machine's peak
    (opprof.flops.peaks); ``ahead``: what was read before (:class:`opprof.preread.Ahead`),
    taken where this process reads."""
    from opprof.analysis.report import analyze, combine, split_ranks

    p = plan(paths)
    if not p.whole:
        engine = parallel.choose(len(p.tasks), p.input_bytes, scheduler=scheduler, jobs=jobs)
        fn: Callable[[tuple[Task, str, bool]], Outcome] = analyze_task
        if ahead is not None:
            if engine.kind == "serial":
                fn = functools.partial(analyze_task, ahead=ahead)
            else:  # the workers read the files
                ahead.close()
        outs = run_tasks(p, fn, [(t, device_span, critical) for t in p.tasks], engine)
        if not any(o.other_format for o in outs):
            parts = [part for o in outs for part in o.parts]
            with plain_strings():
                return combine(parts, combined_meta(p, outs), device_span, peak)
        ahead = _decoded(p, outs)  # a whole-job format: normalized from what was decoded
    from opprof.loader import load

    trace = load(p.paths, ahead)
    meta = trace.meta
    ranks = split_ranks(trace)
    del trace
    parts = []
    while ranks:  # drop each rank's events once analyzed
        with plain_strings():
            parts.append(analyze(ranks.pop(0), device_span, critical=critical))
    with plain_strings():
        return combine(parts, meta, device_span, peak)
