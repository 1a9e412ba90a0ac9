"""Open anything a command takes as TRACE: an opprof `.trace`, or native traces to normalize."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from opprof.errors import ErrorKind, OpprofError
from opprof.files import check_input
from opprof.trace import Trace, read_parquet

if TYPE_CHECKING:
    from opprof.preread import Ahead

_PARQUET_MAGIC = b"PAR1"


def is_opprof_trace(path: Path) -> bool:
    """True when the path is a regular file that starts like Parquet (an opprof trace or
    another one)."""
    if not path.is_file():  # a FIFO or a device is never opened here
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == _PARQUET_MAGIC
    except OSError:
        return False


def existing_paths(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The given trace paths, each checked to exist (one line naming the first missing)."""
    files = [Path(p) for p in paths]
    if not files:
        raise OpprofError("no trace given")
    for f in files:
        check_input(f)
    return files


def opprof_traces_in(files: list[Path]) -> list[Path]:
    """A single folder given as TRACE that holds opprof `.trace` files (a run's or a bench's
    folder) stands for its one `.trace`; several are refused in one line naming them. Any
    other input is returned as given."""
    if len(files) != 1 or not files[0].is_dir():
        return files
    found = sorted(f for f in files[0].glob("*.trace") if is_opprof_trace(f))
    if not found:
        return files
    if len(found) > 1:
        names = ", ".join(f.name for f in found[:6]) + (" …" if len(found) > 6 else "")
        raise OpprofError(f"holds {len(found)} opprof traces ({names}); give one "
                          "of them", path=files[0], kind=ErrorKind.USAGE)
    return found


def load(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
         ahead: Ahead | None = None) -> Trace:
    """Load an opprof `.trace` (several: the hosts of one job, merged), or normalize native
    trace files/folders on the fly (``ahead``: what the command started reading before,
    :class:`opprof.preread.Ahead`)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = opprof_traces_in(existing_paths(paths))
    traces = [is_opprof_trace(f) for f in files]
    if len(files) == 1 and traces[0]:
        return read_parquet(files[0])
    if all(traces):  # the hosts of one job (opprof.merge)
        from opprof.merge import merge_traces

        merged: Trace = merge_traces(files)
        return merged
    if any(traces):
        raise OpprofError("give opprof .trace files (one per host of a job), or native traces "
                          "to normalize, not both")
    from opprof.normalizers import normalize

    trace: Trace = normalize(files, ahead=ahead)
    return trace
