"""The machine's peak: FLOP/s per precision and memory bandwidth, and where that figure came from.

Three sources, the first that has a figure wins, and its name is always carried with it:

1. the user (``--peak-flops``, ``--peak-bandwidth``);
2. for a GPU, the table ``peaks.csv`` keyed by the device's name as the trace gives it
   (Kineto's ``deviceProperties``; the number of SMs / compute units where a name is shared),
   each row citing the vendor's datasheet;
3. for a CPU, a measurement of this kind of host: ``opprof calibrate --peak`` times a GEMM and a
   memory-bandwidth loop per thread count and writes them to a file (:func:`calibration_path`);
   the entry for the trace's thread count is used (else the one with the most threads).

Which of a device's rates: that of the precision of most of the model's FLOPs (``bf16`` → the
BF16 tensor-core rate; ``fp32`` → the FP32 rate: fp32 matmuls that run as TF32 are measured
against FP32 unless the user gives the peak).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from opprof.flops.families import PRECISIONS
from opprof.model.resources import resources as worker_resources

#: The ``kind`` field of a peak calibration file.
CALIBRATION_KIND = "opprof-peak"


@dataclass(frozen=True)
class DevicePeak:
    """The rates of one device: matmul FLOP/s per precision, the vector (elementwise) FP32
    FLOP/s, memory bytes/s, the device's name and where the figures come from."""

    device: str
    flops: Mapping[str, float]
    vector: float | None
    bandwidth: float | None
    source: str


@dataclass(frozen=True)
class PeakOptions:
    """What the user gave: a peak FLOP/s, a bandwidth, a CPU calibration file."""

    flops: float | None = None
    bandwidth: float | None = None
    calibration: Path | None = None


@dataclass(frozen=True)
class Peak:
    """The peak a report measures against: matmul FLOP/s at ``precision``, vector FLOP/s,
    bytes/s (None where unknown), the device, and ``source``: one line naming where each figure
    comes from (``why``: why there is none)."""

    flops_per_s: float | None
    bytes_per_s: float | None
    vector_flops_per_s: float | None = None
    precision: str = ""
    device: str = ""
    source: str = ""
    why: str = ""
    rates: Mapping[str, float] = field(default_factory=dict)

    def matmul_rate(self, precision: str) -> float | None:
        """The matmul peak of a precision (the user's figure, else the device's)."""
        if self.source.startswith("--peak-flops"):
            return self.flops_per_s
        return self.rates.get(precision) or self.flops_per_s


def _rate(text: str) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


@functools.cache
def gpu_table() -> list[tuple[re.Pattern[str], int | None, DevicePeak]]:
    """The rows of ``peaks.csv``: (name pattern, units or None, peak)."""
    text = resources.files("opprof.flops").joinpath("peaks.csv").read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("# ")]
    out = []
    for rec in csv.DictReader(lines):
        rates = {p: r for p in PRECISIONS if (r := _rate(rec.get(p, ""))) is not None}
        units = int(rec["units"]) if (rec.get("units") or "").strip() else None
        out.append((re.compile(rec["pattern"]), units,
                    DevicePeak(rec["device"], rates, _rate(rec["vector"]),
                               _rate(rec["bandwidth"]), rec["source"])))
    return out


def gpu_peak(name: str, units: int | None = None) -> DevicePeak | None:
    """The table's row for a device name (and its SM / CU count), or None."""
    for pattern, want, peak in gpu_table():
        if pattern.fullmatch(name.strip()) and (want is None or want == units):
            return peak
    return None


def calibration_path() -> Path:
    """Where ``opprof calibrate --peak`` keeps its measurement by default: ``$OPPROF_PEAK_FILE``,
    else ``$XDG_CACHE_HOME/opprof/peak.json`` (``~/.cache/opprof/peak.json``)."""
    env = os.environ.get("OPPROF_PEAK_FILE")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "opprof" / "peak.json"


def read_calibration(path: Path) -> dict[str, Any] | None:
    """A peak calibration file's document, or None when it is absent or not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") != CALIBRATION_KIND or not isinstance(
            doc.get("threads"), list):
        return None
    return doc


def cpu_peak(doc: Mapping[str, Any], threads: int | None) -> DevicePeak | None:
    """The calibration entry for ``threads`` (else the one with the most threads)."""
    rows = [r for r in doc.get("threads", []) if isinstance(r, dict)
            and isinstance(r.get("threads"), int)]
    if not rows:
        return None
    row = next((r for r in rows if r["threads"] == threads), None) or max(
        rows, key=lambda r: r["threads"])
    flops = {p: float(v) for p, v in (row.get("flops") or {}).items()
             if p in PRECISIONS and isinstance(v, (int, float)) and v > 0}
    bw = row.get("bandwidth")
    n = row["threads"]
    host = doc.get("host") or "this host"
    return DevicePeak(f"{doc.get('cpu') or 'CPU'} ({n} thread{'s' if n != 1 else ''})",
                      flops, flops.get("fp32"),
                      float(bw) if isinstance(bw, (int, float)) and bw > 0 else None,
                      f"measured on {host} by opprof calibrate --peak ({n} threads"
                      + (f", {doc['created']}" if doc.get("created") else "") + ")")


def resolve(meta: Mapping[str, Any], precision: str, options: PeakOptions | None = None,
            calibration: Mapping[str, Any] | None = None) -> Peak:
    """The peak of a run (its metadata: ``gpus``, ``gpu_units``, ``device``, ``hosts``,
    ``threads``) for FLOPs mostly of ``precision``."""
    options = options or PeakOptions()
    gpus = [str(g) for g in (meta.get("gpus") or []) if str(g)]
    units = meta.get("gpu_units") or {}
    device: DevicePeak | None = None
    why = ""
    on_gpu = str(meta.get("device") or "cpu") != "cpu" and bool(gpus)
    if on_gpu:
        device = gpu_peak(gpus[0], units.get(gpus[0]) if isinstance(units, dict) else None)
        if device is None:
            why = (f"no peak known for the device {gpus[0]!r} (give --peak-flops and "
                   "--peak-bandwidth)")
    elif str(meta.get("device") or "cpu") != "cpu":
        why = "the trace names no GPU model (give --peak-flops and --peak-bandwidth)"
    elif calibration is not None:
        hosts = [str(h) for h in (meta.get("hosts") or [])]
        host = str(calibration.get("host") or "")
        if hosts and host and host not in hosts:
            why = (f"the peak calibration is of host {host!r}, the trace of {', '.join(hosts)} "
                   "(run opprof calibrate --peak there, or give --peak-flops)")
        else:
            device = cpu_peak(calibration, worker_resources(meta).threads)
    else:
        why = ("no peak for this CPU: run opprof calibrate --peak on this host, or give "
               "--peak-flops and --peak-bandwidth")
    rates = dict(device.flops) if device else {}
    flops = rates.get(precision) if precision else None
    prec_used = precision
    if device is not None and flops is None and rates:
        if precision:
            why = f"{device.device} has no {precision} rate in the peak table"
        else:
            prec_used = "fp32" if "fp32" in rates else next(iter(rates))
            flops = rates[prec_used]
    source = ""
    if device is not None and flops is not None:
        source = f"{device.device}, {prec_used} {_kind(prec_used, on_gpu)}: {device.source}"
        why = ""
    bandwidth = device.bandwidth if device else None
    vector = device.vector if device else None
    name = device.device if device else (gpus[0] if gpus else "")
    if options.flops is not None:
        flops, source, why, prec_used = options.flops, "--peak-flops (given)", "", precision
        vector = vector or options.flops
    if options.bandwidth is not None:
        bandwidth = options.bandwidth
        source += ("; " if source else "") + "--peak-bandwidth (given)"
    return Peak(flops, bandwidth, vector, prec_used, name, source, why, rates)


def _kind(precision: str, gpu: bool) -> str:
    if not gpu:
        return "GEMM"
    return "FP32 (CUDA cores / vector)" if precision in ("fp32", "fp64") else "dense tensor"


def parse_rate(text: str) -> float:
    """``"989e12"``, ``"989T"``, ``"3.35 TB/s"``, ``"1.2P"`` → a number (ValueError else)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([kKMGTPE]?)\s*(?:[A-Za-z/]*)\s*",
                     text)
    if not m:
        raise ValueError(f"not a rate: {text!r} (write e.g. 989e12, 989T or 3.35T)")
    scale = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
             "E": 1e18}[m[2]]
    value = float(m[1]) * scale
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"not a positive rate: {text!r}")
    return value
