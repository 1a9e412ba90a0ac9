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

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opprof import drops, parallel
from opprof.errors import OpprofError

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
    meta: dict = field(default_factory=dict)
    memory: tuple[str, ...] = ()  # opprof's sampled memory files of the job (normalizers.sampled)


@dataclass
class Outcome:
    """What a worker sends back: per rank parts or tables, and the file's facts."""

    parts: list = field(default_factory=list)
    tables: list = field(default_factory=list)  # (rank, pyarrow.Table)
    info: dict | None = None
    declared: int | None = None
    rank: int | None = None
    other_format: bool = False  # a JSON file that is not Kineto: normalize the job whole
    skipped: bool = False  # a JSON file found in a folder that is no trace
    damaged: str | None = None  # a file found in a folder that cannot be read: the problem
    events: int = 0
    warnings: dict = field(default_factory=dict)  # what reading a .trace rank dropped


@dataclass
class Plan:
    """How a job's ranks are read: ``tasks`` for workers, or ``whole`` (normalize all)."""

    paths: list[Path]
    tasks: list[Task]
    whole: bool
    meta: dict
    input_bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    damaged: list[dict] = field(default_factory=list)


def plan(paths: Sequence[str | os.PathLike], meta: dict | None = None) -> Plan:
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
    from opprof.normalizers import FILE_FORMATS, expand, folder_meta, head_bytes, split_memory

    meta = {**folder_meta(files), **(meta or {})}
    listed, memory = split_memory(expand(files))
    if not listed:
        raise OpprofError(f"{files[0]}: only sampled memory files, no trace to attach them to")
    tasks: list[Task] = []
    size = 0
    for i, (f, named) in enumerate(listed):
        try:
            head = head_bytes(f)
        except OpprofError:
            if named:
                raise
            return Plan(files, [], True, meta or {}, size)  # normalize() says what it skips
        size += f.stat().st_size * (10 if head.startswith(b"\x1f\x8b") else 1)
        if head.startswith(_PARQUET_MAGIC) or any(m.claims_file(f, head) for m in FILE_FORMATS):
            return Plan(files, [], True, meta or {}, size)
        tasks.append(Task("json", str(f), i, None, named, meta or {},
                          tuple(str(m) for m in memory)))
    return Plan(files, tasks, False, meta or {}, size)


def read_task(task: Task, detail: bool = True) -> tuple[list, Outcome]:
    """(per-rank Traces, outcome facts) of one task, in whichever process runs it."""
    if task.kind == "trace":
        from opprof.trace import TraceFile

        tf = TraceFile(task.path)
        tr = tf.read_rank(int(task.rank), detail)  # type: ignore[arg-type]
        return [tr], Outcome(rank=task.rank, events=len(tr.events),
                             warnings=tf.found.get("read_warnings", {}))
    from opprof.normalizers import chrome, head_bytes, kineto, sampled

    path = Path(task.path)
    head = head_bytes(path)
    doc = kineto.stream(path, head, detail)  # None: not streamed, read whole
    if doc is None:
        data = chrome.read_bytes(path, head)
        doc = kineto.decode(data, path)
        del data
    if doc is None or not kineto.claims_json(doc):
        from opprof.normalizers import mxnet

        if task.named or (doc is not None and mxnet.claims_json(doc)):
            return [], Outcome(other_format=True)  # normalized whole (or its error shown)
        return [], Outcome(skipped=True)  # a sidecar JSON in a folder, as normalize skips
    declared = kineto.declared_rank(doc, -1)  # -1: the file does not say
    rank = (declared if declared >= 0 else task.index) if task.rank is None else task.rank
    trace, info = kineto.rank_trace(path, doc, rank, task.meta, detail)
    del doc
    if task.memory:  # only this rank's own file: no rank is made for another process
        trace = sampled.attach(trace, [Path(m) for m in task.memory], new_ranks=False)
        info["memory_sources"] = trace.meta.get("memory_sources", [])
    return [trace], Outcome(info=info, declared=declared, rank=rank, events=len(trace.events))


def _read_or_skip(task: Task, detail: bool = True) -> tuple[list, Outcome]:
    """:func:`read_task`; a damaged file found in a folder is skipped, its problem kept."""
    try:
        return read_task(task, detail)
    except OpprofError as exc:
        if task.named:
            raise
        return [], Outcome(skipped=True, damaged=str(exc).removeprefix(f"{task.path}: "))


def analyze_task(args: tuple[Task, str]) -> Outcome:
    """Worker: read one task's ranks and reduce each to its RankPart."""
    from opprof.analysis.report import analyze

    task, device_span = args
    traces, out = _read_or_skip(task, detail=False)
    out.parts = [analyze(t, device_span) for t in traces]
    return out


def import_task(task: Task) -> Outcome:
    """Worker: read one task's ranks as Arrow tables (the `.trace` row groups)."""
    from opprof.trace import to_arrow

    traces, out = _read_or_skip(task)
    out.tables = [(int(t.events["rank"].iloc[0]) if len(t.events) else out.rank or 0,
                   to_arrow(t.events)) for t in traces]
    return out


def _run(p: Plan, fn: Any, args: list, engine: parallel.Engine,
         take: Any = None) -> list[Outcome]:
    """Run the tasks, then re-run the JSON files whose rank another file already took (so
    ranks are assigned as a whole-job import assigns them). ``take(i, outcome)``, if given,
    sees each outcome of task ``i`` as it arrives (a re-run's replaces the first)."""
    from opprof.normalizers import kineto

    def arrived(i: int, o: Outcome) -> Outcome:
        if take is not None and not o.skipped and not o.other_format:
            take(i, o)
        return o

    outs = [arrived(i, o) for i, o in enumerate(
        progress(parallel.run_ordered(engine, fn, args), len(args), engine))]
    kept = [i for i, o in enumerate(outs) if not o.skipped]
    p.skipped = [p.tasks[i].path for i, o in enumerate(outs) if o.skipped and not o.damaged]
    p.damaged = [{"path": p.tasks[i].path, "problem": o.damaged}
                 for i, o in enumerate(outs) if o.damaged]
    if p.tasks and p.tasks[0].kind == "json" and not any(o.other_format for o in outs):
        # a file that states no rank is the next one among the traces read (sidecar JSON
        # files found beside it do not count), as a whole-job import numbers them
        final = kineto.assign_ranks([pos if outs[i].declared is None or outs[i].declared < 0
                                     else outs[i].declared for pos, i in enumerate(kept)])
        redo = [i for i, r in zip(kept, final, strict=True) if outs[i].rank != r]
        fixed = [_with_rank(args[i], r) for i, r in zip(kept, final, strict=True)
                 if outs[i].rank != r]
        for i, o in zip(redo, parallel.run_ordered(engine, fn, fixed), strict=True):
            outs[i] = arrived(i, o)
    return [outs[i] for i in kept]


def progress(results: Any, total: int, engine: parallel.Engine) -> Any:
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


def _with_rank(arg: Any, rank: int) -> Any:
    if isinstance(arg, tuple):
        t = arg[0]
        return (Task(t.kind, t.path, t.index, rank, t.named, t.meta, t.memory), *arg[1:])
    return Task(arg.kind, arg.path, arg.index, rank, arg.named, arg.meta, arg.memory)


def _job_meta(p: Plan, outs: list[Outcome]) -> dict:
    if p.tasks and p.tasks[0].kind == "json":
        from opprof.normalizers import kineto

        if not outs:
            if p.damaged:
                first = p.damaged[0]
                raise OpprofError(f"{first['path']}: {first['problem']}" + (
                    f" (and {len(p.damaged) - 1} more damaged file(s))"
                    if len(p.damaged) > 1 else ""))
            raise OpprofError(f"{p.paths[0]}: no known trace format among "
                              f"{len(p.skipped)} JSON file(s)")
        meta = kineto.merge_meta([o.info for o in outs], p.meta)  # type: ignore[misc]
        if p.skipped:
            meta["skipped_files"] = p.skipped
        if p.damaged:
            meta["damaged_files"] = p.damaged
        return meta
    found = drops.merged(o.warnings for o in outs)
    if found:
        return {**p.meta, drops.KEY: drops.merged([p.meta.get(drops.KEY), found])}
    return p.meta


def report(paths: Sequence[str | os.PathLike], *, device_span: str = "steps",
           scheduler: str | None = None, jobs: int | None = None):
    """The Report of a job, computed rank by rank (see the module docstring)."""
    from opprof.analysis.report import analyze, combine, split_ranks

    p = plan(paths)
    if not p.whole:
        engine = parallel.choose(len(p.tasks), p.input_bytes, scheduler=scheduler, jobs=jobs)
        outs = _run(p, analyze_task, [(t, device_span) for t in p.tasks], engine)
        if not any(o.other_format for o in outs):
            parts = [part for o in outs for part in o.parts]
            return combine(parts, _job_meta(p, outs), device_span)
    from opprof.loader import load

    trace = load(p.paths)
    meta = trace.meta
    ranks = split_ranks(trace)
    del trace
    parts = []
    while ranks:  # drop each rank's events once analyzed
        parts.append(analyze(ranks.pop(0), device_span))
    return combine(parts, meta, device_span)


@dataclass
class Imported:
    """What `opprof import` wrote."""

    path: Path
    events: int
    ranks: int
    steps: int
    formats: list[str]
    damaged: list[dict] = field(default_factory=list)
    read_warnings: dict = field(default_factory=dict)  # opprof.drops: what was dropped


def import_(paths: Sequence[str | os.PathLike], output: str | os.PathLike, *,
            scheduler: str | None = None, jobs: int | None = None) -> Imported:
    """Normalize a job into a `.trace` at ``output``, rank by rank: each rank's table is
    spilled to a temporary Arrow file as it arrives, then every rank is written as its row
    groups once the job's metadata is known (it goes in the file's schema)."""
    import pyarrow as pa

    from opprof.files import atomic_path, safe_name, why_not
    from opprof.trace import ROW_GROUP_ROWS, SCHEMA, TraceWriter, save

    output = Path(output)
    p = plan(paths)
    if not p.whole and p.tasks[0].kind == "json":
        engine = parallel.choose(len(p.tasks), p.input_bytes, scheduler=scheduler, jobs=jobs)
        output.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{safe_name(output.name)}.",
                                         dir=output.parent) as tmp:
            spilled: dict[int, list[tuple[int, Path, int]]] = {}  # task → (rank, file, rows)

            def spill(i: int, o: Outcome) -> None:
                spilled[i] = []
                for k, (rank, table) in enumerate(o.tables):
                    f = Path(tmp) / f"{i}.{k}.arrow"
                    try:
                        with pa.OSFile(str(f), "wb") as sink, \
                                pa.ipc.new_file(sink, SCHEMA) as w:
                            w.write_table(table)
                    except OSError as exc:  # disk full, a file size limit
                        raise OpprofError(f"{output}: cannot be written ({why_not(exc)} in "
                                          "its temporary files); nothing was written") from None
                    spilled[i].append((rank, f, table.num_rows))
                o.tables = []

            outs = _run(p, import_task, p.tasks, engine, take=spill)
            if not any(o.other_format for o in outs):
                meta = _job_meta(p, outs)
                ranks = [x for i in sorted(spilled) for x in spilled[i]]
                # the row-group map goes in the schema's metadata, so it is known first
                groups: dict[str, list[int]] = {}
                k = 0
                for rank, _, rows in ranks:
                    m = max(1, -(-rows // ROW_GROUP_ROWS))
                    groups.setdefault(str(rank), []).extend(range(k, k + m))
                    k += m
                meta["row_groups"] = groups
                with atomic_path(output) as out_tmp, TraceWriter(out_tmp, meta) as w:
                    for rank, f, _ in ranks:
                        w.write(rank, pa.ipc.open_file(pa.memory_map(str(f))).read_all())
                n_events = sum(rows for _, _, rows in ranks)
                return Imported(output, n_events, len(ranks),
                                len(meta.get("step_bounds", [])), meta["source_formats"],
                                meta.get("damaged_files", []), meta.get("read_warnings", {}))
    from opprof.loader import load

    trace = load(p.paths)
    save(trace, output)
    ev = trace.events
    return Imported(output, len(ev), int(ev["rank"].nunique()),
                    len(trace.meta.get("step_bounds", [])),
                    list(trace.meta.get("source_formats", [])),
                    trace.meta.get("damaged_files", []),
                    trace.meta.get("read_warnings", {}))
