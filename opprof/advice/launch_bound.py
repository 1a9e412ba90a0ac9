"""Launch-bound GPU steps: the GPU waits for the host to issue work. Evidence: the critical
path's ``launch`` share on the GPU ranks (launch calls, host operators the GPU waits for, the
framework's gaps), the device's idle share, the kernels per step and their mean length,
whether the step already replays CUDA graphs. Action: capture the step in CUDA graphs
(``torch.compile(mode="reduce-overhead")``, ``torch.cuda.graphs``) or issue fewer, larger
kernels (``torch.compile``, a larger batch). Saving: the dependency graph replayed with the
host's issue time removed on the GPU ranks (:func:`opprof.model.knobs.launch_removed`) — an
upper bound: what the graphs capture of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opprof.advice.base import Advice

if TYPE_CHECKING:
    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "launch-bound"
NEEDS: tuple[str, ...] = ("gpu",)
#: The launch share of the GPU ranks' critical paths from which a step is launch-bound.
LAUNCH_SHARE = 0.20
GRAPH_LAUNCH = r"(?i)(?:cuda|hip)GraphLaunch"
#: The gap between two kernels replayed by one CUDA graph where the trace has none of its own:
#: the median measured in fixtures/gpu/compiled-cudagraphs.pt.trace.json.gz (H200, CUDA 13,
#: 189 gaps; p10 384 ns, p90 800 ns).
GRAPH_GAP_NS = 416.0


def advise(ev: Evidence) -> list[Advice]:
    """The launch-bound advice (see the module docstring)."""
    from opprof.model.knobs import launch_removed

    c = ev.critical
    if c.empty:
        return []
    share = ev.bound_share("launch")
    if share < LAUNCH_SHARE:
        return []
    pred = launch_removed(ev.context)
    if pred is None:
        return []
    step = ev.step_ns
    dev = ev.report.devices
    idle = (float(dev["idle_ns"].sum()) / float(dev["span_ns"].sum())
            if len(dev) and "idle_ns" in dev and float(dev["span_ns"].sum()) > 0 else None)
    kern = ev.report.device_ops
    n_steps = max(len(ev.report.steps), 1)
    count = float(kern["count"].sum()) / n_steps if len(kern) else 0.0
    mean_us = (float(kern["total_ns"].sum()) / max(float(kern["count"].sum()), 1) / 1e3
               if len(kern) else None)
    graphs = ev.named(GRAPH_LAUNCH)
    gap, gap_source = _graph_gap(ev)
    # the step cannot get shorter than the device's own work in it, each kernel after the
    # graph's gap (the host may run ahead of a replay, never of the device)
    busy = _device_busy(ev)
    floor = busy + count * gap
    new = max(step - pred.saving_ns + count * gap, floor)
    saving = max(0.0, step - new)
    waits_host = (float(dev["idle_host_ns"].sum()) / float(dev["span_ns"].sum())
                  if len(dev) and "idle_host_ns" in dev and float(dev["span_ns"].sum()) > 0
                  else None)
    evidence: JSONObject = {
        "launch_share": share, "device_idle_share": idle,
        "device_waits_for_host_share": waits_host, "kernels_per_step": count,
        "mean_kernel_us": mean_us, "cuda_graphs": bool(graphs), "graph_kernel_gap_ns": gap,
        "graph_kernel_gap_source": gap_source, "replay_saving_ns": pred.saving_ns,
        "device_busy_ns_per_step": busy,
        "bound_by": {k: ev.bound_share(k) for k in
                     ("compute", "comm", "launch", "sync", "load", "idle")}}
    finding = (f"launch-bound: on the critical path the GPU waits {share:.0%} of the step for "
               f"the host to issue work ({count:,.0f} kernels per step"
               + (f", {mean_us:,.1f} µs each on average" if mean_us is not None else "")
               + (f"; the GPU idles {idle:.0%} of the time" if idle is not None else "") + ")")
    if graphs:
        action = ("the step already replays CUDA graphs: the host work left is outside them — "
                  "capture more of the step (the optimizer, the loss) or move host-side "
                  "Python out of the loop")
    else:
        action = ('capture the step in CUDA graphs (torch.compile(model, mode="reduce-overhead")'
                  " or torch.cuda.graphs), or issue fewer, larger kernels (torch.compile's "
                  "fusion, a larger batch)")
    return [Advice(NAME, finding, action, saving, saving / step, "low" if graphs else "medium",
                   evidence, pred.how + f", each kernel then {gap:,.0f} ns after the last "
                                        "(a graph's own gap), the step no shorter than the "
                                        "device's work in it; an upper bound")]


def _device_busy(ev: Evidence) -> float:
    """The device's busy time per step (its span less its idle time, ÷ the rank's steps; the
    busiest device of a rank, the mean over the ranks)."""
    dev = ev.report.devices
    steps = ev.report.steps.groupby("rank").size()
    if dev.empty or steps.empty:
        return 0.0
    busy = (dev["span_ns"] - dev["idle_ns"]).groupby(dev["rank"]).max()
    per = busy / steps.reindex(busy.index).where(lambda s: s > 0)
    per = per.dropna()
    return float(per.mean()) if len(per) else 0.0


def _graph_gap(ev: Evidence) -> tuple[float, str]:
    """The gap between consecutive kernels of one CUDA graph launch: the trace's own median
    where it replays graphs, else :data:`GRAPH_GAP_NS`."""
    import re

    import numpy as np

    from opprof.filters import device_work, names_where

    t = ev.trace.events
    graph_launch = re.compile(GRAPH_LAUNCH)
    launches = t.loc[names_where(t, lambda name: graph_launch.search(name) is not None),
                     "link"]
    launches = launches[launches >= 0]
    if len(launches):
        k = t[device_work(t) & t["link"].isin(launches)].sort_values(["rank", "tid", "ts"])
        same = ((k["link"].to_numpy()[1:] == k["link"].to_numpy()[:-1])
                & (k["tid"].to_numpy()[1:] == k["tid"].to_numpy()[:-1]))
        gaps = (k["ts"].to_numpy()[1:] - (k["ts"] + k["dur"]).to_numpy()[:-1])[same]
        gaps = gaps[gaps >= 0]
        if len(gaps) >= 10:
            return float(np.median(gaps)), "this trace's graph launches"
    return GRAPH_GAP_NS, "measured on an H200 (fixtures/gpu/compiled-cudagraphs)"
