"""Native trace formats: detect what a file or folder is and read it into an opprof Trace.

Every format is a :class:`~opprof.normalizers.formats.Format` (:mod:`.formats`): it claims a
file and reads a job whole; a format of one rank per file (Kineto) also plans the files'
ranks and reads one rank on its own (:func:`read_native`), in this process (:func:`normalize`)
or in workers (:mod:`opprof.job`): one path, the same ranks, metadata and errors.

JSON is decoded typed (``chrome.py``): a Kineto trace is read as its text streams in
(``kineto.stream``: the events typed a span at a time and their columns taken, the text
never held whole); any other file is decoded once as a Kineto
:class:`~opprof.normalizers.kineto.Document` (its top level; the events stay views of the
text, typed a chunk at a time while their columns are taken, ``kineto.typed_events``),
which also answers MXNet's claim; an MXNet dump is then decoded with MXNet's own type.
Files of a rank format are normalized one at a time, so a job's decoded documents are never
all in memory.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from opprof.errors import ErrorKind, OpprofError
from opprof.files import check_input
from opprof.normalizers import chrome, sampled
from opprof.normalizers.formats import (
    FILE_FORMATS,
    JSON_FORMATS,
    Format,
    RankFormat,
    by_rank,
    file_format,
)
from opprof.trace import Trace, concat_traces

if TYPE_CHECKING:
    from opprof.jsontypes import JSON, JSONObject
    from opprof.meta import MetaMapping
    from opprof.preread import Ahead

__all__ = ["FILE_FORMATS", "JSON_FORMATS", "Format", "Native", "RankFormat", "expand",
           "file_format", "folder_meta", "head_bytes", "normalize", "read_doc", "read_json",
           "read_native", "split_memory", "write_folder_meta"]

_PARQUET_MAGIC = b"PAR1"
_CANDIDATE_SUFFIXES = (".json", ".json.gz", ".xplane.pb", ".sqlite", ".nvvp", ".nsys-rep",
                       sampled.SUFFIX)


def head_bytes(path: Path, n: int = 64) -> bytes:
    """The first n bytes of a file, with clear errors for missing or empty files."""
    if stat.S_ISDIR(check_input(path).st_mode):
        raise OpprofError("is a folder", path=path, kind=ErrorKind.UNREADABLE)
    try:
        with open(path, "rb") as f:
            head = f.read(n)
    except OSError as exc:
        raise OpprofError(f"cannot be read ({exc.strerror or exc})",
                          path=path, kind=ErrorKind.UNREADABLE) from None
    if not head:
        raise OpprofError("file is empty", path=path, kind=ErrorKind.EMPTY)
    return head


def read_json(path: Path) -> JSON:
    """Parse a plain or gzipped JSON file into plain Python objects (dicts and lists); any
    failure is one clear OpprofError line. (The importers decode typed, see chrome.py.)"""
    data = chrome.read_bytes(path, head_bytes(path))
    doc: JSON = chrome.decode(data, path, _PLAIN_JSON, "JSON document")
    return doc


_PLAIN_JSON = msgspec.json.Decoder()


def read_doc(path: Path, head: bytes, detail: bool = True,
             ahead: Ahead | None = None) -> tuple[Format | None, Any]:
    """(format, decoded document) of a JSON trace file; (None, description) when it is
    JSON of no known format. A Kineto trace is read as its text streams in, its events
    taken as columns already (``kineto.stream``; ``detail``: as ``read_rank`` will read
    them); any other file, or one the streaming reader leaves, is decoded whole. ``ahead``:
    what the command started reading before (:class:`opprof.preread.Ahead`)."""
    from opprof.normalizers import kineto

    streamed = kineto.stream(path, head, detail, ahead)
    if streamed is not None:
        fmt = next((f for f in JSON_FORMATS if f.claims(path, head, streamed)), None)
        if fmt is not None and fmt.name == kineto.NAME:
            return fmt, streamed
    data = chrome.read_bytes(path, head, ahead)
    doc = kineto.decode(data, path)
    if doc is None:
        return None, chrome.describe(data)
    for fmt in JSON_FORMATS:
        if fmt.claims(path, head, doc):
            return fmt, fmt.decode(data, path, doc)
    return None, f"chrome-trace events of no known profiler ({len(doc.traceEvents)} events)"


@dataclass
class Native:
    """One native JSON file read: its format (None: JSON of no known format, ``what`` it
    is); for a rank format, its rank's Trace, facts, the rank it declares (-1: none) and the
    rank it was read as; for another format, its document (the job is read whole)."""

    fmt: Format | None
    doc: object = None
    trace: Trace | None = None
    info: dict[str, Any] | None = None
    declared: int = -1
    rank: int | None = None
    what: str = ""


def read_native(path: Path, meta: MetaMapping, *, index: int = 0,
                taken: Sequence[int] = (), rank: int | None = None, detail: bool = True,
                head: bytes | None = None, ahead: Ahead | None = None) -> Native:
    """Decode one native JSON file; when its format reads one rank per file, normalize it:
    as ``rank`` when given, else as its format plans it after the ranks ``taken`` by the
    files before it (the rank it declares, else ``index``). ``ahead``: what was read before
    (:class:`opprof.preread.Ahead`: the file's document decoded already, or what the command
    started reading)."""
    decoded = ahead.decoded(path) if ahead is not None else None
    if decoded is not None:  # decoded before (a job first read rank by rank): not read again
        fmt, doc = decoded
    else:
        fmt, doc = read_doc(path, head if head is not None else head_bytes(path), detail,
                            ahead)
    if fmt is None:
        return Native(None, what=str(doc))
    ranked = by_rank(fmt)
    if ranked is None:
        return Native(fmt, doc=doc)
    declared = ranked.declared_rank(doc, -1)
    if rank is None:
        rank = ranked.plan([*taken, declared if declared >= 0 else index])[-1]
    trace, info = ranked.read_rank(path, doc, rank, meta, detail)
    return Native(fmt, trace=trace, info=info, declared=declared, rank=rank)


def about_file(path: Path | str, exc: OpprofError) -> OpprofError:
    """``exc`` as an error about the file ``path`` (itself when it already is one)."""
    return exc if exc.about(path) else OpprofError(str(exc), path=path, kind=exc.kind)


def damaged_files(errors: Sequence[OpprofError]) -> list[dict[str, str]]:
    """Damaged files as ``meta["damaged_files"]`` lists them: path and problem."""
    return [{"path": str(e.path), "problem": e.problem} for e in errors]


def nothing_read(paths: Sequence[Path | str], skipped: int, damaged: Sequence[OpprofError],
                 count: bool = True) -> OpprofError:
    """The error when no file of a job could be read: the first damaged one's (and, with
    ``count``, how many more), else that no JSON file was of a known format."""
    if damaged:
        first = damaged[0]
        more = (f" (and {len(damaged) - 1} more damaged file(s))"
                if count and len(damaged) > 1 else "")
        return OpprofError(first.problem + more, path=first.path, kind=first.kind)
    return OpprofError(f"no known trace format among {skipped} JSON file(s)", path=paths[0],
                       kind=ErrorKind.NOT_A_TRACE)


def rank_job(fmt: RankFormat, parts: Sequence[tuple[Trace, Mapping[str, Any]]],
             meta: MetaMapping) -> Trace:
    """The Trace of a job read rank by rank: the ranks' events in file order, the job's
    metadata from their facts."""
    return concat_traces([t for t, _ in parts], fmt.job_meta([i for _, i in parts], meta))


def mixed_formats(fmt_of: Mapping[Path, Format]) -> OpprofError | None:
    """The error for files of several formats in one import, or None."""
    kinds = {m.name for m in fmt_of.values()}
    if len(kinds) <= 1:
        return None
    by_kind: dict[str, list[str]] = {}
    for f, m in fmt_of.items():
        by_kind.setdefault(m.name, []).append(f.name)
    return OpprofError("mixed native formats in one import: " + "; ".join(
        f"{k}: {', '.join(names[:4])}" + (f" and {len(names) - 4} more" if len(names) > 4
                                          else "")
        for k, names in sorted(by_kind.items())) + " — import each format on its own")


def noted(trace: Trace, skipped: Sequence[str], damaged: Sequence[OpprofError]) -> Trace:
    """``trace`` with the JSON files skipped and the damaged files left out in its metadata,
    where any."""
    if skipped:
        trace.meta["skipped_files"] = list(skipped)
    if damaged:
        trace.meta["damaged_files"] = damaged_files(damaged)
    return trace


#: The job's metadata a recording leaves in its `.native` folder (model, data set, unprofiled
#: timing, command, version …: what the `.trace` carries), read back when the folder is
#: imported. Not a trace suffix, so the folder's listing never takes it for one.
FOLDER_META = "opprof.meta"


def write_folder_meta(folder: Path, meta: MetaMapping) -> None:
    """Keep ``meta`` (the job metadata given to :func:`normalize`), stamped as the `.trace`
    will be (:func:`opprof.meta.stamp`), in the run's folder."""
    from opprof.files import write_atomic
    from opprof.meta import stamp

    write_atomic(Path(folder) / FOLDER_META,
                 json.dumps(stamp(meta).to_dict(), default=str, indent=1))


def folder_meta(paths: list[Path]) -> JSONObject:
    """The recorded job metadata of the folders among ``paths`` (:data:`FOLDER_META`); a
    file that cannot be read as a JSON object is ignored (the traces still are read)."""
    meta: JSONObject = {}
    for p in paths:
        f = Path(p) / FOLDER_META
        if not f.is_file():
            continue
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            meta.update(doc)
    return meta


def expand(paths: list[Path]) -> list[tuple[Path, bool]]:
    """Files to read, each with whether the user named it: the paths themselves, or the
    candidate trace files found inside folders."""
    out: list[tuple[Path, bool]] = []
    for p in paths:
        if p.is_dir():
            found = sorted(
                f for f in p.rglob("*")
                if f.is_file() and f.name.endswith(_CANDIDATE_SUFFIXES)
            )
            if not found:
                raise OpprofError(
                    f"folder holds no trace files ({', '.join(_CANDIDATE_SUFFIXES)})",
                    path=p, kind=ErrorKind.NOT_A_TRACE)
            out.extend((f, False) for f in profile_twins_dropped(found))
        else:
            out.append((p, True))
    return out


#: What the TensorFlow and JAX profilers write beside an XPlane (``<host>.trace.json.gz``, and
#: JAX's ``perfetto_trace.json.gz``): the same events, converted; the XPlane is read.
_XPLANE_TWINS = (".trace.json.gz", ".trace.json")


def profile_twins_dropped(files: list[Path]) -> list[Path]:
    """``files`` without the chrome-trace exports the TF/JAX profiler writes beside an XPlane
    (``<host>.xplane.pb`` and ``<host>.trace.json.gz``; ``perfetto_trace.json.gz`` in the same
    run folder): the XPlane is the source of truth."""
    xplane_dirs = {f.parent for f in files if f.name.endswith(".xplane.pb")}
    stems = {(f.parent, f.name.removesuffix(".xplane.pb")) for f in files
             if f.name.endswith(".xplane.pb")}

    def twin(f: Path) -> bool:
        if f.parent not in xplane_dirs:
            return False
        if f.name.startswith("perfetto_trace.json"):
            return True
        return any(f.name.endswith(s) and (f.parent, f.name.removesuffix(s)) in stems
                   for s in _XPLANE_TWINS)

    return [f for f in files if not twin(f)]


def split_memory(listed: list[tuple[Path, bool]]) -> tuple[list[tuple[Path, bool]], list[Path]]:
    """(trace files, opprof's sampled memory files) of an :func:`expand` listing."""
    memory = [f for f, _ in listed if sampled.is_memory_file(f)]
    return [(f, n) for f, n in listed if not sampled.is_memory_file(f)], memory


def normalize(paths: list[Path], meta: MetaMapping | None = None, *,
              skip_damaged: bool = False, ahead: Ahead | None = None) -> Trace:
    """Read native trace files (all of one format, e.g. one per rank) into one Trace.

    A file the user named must be a trace; a JSON file found inside a folder that no format
    claims (a collector's sidecar, e.g. ``rank0.key_averages.json``) is skipped. A damaged
    file found inside a folder — empty, truncated (a process killed while writing it), not
    readable by its format — is skipped too when the folder holds other traces, and listed
    in ``meta["damaged_files"]`` (path and problem), so a run cut short is read for what is
    complete; ``skip_damaged`` treats named files the same way (a partial recording).
    opprof's sampled memory files (``*.memory.csv``) among them become the memory rows of
    their ranks (:mod:`.sampled`). ``ahead``: what the command started reading before
    (:class:`opprof.preread.Ahead`)."""
    listed, memory = split_memory(expand([Path(p) for p in paths]))
    if not listed:
        raise OpprofError("only sampled memory files, no trace to attach them to",
                          path=paths[0], kind=ErrorKind.NO_EVENTS)
    meta = {**folder_meta([Path(p) for p in paths]), **(meta or {})}
    return sampled.attach(_normalize(paths, listed, meta, skip_damaged, ahead), memory)


def _normalize(paths: list[Path], listed: list[tuple[Path, bool]], meta: MetaMapping,
               skip_damaged: bool, ahead: Ahead | None = None) -> Trace:
    damaged: list[OpprofError] = []

    def tolerate(f: Path, named: bool, exc: OpprofError) -> None:
        """Note ``f`` as damaged, or raise ``exc`` when it must be read."""
        if named and not skip_damaged:
            raise exc
        damaged.append(about_file(f, exc))

    heads: dict[Path, bytes] = {}
    for f, named in listed:
        try:
            heads[f] = head_bytes(f)
        except OpprofError as exc:
            tolerate(f, named, exc)
    listed = [(f, n) for f, n in listed if f in heads]
    if not listed:
        raise nothing_read(paths, 0, damaged, count=False)
    files = [f for f, _ in listed]
    for fmt in FILE_FORMATS:
        if all(fmt.claims(f, heads[f]) for f in files):
            return noted(_from_files(fmt, listed, meta, tolerate), [], damaged)
    docs: list[tuple[Path, object]] = []
    parts: list[tuple[Trace, dict[str, Any]]] = []
    ranks: list[int] = []
    fmt_of: dict[Path, Format] = {}
    skipped: list[str] = []
    for f, named in listed:
        head = heads[f]
        if head.startswith(_PARQUET_MAGIC):
            raise OpprofError("an opprof trace or Parquet file cannot be mixed with native "
                              "traces", path=f, kind=ErrorKind.NOT_A_TRACE)
        claimed = file_format(f, head)
        if claimed is not None:
            raise OpprofError(f"a {claimed.name} file cannot be mixed with other formats",
                              path=f, kind=ErrorKind.NOT_A_TRACE)
        try:  # a rank format's file is normalized at once: one decoded document is held
            got = read_native(f, meta, index=len(ranks), taken=ranks, head=head, ahead=ahead)
        except OpprofError as exc:
            tolerate(f, named, exc)
            continue
        if got.fmt is None:
            if not named:
                skipped.append(str(f))
                continue
            raise OpprofError(f"JSON but not a known trace format ({got.what})", path=f,
                              kind=ErrorKind.NOT_A_TRACE)
        fmt_of[f] = got.fmt
        if got.trace is not None and got.info is not None and got.rank is not None:
            ranks.append(got.rank)
            parts.append((got.trace, got.info))
        else:
            docs.append((f, got.doc))
    if not fmt_of:
        raise nothing_read(paths, len(skipped), damaged)
    mixed = mixed_formats(fmt_of)
    if mixed is not None:
        raise mixed
    fmt = next(iter(fmt_of.values()))
    ranked = by_rank(fmt)
    trace = rank_job(ranked, parts, meta) if ranked is not None else fmt.read(docs, meta)
    return noted(trace, skipped, damaged)


def _from_files(fmt: Format, listed: list[tuple[Path, bool]], meta: MetaMapping,
                tolerate: Callable[[Path, bool, OpprofError], None]) -> Trace:
    """``fmt.read`` on the files; one that its reader refuses (the error is about it) is
    left out when ``tolerate`` allows, and the rest read again."""
    files = [f for f, _ in listed]
    named = dict(listed)
    while True:
        try:
            return fmt.read([(f, None) for f in files], meta)
        except OpprofError as exc:
            bad = next((f for f in files if exc.about(f)), None)
            if bad is None or len(files) == 1:
                raise
            tolerate(bad, named[bad], exc)
            files = [f for f in files if f != bad]
