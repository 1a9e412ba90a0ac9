"""The native formats opprof reads, each behind one protocol: :class:`Format` claims a file and
reads a job whole; a :class:`RankFormat` (one rank per file: Kineto) also plans the files'
ranks and reads one rank on its own, so a job of such files is normalized rank by rank, in
this process or in workers (:mod:`opprof.job`).

A format's module (``kineto.py``, ``mxnet.py`` …) keeps its reader; the classes here are what
the rest of opprof calls. A format module is imported when a file could be of its kind: the
binary formats' suffixes and magic bytes are checked first, so a report of a Kineto trace
never imports the nsys, nvprof or XPlane readers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from opprof.trace import Trace, concat_traces

if TYPE_CHECKING:
    from opprof.meta import MetaMapping
    from opprof.normalizers import kineto, mxnet

_SQLITE = b"SQLite format 3\x00"


class Format(Protocol):
    """A native trace format."""

    #: its name in ``meta["source_formats"]``
    name: str
    #: True: a JSON format whose files are claimed from their decoded document (decoded once,
    #: :func:`opprof.normalizers.read_doc`); False: claimed from the path and first bytes
    json: bool

    def claims(self, path: Path, head: bytes, doc: object = None) -> bool:
        """Whether the file (its first bytes; a JSON format: its decoded document) is of
        this format."""
        ...

    def decode(self, data: bytes | bytearray, path: Path, doc: object) -> object:
        """The document as this format reads it (JSON formats; ``doc``: the document as first
        decoded, returned as it is when the format reads that)."""
        ...

    def read(self, sources: Sequence[tuple[Path, object]], meta: MetaMapping) -> Trace:
        """The whole job: (path, document) per file (the document None for binary formats),
        in file order."""
        ...


@runtime_checkable
class RankFormat(Format, Protocol):
    """A format of one rank per file, each file normalized on its own."""

    def declared_rank(self, doc: object, index: int) -> int:
        """The rank a file says it is, else ``index`` (-1: let the job's order decide)."""
        ...

    def plan(self, declared: Sequence[int]) -> list[int]:
        """The files' final ranks from their declared ones, in file order (two files of the
        same rank stay apart)."""
        ...

    def read_rank(self, path: Path, doc: object, rank: int, meta: MetaMapping,
                  detail: bool = True) -> tuple[Trace, dict[str, Any]]:
        """One file normalized as ``rank``, and the facts :meth:`job_meta` combines."""
        ...

    def job_meta(self, infos: Sequence[Mapping[str, Any]],
                 meta: MetaMapping) -> dict[str, Any]:
        """The job's metadata from its ranks' facts, in rank-file order."""
        ...


class Kineto:
    """PyTorch's profiler traces (Kineto chrome-trace JSON), one rank per file."""

    name = "kineto"
    json = True

    def claims(self, path: Path, head: bytes, doc: object = None) -> bool:
        from opprof.normalizers import kineto

        return doc is not None and kineto.claims_json(doc)

    def decode(self, data: bytes | bytearray, path: Path, doc: object) -> object:
        return doc

    def declared_rank(self, doc: object, index: int) -> int:
        from opprof.normalizers import kineto

        return kineto.declared_rank(cast("kineto.Document", doc), index)  # (its decode's)

    def plan(self, declared: Sequence[int]) -> list[int]:
        from opprof.normalizers import kineto

        return kineto.assign_ranks(list(declared))

    def read_rank(self, path: Path, doc: object, rank: int, meta: MetaMapping,
                  detail: bool = True) -> tuple[Trace, dict[str, Any]]:
        from opprof.normalizers import kineto

        return kineto.rank_trace(path, cast("kineto.Document", doc), rank, dict(meta), detail)

    def job_meta(self, infos: Sequence[Mapping[str, Any]],
                 meta: MetaMapping) -> dict[str, Any]:
        from opprof.normalizers import kineto

        return kineto.merge_meta([dict(i) for i in infos], dict(meta))

    def read(self, sources: Sequence[tuple[Path, object]], meta: MetaMapping) -> Trace:
        ranks = self.plan([self.declared_rank(doc, i) for i, (_, doc) in enumerate(sources)])
        parts = [self.read_rank(path, doc, rank, meta)
                 for (path, doc), rank in zip(sources, ranks, strict=True)]
        return concat_traces([t for t, _ in parts], self.job_meta([i for _, i in parts], meta))


class MXNet:
    """MXNet profiler dumps (chrome-trace JSON), workers and servers normalized together."""

    name = "mxnet"
    json = True

    def claims(self, path: Path, head: bytes, doc: object = None) -> bool:
        from opprof.normalizers import mxnet

        return doc is not None and mxnet.claims_json(doc)

    def decode(self, data: bytes | bytearray, path: Path, doc: object) -> object:
        from opprof.normalizers import mxnet

        return mxnet.decode(data, path)

    def read(self, sources: Sequence[tuple[Path, object]], meta: MetaMapping) -> Trace:
        from opprof.normalizers import mxnet

        docs = [(p, cast("mxnet.Document", doc)) for p, doc in sources]  # (its decode's)
        return mxnet.from_docs(docs, dict(meta))


class Nsys:
    """NVIDIA Nsight Systems reports (``.nsys-rep``, exported with ``nsys``) or their SQLite
    exports."""

    name = "nsys"
    json = False

    def claims(self, path: Path, head: bytes, doc: object = None) -> bool:
        if not (path.name.endswith((".nsys-rep", ".qdrep")) or head.startswith(_SQLITE)):
            return False
        from opprof.normalizers import nsys

        return nsys.claims_file(path, head)

    def decode(self, data: bytes | bytearray, path: Path, doc: object) -> object:
        return doc

    def read(self, sources: Sequence[tuple[Path, object]], meta: MetaMapping) -> Trace:
        from opprof.normalizers import nsys

        return nsys.from_files([p for p, _ in sources], dict(meta))


class Nvprof:
    """nvprof's SQLite exports (``.nvvp``, ``--export-profile``)."""

    name = "nvprof"
    json = False

    def claims(self, path: Path, head: bytes, doc: object = None) -> bool:
        if not head.startswith(_SQLITE):
            return False
        from opprof.normalizers import nvprof

        return nvprof.claims_file(path, head)

    def decode(self, data: bytes | bytearray, path: Path, doc: object) -> object:
        return doc

    def read(self, sources: Sequence[tuple[Path, object]], meta: MetaMapping) -> Trace:
        from opprof.normalizers import nvprof

        return nvprof.from_files([p for p, _ in sources], dict(meta))


class XPlane:
    """The TensorFlow (and JAX) profiler's XPlane files (``*.xplane.pb``), one per host."""

    name = "xplane"
    json = False
    suffix = ".xplane.pb"

    def claims(self, path: Path, head: bytes, doc: object = None) -> bool:
        return Path(path).name.endswith(self.suffix)

    def decode(self, data: bytes | bytearray, path: Path, doc: object) -> object:
        return doc

    def read(self, sources: Sequence[tuple[Path, object]], meta: MetaMapping) -> Trace:
        from opprof.normalizers import xplane

        return xplane.from_files([p for p, _ in sources], dict(meta))


class Chainer:
    """opprof's Chainer traces (``rankR.chainer.json``, from Chainer's function hooks)."""

    name = "chainer"
    json = False

    def claims(self, path: Path, head: bytes, doc: object = None) -> bool:
        return head.startswith(b'{"opprof_chainer_trace"')  # (normalizers/chainer.py MAGIC)

    def decode(self, data: bytes | bytearray, path: Path, doc: object) -> object:
        return doc

    def read(self, sources: Sequence[tuple[Path, object]], meta: MetaMapping) -> Trace:
        from opprof.normalizers import chainer

        return chainer.from_files([p for p, _ in sources], dict(meta))


KINETO = Kineto()
#: The JSON formats, in the order they are asked to claim a document.
JSON_FORMATS: tuple[Format, ...] = (KINETO, MXNet())
#: The formats claimed from a file's path and first bytes.
FILE_FORMATS: tuple[Format, ...] = (Nsys(), Nvprof(), XPlane(), Chainer())
FORMATS: tuple[Format, ...] = (*JSON_FORMATS, *FILE_FORMATS)


def file_format(path: Path, head: bytes) -> Format | None:
    """The binary format that claims a file, or None."""
    return next((f for f in FILE_FORMATS if f.claims(path, head)), None)


def by_rank(fmt: Format | None) -> RankFormat | None:
    """``fmt`` when its files are read one rank at a time, else None."""
    return fmt if isinstance(fmt, RankFormat) else None
