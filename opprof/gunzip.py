"""Gzip traces inflated in bounded pieces, with the reader's memory guards, and the one
file a command reads inflated ahead on a second thread (:func:`prefetch`).

Standard library only (and ISA-L's inflate where the ``fast`` extra installs it): the CLI
starts :func:`prefetch` before it imports pandas and numpy, so the inflating (which holds
no GIL) runs on the other core while the interpreter imports (about 0.4 s); the reader
(``chrome.read_bytes``) then takes the text (:func:`prefetched`) instead of inflating it
again. Any failure there (damaged data, a bomb, the file changed) is left to the reader,
which reads the file again and says what is wrong in its usual line.
"""

from __future__ import annotations

import os
import stat
import threading
import types
import zlib
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
    total, size = 0, len(data)
    hint = int.from_bytes(data[-4:], "little") if size >= 18 else 0
    out = bytearray(min(hint, budget, max(_RATIO_FROM, MAX_INFLATE_RATIO * size)))
    try:
        while data:
            d = _inflater.decompressobj(wbits=31)
            rest = data
            while True:
                piece = d.decompress(rest, _PIECE)
                out[total:total + len(piece)] = piece  # grows the buffer past its end
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
    del out[total:]
    return out




_ahead: dict[tuple[int, int], tuple[threading.Thread, dict[str, object], tuple[int, int]]] = {}


def _identity(path: str | os.PathLike[str]) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """((device, inode), (size, mtime ns)) of a regular file; None for anything else."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino), (st.st_size, st.st_mtime_ns)


def prefetch(path: str | os.PathLike[str]) -> bool:
    """Start reading and inflating ``path`` on a second thread when it is a regular gzip
    file within the memory budget; True when started. Its text is kept for the reader
    (:func:`prefetched`)."""
    ident = _identity(path)
    if ident is None or ident[0] in _ahead:
        return False
    try:
        with open(path, "rb") as f:
            if f.read(2) != GZIP_MAGIC:
                return False
    except OSError:
        return False
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["data"] = gunzip(Path(path).read_bytes(), Path(path), memory_budget())
        except (OSError, OpprofError, MemoryError):
            pass  # the reader reads it again and says what is wrong

    thread = threading.Thread(target=work, name="opprof-inflate", daemon=True)
    _ahead[ident[0]] = (thread, box, ident[1])
    thread.start()
    return True


def prefetched(path: str | os.PathLike[str]) -> bytearray | None:
    """The inflated text of ``path`` when :func:`prefetch` started on it (waiting for the
    thread) and the file is unchanged since; None otherwise. Handed out once."""
    ident = _identity(path)
    if ident is None:
        return None
    entry = _ahead.pop(ident[0], None)
    if entry is None:
        return None
    thread, box, when = entry
    thread.join()
    data = box.pop("data", None)
    return data if isinstance(data, bytearray) and ident[1] == when else None


def prefetch_argv(argv: list[str], commands: tuple[str, ...] = ("report",)) -> None:
    """:func:`prefetch` the one gzip file a command line names (``opprof report
    FILE.json.gz ...``); nothing for other commands, several files or a ``.trace``."""
    args = [a for i, a in enumerate(argv) if not a.startswith("-")
            and (i == 0 or argv[i - 1] not in ("-o", "--output"))]
    if not args or args[0] not in commands:
        return
    files = [a for a in args[1:] if a.endswith(".gz")]
    if len(files) == 1:
        prefetch(files[0])
