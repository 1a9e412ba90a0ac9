"""The communication model: a latency–bandwidth (α–β) cost per collective — ring all-reduce
and parameter-server push/pull over S servers — fitted from measured collectives.

Costs of moving ``n`` bytes of gradients among ``N`` workers (Thakur et al.'s ring, and the
parameter server of Li et al.)::

    ring all-reduce:   T(n) = 2(N−1)·α + 2(N−1)/N · n · β
    PS push + pull:    T(n) = 2·α + 2 · max(1, N/S) · n · β
    ring all-gather / reduce-scatter (FSDP, ``fsdp``): T(n) = (N−1)·α + (N−1)/N · n · β

α is the per-message latency (ns) and β the time per byte (ns/B, 1/β the bandwidth). The
ring sends 2(N−1) messages of n/N bytes per worker; with a parameter server every worker pushes
its n bytes and pulls n bytes back, and each of the S servers (keys split evenly over them)
receives and sends N·n/S bytes, so the busiest link moves 2·max(n, N·n/S). With N = 1 nothing
is exchanged in a ring (T = 0); a single worker's parameter server still pushes and pulls.
For ``fsdp`` n is the unit's unsharded parameter bytes: each rank sends and receives (N−1)
shards of n/N. Its network holds the all-gather's α and β, and the reduce-scatter's in
``info["reduce_scatter"]`` (a backend may implement it otherwise: gloo reduces the whole
buffer, so its fitted β is about twice the all-gather's), with ``info["copy_ns_per_byte"]``
for FSDP's copy-in/copy-out around each collective.

**The measured curve** (:func:`on_curve`): where a network holds its measured sizes (a
calibration, or a trace's own collectives), a collective of a size inside their range costs
what was measured — linear between the two nearest sizes' median times, the last two sizes'
slope beyond the largest — moved to another N (or S) by the ratio of the α–β costs; α–β
alone below the smallest size and where there are fewer than two sizes. A straight α–β line
misses how a host's cost per byte grows once the buffers outgrow its caches (on this
project's machine the 64 MiB times of 25 calibrations were 0.8–15× the fitted line's, median
2.4×).

**Fitting** (:func:`fit`): measured (bytes, ns) pairs are reduced to the median time per
message size (or the mean, for FSDP's calls timed as in training), then α and β are the
least-squares solution of the cost equation above over those sizes, weighted by 1/time (each
size counts by its relative error, so small messages pin α and large ones β), re-weighted
three times with Huber weights (residuals beyond 1.5× the median absolute residual count
less) and kept non-negative. With a single message size α cannot be told from β: α is set to
0 and β fitted alone, and the fit says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
import pandas as pd

from opprof import kinds
from opprof.errors import ErrorKind, OpprofError
from opprof.kinds import Collective

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.jsontypes import JSONObject

COLLECTIVES = Collective.values()
FORMAT = 1
#: The network assumed when neither a calibration nor the trace's own collectives give one:
#: a 10 Gb/s Ethernet link (1.25 GB/s) with TCP latency of 25 µs.
ASSUMED: dict[str, float | str] = {"alpha_ns": 25_000.0, "beta_ns_per_byte": 0.8,
                                   "name": "10 Gb/s Ethernet (assumed)"}


def collective_of(mode: str) -> Collective:
    """The collective a distributed mode uses (:func:`opprof.kinds.collective_of`): ``allreduce``
    (zero: DDP's all-reduce of the gradients; the update on the shard), ``ps`` or ``fsdp``."""
    collective = kinds.collective_of(mode)
    if collective is not None:
        return collective
    raise OpprofError(f"mode {mode!r} has no collective model; choose allreduce, fsdp, zero, "
                      "ps-sync or ps-async")


def design(nbytes: Array, collective: str, workers: int,
           servers: int = 1) -> tuple[Array, Array]:
    """The (α, β) coefficients of the cost equation for each message size."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    if collective == Collective.ALLREDUCE:
        return (np.full_like(nbytes, 2.0 * (workers - 1)),
                2.0 * (workers - 1) / max(workers, 1) * nbytes)
    if collective == Collective.PS:
        return np.full_like(nbytes, 2.0), 2.0 * max(1.0, workers / max(servers, 1)) * nbytes
    if collective == Collective.FSDP:
        return (np.full_like(nbytes, float(workers - 1)),
                (workers - 1) / max(workers, 1) * nbytes)
    raise OpprofError(f"unknown collective {collective!r}; choose {', '.join(COLLECTIVES)}")


class Sample(TypedDict):
    """One measured message size of a network: its calls' median time and the α–β fit's."""

    bytes: int
    ns: float
    calls: int
    predicted_ns: float


class FitQuality(TypedDict, total=False):
    """How well α–β fits the measured sizes (empty for an assumed network)."""

    points: int  # message sizes
    calls: int
    rel_rmse: float
    max_rel_error: float
    note: str
    center: str  # each size's time: its calls' median (or mean)


@dataclass
class Network:
    """α (ns per message) and β (ns per byte) of one collective, and where they came from."""

    collective: str
    alpha_ns: float
    beta_ns_per_byte: float
    workers: int = 2
    servers: int = 0
    backend: str = ""
    framework: str = ""
    source: str = ""  # calibrate / trace / assumed
    samples: list[Sample] = field(default_factory=list)
    fit: FitQuality = field(default_factory=lambda: FitQuality())
    info: dict[str, Any] = field(default_factory=dict)  # what the calibration measured too

    @property
    def bandwidth_Bps(self) -> float | None:
        """1/β in bytes per second."""
        return 1e9 / self.beta_ns_per_byte if self.beta_ns_per_byte > 0 else None

    def cost_ns(self, nbytes: float | Array, workers: int,
                servers: int = 1) -> Array:
        """Predicted time of one collective of ``nbytes`` among ``workers`` (and ``servers``):
        the measured curve where the network has one (:func:`on_curve`), else α–β."""
        n = np.asarray(nbytes, dtype=np.float64)
        if self.collective in (Collective.ALLREDUCE, Collective.FSDP) and workers <= 1:
            return np.zeros_like(n)
        return self._cost(n, workers, servers, self.alpha_ns, self.beta_ns_per_byte,
                          self.samples)

    def kind_cost_ns(self, kind: str, nbytes: float, workers: int) -> float:
        """``fsdp``: one ``all_gather`` or ``reduce_scatter`` of a unit of ``nbytes``
        (unsharded) among ``workers``; the reduce-scatter's α–β (and measured curve) from
        ``info`` (else the all-gather's)."""
        if workers <= 1:
            return 0.0
        rs = self.info.get("reduce_scatter") or {}
        if kind == "reduce_scatter" and rs:
            alpha = float(rs.get("alpha_ns", self.alpha_ns))
            beta = float(rs.get("beta_ns_per_byte", self.beta_ns_per_byte))
            samples = list(rs.get("samples") or [])
        else:
            alpha, beta, samples = self.alpha_ns, self.beta_ns_per_byte, self.samples
        return float(self._cost(np.array([float(nbytes)]), workers, 1, alpha, beta,
                                samples)[0])

    def _cost(self, n: Array, workers: int, servers: int, alpha: float, beta: float,
              samples: list[Sample]) -> Array:
        a, b = design(n, self.collective, workers, servers)
        cost = a * alpha + b * beta
        if len(samples) < 2:
            return cost
        # the measured curve, moved to this N (and S) by the α–β model's ratio
        a0, b0 = design(n, self.collective, max(self.workers, 1), max(self.servers, 1))
        at_own = a0 * alpha + b0 * beta
        curve = on_curve(samples, n)
        scale = np.divide(cost, at_own, out=np.ones_like(cost), where=at_own > 0)
        return np.where(np.isnan(curve), cost, curve * scale)

    def to_dict(self) -> JSONObject:
        """The JSON form (``opprof calibrate -o net.json`` writes it)."""
        d = {"opprof_network": FORMAT, **asdict(self)}
        d["bandwidth_Bps"] = self.bandwidth_Bps
        return d

    @classmethod
    def from_dict(cls, d: object, where: str = "network") -> Network:
        """Read the JSON form back; a clear error for anything else."""
        if not isinstance(d, dict) or "opprof_network" not in d:
            raise OpprofError("not an opprof network file (write one with "
                              "`opprof calibrate`)", path=where, kind=ErrorKind.NOT_A_TRACE)
        if int(d["opprof_network"]) > FORMAT:
            raise OpprofError(f"network format {d['opprof_network']} is newer than "
                              f"this opprof reads ({FORMAT})", path=where, kind=ErrorKind.NEWER)
        try:
            net = cls(collective=str(d["collective"]), alpha_ns=float(d["alpha_ns"]),
                      beta_ns_per_byte=float(d["beta_ns_per_byte"]),
                      workers=int(d.get("workers", 2)), servers=int(d.get("servers", 0)),
                      backend=str(d.get("backend", "")), framework=str(d.get("framework", "")),
                      source=str(d.get("source", "")), samples=list(d.get("samples", [])),
                      fit=cast("FitQuality", dict(d.get("fit", {}))),  # (as written)
                      info=dict(d.get("info", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise OpprofError(f"damaged network file ({exc})",
                              path=where, kind=ErrorKind.DAMAGED) from None
        if net.collective not in COLLECTIVES:
            raise OpprofError(f"unknown collective {net.collective!r}",
                              path=where, kind=ErrorKind.DAMAGED)
        if not (net.alpha_ns >= 0 and net.beta_ns_per_byte >= 0):
            raise OpprofError("α and β must be non-negative", path=where, kind=ErrorKind.DAMAGED)
        return net


def on_curve(samples: list[Sample], nbytes: Array) -> Array:
    """The measured time of a collective of each size in ``nbytes``: linear between the
    measured sizes (their median times), the last two sizes' slope beyond the largest; NaN
    below the smallest (where α–β stands in)."""
    pts = sorted((float(s["bytes"]), float(s["ns"])) for s in samples
                 if s.get("bytes") and s.get("ns"))
    n = np.asarray(nbytes, dtype=np.float64)
    if len(pts) < 2:
        return np.full(n.shape, np.nan)
    x = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    slope = max(0.0, (y[-1] - y[-2]) / (x[-1] - x[-2]))
    out = np.where(n > x[-1], y[-1] + (n - x[-1]) * slope, np.interp(n, x, y))
    return np.where(n < x[0], np.nan, out)


#: A fit whose prediction is off by more than this at any measured size is flagged.
FIT_LIMIT = 0.20


def fit_errors(net: Network) -> list[tuple[int, float]]:
    """(bytes, relative error of the α–β fit) for each measured size, in size order."""
    return [(int(s["bytes"]), (float(s["predicted_ns"]) - float(s["ns"])) / float(s["ns"]))
            for s in net.samples if s.get("ns") and s.get("predicted_ns") is not None]


def assumed(collective: str) -> Network:
    """The default network (``ASSUMED``) for a collective."""
    return Network(collective, float(ASSUMED["alpha_ns"]), float(ASSUMED["beta_ns_per_byte"]),
                   workers=2, source="assumed", backend=str(ASSUMED["name"]))


def fit(samples: pd.DataFrame, collective: str, workers: int, servers: int = 1,
        center: str = "median", **fields: Any) -> Network:
    """Fit α and β to measured collectives (columns ``bytes``, ``ns``) of ``workers`` workers
    (see the module docstring): each size's time is the ``center`` (``median``, or ``mean``
    where rare long calls are part of the cost) of its calls. Extra keyword fields go into
    the Network."""
    s = samples[(samples["bytes"] > 0) & (samples["ns"] > 0)]
    if s.empty:
        raise OpprofError("no collective with a known size and duration to fit α and β to")
    if collective in (Collective.ALLREDUCE, Collective.FSDP) and workers < 2:
        raise OpprofError("a collective among one worker moves nothing; α and β need at least "
                          "two workers")
    g = s.groupby("bytes")["ns"]
    pts = pd.DataFrame({"ns": g.mean() if center == "mean" else g.median(),
                        "calls": g.size()}).reset_index()
    x = pts["bytes"].to_numpy(np.float64)
    y = pts["ns"].to_numpy(np.float64)
    a, b = design(x, collective, workers, servers)
    note = ""
    if len(pts) == 1:
        alpha, beta = 0.0, float(y[0] / b[0]) if b[0] > 0 else 0.0
        note = "one message size: α cannot be told from β, so α = 0"
    else:
        alpha, beta = _robust_fit(a, b, y)
    pred = a * alpha + b * beta
    rel = (pred - y) / y
    fit_info: FitQuality = {"points": int(len(pts)), "calls": int(pts["calls"].sum()),
                            "rel_rmse": float(np.sqrt(np.mean(rel ** 2))),
                            "max_rel_error": float(np.max(np.abs(rel))), "note": note,
                            "center": center}
    samples_out: list[Sample] = [
        {"bytes": int(r.bytes), "ns": float(r.ns), "calls": int(r.calls),
         "predicted_ns": float(p)} for r, p in zip(pts.itertuples(), pred, strict=True)]
    return Network(collective, float(alpha), float(beta), workers=workers,
                   servers=servers if collective == Collective.PS else 0, samples=samples_out,
                   fit=fit_info, **fields)


def _robust_fit(a: Array, b: Array, y: Array) -> tuple[float, float]:
    """Relative-error least squares of y ≈ α·a + β·b with Huber re-weighting, α, β ≥ 0."""
    w = 1.0 / y
    for _ in range(4):
        alpha, beta = _nnls2(a * w, b * w, y * w)
        r = np.abs((a * alpha + b * beta - y) / y)
        scale = 1.5 * max(float(np.median(r)), 1e-3)
        w = (1.0 / y) * np.where(r <= scale, 1.0, np.sqrt(scale / np.maximum(r, 1e-12)))
    return alpha, beta


def _nnls2(a: Array, b: Array, y: Array) -> tuple[float, float]:
    """min ||α·a + β·b − y|| with α, β ≥ 0 (two unknowns: check the faces)."""
    m = np.column_stack([a, b])
    sol, *_ = np.linalg.lstsq(m, y, rcond=None)
    if sol[0] >= 0 and sol[1] >= 0:
        return float(sol[0]), float(sol[1])
    best = (math.inf, 0.0, 0.0)
    for alpha, beta in ((0.0, _ls1(b, y)), (_ls1(a, y), 0.0)):
        err = float(np.sum((a * alpha + b * beta - y) ** 2))
        if err < best[0]:
            best = (err, alpha, beta)
    return best[1], best[2]


def _ls1(x: Array, y: Array) -> float:
    den = float(np.dot(x, x))
    return max(0.0, float(np.dot(x, y)) / den) if den > 0 else 0.0
