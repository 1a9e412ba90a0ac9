"""Which per-worker resources a trace's workers had — device, compute threads, CPUs shared
among the workers of a host — and whether a prediction from one trace holds for another's
workers (the model's resource check)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject
    from opprof.meta import MetaMapping


@dataclass(frozen=True)
class Resources:
    """What one worker of a trace had to compute with."""

    device: str
    threads: int | None  # compute threads per worker (intra-op / OpenMP)
    cpus: int | None  # CPUs of one host
    hosts: int
    workers: int

    @property
    def cores_per_worker(self) -> float | None:
        """CPUs of a host shared among the workers on it."""
        if not self.cpus:
            return None
        per_host = max(1, math.ceil(self.workers / max(self.hosts, 1)))
        return self.cpus / per_host

    @property
    def effective(self) -> float | None:
        """Cores a worker can keep busy: min(threads, cores per worker)."""
        vals = [v for v in (self.threads, self.cores_per_worker) if v]
        return float(min(vals)) if vals else None

    def describe(self) -> str:
        """E.g. ``cpu, 1 thread, 2 CPUs per host shared by 2 workers``."""
        parts = [self.device or "device unknown"]
        parts.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}"
                     if self.threads else "threads unknown")
        if self.cpus:
            per_host = max(1, math.ceil(self.workers / max(self.hosts, 1)))
            parts.append(f"{self.cpus} CPUs per host shared by {per_host} worker"
                         f"{'s' if per_host != 1 else ''}")
        return ", ".join(parts)

    def to_dict(self) -> JSONObject:
        """JSON form."""
        return {"device": self.device, "threads": self.threads, "cpus": self.cpus,
                "hosts": self.hosts, "workers": self.workers,
                "cores_per_worker": self.cores_per_worker, "effective_cores": self.effective}


def resources(meta: MetaMapping) -> Resources:
    """The per-worker resources a trace's metadata records."""
    threads = meta.get("threads")
    cpus = meta.get("cpus")
    if isinstance(threads, dict):  # TensorFlow: intra-op threads, 0 = one per CPU
        cpus = cpus or threads.get("cpus")
        threads = threads.get("intra_op") or cpus
    hosts = meta.get("hosts") or []
    return Resources(device=str(meta.get("device") or ""),
                     threads=int(threads) if threads else None,
                     cpus=int(cpus) if cpus else None,
                     hosts=max(1, len(hosts)) if isinstance(hosts, list) else 1,
                     workers=int(meta.get("workers") or 1))


def resource_mismatch(base: Resources, target: Resources) -> str | None:
    """Why a prediction from ``base`` does not hold for ``target``'s workers (None: it does)."""
    if base.device and target.device and base.device != target.device:
        return f"device {base.device} vs {target.device}"
    if base.threads and target.threads and base.threads != target.threads:
        return f"{base.threads} vs {target.threads} threads per worker"
    be, te = base.effective, target.effective
    if be and te and abs(be - te) > 0.01 * max(be, te):
        return (f"{be:g} vs {te:g} cores per worker ({base.describe()} vs "
                f"{target.describe()})")
    return None
