"""Gzip traces inflated in bounded pieces, with the reader's memory guards, on a second
thread (the inflating holds no GIL).

Standard library only (and ISA-L's inflate where the ``fast`` extra installs it).
:func:`pieces` gives a file's text in pieces for the streaming Kineto reader, inflated at
most :data:`AHEAD` bytes ahead of it; :func:`gunzip` the whole text in one buffer, for the
other readers. `opprof report` starts :func:`prefetch` on the one file it reads (when no
second process reads it: ``opprof.readahead``) before it imports pandas and the analyses, so
the first pieces are inflated while the interpreter imports; the handle travels to the reader
(:class:`opprof.preread.Ahead`), which takes them (:func:`pieces`, or all at once:
:meth:`Pieces.text`). Any failure there (damaged data, a bomb, the file changed) is left to
the reader, which reads the file again and says what is wrong in its usual line.
"""

from __future__ import annotations

import os
import stat
import threading
import types
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from opprof.errors import ErrorKind, OpprofError

GZIP_MAGIC = b"\x1f\x8b"

_inflater: types.ModuleType
try:  # ISA-L's inflate (the ``fast`` extra): the same stream API as zlib, about 2x faster
    from isal import isal_zlib as _inflater
except ImportError:  # pragma: no cover - the standard one
    _inflater = zlib
_INFLATE_ERRORS: tuple[type[BaseException], ...] = (zlib.error, _inflater.error)


#: A gzip stream inflating to more than this many times its compressed size (once past
#: _RATIO_FROM bytes) is a decompression bomb, not a trace.
MAX_INFLATE_RATIO = 200
_RATIO_FROM = 64 << 20
_PIECE = 4 << 20  # bytes inflated at a time


def memory_budget() -> int:
    """Bytes of JSON text one file may have: a third of the memory available now (decoding
    takes several times the text), at least 256 MiB; 4 GiB where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return max(256 << 20, int(line.split()[1]) * 1024 // 3)
    except (OSError, ValueError, IndexError):
        pass
    return 4 << 30


def gib(n: float) -> str:
    """A size in GiB, or MiB below one GiB."""
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def gunzip(data: bytes, path: Path, budget: int) -> bytearray:
    """gunzip (ISA-L's where installed, else zlib's) in pieces of :data:`_PIECE` bytes
    (faster than the gzip module's reader); several gzip members one after another
    (``cat a.gz b.gz``) are joined as gzip does. Stops, with one line, at ``budget`` bytes
    or a decompression bomb's ratio.

    The pieces are copied into one buffer as they come, so the text is held once: never
    as pieces and their join, nor as zlib's output blocks and the bytes object made of
    them (each twice the text at its peak). The buffer is sized up front from the gzip
    trailer's ISIZE (the text's size mod 2**32) — only a hint: at most what the checks
    allow (the budget, the bomb ratio), and grown or cut to what is really inflated."""
    out = bytearray(_size_hint(data, budget))
    total = 0
    for piece in inflate(data, path, budget):
        out[total:total + len(piece)] = piece  # grows the buffer past its end
        total += len(piece)
    del out[total:]
    return out


def _size_hint(data: bytes, budget: int) -> int:
    """The inflated size the gzip trailer states, within what the checks allow."""
    size = len(data)
    hint = int.from_bytes(data[-4:], "little") if size >= 18 else 0
    return min(hint, budget, max(_RATIO_FROM, MAX_INFLATE_RATIO * size))


def inflate(data: bytes, path: Path, budget: int, piece_size: int = _PIECE) -> Iterator[bytes]:
    """The inflated text of gzip ``data`` in pieces of at most ``piece_size`` bytes, with
    :func:`gunzip`'s checks (each a one-line OpprofError): more than ``budget`` bytes, a
    decompression bomb, damaged or truncated data."""
    total, size = 0, len(data)
    try:
        while data:
            d = _inflater.decompressobj(wbits=31)
            rest = data
            while True:
                piece = d.decompress(rest, piece_size)
                total += len(piece)
                used = size - len(d.unconsumed_tail) - len(d.unused_data)  # of the whole file
                if total > budget:
                    raise OpprofError(
                        f"gzip data inflating to more than {gib(budget)} (a third of "
                        "the memory available); not read", path=path, kind=ErrorKind.TOO_LARGE)
                if total > _RATIO_FROM and total > MAX_INFLATE_RATIO * max(used, 1):
                    raise OpprofError(
                        f"gzip data inflating over {MAX_INFLATE_RATIO}x its size "
                        f"({gib(total)} from {gib(used)} so far): a "
                        "decompression bomb, not a trace; not read",
                        path=path, kind=ErrorKind.TOO_LARGE)
                if piece:
                    yield piece
                rest = d.unconsumed_tail
                if d.eof or not rest and not piece:
                    break
            if not d.eof:
                raise OpprofError("truncated or damaged gzip data (ends early)",
                                  path=path, kind=ErrorKind.DAMAGED)
            data = d.unused_data.lstrip(b"\x00")
    except _INFLATE_ERRORS as exc:
        raise OpprofError(f"truncated or damaged gzip data ({exc})",
                          path=path, kind=ErrorKind.DAMAGED) from None


#: The inflating thread stays at most this many bytes of text ahead of its reader, so a
#: streaming reader never holds the whole text (the whole-text reader takes them all).
AHEAD = 4 << 20
#: Bytes a streaming reader takes at a time.
STREAM_PIECE = 1 << 20


class Pieces:
    """A regular file's text in pieces of at most :data:`STREAM_PIECE` bytes — a gzip file
    inflated on a second thread (the inflating holds no GIL) at most :data:`AHEAD` bytes
    ahead of the reader, a plain file read as it is taken. Iterate once; a problem (damaged
    gzip, a bomb, the budget, an unreadable file) is the OpprofError line :func:`gunzip`
    gives, raised where the reader has come to. :meth:`close` stops the thread."""

    def __init__(self, path: str | os.PathLike[str], gzipped: bool) -> None:
        self.path = Path(path)
        self._gzipped = gzipped
        self._cond = threading.Condition()
        self._queue: deque[bytes] = deque()
        self._held = 0
        self._done = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.hint = 0  # the inflated size the gzip trailer states (a hint only)
        if gzipped:
            self._thread = threading.Thread(target=self._inflate, name="opprof-inflate",
                                            daemon=True)
            self._thread.start()

    def _inflate(self) -> None:
        try:
            data, budget = self.path.read_bytes(), memory_budget()
            self.hint = _size_hint(data, budget)
            for piece in inflate(data, self.path, budget, STREAM_PIECE):
                with self._cond:
                    while self._held >= AHEAD and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    self._queue.append(piece)
                    self._held += len(piece)
                    self._cond.notify_all()
        except (OSError, OpprofError, MemoryError) as exc:
            self._error = exc
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def __iter__(self) -> Iterator[bytes]:
        if not self._gzipped:
            yield from self._plain()
            return
        while True:
            with self._cond:
                while not self._queue and not self._done:
                    self._cond.wait()
                if not self._queue:
                    if self._error is not None:
                        raise self._error if isinstance(self._error, OpprofError) else \
                            OpprofError(f"cannot read ({self._error})", path=self.path,
                                        kind=ErrorKind.UNREADABLE)
                    return
                piece = self._queue.popleft()
                self._held -= len(piece)
                self._cond.notify_all()
            yield piece

    def _plain(self) -> Iterator[bytes]:
        budget = memory_budget()
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size > budget:
                    raise OpprofError(f"{gib(os.fstat(f.fileno()).st_size)} of JSON is more "
                                      "than this machine can decode now", path=self.path,
                                      kind=ErrorKind.TOO_LARGE)
                while piece := f.read(STREAM_PIECE):
                    yield piece
        except OSError as exc:
            raise OpprofError(f"cannot read ({exc.strerror or exc})", path=self.path,
                              kind=ErrorKind.UNREADABLE) from None

    def text(self) -> bytearray | None:
        """All of the text as one buffer (None on any problem: the reader reads the file
        again and says what is wrong)."""
        out, total = bytearray(), 0
        try:
            for piece in self:
                if not total:
                    out = bytearray(self.hint)  # known once the first piece is in
                out[total:total + len(piece)] = piece
                total += len(piece)
        except OpprofError:
            return None
        del out[total:]
        return out

    def close(self) -> None:
        """Stop inflating and drop what is held (the thread ends at its next piece)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._held = 0
            self._cond.notify_all()


#: ((device, inode), (size, mtime ns)) of a regular file: the same file, unchanged.
FileIdentity = tuple[tuple[int, int], tuple[int, int]]


def file_identity(path: str | os.PathLike[str]) -> FileIdentity | None:
    """((device, inode), (size, mtime ns)) of a regular file; None for anything else."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino), (st.st_size, st.st_mtime_ns)


def _is_gzip(path: str | os.PathLike[str]) -> bool | None:
    """Whether a file starts like gzip; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return None


def prefetch(path: str | os.PathLike[str]) -> Pieces | None:
    """Start inflating ``path`` on a second thread when it is a regular gzip file: its
    :class:`Pieces` (the caller hands them to the reader, :class:`opprof.preread.Ahead`),
    at most :data:`AHEAD` bytes ahead of it; None for anything else."""
    if file_identity(path) is None or not _is_gzip(path):
        return None
    return Pieces(path, gzipped=True)


def pieces(path: str | os.PathLike[str], ahead: Pieces | None = None) -> Pieces | None:
    """The text of the regular file ``path`` in pieces (:class:`Pieces`): ``ahead`` when
    given (its :func:`prefetch`, started before), else a new one (gzip inflated on a second
    thread). None for anything but a regular file."""
    if ahead is not None:
        return ahead
    if file_identity(path) is None:
        return None
    gz = _is_gzip(path)
    return None if gz is None else Pieces(path, gzipped=gz)
