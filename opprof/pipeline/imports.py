"""The import pipeline: native traces (one per rank, or folders; any supported format), or
the `.trace` files of one job's hosts, into one `.trace` (:func:`import_`), rank by rank where
the format allows (:mod:`opprof.job`)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opprof import parallel
from opprof.errors import ErrorKind, OpprofError
from opprof.job import Outcome, combined_meta, import_task, plan, run_tasks
from opprof.meta import TraceMeta


@dataclass
class Imported:
    """What `opprof import` wrote."""

    path: Path
    events: int
    ranks: int
    steps: int
    formats: list[str]
    damaged: list[dict[str, str]] = field(default_factory=list)
    read_warnings: dict[str, int] = field(default_factory=dict)  # opprof.drops: what dropped


def import_(paths: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str], *,
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
                        raise OpprofError(f"cannot be written ({why_not(exc)} in "
                                          "its temporary files); nothing was written",
                                          path=output, kind=ErrorKind.UNWRITABLE) from None
                    spilled[i].append((rank, f, table.num_rows))
                o.tables = []

            outs = run_tasks(p, import_task, p.tasks, engine, take=spill)
            if not any(o.other_format for o in outs):
                meta = TraceMeta.of(combined_meta(p, outs))
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
                return Imported(output, n_events, len(ranks), meta.steps,
                                list(meta.source_formats or []), meta.damaged_files or [],
                                meta.read_warnings or {})
    from opprof.loader import load

    trace = load(p.paths)
    save(trace, output)
    ev, meta = trace.events, trace.meta
    return Imported(output, len(ev), int(ev["rank"].nunique()), meta.steps,
                    list(meta.source_formats or []), meta.damaged_files or [],
                    meta.read_warnings or {})
