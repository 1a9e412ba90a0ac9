"""Native trace formats: detect what a file or folder is and read it into an opprof Trace.

Each format module offers ``NAME`` and either ``claims_json(doc) -> bool`` with
``from_docs([(path, doc), ...], meta) -> Trace`` (JSON formats), or ``claims_file(path,
head) -> bool`` with ``from_files([path, ...], meta) -> Trace`` (binary formats).

JSON is decoded typed (``chrome.py``): a file is decoded once as a Kineto
:class:`~opprof.normalizers.kineto.Document` (only the fields Kineto needs), which also
answers MXNet's ``claims_json``; an MXNet dump is then decoded with MXNet's own type. Kineto
files are normalized one at a time (``kineto.rank_trace``), so a job's decoded documents are
never all in memory; ``opprof.job`` does the same in worker processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from opprof.errors import OpprofError
from opprof.normalizers import chrome, kineto, mxnet, nsys, nvprof, sampled, xplane
from opprof.trace import Trace, concat_traces

JSON_FORMATS: list[Any] = [kineto, mxnet]
FILE_FORMATS: list[Any] = [nsys, nvprof, xplane]

_PARQUET_MAGIC = b"PAR1"
_CANDIDATE_SUFFIXES = (".json", ".json.gz", ".xplane.pb", ".sqlite", ".nvvp", ".nsys-rep",
                       sampled.SUFFIX)


def head_bytes(path: Path, n: int = 64) -> bytes:
    """The first n bytes of a file, with clear errors for missing or empty files."""
    if not path.exists():
        raise OpprofError(f"{path}: no such file or folder")
    if path.is_dir():
        raise OpprofError(f"{path}: is a folder")
    with open(path, "rb") as f:
        head = f.read(n)
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
    data = chrome.read_bytes(path, head)
    doc = kineto.decode(data, path)
    if doc is None:
        return None, chrome.describe(data)
    for fmt in JSON_FORMATS:
        if fmt.claims_json(doc):
            return fmt, (doc if fmt is kineto else fmt.decode(data, path))
    return None, f"chrome-trace events of no known profiler ({len(doc.traceEvents)} events)"


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


def normalize(paths: list[Path], meta: dict | None = None) -> Trace:
    """Read native trace files (all of one format, e.g. one per rank) into one Trace.

    A file the user named must be a trace; a JSON file found inside a folder that no format
    claims (a collector's sidecar, e.g. ``rank0.key_averages.json``) is skipped. opprof's
    sampled memory files (``*.memory.csv``) among them become the memory rows of their
    ranks (:mod:`.sampled`)."""
    listed, memory = split_memory(expand([Path(p) for p in paths]))
    if not listed:
        raise OpprofError(f"{paths[0]}: only sampled memory files, no trace to attach them to")
    return sampled.attach(_normalize(listed, meta), memory)


def _normalize(listed: list[tuple[Path, bool]], meta: dict | None) -> Trace:
    paths = [f for f, _ in listed]
    files = [f for f, _ in listed]
    for fmt in FILE_FORMATS:
        if all(fmt.claims_file(f, head_bytes(f)) for f in files):
            return fmt.from_files(files, meta or {})
    docs = []
    parts: list[tuple[Trace, dict]] = []
    ranks: list[int] = []
    fmt_of: dict[Path, Any] = {}
    skipped: list[str] = []
    for f, named in listed:
        head = head_bytes(f)
        if head.startswith(_PARQUET_MAGIC):
            raise OpprofError(
                f"{f}: an opprof trace or Parquet file cannot be mixed with native traces")
        claimed = next((m for m in FILE_FORMATS if m.claims_file(f, head)), None)
        if claimed is not None:
            raise OpprofError(f"{f}: a {claimed.NAME} file cannot be mixed with other formats")
        fmt, doc = read_doc(f, head)
        if fmt is None:
            if not named:
                skipped.append(str(f))
                continue
            raise OpprofError(f"{f}: JSON but not a known trace format ({doc})")
        fmt_of[f] = fmt
        if fmt is kineto:  # normalized at once, so only one decoded document is held
            rank = kineto.assign_ranks([*ranks, kineto.declared_rank(doc, len(ranks))])[-1]
            ranks.append(rank)
            parts.append(kineto.rank_trace(f, doc, rank, meta or {}))
            del doc
        else:
            docs.append((f, doc))
    if not fmt_of:
        raise OpprofError(f"{paths[0]}: no known trace format among {len(skipped)} JSON file(s)")
    kinds = {m.NAME for m in fmt_of.values()}
    if len(kinds) > 1:
        raise OpprofError(f"mixed native formats in one import: {', '.join(sorted(kinds))}")
    fmt = next(iter(fmt_of.values()))
    if fmt is kineto:
        trace = concat_traces([t for t, _ in parts],
                              kineto.merge_meta([i for _, i in parts], meta or {}))
    else:
        trace = fmt.from_docs(docs, meta or {})
    if skipped:
        trace.meta["skipped_files"] = skipped
    return trace
