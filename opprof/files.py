"""Atomic file output: write to a temporary name in the same folder, then rename. A write
that fails (disk full, a file size limit) removes the temporary file and is one
:class:`~opprof.errors.OpprofError` line naming the file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from opprof.errors import OpprofError


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
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
        raise OpprofError(f"{path}: cannot be written ({why_not(exc)}); nothing was "
                          "written") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes | Callable[[Path], None]) -> Path:
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
