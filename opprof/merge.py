"""Traces of one job written on different hosts, as one: `opprof import a.trace b.trace …`.

Each host of a multi-host run writes a `.trace` of the ranks it ran (``opprof record …
--nnodes N --node-rank K``, or ``opprof import`` of its own native traces). Their events
already stand on one clock: a recorded rank's offset to rank 0's clock was measured and
applied when its native trace was normalized, as for a native folder (``clock_offsets_ns``;
an imported rank without one keeps its host's clock, as it would in a folder). Merging keeps
every rank's number and joins the files' metadata rank by rank.

Refused, in one line naming the files: two files that hold the same rank, and files of
different jobs — a different framework, model, mode, dataset, batch size, world size, node
count or rendezvous address wherever both files say it, or steps more than
:data:`APART_NS` apart (the ranks of one job step together; a user's imported traces carry
none of the rest).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opprof.errors import OpprofError

if TYPE_CHECKING:
    from opprof.meta import MetaMapping

#: What both files must agree on, where both have it.
JOB_KEYS = ("framework", "model", "mode", "dataset", "batch_size", "nnodes", "master",
            "workers")
#: Two files whose profiled steps are further apart than this are not one job's.
APART_NS = 60 * 10**9
#: Per-host facts that no longer describe the merged job.
HOST_KEYS = ("node_rank", "row_groups", "command")


def world_size(meta: dict[str, Any]) -> int | None:
    """The job's world size as the trace's ``distributedInfo`` says it (None: unknown)."""
    for info in (meta.get("distributed") or {}).values():
        if isinstance(info, dict) and isinstance(info.get("world_size"), int):
            return int(info["world_size"])
    return None


def steps_span(meta: MetaMapping) -> tuple[int, int] | None:
    """(first step's start, last step's end) of a trace, ns (None: no steps)."""
    rows = [r for r in meta.get("step_bounds") or [] if isinstance(r, (list, tuple))
            and len(r) >= 4]
    try:
        return (min(int(r[2]) for r in rows), max(int(r[3]) for r in rows)) if rows else None
    except (TypeError, ValueError):
        return None


def check_one_job(files: Sequence[tuple[Path, dict[str, Any], list[int]]]) -> None:
    """(path, metadata, ranks) per file: raise one OpprofError line unless they are the
    hosts of one job with disjoint ranks."""
    first, meta0, _ = files[0]
    for path, meta, _ in files[1:]:
        for key in JOB_KEYS:
            if key == "workers" and not ("nnodes" in meta0 and "nnodes" in meta):
                continue  # an import counts its own files: only a recording's is the job's
            a, b = meta0.get(key), meta.get(key)
            if a is not None and b is not None and a != b:
                raise OpprofError(f"{first} and {path} are not one job ({key} {a} vs {b})")
        a, b = world_size(meta0), world_size(meta)
        if a is not None and b is not None and a != b:
            raise OpprofError(f"{first} and {path} are not one job (world size {a} vs {b})")
        sa, sb = steps_span(meta0), steps_span(meta)
        if sa is not None and sb is not None:
            gap = max(sa[0], sb[0]) - min(sa[1], sb[1])
            if gap > APART_NS:
                raise OpprofError(f"{first} and {path} are not one job (their steps are "
                                  f"{gap / 1e9:,.0f} s apart)")
    seen: dict[int, Path] = {}
    for path, _, ranks in files:
        for r in ranks:
            if r in seen:
                raise OpprofError(f"{seen[r]} and {path} both hold rank {r}: give each "
                                  "host's trace of one job once")
            seen[r] = path


def _union(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        for x in v if isinstance(v, list) else [v]:
            if x not in out:
                out.append(x)
    return out


def merge_meta(metas: list[dict[str, Any]], paths: list[Path], worker_ranks: int) -> dict[str, Any]:
    """One job's metadata from its hosts' (in the order given): per-rank tables joined,
    lists united, the first file's value for the rest."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for m in metas for k in m):
        values = [m[key] for m in metas if key in m]
        if key in HOST_KEYS:
            continue
        if all(isinstance(v, dict) for v in values):
            joined: dict[str, Any] = {}
            for v in values:
                joined.update(v)
            out[key] = joined
        elif key == "step_bounds":
            out[key] = sorted((b for v in values for b in v), key=lambda b: (b[0], b[2]))
        elif key == "per_rank":
            out[key] = sorted((r for v in values for r in v), key=lambda r: r.get("rank", 0))
        elif all(isinstance(v, list) for v in values):
            out[key] = _union(values)
        else:
            out[key] = values[0]
    out["workers"] = max(int(out.get("workers") or 0), worker_ranks)
    out["merged_from"] = [str(p) for p in paths]
    return out


def job_meta(files: Sequence[Any]) -> dict[str, Any]:
    """The merged metadata of the hosts' opened `.trace` files (``TraceFile``), checked to
    be one job."""
    check_one_job([(f.path, f.meta, f.ranks) for f in files])
    # a host's worker ranks: its ranks, less servers and schedulers (its own worker count)
    workers = sum(min(len(f.ranks), int(f.meta.get("workers") or len(f.ranks)))
                  for f in files)
    return merge_meta([f.meta for f in files], [f.path for f in files], workers)


def merge_traces(paths: Sequence[Path]) -> Any:
    """The Trace of one job from its hosts' `.trace` files (checked as above)."""
    from opprof.trace import TraceFile, concat_traces

    files = [TraceFile(p) for p in paths]
    meta = job_meta(files)
    return concat_traces([f.read() for f in files], meta)
