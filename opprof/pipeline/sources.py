"""The traces a pipeline reads, each once: whether two paths name the same file or folder
(:func:`same_file`), and the traces already read, by what they name (:class:`Traces`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opprof.trace import Trace


def _key(path: str | os.PathLike[str]) -> tuple[int, int] | str:
    """What a path names: its (device, inode) where it exists, else its text."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return os.fspath(path)
    return st.st_dev, st.st_ino


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name the same file or folder (a link, another spelling)."""
    return _key(a) == _key(b)


class Traces:
    """Traces read whole (:func:`opprof.loader.load`), each job once: asking again for the
    paths of a job already read gives the same Trace."""

    def __init__(self) -> None:
        self._read: dict[tuple[tuple[int, int] | str, ...], Trace] = {}

    def load(self, paths: Path | Sequence[Path]) -> Trace:
        """The Trace of ``paths`` (one path, or the files of one job), read the first time."""
        from opprof.loader import load

        listed = [paths] if isinstance(paths, Path) else list(paths)
        key = tuple(_key(p) for p in listed)
        if key not in self._read:
            self._read[key] = load(listed)
        return self._read[key]
