"""`opprof calibrate --peak`: this host's CPU peak, measured — a GEMM's FLOP/s and a memory
bandwidth loop's bytes/s per thread count — and the file it is kept in (read by
:mod:`opprof.flops.peaks` for the MFU of a CPU trace recorded on this host).

The GEMM is ``torch.mm`` of two square matrices (fp32, and bf16 where this CPU runs it faster
than fp32's half), the best of ``repeat`` timed calls after a warm-up one; the bandwidth loop is
a triad (``a = b + s·c`` over three arrays far larger than the caches: 3 × 4 bytes per element
moved), the best of ``repeat``. Each at 1, 2, 4 … threads up to the host's CPUs (and that
count). The file (``kind: opprof-peak``) names the host, the CPU, the date and the command.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opprof.errors import OpprofError
from opprof.files import write_atomic
from opprof.flops.peaks import CALIBRATION_KIND


@dataclass(frozen=True)
class PeakCalibrateOptions:
    """What `opprof calibrate --peak` measures: the thread counts (None: 1, 2, 4 … and every
    CPU), the GEMM's size, the bandwidth arrays' elements, timed calls per figure."""

    threads: tuple[int, ...] | None = None
    gemm_n: int = 1024
    stream_elements: int = 1 << 24
    repeat: int = 5


def thread_counts(cpus: int) -> list[int]:
    """1, 2, 4 … below ``cpus``, and ``cpus``."""
    out, t = [], 1
    while t < cpus:
        out.append(t)
        t *= 2
    return [*out, cpus]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _best(fn: Any, repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(o: PeakCalibrateOptions) -> dict[str, Any]:
    """The calibration document (see the module docstring)."""
    try:
        import torch
    except ImportError:
        raise OpprofError("opprof calibrate --peak times torch's GEMM and copies: "
                          "pip install -e '.[torch]' -c constraints.txt") from None
    cpus = os.cpu_count() or 1
    counts = sorted(set(o.threads)) if o.threads else thread_counts(cpus)
    saved = torch.get_num_threads()
    n = o.gemm_n
    a32, b32 = torch.randn(n, n), torch.randn(n, n)
    a16, b16 = a32.to(torch.bfloat16), b32.to(torch.bfloat16)
    m = o.stream_elements
    x, y, z = torch.empty(m), torch.randn(m), torch.randn(m)
    rows = []
    try:
        for t in counts:
            torch.set_num_threads(t)
            fp32 = 2.0 * n ** 3 / _best(lambda: torch.mm(a32, b32), o.repeat)
            bf16 = 2.0 * n ** 3 / _best(lambda: torch.mm(a16, b16), o.repeat)
            bw = 3.0 * 4 * m / _best(lambda: torch.add(y, z, alpha=0.5, out=x), o.repeat)
            flops = {"fp32": fp32}
            if bf16 > fp32 / 2:  # a native bf16 path, not a conversion to fp32 and back
                flops["bf16"] = bf16
            rows.append({"threads": t, "flops": flops, "bandwidth": bw})
    finally:
        torch.set_num_threads(saved)
    return {"kind": CALIBRATION_KIND, "host": socket.gethostname(), "cpu": cpu_name(),
            "cpus": cpus, "created": datetime.date.today().isoformat(),
            "torch": torch.__version__, "gemm_n": n, "stream_elements": m,
            "repeat": o.repeat, "threads": rows}


def write(doc: dict[str, Any], path: Path) -> None:
    """Write a calibration (atomically; the folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=2) + "\n")
