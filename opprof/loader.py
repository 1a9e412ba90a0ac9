"""Open anything a command takes as TRACE: an opprof `.trace`, or native traces to normalize."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from opprof.errors import OpprofError
from opprof.trace import Trace, read_parquet

_PARQUET_MAGIC = b"PAR1"


def is_opprof_trace(path: Path) -> bool:
    """True when the path is a file that starts like Parquet (an opprof trace or another one)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == _PARQUET_MAGIC
    except (IsADirectoryError, FileNotFoundError, PermissionError):
        return False


def existing_paths(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The given trace paths, each checked to exist (one line naming the first missing)."""
    files = [Path(p) for p in paths]
    if not files:
        raise OpprofError("no trace given")
    for f in files:
        if not f.exists():
            raise OpprofError(f"{f}: no such file or folder")
    return files


def load(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> Trace:
    """Load an opprof `.trace` (several: the hosts of one job, merged), or normalize native
    trace files/folders on the fly."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = existing_paths(paths)
    traces = [is_opprof_trace(f) for f in files]
    if len(files) == 1 and traces[0]:
        return read_parquet(files[0])
    if all(traces):  # the hosts of one job (opprof.merge)
        from opprof.merge import merge_traces

        return merge_traces(files)
    if any(traces):
        raise OpprofError("give opprof .trace files (one per host of a job), or native traces "
                          "to normalize, not both")
    from opprof.normalizers import normalize

    return normalize(files)
