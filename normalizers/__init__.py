"""Native trace formats: detect what a file or folder is and read it into an opprof Trace.

Each format module offers ``NAME`` and either ``claims_json(doc) -> bool`` with
``from_docs([(path, doc), ...], meta) -> Trace`` (JSON formats), or ``claims_file(path,
head) -> bool`` with ``from_files([path, ...], meta) -> Trace`` (binary formats).

JSON is decoded typed (``chrome.py``): a file is decoded once as a Kineto
:class:`~opprof.normalizers.kineto.Document` (its top level; the events stay views of the
text, typed a chunk at a time while their columns are taken, ``kineto.typed_events``),
which also answers MXNet's ``claims_json``; an MXNet dump is then decoded with MXNet's own
type. Kineto
files are normalized one at a time (``kineto.rank_trace``), so a job's decoded documents are
never all in memory; ``opprof.job`` does the same in worker processes.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import msgspec

from opprof.errors import OpprofError
from opprof.files import check_input
from opprof.normalizers import chrome, kineto, mxnet, nsys, nvprof, sampled, xplane
from opprof.trace import Trace, concat_traces

JSON_FORMATS: list[Any] = [kineto, mxnet]
FILE_FORMATS: list[Any] = [nsys, nvprof, xplane]

_PARQUET_MAGIC = b"PAR1"
_CANDIDATE_SUFFIXES = (".json", ".json.gz", ".xplane.pb", ".sqlite", ".nvvp", ".nsys-rep",
                       sampled.SUFFIX)


def head_bytes(path: Path, n: int = 64) -> bytes:
    """The first n bytes of a file, with clear errors for missing or empty files."""
    if stat.S_ISDIR(check_input(path).st_mode):
        raise OpprofError(f"{path}: is a folder")
    try:
        with open(path, "rb") as f:
            head = f.read(n)
    except OSError as exc:
        raise OpprofError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not head:
        raise OpprofError(f"{path}: file is empty")
    return head


def read_json(path: Path) -> Any:
    """Parse a plain or gzipped JSON file into plain Python objects (dicts and lists); any
    failure is one clear OpprofError line. (The importers decode typed, see chrome.py.)"""
    data = chrome.read_bytes(path, head_bytes(path))
    return chrome.decode(data, path, _PLAIN_JSON, "JSON document")


_PLAIN_JSON = msgspec.json.Decoder()


def read_doc(path: Path, head: bytes) -> tuple[Any, Any]:
    """(format module, decoded document) of a JSON trace file; (None, description) when it
    is JSON of no known format."""
    doc = kineto.stream(path, head)  # a Kineto trace read as it streams in
    if doc is not None:
        return kineto, doc
    data = chrome.read_bytes(path, head)
    doc = kineto.decode(data, path)
    if doc is None:
        return None, chrome.describe(data)
    for fmt in JSON_FORMATS:
        if fmt.claims_json(doc):
            return fmt, (doc if fmt is kineto else fmt.decode(data, path))
    return None, f"chrome-trace events of no known profiler ({len(doc.traceEvents)} events)"


#: The job's metadata a recording leaves in its `.native` folder (model, data set, unprofiled
#: timing, command, version …: what the `.trace` carries), read back when the folder is
#: imported. Not a trace suffix, so the folder's listing never takes it for one.
FOLDER_META = "opprof.meta"


def write_folder_meta(folder: Path, meta: dict) -> None:
    """Keep ``meta`` (the job metadata given to :func:`normalize`) in the run's folder."""
    from opprof.files import write_atomic

    write_atomic(Path(folder) / FOLDER_META, json.dumps(meta, default=str, indent=1))


def folder_meta(paths: list[Path]) -> dict:
    """The recorded job metadata of the folders among ``paths`` (:data:`FOLDER_META`); a
    file that cannot be read as a JSON object is ignored (the traces still are read)."""
    meta: dict = {}
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
                    f"{p}: folder holds no trace files ({', '.join(_CANDIDATE_SUFFIXES)})")
            out.extend((f, False) for f in found)
        else:
            out.append((p, True))
    return out


def split_memory(listed: list[tuple[Path, bool]]) -> tuple[list[tuple[Path, bool]], list[Path]]:
    """(trace files, opprof's sampled memory files) of an :func:`expand` listing."""
    memory = [f for f, _ in listed if sampled.is_memory_file(f)]
    return [(f, n) for f, n in listed if not sampled.is_memory_file(f)], memory


def normalize(paths: list[Path], meta: dict | None = None, *,
              skip_damaged: bool = False) -> Trace:
    """Read native trace files (all of one format, e.g. one per rank) into one Trace.

    A file the user named must be a trace; a JSON file found inside a folder that no format
    claims (a collector's sidecar, e.g. ``rank0.key_averages.json``) is skipped. A damaged
    file found inside a folder — empty, truncated (a process killed while writing it), not
    readable by its format — is skipped too when the folder holds other traces, and listed
    in ``meta["damaged_files"]`` (path and problem), so a run cut short is read for what is
    complete; ``skip_damaged`` treats named files the same way (a partial recording).
    opprof's sampled memory files (``*.memory.csv``) among them become the memory rows of
    their ranks (:mod:`.sampled`)."""
    listed, memory = split_memory(expand([Path(p) for p in paths]))
    if not listed:
        raise OpprofError(f"{paths[0]}: only sampled memory files, no trace to attach them to")
    meta = {**folder_meta([Path(p) for p in paths]), **(meta or {})}
    return sampled.attach(_normalize(paths, listed, meta, skip_damaged), memory)


def _normalize(paths: list[Path], listed: list[tuple[Path, bool]], meta: dict | None,
               skip_damaged: bool) -> Trace:
    damaged: list[dict[str, str]] = []

    def tolerate(f: Path, named: bool, exc: OpprofError) -> None:
        """Note ``f`` as damaged, or raise ``exc`` when it must be read."""
        if named and not skip_damaged:
            raise exc
        text = str(exc)
        damaged.append({"path": str(f), "problem": text.removeprefix(f"{f}: ")})

    heads: dict[Path, bytes] = {}
    for f, named in listed:
        try:
            heads[f] = head_bytes(f)
        except OpprofError as exc:
            tolerate(f, named, exc)
    listed = [(f, n) for f, n in listed if f in heads]
    if not listed:
        raise OpprofError(f"{damaged[0]['path']}: {damaged[0]['problem']}")
    files = [f for f, _ in listed]
    for fmt in FILE_FORMATS:
        if all(fmt.claims_file(f, heads[f]) for f in files):
            trace = _from_files(fmt, listed, meta or {}, tolerate)
            return _noted(trace, [], damaged)
    docs = []
    parts: list[tuple[Trace, dict]] = []
    ranks: list[int] = []
    fmt_of: dict[Path, Any] = {}
    skipped: list[str] = []
    for f, named in listed:
        head = heads[f]
        if head.startswith(_PARQUET_MAGIC):
            raise OpprofError(
                f"{f}: an opprof trace or Parquet file cannot be mixed with native traces")
        claimed = next((m for m in FILE_FORMATS if m.claims_file(f, head)), None)
        if claimed is not None:
            raise OpprofError(f"{f}: a {claimed.NAME} file cannot be mixed with other formats")
        try:
            fmt, doc = read_doc(f, head)
        except OpprofError as exc:
            tolerate(f, named, exc)
            continue
        if fmt is None:
            if not named:
                skipped.append(str(f))
                continue
            raise OpprofError(f"{f}: JSON but not a known trace format ({doc})")
        if fmt is kineto:  # normalized at once, so only one decoded document is held
            rank = kineto.assign_ranks([*ranks, kineto.declared_rank(doc, len(ranks))])[-1]
            try:
                part = kineto.rank_trace(f, doc, rank, meta or {})
            except OpprofError as exc:
                tolerate(f, named, exc)
                continue
            fmt_of[f] = fmt
            ranks.append(rank)
            parts.append(part)
            del doc
        else:
            fmt_of[f] = fmt
            docs.append((f, doc))
    if not fmt_of:
        if damaged:
            raise OpprofError(f"{damaged[0]['path']}: {damaged[0]['problem']}"
                              + (f" (and {len(damaged) - 1} more damaged file(s))"
                                 if len(damaged) > 1 else ""))
        raise OpprofError(f"{paths[0]}: no known trace format among {len(skipped)} JSON file(s)")
    kinds = {m.NAME for m in fmt_of.values()}
    if len(kinds) > 1:
        by_kind: dict[str, list[str]] = {}
        for f, m in fmt_of.items():
            by_kind.setdefault(m.NAME, []).append(f.name)
        raise OpprofError("mixed native formats in one import: " + "; ".join(
            f"{k}: {', '.join(names[:4])}" + (f" and {len(names) - 4} more" if len(names) > 4
                                              else "")
            for k, names in sorted(by_kind.items())) + " — import each format on its own")
    fmt = next(iter(fmt_of.values()))
    if fmt is kineto:
        trace = concat_traces([t for t, _ in parts],
                              kineto.merge_meta([i for _, i in parts], meta or {}))
    else:
        trace = fmt.from_docs(docs, meta or {})
    return _noted(trace, skipped, damaged)


def _from_files(fmt: Any, listed: list[tuple[Path, bool]], meta: dict, tolerate: Any) -> Trace:
    """``fmt.from_files`` on the files; one that its reader refuses (the error names it) is
    left out when ``tolerate`` allows, and the rest read again."""
    files = [f for f, _ in listed]
    named = dict(listed)
    while True:
        try:
            return fmt.from_files(files, meta)
        except OpprofError as exc:
            bad = next((f for f in files if str(exc).startswith(f"{f}: ")), None)
            if bad is None or len(files) == 1:
                raise
            tolerate(bad, named[bad], exc)
            files = [f for f in files if f != bad]


def _noted(trace: Trace, skipped: list[str], damaged: list[dict[str, str]]) -> Trace:
    if skipped:
        trace.meta["skipped_files"] = skipped
    if damaged:
        trace.meta["damaged_files"] = damaged
    return trace
