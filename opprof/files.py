"""Atomic file output: write to a temporary name in the same folder, then rename. A write
that fails (disk full, a file size limit) removes the temporary file and is one
:class:`~opprof.errors.OpprofError` line naming the file."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from opprof.errors import ErrorKind, OpprofError


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on error it
    is removed, so no half-written file is ever left under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{safe_name(path.name)}.", suffix=".tmp",
                               dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except OSError as exc:  # disk full, a file size limit, a quota: one line, no file
        Path(tmp).unlink(missing_ok=True)
        raise OpprofError(f"cannot be written ({why_not(exc)}); nothing was "
                          "written", path=path, kind=ErrorKind.UNWRITABLE) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], data: str | bytes | Callable[[Path], None]) -> Path:
    """Write text, bytes, or whatever ``data(tmp_path)`` writes, atomically to ``path``."""
    with atomic_path(path) as tmp:
        if callable(data):
            data(tmp)
        elif isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
    return Path(path)


def why_not(exc: OSError) -> str:
    """The system's words for a failed write (``No space left on device``), also from
    pyarrow's errors, which carry the errno only in their text."""
    import re

    code = exc.errno
    if code is None:
        found = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)
        code = int(found.group(1)) if found else None
    return os.strerror(code) if code else (exc.strerror or str(exc).strip() or "I/O error")


def safe_name(name: str) -> str:
    """``name`` with what cannot be UTF-8 (bytes of a non-UTF-8 file name) as ``_``: for
    temporary names that libraries needing UTF-8 paths (pyarrow) must open."""
    return name.encode("utf-8", "replace").decode("utf-8").replace("?", "_")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_input(path: Path) -> os.stat_result:
    """The stat of a path a command reads, which must be a regular file or a folder: a FIFO,
    a device (a link to ``/dev/zero``), a socket, a missing or unreadable path is one
    :class:`~opprof.errors.OpprofError` line at once, before anything is opened."""
    if str(path) == "":
        raise OpprofError("an empty path was given as a trace")
    try:
        st = path.stat()
    except FileNotFoundError:
        raise OpprofError("no such file or folder", path=path, kind=ErrorKind.MISSING) from None
    except OSError as exc:  # a loop of links, a name too long, no permission to look
        raise OpprofError(f"cannot be read ({exc.strerror or exc})",
                          path=path, kind=ErrorKind.UNREADABLE) from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        what = next((w for test, w in _NOT_REGULAR if test(st.st_mode)), "not a regular file")
        raise OpprofError(f"{what}, not a regular file; only files and folders are "
                          "read", path=path, kind=ErrorKind.UNREADABLE)
    if not os.access(path, os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)):
        raise OpprofError("cannot be read (permission denied)",
                          path=path, kind=ErrorKind.UNREADABLE)
    return st


def shown(text: str) -> str:
    """``text`` safe to print on one line: newlines, other control characters and bytes that
    are not UTF-8 (in file names) escaped as Python writes them."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)
