"""torch.profiler (Kineto) chrome-trace JSON → the common events table.

Reads every complete (``ph == "X"``) event: CPU operators, user annotations (step and
phase markers, ``nccl:*``/``gloo:*`` collectives), CUDA/HIP runtime calls, GPU kernels,
memcpy and memset. Timestamps are microseconds, relative to ``baseTimeNanoseconds`` when
the file has it, else absolute; they become int64 nanoseconds since the epoch. The rank is
``distributedInfo.rank``. Device events are tied to the runtime call that launched them by
``args.correlation`` and so to the operator around that call.

A trace of a user's own job (no ``opprof.*`` or ``## phase ##`` markers) gets its phases from
the operators torch records anyway — autograd's ``…Backward0`` functions backward,
``Optimizer.step#…``/``Optimizer.zero_grad#…`` update, ``enumerate(DataLoader)#…`` load,
``gloo:``/``nccl:`` collectives comm — and its steps from ``ProfilerStep#N`` when
``prof.step()`` was called, else from ``Optimizer.step`` (``opprof.normalizers.events``).
An ``Optimizer.step`` that ran its closure (Lightning's ``fit``) is first cut around the
closure's calls, so that their forward and backward are not the optimizer's
(``opprof.normalizers.closures``).
"""

from __future__ import annotations

import codecs
import functools
import math
import re
from collections.abc import Iterator
from itertools import compress, repeat
from operator import attrgetter, eq, is_, is_not
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec
import numpy as np

from opprof import drops, gunzip
from opprof.errors import ErrorKind, OpprofError
from opprof.gunzip import GZIP_MAGIC
from opprof.kinds import ASYNC_TID, BACKEND_SPAN
from opprof.normalizers import chrome
from opprof.preread import NOT_STREAMED
from opprof.sharding import refine_mode, sharded_mode

if TYPE_CHECKING:
    import pandas as pd

    from opprof.preread import Ahead
    from opprof.trace import Trace

# The reading half of this module (decoding, streaming, taking columns) needs msgspec and
# numpy only: pandas and the table-building modules are imported by the functions that
# build tables, so that opprof.readahead reads a trace in a process that never imports them.

NAME = "kineto"
_KIND_OF_CAT = {
    "cpu_op": "cpu_op", "operator": "cpu_op",
    "user_annotation": "marker", "gpu_user_annotation": "marker",
    "python_function": "marker", "trace": "marker",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "cuda_sync": "runtime",
    "overhead": "runtime",
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
}
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
#: The categories of GPU activities a host call launched (Kineto gives each its correlation id).
_LAUNCHED_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_KINETO_CATS = {"cpu_op", "kernel", "cuda_runtime", "user_annotation", "python_function",
                "gpu_memcpy", "cuda_driver"}
_DTYPE_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long int": 8,
                "int": 4, "Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8,
                "Int": 4, "signed char": 1, "unsigned char": 1, "bool": 1, "long": 8}


_COMM_NAME = re.compile(
    r"(?:nccl|gloo|mpi|ucc|xccl):|record_param_comms|c10d::|(?:void )?nccl(?:Dev)?Kernel"
    r"|_?c10d_functional(?:_autograd)?::(?!wait)")


class Args(msgspec.Struct, gc=False):
    """The ``args`` fields opprof reads (every other one is skipped unread)."""

    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    device: Any = None
    bytes: Any = None
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    group_size: Any = msgspec.field(default=None, name="Group size")
    group_name: Any = msgspec.field(default=None, name="Process Group Name")
    group_desc: Any = msgspec.field(default=None, name="Process Group Description")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")
    in_split: Any = msgspec.field(default=None, name="In split size")
    out_split: Any = msgspec.field(default=None, name="Out split size")
    name: Any = None  # process_name / thread_name metadata (format detection)
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct, gc=False):
    """One chrome-trace event, as far as opprof reads it."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Args | None = None


class Document(msgspec.Struct, gc=False):
    """A chrome-trace document: Kineto's top-level fields, and its events still undecoded
    (``msgspec.Raw``: each a view of its span of the text, checked to be well-formed JSON),
    typed a chunk at a time by :func:`typed_events` so that only one chunk's structs are alive."""

    traceEvents: list[msgspec.Raw]
    schemaVersion: Any = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    opprofClock: Any = None
    #: bytes of the text that were not UTF-8 (set after decoding, chrome.Repaired)
    invalid_utf8: int = msgspec.field(default=0, name="\u00a7opprof invalid utf-8\u00a7")
    #: the events already taken as columns while the text streamed in (:func:`stream`):
    #: ``(detail, column pieces, allocator samples)``; None when ``traceEvents`` holds them
    streamed: Any = msgspec.field(default=None, name="\u00a7opprof streamed\u00a7")


_DECODER = msgspec.json.Decoder(Document)
_EVENTS = msgspec.json.Decoder(list[Event])
_NO_ARGS = Args()
#: Events typed at a time: their structs (~700 bytes each) are dropped once their columns
#: are taken, so a large file never has all its events as Python objects at once.
CHUNK = 4096
HEAD = 2000


def decode(data: bytes | bytearray, path: Path) -> Document | None:
    """Decode chrome-trace JSON into a :class:`Document` (None: JSON, but no ``traceEvents``
    object at the top); malformed input is one OpprofError line. The events are checked
    to be well-formed JSON; the first :data:`HEAD` (those the formats' ``claims_json`` read)
    are typed here too, so that an error in them names the file."""
    try:
        with chrome.no_gc():
            doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        top = " - at `$" not in msg  # the document itself is not an object
        if "missing required field `traceEvents`" in msg or (
                top and msg.startswith("Expected `object`")):
            chrome.decode(data, path, _ANY_JSON, "JSON document")  # malformed? say so
            return None
        raise OpprofError(f"not a valid chrome trace ({msg})",
                          path=path, kind=ErrorKind.DAMAGED) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        chrome.decode(data, path, _DECODER, "chrome trace")  # raises the clear error
        raise
    doc.invalid_utf8 = getattr(data, "invalid_utf8", 0)
    typed_events(doc, 0, HEAD, path)
    return doc


_ANY_JSON = msgspec.json.Decoder()
_AT = re.compile(r"`\$\[(\d+)\]")


def typed_events(doc: Document, start: int = 0, stop: int | None = None,
                 path: Path | str = "") -> list[Event]:
    """The document's events ``start:stop`` as typed structs (one decode of that chunk's
    text); an event of the wrong shape is one OpprofError line naming the file and the
    event's index."""
    raws = doc.traceEvents[start:stop]
    try:
        with chrome.no_gc():
            return _EVENTS.decode(b"[" + b",".join(raws) + b"]")
    except msgspec.ValidationError as exc:
        msg = _AT.sub(lambda m: f"`$.traceEvents[{start + int(m[1])}]", str(exc))
        raise OpprofError(f"not a valid chrome trace ({msg})",
                          path=path, kind=ErrorKind.DAMAGED) from None
    except msgspec.DecodeError as exc:
        raise OpprofError(f"malformed JSON ({exc})", path=path, kind=ErrorKind.DAMAGED) from None
    except RecursionError:
        raise OpprofError("JSON nested too deeply to be a trace",
                          path=path, kind=ErrorKind.DAMAGED) from None
    except UnicodeDecodeError as exc:
        raise OpprofError(f"JSON with text that is not UTF-8 ({exc.reason})",
                          path=path, kind=ErrorKind.DAMAGED) from None


def event_chunks(doc: Document, path: Path | str = "",
                 size: int | None = None) -> Iterator[list[Event]]:
    """All of the document's events as typed structs, ``size`` (:data:`CHUNK`) at a time."""
    size = size or CHUNK
    for start in range(0, len(doc.traceEvents), size):
        yield typed_events(doc, start, start + size, path)


#: Where the event array begins: the streaming reader's header ends there.
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
#: The most text read before the event array for a file to be streamed (Kineto writes a
#: few KiB of device properties there); past it, the file is read whole.
_HEADER_LIMIT = 4 << 20
_WHITESPACE = b" \t\n\r"
_UTF8_BOM = b"\xef\xbb\xbf"
_BOUNDARY_TRIES = 4  # earlier event boundaries tried when a cut is not one (nested objects)


class _NotStreamed(Exception):
    """The file is not one the streaming reader takes: read it whole."""


def stream(path: Path, head: bytes, detail: bool = True,
           ahead: Ahead | None = None) -> Document | None:
    """A Kineto document read as its text streams in, without ever holding the text whole
    (:func:`gunzip.pieces`: gzip inflated on a second thread, a bounded stretch ahead): the
    events are typed :data:`CHUNK` at a time, in the same chunks as the whole-text reader,
    and their columns taken (:func:`_take_chunk`) as the pieces arrive; the top-level fields
    are decoded from the text around the event array. The result is the
    :func:`decode` + :func:`_raw_events` of the whole text, exactly, with the columns
    already taken (``Document.streamed``).

    None — read the file whole (:func:`chrome.read_bytes`, :func:`decode`), which says what
    is wrong with a damaged file — for anything this reader does not take as it is: a file
    that does not state Kineto's ``schemaVersion``, ``distributedInfo`` or
    ``deviceProperties`` before its events, text that is not UTF-8, JSON it cannot cut into
    events, any error. ``ahead``: what the command started reading before (the document a
    second process read, or the text inflating: :class:`opprof.preread.Ahead`)."""
    if not (head.startswith(GZIP_MAGIC) or head.lstrip(b" \t\n\r\xef\xbb\xbf")[:1] == b"{"):
        return None
    if ahead is not None:
        doc = ahead.document(path, detail)  # read by `opprof report`'s second process
        if doc is not None:
            return None if doc is NOT_STREAMED else cast(Document, doc)
    source = gunzip.pieces(path, ahead.text(path) if ahead is not None else None)
    if source is None:
        return None
    try:
        return _stream(iter(source), path, detail)
    except (_NotStreamed, OpprofError, msgspec.DecodeError, msgspec.ValidationError,
            UnicodeDecodeError, RecursionError, ValueError):
        return None
    finally:
        source.close()


def _utf8(text: bytes) -> None:
    """UnicodeDecodeError when ``text`` is not UTF-8 (the whole-text reader repairs it)."""
    if not text.isascii():
        codecs.utf_8_decode(text, "strict", True)


def _stream(pieces: Iterator[bytes], path: Path, detail: bool) -> Document:
    buf = bytearray()
    for piece in pieces:  # the header: the text before the event array
        buf += piece
        found = _EVENTS_KEY.search(buf)
        if found:
            break
        if len(buf) > _HEADER_LIMIT:
            raise _NotStreamed
    else:
        raise _NotStreamed
    header = bytes(buf[:found.end() - 1])  # up to the array's "["
    if header.startswith(_UTF8_BOM):
        header = header[len(_UTF8_BOM):]
    _utf8(header)
    with chrome.no_gc():
        top = _DECODER.decode(header + b"[]}")
    # no Kineto field before the events (a trace written again by another tool puts them
    # after): streamed only if its first events are Kineto's (their categories), and kept
    # only if the fields come after them (below)
    unsure = top.schemaVersion is None and top.distributedInfo is None and \
        top.deviceProperties is None
    del buf[:found.end() - 1]  # the text now starts with the array's "["
    ascii_only = buf.isascii()  # else each span is checked to be UTF-8
    cols: list[dict[str, Any]] = []
    mem: list[Event] = []
    pending: list[Event] = []  # typed, not yet taken: chunks as the whole-text reader's

    def take(events: list[Event], final: bool = False) -> None:
        nonlocal pending, unsure
        pending += events
        if unsure:  # decided on the first chunk's events (metadata events come first)
            if len(pending) < CHUNK and not final:
                return
            if not any(type(e.cat) is str and e.cat.lower() in _KINETO_CATS
                       for e in pending[:CHUNK]):
                raise _NotStreamed  # maybe no Kineto trace: the whole-text reader decides
            unsure = False
        done = 0
        while len(pending) - done >= CHUNK or (final and done < len(pending)):
            _take_chunk(pending[done:done + CHUNK], cols, mem, detail)
            done += CHUNK
        pending = pending[done:]

    for piece in pieces:
        buf += piece
        ascii_only = ascii_only and piece.isascii()
        end = len(buf)
        for _ in range(_BOUNDARY_TRIES):
            cut = _last_boundary(buf, end)
            if cut is None:
                break
            end, nxt = cut
            events = _typed_span(buf, end, not ascii_only)
            if events is not None:
                take(events)
                del buf[:nxt - 1]  # keep one byte before the next event: it becomes "["
                buf[0] = 0x5B
                break
            end -= 1  # not between two events (nested objects): look before that "}"
        else:
            raise _NotStreamed  # no cut between events found: read whole
    events, footer = _tail(buf, header, not ascii_only)
    take(events, final=True)
    _utf8(footer)
    with chrome.no_gc():
        doc = _DECODER.decode(header + b"[]" + footer)
    if doc.traceEvents or b'"traceEvents"' in footer or (
            doc.schemaVersion is None and doc.distributedInfo is None
            and doc.deviceProperties is None):
        raise _NotStreamed  # another event array, or no Kineto marks after all
    doc.streamed = (detail, cols, mem)
    return doc


def _last_boundary(buf: bytearray, end: int) -> tuple[int, int] | None:
    """The last place before ``end`` where one event ends and the next begins: (the index
    just past the ``}``, the index of the next ``{``), with only whitespace and one comma
    between; None when there is none. (A cut between nested objects is found too; the
    decoder rejects it, see :func:`_stream`.)"""
    n = len(buf)
    j = end
    while True:
        j = buf.rfind(b"}", 0, j)
        if j <= 0:
            return None
        k = j + 1
        while k < n and buf[k] in _WHITESPACE:
            k += 1
        if k < n and buf[k] == 0x2C:  # ","
            k += 1
            while k < n and buf[k] in _WHITESPACE:
                k += 1
            if k < n and buf[k] == 0x7B:  # "{"
                return j + 1, k


def _typed_span(buf: bytearray, end: int, check_utf8: bool) -> list[Event] | None:
    """The events of ``buf[:end]`` (which starts with ``[``) typed, or None when that text
    is not a list of events (the cut was not between two events). ``check_utf8``: the text
    is not all ASCII (UnicodeDecodeError where it is not UTF-8)."""
    if check_utf8:
        with memoryview(buf) as view, view[:end] as span:
            codecs.utf_8_decode(span, "strict", True)
    keep = buf[end]
    buf[end] = 0x5D  # "]": the span is a JSON array in place, no copy of the text
    try:
        with memoryview(buf) as view, view[:end + 1] as span, chrome.no_gc():
            return _EVENTS.decode(span)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    finally:
        buf[end] = keep


def _tail(buf: bytearray, header: bytes, check_utf8: bool) -> tuple[list[Event], bytes]:
    """The last events and the text after the event array (the footer), from the rest of
    the text (which starts with ``[``): the array's ``]`` is the one after which the text
    reads as the end of the document and before which as a list of events."""
    j = len(buf)
    for _ in range(64):
        j = buf.rfind(b"]", 0, j)
        if j <= 0:
            break
        footer = bytes(buf[j + 1:])
        try:
            with chrome.no_gc():
                _DECODER.decode(header + b"[]" + footer)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            continue
        try:
            with memoryview(buf) as view, view[:j + 1] as span, chrome.no_gc():
                if check_utf8:
                    codecs.utf_8_decode(span, "strict", True)
                return _EVENTS.decode(span), footer
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    raise _NotStreamed


def _field(obj: Any, key: str) -> Any:
    """A field of a decoded document or event, typed struct or plain dict alike."""
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def claims_json(doc: Any) -> bool:
    """A Kineto trace: a dict of traceEvents with Kineto's schema or categories."""
    events = _field(doc, "traceEvents") if isinstance(doc, (dict, Document)) else None
    if not isinstance(events, list):
        return False
    if isinstance(doc, Document):
        if (doc.schemaVersion is not None or doc.distributedInfo is not None
                or doc.deviceProperties is not None):
            return True
    elif "schemaVersion" in doc or "distributedInfo" in doc or "deviceProperties" in doc:
        return True
    head = typed_events(doc, 0, 500) if isinstance(doc, Document) else events[:500]
    return any(isinstance(e, (dict, Event)) and _field(e, "cat") in _KINETO_CATS
               for e in head)


def from_docs(docs: list[tuple[Path, Document]], meta: dict) -> Trace:
    """Normalize one Kineto document per rank into one Trace."""
    from opprof.trace import concat_traces

    ranks = assign_ranks([declared_rank(doc, i) for i, (_, doc) in enumerate(docs)])
    parts = [rank_trace(path, doc, rank, meta) for (path, doc), rank in
             zip(docs, ranks, strict=True)]
    return concat_traces([t for t, _ in parts], merge_meta([i for _, i in parts], meta))


def declared_rank(doc: Document, index: int) -> int:
    """The rank a document says it is (``distributedInfo.rank``), else its position."""
    if _rank_undeclared(doc):
        return index
    return _int(doc.distributedInfo["rank"], index, 0, _MAX_RANK)


def _rank_undeclared(doc: Document) -> bool:
    """True when the document names no rank (no ``distributedInfo.rank``)."""
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    return "rank" not in info


def _rank_unusable(doc: Document) -> bool:
    """True when the document declares a rank that is no usable rank (text, a fraction,
    negative or past the .trace's int32)."""
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    if "rank" not in info:
        return False
    value = info["rank"]
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())
    return not (ok and 0 <= value <= _MAX_RANK)


def assign_ranks(declared: list[int]) -> list[int]:
    """Final ranks, in file order: the declared rank, or one past the largest so far when
    an earlier file already has it (two traces of one rank stay apart)."""
    out: list[int] = []
    for r in declared:
        out.append(max(out) + 1 if r in out else r)
    return out


def release_freed_memory() -> None:
    """Give the C heap's free memory back to the system (glibc's ``malloc_trim``): the
    chunks of events decoded and dropped while reading leave ~30 MiB of free heap on a
    135k-event file that the finishing pass's arrays (mapped, not from that heap) cannot
    reuse, so returning it lowers the read's peak. A no-op where the C library has none."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (musl, macOS)."""
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def rank_trace(path: Path, doc: Document, rank: int, meta: dict,
               detail: bool = True) -> tuple[Trace, dict]:
    """One document normalized as ``rank`` (a Trace whose metadata is that of a one-file
    import), and the facts about it that :func:`merge_meta` combines across ranks. Without
    ``detail``, only collectives have their ``detail`` text (what a report reads)."""
    import pandas as pd

    # Plain object strings, the whole normalization through: pandas 3's Arrow strings cost
    # more than they save here — every name made, compared or mapped is a conversion to or
    # from Arrow (a third of a report of a trace with thousands of ``python_function`` names),
    # and the finished table keeps its text as categories and the ``detail`` column as its
    # schema says either way. (A categorical column's ``astype(str)`` is a fixed-width numpy
    # array in this scope, as wide as its longest name: ``astype(object)`` on names.) Conformed
    # again outside it: its column labels and text categories in pandas' default string
    # dtype, as a table made outside the scope has them (only the categories are remade).
    from opprof.trace import conform

    with pd.option_context("future.infer_string", False):
        trace, info = _rank_trace(path, doc, rank, meta, detail)
    trace.events = conform(trace.events)
    return trace, info


def _rank_trace(path: Path, doc: Document, rank: int, meta: dict,
                detail: bool) -> tuple[Trace, dict]:
    """:func:`rank_trace`, inside its scope of plain strings."""
    from opprof.normalizers.closures import split_closures
    from opprof.normalizers.events import finish
    from opprof.normalizers.memory_rows import add_memory
    from opprof.taxonomy import KINDS, mapping_table

    base_ns = _int(doc.baseTimeNanoseconds or 0)
    warnings: dict = {}
    if _rank_unusable(doc):
        drops.note(warnings, "rank in distributedInfo unusable (file order used)", 1)
    raw, mem = _raw_events(doc, rank, path, warnings, detail)
    raw["collective"], raw["bytes"] = served_collectives(raw, _one_group_size(doc))
    raw = split_closures(raw, mapping_table(NAME))
    raw["tid"] = async_lanes(raw)
    raw = with_waits(raw)
    memory = _memory_samples(mem, rank, base_ns)
    # Clock alignment (opprof.collectors.torch): rank r's clock + offset = rank 0's.
    clock = doc.opprofClock if isinstance(doc.opprofClock, dict) else {}
    offset = _ns((meta.get("clock_offsets_ns") or {}).get(str(rank),
                                                          clock.get("offset_ns", 0)),
                 "clock offset", path)
    raw["ts"] += offset
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    info = {
        "rank": rank, "source": str(path), "offset": offset,
        "error": _int(clock.get("error_ns", 0)),
        "has_gpu": bool(np.isin(raw["kind"].cat.codes.to_numpy(),  # per category
                                [KINDS.index(k) for k in ("kernel", "memcpy", "memset")]).any()),
        "gpus": [str(d.get("name", "")) for d in props if isinstance(d, dict)],
        "gpu_memory": [int(d["totalGlobalMem"]) for d in props if isinstance(d, dict)
                       and isinstance(d.get("totalGlobalMem"), int) and d["totalGlobalMem"] > 0],
        "distributed": doc.distributedInfo or None,
        "sharded": sharded_mode(raw["name"].cat.categories),
        drops.KEY: warnings.get(drops.KEY, {}),
    }
    release_freed_memory()  # the decoded chunks' heap, before the finishing pass peaks
    trace = finish(raw, mapping_table(NAME), merge_meta([info], meta))
    from opprof.parallelism import tag

    detail_col, info["parallel"] = tag(trace.events, doc.distributedInfo)
    if detail_col is not None:
        trace.events["detail"] = detail_col
    info[drops.KEY] = dict(trace.meta.get(drops.KEY) or {})
    if _rank_undeclared(doc) and (trace.events["kind"] == "comm").any():
        # a job of several ranks whose trace does not say which it is (no
        # distributedInfo.rank: torch before 1.13, or a trace rewritten by another tool)
        drops.note(info, "traces with collectives but no rank in distributedInfo "
                   "(file order used)", 1)
        trace.meta[drops.KEY] = info[drops.KEY]
    if memory is not None:
        memory["ts"] += offset
        trace = add_memory(trace, memory)
        info["memory_sources"] = trace.meta["memory_sources"]
    info["step_bounds"] = trace.meta["step_bounds"]
    info["inferred_phases"] = trace.meta.get("inferred_phases", [])
    return trace, info


def merge_meta(infos: list[dict], meta: dict) -> dict:
    """The metadata of a job from its ranks' facts (``rank_trace``), in file order."""
    info: dict[str, Any] = {
        "source_formats": [NAME],
        "sources": [i["source"] for i in infos],
        "framework": meta.get("framework", "torch"),
        "workers": len(infos),
        "device": "cuda" if any(i["has_gpu"] for i in infos) else "cpu",
        "gpus": sorted({g for i in infos for g in i["gpus"]}),
        "clock_error_ns": {str(i["rank"]): i["error"] for i in infos},
    }
    memory = [m for i in infos for m in i.get("gpu_memory", [])]
    if memory:  # the smallest device's total memory (`opprof advise`'s memory headroom)
        info["gpu_memory_bytes"] = min(memory)
    dist = {str(i["rank"]): i["distributed"] for i in infos if i["distributed"]}
    if dist:
        info["distributed"] = dist
    info.update(meta)
    refine_mode(info, next((i["sharded"] for i in infos if i.get("sharded")), None))
    if any("parallel" in i for i in infos):
        from opprof.parallelism import layout

        mode, parallelism = layout([i.get("parallel") or {} for i in infos], len(infos),
                                   info.get("mode"))
        if parallelism:
            info["parallelism"] = parallelism
        if mode is not None:
            info["mode"] = mode
    info["clock_offsets_ns"] = {str(i["rank"]): i["offset"] for i in infos}  # as applied
    if all("step_bounds" in i for i in infos):
        bounds = sorted((b for i in infos for b in i["step_bounds"]),
                        key=lambda b: (b[0], b[2]))
        info["step_bounds"] = bounds
    warned = drops.merged(i.get(drops.KEY) for i in infos)
    if warned:
        info[drops.KEY] = warned
    inferred = sorted({r for i in infos for r in i.get("inferred_phases", [])})
    if inferred:
        info["inferred_phases"] = inferred
    sources = sorted({s for i in infos for s in i.get("memory_sources", [])})
    if sources:
        info["memory_sources"] = sources
    skipped = next((i["memory_skipped"] for i in infos if i.get("memory_skipped")), None)
    if skipped:
        info["memory_skipped"] = skipped
    return info


#: The largest time in ns (or offset) a trace may hold: int64 with room for sums.
_MAX_NS = 2**62
_MAX_RANK = 2**31 - 1  # the .trace rank column is int32


def _int(value: Any, default: int = 0, low: int = -_MAX_NS, high: int = _MAX_NS) -> int:
    """An integer field of a hostile file: ``default`` when it is not one, or out of
    ``[low, high]``."""
    try:
        out = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return out if low <= out <= high else default


def _ns(value: Any, what: str, path: Path) -> int:
    """A time or offset in ns: 0 when absent or not a number; one clear error when it is a
    number beyond the range of int64 nanoseconds (±146 years)."""
    try:
        out = int(value or 0)
    except (TypeError, ValueError):
        return 0
    except OverflowError:  # infinity
        out = _MAX_NS
    if abs(out) >= _MAX_NS:
        raise OpprofError(f"{what} out of range ({value!r})", path=path, kind=ErrorKind.DAMAGED)
    return out


#: c10::DeviceType codes of the devices whose allocators the profiler reports (ROCm builds
#: report their GPUs as CUDA).
_CPU_DEVICE, _GPU_DEVICES = 0, {1: "cuda", 6: "cuda"}


def _memory_samples(mem: list[Event], rank: int, base_ns: int) -> pd.DataFrame | None:
    """The allocator's ``[memory]`` instant events (``profile_memory=True``, as
    :func:`_raw_events` keeps them) as samples:
    ``Total Allocated`` per device as the ``allocated`` series and, on GPUs, ``Total
    Reserved`` as ``reserved`` (the CPU allocator keeps no pool: Kineto writes 0 there).
    On the CPU, torch counts only what was allocated while the profiler ran: tensors
    allocated before it started (the parameters, the optimizer's state) are not in it."""
    import pandas as pd

    from opprof.normalizers.memory_rows import samples

    if not mem:
        return None
    ts_v, pid_v, args_v = chrome.columns(mem, ("ts", "pid", "args"))
    alloc, reserved, dtype, dev_id = (chrome.numbers(c) for c in chrome.columns(
        args_v, ("total_allocated", "total_reserved", "device_type", "device_id")))
    ts = chrome.numbers(ts_v)
    ok = ~np.isnan(ts) & ~np.isnan(alloc) & np.isfinite(ts) & (np.abs(ts) < 2**62 / 1000)
    if not ok.any():
        return None
    dtype = np.where(np.isnan(dtype), _CPU_DEVICE, dtype).astype(np.int64)
    dev_id = np.where(np.isnan(dev_id), 0, dev_id).astype(np.int64)
    names = np.array([_GPU_DEVICES.get(int(t), f"device{int(t)}") for t in dtype], object)
    device = np.where(dtype == _CPU_DEVICE, "cpu",
                      names + ":" + np.maximum(dev_id, 0).astype(str).astype(object))
    pid = chrome.numbers(pid_v)
    pid = np.where(np.isnan(pid), -1, pid).astype(np.int64)
    t_ns = base_ns + np.rint(np.where(ok, ts, 0) * 1000).astype(np.int64)
    frames = [samples(rank, "worker", pid[ok], device[ok], t_ns[ok], "allocated",
                      alloc[ok].astype(np.int64), NAME)]
    gpu = ok & (dtype != _CPU_DEVICE) & ~np.isnan(reserved)
    if gpu.any():
        frames.append(samples(rank, "worker", pid[gpu], device[gpu], t_ns[gpu], "reserved",
                              reserved[gpu].astype(np.int64), NAME))
    return pd.concat(frames, ignore_index=True)


def _with_ph(events: list[Event], ph: str) -> list[Event]:
    """The events whose ``ph`` equals ``ph`` (``==``), selected in C (no Python frame per
    event)."""
    return list(compress(events, map(eq, map(_PH, events), repeat(ph))))


_PH = attrgetter("ph")
_COST_ARGS = attrgetter("input_dims", "input_type", "concrete")


def _ENCODE(value: Any) -> bytes:  # noqa: N802 - msgspec's encoder, named as a constant
    """An event's shape args as one hashable key (JSON text); b"" when they cannot be."""
    try:
        return _JSON_ENCODE(value)
    except (TypeError, msgspec.EncodeError, OverflowError):
        return b""


_JSON_ENCODE = msgspec.json.encode
_CORRELATION, _INPUT_DIMS = attrgetter("correlation"), attrgetter("input_dims")
_EXTERNAL = attrgetter("external_id")


def _usable_times(ts_us: np.ndarray, dur_us: np.ndarray, pid: np.ndarray,
                  tid_frac: np.ndarray, warnings: dict, is_step: np.ndarray) -> np.ndarray:
    """Which events have a usable start, duration and ids: numbers, finite, in the range of
    int64 nanoseconds, ids integral (a string pid such as Kineto's ``Spans`` is no number
    and stays). The rest are counted in ``warnings`` (:mod:`opprof.drops`), the step
    markers among them (``is_step``) on their own."""
    limit = 2**62 / 1000
    with np.errstate(invalid="ignore"):
        bad_ts = ~(np.abs(ts_us) < limit)  # NaN (missing, text) and infinities too
        bad_dur = ~bad_ts & ~(np.abs(dur_us) < limit)
        frac = ((np.isfinite(pid) & (pid != np.floor(pid)))
                | tid_frac) & ~bad_ts & ~bad_dur
    bad = bad_ts | bad_dur | frac
    drops.note(warnings, "step markers unusable (time, duration or id not a usable number)",
               int((bad & is_step).sum()))
    drops.skip(warnings, bad_ts & ~is_step, "timestamp missing, not a number or out of range")
    drops.skip(warnings, bad_dur & ~is_step, "duration missing, not a number or out of range")
    drops.skip(warnings, frac & ~is_step, "process or thread id not an integer")
    return ~bad


def _copies(usable: np.ndarray, name: np.ndarray, cat: np.ndarray, pid: np.ndarray,
            tid: np.ndarray, ts: np.ndarray, dur: np.ndarray, corr: np.ndarray,
            ext: np.ndarray) -> np.ndarray:
    """The usable events that are exact copies of an earlier one: the same name, category,
    ids, times and correlation or external id (a call's own: two calls never share one;
    events with neither are never taken for copies — two calls of one operator can
    share their microsecond)."""
    idd = usable & ((corr >= 0) | (ext >= 0))
    rows = np.flatnonzero(idd)
    out = np.zeros(len(usable), bool)
    if len(rows) < 2:
        return out
    keys = [a[rows] for a in (ext, corr, dur, ts, tid, pid, cat, name)]
    order = np.lexsort(keys)
    same = np.ones(len(rows) - 1, bool)
    for k in keys:
        ko = k[order]
        same &= ko[1:] == ko[:-1]
    out[rows[order[1:][same]]] = True
    return out


def _identified(ts_us: np.ndarray, pid: np.ndarray, tid_nan: np.ndarray,
                name_bad: np.ndarray, cat: pd.Categorical, names: pd.Categorical,
                usable: np.ndarray, warnings: dict, is_step: np.ndarray) -> np.ndarray:
    """Which of the ``usable`` events can be placed and named: a start before the epoch
    (Kineto's times are µs since it: a negative one is damage, and a trace of them would
    nest every event wrongly), no name or one that is no text (nothing to classify it by),
    no process or thread
    id or one that is no number (only Kineto's own ``Trace`` spans have text ids:
    ``Spans``, ``PyTorch Profiler``) are dropped and counted (step markers among them on
    their own)."""
    import pandas as pd

    negative = usable & (ts_us < 0)
    name_cats = np.asarray(names.categories.astype(str))
    no_name = usable & ~negative & (name_bad | np.append(name_cats == "", False)[names.codes])
    trace_cat = np.append(pd.Index(cat.categories.astype(str)).str.lower() == "trace",
                          False)[cat.codes]
    no_pid = usable & ~negative & ~no_name & (np.isnan(pid) | tid_nan) & ~trace_cat
    cat_cats = np.asarray(cat.categories.astype(str))
    no_cat = usable & ~negative & ~no_name & ~no_pid & np.append(cat_cats == "", False)[
        cat.codes]
    drops.note(warnings, "step markers unusable (negative timestamp)",
               int((negative & is_step).sum()))
    drops.skip(warnings, negative & ~is_step, "negative timestamp")
    drops.skip(warnings, no_name, "name missing or not text")
    drops.note(warnings, "step markers unusable (process or thread id missing or not a "
               "number)", int((no_pid & is_step).sum()))
    drops.skip(warnings, no_pid & ~is_step, "process or thread id missing or not a number")
    drops.skip(warnings, no_cat, "category (cat) missing")
    return ~(negative | no_name | no_pid | no_cat)


def _raw_events(doc: Document, rank: int, path: Path, warnings: dict | None = None,
                detail: bool = True) -> tuple[pd.DataFrame, list[Event]]:
    """The complete (``X``) events of one document as raw columns (see events.finish), and
    its allocator's ``[memory]`` instant events. The events are typed a chunk at a time
    (:data:`CHUNK`) and each chunk's columns taken before the next is decoded, so only one
    chunk's structs are ever alive; the document's events (and so the text they are views
    of) are dropped (``doc.traceEvents`` emptied) before the table is built. Events whose
    times or ids cannot be used are dropped and counted in ``warnings``. Without ``detail``
    only collectives get their ``detail`` text (their process group: what a report reads).
    """
    import pandas as pd

    from opprof.normalizers.events import STEP_PATTERN
    from opprof.taxonomy import KINDS, ROLES

    warnings = {} if warnings is None else warnings
    pieces: list[dict[str, Any]] = []
    mem: list[Event] = []
    if doc.streamed is not None:  # taken while the text streamed in
        streamed_detail, pieces, mem = doc.streamed
        doc.streamed = None
        if streamed_detail != detail:
            raise ValueError("the document was streamed with another detail setting")
    else:
        if doc.invalid_utf8:  # the events holding a byte that was not UTF-8 (chrome.Repaired)
            mark = bytes([chrome.INVALID])
            dirty = [mark in bytes(r) for r in doc.traceEvents]
            drops.skip(warnings, np.array(dirty, bool), "JSON text that is not UTF-8")
            in_events = sum(bytes(r).count(mark) for r, d in
                            zip(doc.traceEvents, dirty, strict=True) if d)
            # the rest is in the fields around the events (a device's properties): said too
            drops.note(warnings, "bytes of JSON text not UTF-8 outside the events (the fields "
                       "holding them unread)", doc.invalid_utf8 - in_events)
            doc.traceEvents = [r for r, d in zip(doc.traceEvents, dirty, strict=True) if not d]
        for chunk in event_chunks(doc, path):
            _take_chunk(chunk, pieces, mem, detail)
            del chunk
    doc.traceEvents = []
    if not pieces:
        dropped = warnings.get(drops.KEY)
        raise OpprofError(f"{path}: Kineto trace with no complete events"
                          + (f" ({drops.describe(dropped)})" if dropped else ""))
    drops.note(warnings, "events skipped: phase type (ph) missing",
               sum(p.pop("no_ph", 0) for p in pieces))
    n = sum(p["n"] for p in pieces)
    (ts_us, dur_us, dev_no, nbytes, pid, tid, tid_frac, tid_nan, name_bad, corr, ext,
     comm_bytes, collective) = (_joined([p.pop(k) for p in pieces])
                                for k in ("ts", "dur", "device", "bytes", "pid", "tid",
                                          "tid_frac", "tid_nan", "name_bad", "link", "ext",
                                          "comm", "collective"))
    costs = {k: _joined([p.pop(k) for p in pieces]) for k in COST_COLUMNS}
    collective = _collective_ops(collective)
    cat, names = (_join_strings([p.pop(k) for p in pieces]) for k in ("cat", "name"))
    texts: np.ndarray | None = None
    if any(p["detail"] is not None for p in pieces):
        texts = np.concatenate([p["detail"] if p["detail"] is not None
                                else np.full(p["n"], None, dtype=object)
                                for p in pieces])
    del pieces
    base_ns = _ns(doc.baseTimeNanoseconds, "baseTimeNanoseconds", path)
    if doc.baseTimeNanoseconds is not None and (
            type(doc.baseTimeNanoseconds) not in (int, float)
            or not np.isfinite(doc.baseTimeNanoseconds)):
        drops.note(warnings, "baseTimeNanoseconds not a number (0 used: the times not "
                   "aligned with other ranks')", 1)
    step_cats = pd.Index(names.categories.astype(str)).str.fullmatch(STEP_PATTERN)
    is_step = np.append(np.asarray(step_cats, bool), False)[names.codes]
    keep = _usable_times(ts_us, dur_us, pid, tid_frac, warnings, is_step)
    keep &= _identified(ts_us, pid, tid_nan, name_bad, cat, names, keep, warnings, is_step)
    keep &= drops.skip(warnings, _copies(keep, names.codes, cat.codes, pid, tid, ts_us, dur_us,
                                         corr, ext), "an exact copy of another event")
    if not keep.any():
        raise OpprofError("Kineto trace with no usable events "
                          f"({drops.describe(warnings[drops.KEY])})",
                          path=path, kind=ErrorKind.NO_EVENTS)
    ts_us, dur_us = np.where(keep, ts_us, 0), np.where(keep, dur_us, 0)
    pid = np.where(keep, pid, -1)
    cat_lower = pd.Index(cat.categories.astype(str)).str.lower()
    codes = cat.codes
    on_device = np.isin(cat_lower, list(_DEVICE_CATS))[codes]
    kind_of_cat = pd.Series(cat_lower).map(_KIND_OF_CAT).fillna("cpu_op").to_numpy(object)
    kind = pd.Categorical.from_codes(  # per category, not per event
        np.array([KINDS.index(k) for k in kind_of_cat] + [-1], np.int64)[codes],
        categories=KINDS)
    dev_no = np.where(np.isnan(dev_no), pid, dev_no)
    dev_no = np.where(np.isnan(dev_no), 0, dev_no).astype(np.int64)
    device_code = np.zeros(n, np.int64)  # "cpu"
    uniq = np.zeros(0, np.int64)
    if on_device.any():
        uniq, inv = np.unique(dev_no[on_device], return_inverse=True)
        device_code[on_device] = inv + 1
    device = pd.Categorical.from_codes(
        device_code, categories=["cpu", *(f"cuda:{d}" for d in uniq)])
    nbytes = np.where(np.isnan(comm_bytes), nbytes, comm_bytes).astype(np.int64)
    launched = np.isin(cat_lower, list(_LAUNCHED_CATS))[codes]
    drops.note(warnings, "GPU activities with no correlation id: the call that launched "
               "them unknown", int((launched & (corr < 0) & keep).sum()))
    launching = np.isin(cat_lower, ["cuda_runtime", "cuda_driver"])[codes]
    drops.note(warnings, "CUDA runtime calls with no correlation id: the GPU work they "
               "launched unknown", int((launching & (corr < 0) & keep).sum()))
    frame = pd.DataFrame({
        "rank": rank,
        "role": pd.Categorical.from_codes(np.zeros(n, np.int8), categories=ROLES),
        "pid": np.where(np.isnan(pid), -1, pid).astype(np.int64),
        "tid": tid,
        "device": device,
        "ts": base_ns + np.rint(ts_us * 1000).astype(np.int64),
        "dur": np.rint(dur_us * 1000).astype(np.int64),
        "name": names,
        "kind": kind,
        "bytes": nbytes,
        "detail": texts,
        "link": corr,
        "collective": collective,
        **costs,
    }, copy=False)  # every column is made here: no copy
    return (frame if keep.all() else frame[keep].reset_index(drop=True)), mem


def _take_chunk(chunk: list[Event], pieces: list[dict[str, Any]], mem: list[Event],
                detail: bool) -> None:
    """One chunk of events (:data:`CHUNK`, in file order): its complete events' columns
    appended to ``pieces``, its allocator samples (``[memory]`` instant events) to ``mem``."""
    phs = list(map(_PH, chunk))
    if "i" in phs:  # instant events: the allocator's samples among them
        mem += [e for e in compress(chunk, map(eq, phs, repeat("i")))
                if e.name == "[memory]" and e.args is not None]
    x = list(compress(chunk, map(eq, phs, repeat("X"))))
    # an event with no phase type (``ph``) is no event of any kind: counted, not read
    no_ph = phs.count(None)
    del phs
    if x:
        pieces.append(_chunk_columns(x, detail))
    if no_ph and pieces:
        pieces[-1]["no_ph"] = pieces[-1].get("no_ph", 0) + no_ph


def _chunk_columns(x: list[Event], detail: bool = True) -> dict[str, Any]:
    """The columns of one chunk of complete events: numbers as numpy arrays, names and
    categories as (codes, distinct text) (joined by :func:`_join_strings`), ``Input Dims``
    as text (None where absent; no array when no event has them; without ``detail``, only
    on the collectives that have a process group)."""
    n = len(x)
    cat_v, name_v, pid_v, tid_v, args_v = chrome.columns(
        x, ("cat", "name", "pid", "tid", "args"))
    out: dict[str, Any] = {"n": n, "ts": chrome.number_column(x, "ts", strict=True),
                           "dur": chrome.number_column(x, "dur", strict=True)}
    if None in args_v:  # (a scan in C; Kineto writes args on every complete event)
        args_v = [a if a is not None else _NO_ARGS for a in args_v]
    corr_v = list(map(_CORRELATION, args_v))
    ext_v = list(map(_EXTERNAL, args_v))
    out["device"] = chrome.number_column(args_v, "device")
    out["bytes"] = chrome.number_column(args_v, "bytes", fill=0.0)
    out["name"] = chrome.string_codes(name_v)
    # a name that is no text (missing, a number, a list): nothing to classify the event by
    out["name_bad"] = ~np.fromiter(map(is_, map(type, name_v), repeat(str)), bool, n)
    del name_v
    out["comm"], out["collective"], group = _comm_args(out["name"], args_v)
    if detail:
        dims_v = list(map(_INPUT_DIMS, args_v))
    else:  # the collectives' alone, for their group's text
        dims_v = [None] * n
        if group is not None:
            for i in np.flatnonzero(group != None).tolist():  # noqa: E711 (element-wise)
                dims_v[i] = args_v[i].input_dims
    out.update(_chunk_costs(out["name"], args_v))
    del args_v
    out["cat"] = chrome.string_codes(cat_v)
    out["pid"] = chrome.numbers(pid_v)
    out["tid"] = chrome.integers(tid_v)
    tid_f = chrome.numbers(tid_v)
    out["tid_frac"] = np.isfinite(tid_f) & (tid_f != np.floor(tid_f))
    out["tid_nan"] = np.isnan(tid_f)
    out["link"] = chrome.integers(corr_v)
    out["ext"] = chrome.integers(ext_v)
    has_dims = np.fromiter(map(is_not, dims_v, repeat(None)), bool, n)
    out["detail"] = None
    if has_dims.any() or group is not None:
        texts = np.full(n, None, dtype=object)
        texts[has_dims] = [d if type(d) is str else str(d)
                           for d, h in zip(dims_v, has_dims, strict=True) if h]
        if group is not None:  # a collective's process group, before its dims
            has = np.flatnonzero(group != None)  # noqa: E711 (element-wise)
            texts[has] = [g if d is None else f"{g} dims={d}"
                          for g, d in zip(group[has], texts[has], strict=True)]
        out["detail"] = texts
    return out


#: The raw cost columns (opprof.flops.attribute) taken per chunk.
COST_COLUMNS = ("flops", "model_flops", "mem_bytes", "precision", "cost_kind")


def _chunk_costs(names: tuple[np.ndarray, list[str]], args: list[Args]) -> dict[str, np.ndarray]:
    """Each event's own cost (:func:`opprof.flops.table.kineto_cost`) from its ``Input Dims``,
    ``Input type`` and ``Concrete Inputs``: looked up per distinct name, costed per distinct
    call (cached), only for the events whose name the torch operator table models."""
    from opprof.flops.table import UNMODELED, operator_table, torch_cost

    codes, text = names
    n = len(codes)
    out = {"flops": np.full(n, np.nan), "model_flops": np.full(n, np.nan),
           "mem_bytes": np.full(n, np.nan), "precision": np.full(n, -1, np.int8),
           "cost_kind": np.full(n, UNMODELED, np.int8)}
    table = operator_table("torch")
    modeled = np.fromiter((table.row(t) is not None for t in text), bool, len(text))
    if not len(modeled) or not modeled.any():
        return out
    idx = np.flatnonzero(modeled[codes])
    if not len(idx):
        return out
    # one key per event (its args as JSON, encoded in C), one cost per distinct (name, key)
    picked = [args[i] for i in idx.tolist()]
    names_of = np.array(text, dtype=object)[codes[idx]].tolist()
    try:  # (the args were decoded from JSON: they encode back; else one at a time)
        keys = list(map(_JSON_ENCODE, map(_COST_ARGS, picked)))
    except (TypeError, msgspec.EncodeError, OverflowError):
        keys = list(map(_ENCODE, map(_COST_ARGS, picked)))
    pairs = list(zip(names_of, keys, strict=True))
    costs = dict.fromkeys(pairs)
    for pair in costs:
        costs[pair] = torch_cost(*pair)
    vals = np.array(list(map(costs.__getitem__, pairs)), dtype=np.float64).reshape(-1, 5)
    out["flops"][idx], out["model_flops"][idx], out["mem_bytes"][idx] = vals[:, :3].T
    out["precision"][idx] = vals[:, 3].astype(np.int8)
    out["cost_kind"][idx] = vals[:, 4].astype(np.int8)
    return out


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The chunks' arrays of one column as one."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _join_strings(parts: list[tuple[np.ndarray, list[str]]]) -> pd.Categorical:
    """One Categorical of the chunks' columns (:func:`chrome.string_codes`), as
    :func:`chrome.strings` makes it of the whole column: the sorted union of their text,
    each chunk's codes mapped into it (once per distinct value, not per event)."""
    import pandas as pd

    cats = sorted(set().union(*(text for _, text in parts)))
    pos = {t: i for i, t in enumerate(cats)}
    codes = np.concatenate([np.array([pos[t] for t in text], np.int64)[c] if len(c)
                            else np.zeros(0, np.int64) for c, text in parts])
    return pd.Categorical.from_codes(codes, categories=pd.Index(cats, dtype=object))


def _one_group_size(doc: Document) -> int | None:
    """The size of the job's process group when ``distributedInfo`` says it has just one
    (every collective runs in it), else None."""
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    groups = info.get("pg_config")
    if isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict):
        return _int(groups[0].get("pg_size"), 0, 1, _MAX_RANK) or None
    if info.get("pg_count") == 1:
        return _int(info.get("world_size"), 0, 1, _MAX_RANK) or None
    return None


def served_collectives(raw: pd.DataFrame,
                       group_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``collective`` and ``bytes`` columns with gloo's own spans named by the c10d calls
    they serve, and given their message size where the call's is larger (a
    ``gloo:all_gather`` span's shapes are its input only: the gathered buffer, nccl-tests'
    size, is ``group_size`` times it where the job has one process group, as FSDP1's list
    ``c10d::allgather_`` names no output shape).

    gloo runs each collective on its own thread, as a ``gloo:<op>`` span that starts after
    the ``c10d::`` call that enqueued it, first in first out; it runs a reduce-scatter as an
    all-reduce (``c10d::_reduce_scatter_base_`` is served by ``gloo:all_reduce``). When the
    rank's queued calls and spans pair one to one in order, each of the same collective or
    that reduce-scatter case, a span takes its call's collective; otherwise (several
    process groups interleaving) they keep their own. Spans run inline inside their call
    (``gloo:send`` in ``c10d::send``) are their call's already."""
    import pandas as pd

    from opprof.intervals import containing
    from opprof.taxonomy import mapping_table

    out = raw["collective"].to_numpy(object).copy()
    nbytes = raw["bytes"].to_numpy(np.int64).copy()
    names = raw["name"].astype("category")
    cats = pd.Index(names.cat.categories.astype(str))
    codes = names.cat.codes.to_numpy()
    call = np.append(cats.str.startswith("c10d::"), False)[codes]
    span = np.append(cats.str.startswith("gloo:"), False)[codes]
    if not call.any() or not span.any():
        return out, nbytes
    tid = raw["tid"].to_numpy(np.int64)
    ts = raw["ts"].to_numpy(np.int64)
    end = ts + raw["dur"].to_numpy(np.int64)
    calls, spans = np.flatnonzero(call), np.flatnonzero(span)
    inline = containing(tid[spans], ts[spans], end[spans], tid[calls], ts[calls], end[calls])
    calls = np.setdiff1d(calls, calls[inline[inline >= 0]])
    spans = spans[inline < 0]
    if len(calls) != len(spans) or not len(spans):
        return out, nbytes
    calls, spans = calls[np.argsort(ts[calls], kind="stable")], spans[np.argsort(ts[spans],
                                                                                 kind="stable")]
    table = mapping_table(NAME).classify(cats)["op"]
    call_op = table.reindex(cats[codes[calls]]).to_numpy(object)
    span_op = table.reindex(cats[codes[spans]]).to_numpy(object)
    pairs = (call_op == span_op) | ((span_op == "all_reduce") & (call_op == "reduce_scatter"))
    if pairs.all() and (ts[spans] >= ts[calls]).all():
        out[spans] = call_op
        gathered = nbytes[spans] * np.where(span_op == "all_gather", group_size or 1, 1)
        nbytes[spans] = np.maximum(gathered, nbytes[calls])
    return out, nbytes


#: Rounds of lane assignment before the spans left each get a lane of their own.
_ASYNC_ROUNDS = 64


def async_lanes(raw: pd.DataFrame) -> np.ndarray:
    """The ``tid`` column with each *asynchronous* backend span moved to a lane of its own.

    gloo records the span of an asynchronous point-to-point call (``isend``/``irecv``,
    ``batch_isend_irecv``: ``gloo:send``, ``gloo:recv``) on the thread that issued it, from
    the moment it is posted to the moment it completes: it starts inside its ``c10d::send``
    and ends long after it, while the thread computes on. Left on that lane it would seem to
    enclose what follows. A backend span on a thread that issues ``c10d::`` calls and that
    no such call contains is one of these: it goes to a lane ``ASYNC_TID - k`` where it
    overlaps no other (lanes given in rounds, each taking the spans that start after every
    earlier one ended), where it is an operator of its own (the collective in flight)."""
    import pandas as pd

    from opprof.intervals import containing

    tid = raw["tid"].to_numpy(np.int64).copy()
    names = raw["name"].astype("category")
    cats = pd.Index(names.cat.categories.astype(str))
    codes = names.cat.codes.to_numpy()
    span = np.append(cats.str.match(BACKEND_SPAN), False)[codes]
    call = np.append(cats.str.startswith("c10d::"), False)[codes]
    if not span.any() or not call.any():
        return tid
    pid = raw["pid"].to_numpy(np.int64)
    lane = pid * (1 << 32) + tid
    ts = raw["ts"].to_numpy(np.int64)
    end = ts + raw["dur"].to_numpy(np.int64)
    spans = np.flatnonzero(span & np.isin(lane, lane[call]))
    calls = np.flatnonzero(call)
    inside = containing(lane[spans], ts[spans], end[spans], lane[calls], ts[calls], end[calls])
    moved = spans[inside < 0]
    if not len(moved):
        return tid
    moved = moved[np.argsort(ts[moved], kind="stable")]
    out_lane = np.full(len(moved), -1, np.int64)
    left = np.arange(len(moved))
    for k in range(_ASYNC_ROUNDS):
        if not len(left):
            break
        s, e = ts[moved[left]], end[moved[left]]
        reach = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, e[:-1]])
        take = s >= reach  # starts after every earlier span left ended: no overlap
        out_lane[left[take]] = k
        left = left[~take]
    out_lane[left] = _ASYNC_ROUNDS + np.arange(len(left))
    tid[moved] = ASYNC_TID - out_lane
    return tid


#: The name of a wait opprof adds to a trace (:func:`with_waits`).
WAIT_NAME = "opprof.wait"
#: Spans of a rank tried per call, latest-ending first, for the one it waited for.
_WAIT_TRIES = 4


def with_waits(raw: pd.DataFrame) -> pd.DataFrame:
    """``raw`` with one event ``opprof.wait`` (kind comm, of the call's collective) for every
    synchronous ``c10d::`` call after which its thread waited for the collective to complete.

    A call such as ``dist.all_to_all_single`` enqueues the collective (the ``c10d::`` event)
    and then blocks in ``Work.wait()``, which the profiler does not record: the thread is idle
    until the backend's span (``gloo:all_to_all``, on gloo's thread) ends. When the call was
    issued inside an operator (an autograd function's backward), that operator would seem to
    compute all along. A call waited on so is one made inside an operator that is still open
    when a backend span of the same collective (gloo runs a reduce-scatter as an all-reduce),
    started after the call, ends, and whose thread issues its next event only after that
    end; the wait is the time from the call's end to that span's end, on the call's thread.
    A call that returns at once (DDP's all-reduce from a backward hook: the backward goes on
    while it runs) gets none, nor one made between operators (the span shows that wait)."""
    import pandas as pd

    from opprof.taxonomy import mapping_table

    names = raw["name"].astype("category")
    cats = pd.Index(names.cat.categories.astype(str))
    codes = names.cat.codes.to_numpy()
    call = np.append(cats.str.startswith("c10d::"), False)[codes]
    span = np.append(cats.str.match(BACKEND_SPAN), False)[codes]
    if not call.any() or not span.any():
        return raw
    table = mapping_table(NAME).classify(cats)["op"].reindex(cats).to_numpy(object)
    op = np.append(table, np.array([None], dtype=object))[codes]
    named = raw["collective"].to_numpy(object) if "collective" in raw else np.full(
        len(raw), None, dtype=object)
    op = np.where(pd.isna(named), op, named)
    lane = raw["pid"].to_numpy(np.int64) * (1 << 32) + raw["tid"].to_numpy(np.int64)
    ts = raw["ts"].to_numpy(np.int64)
    end = ts + raw["dur"].to_numpy(np.int64)
    calls = np.flatnonzero(call)
    # each call's thread: the start of its next event after the call ended
    order = np.lexsort((ts, lane))
    lanes = np.unique(lane)
    t0 = int(ts.min())
    width = int(ts.max() - t0) + 2
    flat = np.searchsorted(lanes, lane[order]) * width + (ts[order] - t0)
    c_lane = np.searchsorted(lanes, lane[calls])
    at = np.searchsorted(flat, c_lane * width + np.minimum(end[calls] - t0, width - 1))
    same = (at < len(flat)) & (flat[np.minimum(at, len(flat) - 1)] // width == c_lane)
    nxt = np.where(same, ts[order][np.minimum(at, len(flat) - 1)], np.iinfo(np.int64).max)
    # and, when operators are around it (none: the call was made between operators, where
    # the backend's span shows the wait), the first end of an event on its lane after the
    # call's: the thread stays in the innermost of them, idle, until then
    e_order = np.lexsort((end, lane))
    e_flat = np.searchsorted(lanes, lane[e_order]) * width + (end[e_order] - t0)
    e_at = np.searchsorted(e_flat, c_lane * width + (end[calls] - t0), side="right")
    e_same = (e_at < len(e_flat)) & (e_flat[np.minimum(e_at, len(e_flat) - 1)] // width
                                      == c_lane)
    first_end = np.where(e_same, end[e_order][np.minimum(e_at, len(e_flat) - 1)], -1)
    # (an operator around it at all: the outermost one, still open)
    from opprof.intervals import Nesting

    ops = (raw["kind"] == "cpu_op").to_numpy() if "kind" in raw else np.ones(
        len(raw), bool)
    _, anc = Nesting(lane, ts, end).nest(ops & ~call)
    around = anc[calls]
    open_until = np.where(around >= 0, np.minimum(end[np.maximum(around, 0)], first_end), -1)
    spans = np.flatnonzero(span)
    spans = spans[np.argsort(end[spans], kind="stable")]
    s_end = end[spans]
    wait_end = np.full(len(calls), -1, np.int64)
    base = np.searchsorted(s_end, end[calls], side="left")
    for k in range(_WAIT_TRIES):
        j = base + k
        inside = j < len(spans)
        cand = spans[np.minimum(j, len(spans) - 1)]
        serves = (op[cand] == op[calls]) | ((op[cand] == "all_reduce")
                                             & (op[calls] == "reduce_scatter"))
        good = (inside & (wait_end < 0) & serves & (ts[cand] >= ts[calls])
                & (end[cand] <= nxt) & (end[cand] > end[calls]) & (end[cand] <= open_until))
        wait_end[good] = end[cand[good]]
    waited = np.flatnonzero(wait_end > 0)
    if not len(waited):
        return raw
    c = calls[waited]
    rows = raw.iloc[c].copy()
    rows["name"] = WAIT_NAME
    rows["ts"] = end[c]
    rows["dur"] = wait_end[waited] - end[c]
    rows["bytes"] = 0
    rows["link"] = -1
    if "detail" in rows:
        rows["detail"] = None
    rows["collective"] = op[c]
    out = pd.concat([raw, rows], ignore_index=True)
    out["name"] = out["name"].astype("category")
    return out




def _comm_args(names: tuple[np.ndarray, list[str]],
               args: list[Args]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per event, for communication events (NaN / None for every other one): the payload
    (the larger of the in and out messages' elements x dtype size, else the largest input
    tensor's: nccl-tests' message size, all-gather's gathered and reduce-scatter's scattered
    buffer), the collective its args
    name (Kineto's ``Collective name`` as written: :func:`_collective_ops` maps the whole
    column once) and its process group as ``detail`` text (``pg=NAME size=N``,
    None without one). ``names``: the events' (codes, distinct names); the name test runs
    once per distinct name."""
    codes, text = names
    n = len(codes)
    out = np.full(n, np.nan)
    collective = np.full(n, None, dtype=object)
    group = np.full(n, None, dtype=object)
    is_comm_name = np.fromiter(map(_is_comm_name, text), bool, len(text))
    idx = np.flatnonzero(is_comm_name[codes]).tolist() if len(is_comm_name) else []
    for i in idx:
        a = args[i]
        collective[i] = a.collective if isinstance(a.collective, str) else None
        group[i] = _group_text(a)
        name = text[codes[i]]
        if "all_to_all" in name or "alltoall" in name or (
                a.in_split is not None and a.collective in ("all_to_all", "alltoall",
                                                            "alltoall_base")):
            peers = _gloo_list_bytes(a) if name.startswith("gloo:") else []
            split = _a2a_text(peers, peers) if peers else _split_text(name, a)
            if split:
                group[i] = f"{group[i]} {split}" if group[i] else split
            if peers:  # gloo's list form: its bytes are every tensor's
                out[i] = float(sum(peers))
                continue
        size = _DTYPE_BYTES.get(a.dtype) if isinstance(a.dtype, str) else None
        nel = max([v for v in chrome.numbers([a.in_nelems, a.out_nelems]).tolist()
                   if v == v] + [-1.0])  # the larger of the two that are numbers, else -1
        if size is not None and nel >= 0:
            out[i] = nel * size
            continue
        numel = _largest_numel(a.input_dims)
        t = a.input_type
        first = _DTYPE_BYTES.get(t[0]) if isinstance(t, list) and t and isinstance(
            t[0], str) else None
        if first is not None:
            out[i] = numel * first
    has_group = any(g is not None for g in group[idx]) if len(idx) else False
    return out, collective, group if has_group else None


@functools.lru_cache(maxsize=1 << 16)
def _is_comm_name(name: str) -> bool:
    """Whether an event of this name may be a collective (matched once per distinct name)."""
    return bool(_COMM_NAME.match(name))


def _collective_ops(collective: np.ndarray) -> np.ndarray:
    """The ``Collective name`` column mapped by ``maps/collectives.csv`` (the op of a
    ``record_param_comms``), in place: one classification of the whole column."""
    from opprof.taxonomy import mapping_table

    has = np.flatnonzero(collective != None)  # noqa: E711 (element-wise)
    if len(has):
        cls = mapping_table("collectives").classify(collective[has])
        collective[has] = cls["op"].reindex(collective[has]).to_numpy(object)
    return collective


def _group_text(a: Args) -> str | None:
    """``pg=NAME size=N desc=DESC`` of a collective's args (each part only where the args
    have it), or None."""
    parts = []
    if isinstance(a.group_name, (str, int)) and not isinstance(a.group_name, bool):
        parts.append(f"pg={a.group_name}")
    size = _int(a.group_size, 0, 1, _MAX_RANK)
    if size:
        parts.append(f"size={size}")
    if parts and isinstance(a.group_desc, str) and a.group_desc and " " not in a.group_desc:
        parts.append(f"desc={a.group_desc}")
    return " ".join(parts) or None


def _split_text(name: str, a: Args) -> str | None:
    """``a2a_send_bytes=… a2a_recv_bytes=…`` of an all-to-all (the bytes it sends to and
    receives from each peer, in group order), from its split sizes (rows of its tensors):
    ``record_param_comms``' ``In split size`` / ``Out split size``; ``c10d::alltoall_base_``'s
    and ``all_to_all_single``'s split arguments (``Concrete Inputs``, with
    ``record_shapes``) — gloo's list form is read by :func:`_gloo_list_bytes`. None when the
    trace has no split sizes (an even ``all_to_all_single``)."""
    if name == "record_param_comms":
        send, recv = _int_list(a.in_split), _int_list(a.out_split)
        size = _DTYPE_BYTES.get(a.dtype) if isinstance(a.dtype, str) else None
        nel = chrome.numbers([a.in_nelems]).tolist()[0]
        rows = sum(send) if send else 0
        row_bytes = nel * size / rows if size and rows and nel == nel else None
    else:
        c = a.concrete if isinstance(a.concrete, list) else []
        dims = a.input_dims if isinstance(a.input_dims, list) else []
        types = a.input_type if isinstance(a.input_type, list) else []
        if name.startswith("c10d::"):  # (output, input, pg, output_splits, input_splits, …)
            recv, send = (_int_list(c[3]), _int_list(c[4])) if len(c) > 4 else ([], [])
            tensor, dtype = (dims[1], types[1]) if len(dims) > 1 and len(types) > 1 else (
                None, None)
        else:  # all_to_all_single(input, output_splits, input_splits, group)
            recv, send = (_int_list(c[1]), _int_list(c[2])) if len(c) > 2 else ([], [])
            tensor, dtype = (dims[0], types[0]) if dims and types else (None, None)
        size = _DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        trailing = tensor[1:] if isinstance(tensor, list) and tensor else None
        row_bytes = float(np.prod(trailing)) * size if trailing is not None and size and all(
            isinstance(d, int) for d in trailing) else None
    if not send or not recv or row_bytes is None:
        return None
    return _a2a_text([int(r * row_bytes) for r in send], [int(r * row_bytes) for r in recv])


def _a2a_text(send: list[int], recv: list[int]) -> str:
    """``a2a_send_bytes=… a2a_recv_bytes=…``: the bytes to and from each peer, in group
    order (:mod:`opprof.analysis.experts` reads them)."""
    return (f"a2a_send_bytes={','.join(map(str, send))} "
            f"a2a_recv_bytes={','.join(map(str, recv))}")


def _gloo_list_bytes(a: Args) -> list[int]:
    """The bytes per peer of gloo's range of a list-form all-to-all (``dist.all_to_all``:
    its ``Input Dims`` and ``Input type`` hold one input tensor per peer, in group order);
    ProcessGroupGloo requires every input and output tensor of that form to have the first's
    shape, so what a rank receives from each peer is what it sends. [] for one tensor (the
    range of ``all_to_all_single`` lists only its output: its splits are on c10d's call) or
    a tensor without a shape or a known element type."""
    dims = a.input_dims if isinstance(a.input_dims, list) else []
    types = a.input_type if isinstance(a.input_type, list) else []
    if len(dims) < 2 or len(types) != len(dims):
        return []
    out = []
    for d, t in zip(dims, types, strict=True):
        size = _DTYPE_BYTES.get(t) if isinstance(t, str) else None
        if size is None or not isinstance(d, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
            return []
        nbytes = math.prod(d) * size
        if nbytes >= 1 << 62:  # no tensor is that large: a damaged shape
            return []
        out.append(nbytes)
    return out


def _int_list(value: Any) -> list[int]:
    """A list of integers given as a list or as its text (``'[63, 1]'``); [] otherwise."""
    if isinstance(value, str):
        value = value.strip()
        if not (value.startswith("[") and value.endswith("]")):
            return []
        try:
            value = [int(v) for v in value[1:-1].split(",") if v.strip()]
        except ValueError:
            return []
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return []
    return list(value)


def _largest_numel(dims: Any) -> float:
    """Elements of the largest tensor in ``Input Dims`` (NaN when none has a shape)."""
    if not isinstance(dims, list):
        return np.nan
    best = np.nan
    for d in dims:
        if isinstance(d, list) and d:
            try:
                n = float(np.prod(np.array(d, dtype=np.float64)))
            except (TypeError, ValueError):
                continue
            best = n if np.isnan(best) else max(best, n)
    return best
