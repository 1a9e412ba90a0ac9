"""The pipelines the commands call, one module each: a command parses its options into an
options object and calls its pipeline; the pipeline does the work and returns what it made.

* :mod:`.record` — a built-in model trained under its framework's profiler (`record`, and
  every run of `bench`), the native traces normalized into a `.trace`;
* :mod:`.run` — any training command profiled unchanged (`run`);
* :mod:`.profile` — ``opprof.profile()``, the same runner under a script's own control;
* :mod:`.imports` — native traces (or hosts' `.trace` files) into one `.trace` (`import`);
* :mod:`.bench` — the matrix of recordings and its comparison (`bench`; bench.json);
* :mod:`.calibrate` — the collective timed over message sizes, its α–β (`calibrate`;
  net.json).

Every recording ends the same way (:func:`save_recording`): the job's metadata kept in the
native folder, the native traces normalized, the `.trace` written (stamped once, in
:func:`opprof.trace.save`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opprof.meta import MetaMapping
    from opprof.trace import Trace


def native_folder(output: Path) -> Path:
    """Where a recording's native traces go: ``OUTPUT-STEM.native/`` beside the `.trace`."""
    return output.with_name(output.name.removesuffix(".trace") + ".native")


def save_recording(native: Sequence[Path], meta: MetaMapping, native_dir: Path,
                   output: Path | None, *, skip_damaged: bool = False) -> Trace:
    """The `.trace` of a recording: ``meta`` kept in the native folder (``opprof import``
    of the folder reads it back), the native traces (and sampled memory files) normalized,
    and written to ``output`` (None: not written)."""
    from opprof.normalizers import normalize, write_folder_meta
    from opprof.trace import save

    write_folder_meta(native_dir, meta)
    trace: Trace = normalize(list(native), dict(meta), skip_damaged=skip_damaged)
    if output is not None:
        save(trace, output)
    return trace
