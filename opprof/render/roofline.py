"""The roofline chart: each operator at its arithmetic intensity and achieved FLOP/s, under the
machine's ceilings — in the HTML report (plotly) and as `opprof plot --figure roofline`
(matplotlib). It draws what :mod:`opprof.analysis.roofline` computed; nothing is computed here
but the ceilings' lines, ``min(peak FLOP/s, intensity × peak bytes/s)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.render.units import flops_rate, rate, share

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from opprof.analysis.efficiency import Efficiency
    from opprof.analysis.report import Report
    from opprof.arrays import Array

BOUND_COLORS = {"compute": "#1b7837", "memory": "#2166ac", "latency-overhead": "#b2182b",
                "": "#777777"}


def points(eff: Efficiency) -> pd.DataFrame:
    """The operators a roofline chart shows: those with an intensity and a rate (op, phase,
    intensity, achieved_flops_per_s, time_ns_per_step, bound, label)."""
    r = eff.roofline
    if r.empty:
        return r
    ok = (r["intensity"] > 0) & (r["achieved_flops_per_s"] > 0)
    out = r[ok].copy()
    out["label"] = out["op"].astype(str)
    return out.reset_index(drop=True)


def ceilings(eff: Efficiency, x: Array) -> list[tuple[str, Array]]:
    """(name, FLOP/s at each intensity of ``x``) of the machine's ceilings: the matmul peak of
    the run's precision and the vector peak, each under the bandwidth's slope."""
    peak = eff.peak
    out: list[tuple[str, Array]] = []
    bw = peak.bytes_per_s
    for name, p in ((f"{peak.precision or 'matmul'} peak", peak.flops_per_s),
                    ("vector peak", peak.vector_flops_per_s)):
        if not p:
            continue
        if out and p == peak.flops_per_s:
            continue
        y = np.minimum(p, x * bw) if bw else np.full(len(x), p)
        out.append((f"{name} {flops_rate(p)}" + (f", {rate(bw)}" if bw else ""), y))
    return out


def span(pts: pd.DataFrame, eff: Efficiency) -> Array:
    """The intensities a chart's ceilings are drawn over: the points' and a decade around
    the ridge."""
    lo = float(pts["intensity"].min()) if len(pts) else 0.01
    hi = float(pts["intensity"].max()) if len(pts) else 100.0
    if eff.peak.flops_per_s and eff.peak.bytes_per_s:
        ridge = eff.peak.flops_per_s / eff.peak.bytes_per_s
        lo, hi = min(lo, ridge / 10), max(hi, ridge * 10)
    return np.logspace(np.log10(max(lo / 2, 1e-4)), np.log10(hi * 2), 200)


def figure(traces: list[tuple[str, Report]], top: int) -> Figure:
    """`opprof plot --figure roofline`: one panel per trace."""
    from matplotlib.figure import Figure

    from opprof.errors import OpprofError

    effs = [(name, rep.efficiency) for name, rep in traces if rep.efficiency is not None]
    if not effs:
        raise OpprofError("nothing to plot: no trace holds operator shapes (no FLOPs)")
    fig = Figure(figsize=(5.2 * len(effs), 4.2), layout="constrained")
    axes: Any = fig.subplots(1, len(effs), squeeze=False)[0]
    for ax, (name, eff) in zip(axes, effs, strict=True):
        assert eff is not None
        pts = points(eff).nlargest(top, "time_ns_per_step") if len(points(eff)) else points(eff)
        x = span(pts, eff)
        for label, y in ceilings(eff, x):
            ax.plot(x, y, color="#333333", lw=1.2, ls="--" if "vector" in label else "-",
                    label=label)
        for bound, g in pts.groupby("bound", sort=False):
            size = 20 + 300 * g["time_ns_per_step"] / max(float(pts["time_ns_per_step"].max()),
                                                          1.0)
            ax.scatter(g["intensity"], g["achieved_flops_per_s"], s=size, alpha=0.8,
                       color=BOUND_COLORS.get(str(bound), "#777777"),
                       label=str(bound) or "unbounded")
            for _, r in g.iterrows():
                ax.annotate(str(r["label"]), (r["intensity"], r["achieved_flops_per_s"]),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("achieved FLOP/s")
        mfu = f", MFU {share(eff.mfu)}" if eff.mfu is not None else ""
        ax.set_title(f"{name}{mfu}")
        ax.legend(fontsize=7, loc="lower right")
    return fig
