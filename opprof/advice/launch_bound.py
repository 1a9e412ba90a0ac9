"""Launch-bound GPU steps: the GPU waits for the host to issue work. Evidence: the critical
path's ``launch`` share on the GPU ranks (launch calls, host operators the GPU waits for, the
framework's gaps), the device's idle share, the kernels per step and their mean length,
whether the step already replays CUDA graphs. Action: capture the step in CUDA graphs
(``torch.compile(mode="reduce-overhead")``, ``torch.cuda.graphs``) or issue fewer, larger
kernels (``torch.compile``, a larger batch). Saving: the dependency graph replayed with the
host's issue time removed on the GPU ranks (:func:`opprof.analysis.knobs.launch_removed`) — an
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
GRAPH_LAUNCH = r"(?i)(cuda|hip)GraphLaunch"


def advise(ev: Evidence) -> list[Advice]:
    """The launch-bound advice (see the module docstring)."""
    from opprof.analysis.knobs import launch_removed

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
    waits_host = (float(dev["idle_host_ns"].sum()) / float(dev["span_ns"].sum())
                  if len(dev) and "idle_host_ns" in dev and float(dev["span_ns"].sum()) > 0
                  else None)
    evidence: JSONObject = {"launch_share": share, "device_idle_share": idle,
                "device_waits_for_host_share": waits_host,
                "kernels_per_step": count, "mean_kernel_us": mean_us,
                "cuda_graphs": bool(graphs),
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
    return [Advice(NAME, finding, action, pred.saving_ns, pred.saving_ns / step, "low"
                   if graphs else "medium", evidence, pred.how + "; an upper bound")]
