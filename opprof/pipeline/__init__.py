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


def host_memory() -> dict[str, int] | None:
    """This host's memory as a recording starts: ``total_bytes`` (physical, or the container's
    limit when lower) and ``available_bytes`` (what the kernel could give without swapping:
    ``MemAvailable``, within the limit) — what `opprof advise` weighs a larger batch against.
    None where the system does not say (no /proc)."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f
                    if line.split(":")[0] in ("MemTotal", "MemAvailable")}
    except (OSError, ValueError, IndexError):
        return None
    if "MemTotal" not in info:
        return None
    total, available = info["MemTotal"], info.get("MemAvailable", info["MemTotal"])
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            used = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < total:
            total = int(limit)
            available = min(available, max(0, total - used))
        break
    return {"total_bytes": total, "available_bytes": available}


def cpus() -> int | None:
    """CPUs this process may run on (the recording host's)."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


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
