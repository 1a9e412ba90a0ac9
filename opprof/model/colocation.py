"""Co-location: how much a worker's compute slows when other processes of the job compute on
the same host at the same time (shared cores, memory bandwidth, caches, the scheduler), and
which workers share a host.

The slowdown ``s(k)`` means: with ``k`` processes of the job computing at once on a host, a
worker's compute (forward, backward, the update it runs itself) takes ``(1 + s(k))`` times its
time alone, ``s(1) = 0``. It comes, in this order, from

1. ``opprof calibrate``'s co-location loop (the network file's ``info.colocation``): the
   framework's own training step of a small built-in model (or of the base's model, ``calibrate
   --model BASE.trace``) timed on one worker alone and on k workers at once, for every k up to
   the calibrated worker count, in interleaved rounds (alone and together back to back, their
   order alternating), ``s(k)`` the median over rounds of each round's ratio of medians — a
   ratio taken within seconds, so a host whose load drifts (a busy one) moves both sides;
2. the cores: ``k`` processes of ``t`` compute threads each on ``c`` CPUs oversubscribe them
   when ``k·t > c``: ``s(k) = k·t/c − 1`` (else 0: sharing caches and memory bandwidth is not
   known without a measurement).

Between the calibrated counts ``s`` is interpolated linearly (``s(1) = 0``); beyond the
largest it grows linearly with the number of neighbours, and at least as the cores'
oversubscription does.

**Placement** (:func:`placement`): which workers share a host comes from the trace's metadata
(``per_rank``: each process's role and host, which `opprof record` writes); a worker's ``k``
counts the workers on its host and the parameter servers on it weighted by the share of the
step they compute beside the workers' compute (0 in synchronous modes, where the servers work
between push and pull while the workers wait; ``ps-async``, their optimizer's share of the
step). Without hosts in the metadata the workers are taken to share the base's hosts evenly.
On GPUs each worker computes on its own device: no co-location.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.kinds import Role

if TYPE_CHECKING:
    from opprof.jsontypes import JSONObject
    from opprof.meta import MetaMapping
    from opprof.model.resources import Resources


@dataclass(frozen=True)
class Curve:
    """``s(k)`` at the measured counts ``points`` (k → s; ``s(1) = 0``), with where it comes
    from and, for a calibration, what its loop ran (``model``, ``batch_size``, ``threads``)."""

    points: dict[int, float]
    source: str
    model: str | None = None
    batch_size: int | None = None
    threads: int | None = None
    cpus: int | None = None

    def at(self, k: float) -> float:
        """``s(k)`` (see the module docstring): 0 for ``k ≤ 1``."""
        if k <= 1.0:
            return 0.0
        pts = sorted({1: 0.0, **{int(n): max(0.0, float(v)) for n, v in self.points.items()}}
                     .items())
        for (k0, s0), (k1, s1) in zip(pts, pts[1:], strict=False):
            if k0 <= k <= k1:
                return s0 + (s1 - s0) * (k - k0) / (k1 - k0)
        top, s_top = pts[-1]
        grown = s_top * (k - 1.0) / (top - 1.0) if top > 1 else 0.0
        return max(grown, _oversubscribed(k, self.threads, self.cpus, top, s_top))


def _oversubscribed(k: float, threads: int | None, cpus: int | None, k0: float = 1.0,
                    s0: float = 0.0) -> float:
    """The slowdown of ``k`` processes of ``threads`` threads on ``cpus`` CPUs from the
    oversubscription of the cores alone, relative to ``k0`` processes that ran ``1 + s0`` times
    slower than alone."""
    if not threads or not cpus:
        return 0.0
    over = max(1.0, k * threads / cpus) / max(1.0, k0 * threads / cpus)
    return (1.0 + s0) * over - 1.0


def curve_from_cores(res: Resources) -> Curve:
    """The cores' curve: ``k`` processes of the base's threads on its host's CPUs."""
    t = res.threads or (int(res.effective) if res.effective else None)
    if not t or not res.cpus:
        return Curve({}, "none: threads or CPUs unknown, and no calibration (assumed 0)")
    return Curve({}, f"cores: {t} compute thread(s) per process on {res.cpus} CPU(s), "
                     "oversubscribed beyond them; sharing caches and memory bandwidth not "
                     "measured (`opprof calibrate` measures it)", threads=t, cpus=res.cpus)


def from_network(info: dict[str, Any]) -> Curve | None:
    """The curve a network file's ``info.colocation`` holds (None: it has none)."""
    doc = info.get("colocation")
    if not isinstance(doc, dict) or not isinstance(doc.get("slowdown"), dict):
        return None
    points = {int(k): float(v) for k, v in doc["slowdown"].items()}
    what = doc.get("model") or "a model"
    batch = f" (batch {doc['batch_size']})" if doc.get("batch_size") else ""
    return Curve(points, f"calibrate: {what}'s training step{batch} alone and on "
                         f"{'/'.join(str(k) for k in sorted(points) if k > 1) or '-'} workers "
                         f"at once, {doc.get('rounds', '?')} interleaved rounds",
                 model=doc.get("model"), batch_size=doc.get("batch_size"),
                 threads=info.get("threads"), cpus=doc.get("cpus"))


@dataclass(frozen=True)
class Placement:
    """Where a job's workers compute: per worker, the workers on its host (itself included)
    and the parameter servers on it; and how many hosts the workers use."""

    workers_on_host: tuple[int, ...]
    servers_on_host: tuple[int, ...]
    hosts: int
    source: str

    def crowds(self, server_duty: float = 0.0) -> list[float]:
        """Per worker: processes computing at once on its host (servers × ``server_duty``)."""
        return [w + server_duty * s for w, s in
                zip(self.workers_on_host, self.servers_on_host, strict=True)]


def placement(meta: MetaMapping, workers: int | None = None,
              servers: int | None = None) -> Placement:
    """The placement a trace's metadata records (``per_rank``: role and host of every
    process); where it records none, ``workers`` (default: the trace's) spread evenly over its
    hosts (``hosts``; one when unknown), and its ``servers`` over the same hosts."""
    n = int(workers or meta.get("workers") or 1)
    s = int(servers if servers is not None else (meta.get("servers") or 0))
    rows = meta.get("per_rank") or []
    hosted = [(str(r.get("role") or ""), str(r.get("host"))) for r in rows
              if isinstance(r, dict) and r.get("host")]
    mine = [h for role, h in hosted if role == Role.WORKER]
    if mine and (workers is None or len(mine) == n):
        w = Counter(mine)
        srv = Counter(h for role, h in hosted if role == Role.SERVER)
        return Placement(tuple(w[h] for h in mine), tuple(srv[h] for h in mine), len(w),
                         "the trace's hosts per rank")
    hosts = meta.get("hosts")
    count = max(1, len(hosts)) if isinstance(hosts, list) and hosts else 1
    return spread_over(n, s, count, "the base's hosts" if isinstance(hosts, list) and hosts
                  else "hosts unknown: one host assumed")


def spread_over(workers: int, servers: int, hosts: int, source: str) -> Placement:
    """``workers`` (and ``servers``) spread as evenly as can be over ``hosts`` hosts."""
    hosts = max(1, min(hosts, workers))
    per = [workers // hosts + (1 if i < workers % hosts else 0) for i in range(hosts)]
    srv = [servers // hosts + (1 if i < servers % hosts else 0) for i in range(hosts)]
    w = tuple(k for k in per for _ in range(k))
    s = tuple(m for k, m in zip(per, srv, strict=True) for _ in range(k))
    return Placement(w, s, hosts, source)


def per_host(workers: int, per: int, servers: int = 0) -> Placement:
    """``workers`` placed ``per`` to a host (the last host may hold fewer); servers spread
    over those hosts (`opprof model --workers-per-host`)."""
    hosts = max(1, math.ceil(workers / max(per, 1)))
    return spread_over(workers, servers, hosts, f"--workers-per-host {per}")


@dataclass(frozen=True)
class Colocation:
    """The co-location of one configuration: compute with neighbours takes ``1 + slowdown``
    times its time alone (the mean over the workers), the most crowded host's ``1 +
    max_slowdown``; the processes computing at once on a worker's host (mean); the sources."""

    slowdown: float
    max_slowdown: float
    crowd: float
    source: str
    placement: str = ""
    #: the calibration's loop ran another model than the base (a caveat to print)
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> JSONObject:
        """JSON form."""
        return {"slowdown": self.slowdown, "max_slowdown": self.max_slowdown,
                "workers_per_host": self.crowd, "source": self.source,
                "placement": self.placement, "notes": list(self.notes)}


NONE = Colocation(0.0, 0.0, 1.0, "none: one worker per host")


def colocation(curve: Curve, place: Placement, server_duty: float = 0.0,
               device: str = "cpu", notes: tuple[str, ...] = ()) -> Colocation:
    """The :class:`Colocation` of the workers ``place`` puts on hosts, by ``curve``."""
    if str(device).startswith("cuda"):
        return Colocation(0.0, 0.0, 1.0, "GPU: every worker computes on its own device",
                          place.source)
    crowds = place.crowds(server_duty)
    if not crowds:
        return NONE
    s = [curve.at(k) for k in crowds]
    return Colocation(sum(s) / len(s), max(s), sum(crowds) / len(crowds), curve.source,
                      place.source, notes)


def fit_loop(samples: pd.DataFrame, column: str = "ns") -> dict[int, list[float]]:
    """Each round's co-location ratio per count ``k`` from `opprof calibrate`'s loop (``kind:
    coloc`` samples: ``rank``, ``round``, ``k``, ``index`` of the step in its phase, ``ns``
    (wall) and ``cpu_ns``): the median step of the round's k-worker phase over the median step
    of its one-worker phase, the first step of every phase left out (it follows an idle
    wait); ``column`` ``cpu_ns`` for the steps' CPU time. k → the rounds' ratios."""
    df = samples[samples["index"] > 0] if (samples["index"] > 0).any() else samples
    med = df.groupby(["round", "k"])[column].median().unstack("k")
    if 1 not in med.columns:
        return {}
    out: dict[int, list[float]] = {}
    for k in med.columns:
        if int(k) > 1:
            ratio = (med[k] / med[1]).dropna()
            out[int(k)] = [float(v) for v in ratio if np.isfinite(v) and v > 0]
    return out


def slowdowns(ratios: dict[int, list[float]]) -> dict[int, float]:
    """``s(k)``: the median over rounds of the ratio, less 1 (may come out a little below 0 on
    a noisy host; :meth:`Curve.at` reads it as 0)."""
    return {k: float(np.median(v)) - 1.0 for k, v in sorted(ratios.items()) if v}
