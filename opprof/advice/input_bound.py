"""Input-bound steps: the step waits for its next batch (the ``load`` phase) or for copying it
to the device (``h2d``). Evidence: the exposed load and copy time, the loader the trace names
(PyTorch's single-process or multi-process DataLoader iterator, tf.data, MXNet's DataLoader),
pageable host-to-device copies. Action: load in worker processes that prefetch (DataLoader
``num_workers``, ``tf.data`` ``num_parallel_calls``/``prefetch``), pinned memory and
non-blocking copies. Saving: the phase model with the loading in K prefetching workers
(:func:`opprof.model.knobs.prefetch`: the research's ``max(t_compute, t_io)``), the copies
beside compute (:func:`~opprof.model.knobs.h2d_hidden`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from opprof.advice.base import Advice, Knob
from opprof.model.knobs import h2d_hidden, load_busy_ns, prefetch
from opprof.model.resources import resources

if TYPE_CHECKING:
    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "input-bound"
NEEDS: tuple[str, ...] = ()
#: Kineto's names of PyTorch's DataLoader iterators.
SINGLE = r"_SingleProcessDataLoaderIter"
MULTI = r"_MultiProcessingDataLoaderIter"
#: Most loader workers advised (past a few, workers contend for the host's cores).
MAX_WORKERS = 8


def advise(ev: Evidence) -> list[Advice]:
    """The input-bound advice (see the module docstring)."""
    out = []
    load = ev.phase_ns("load")
    step = ev.step_ns
    if load > 0 and step > 0:
        out.append(_loader(ev, load, step))
    h2d = ev.phase_ns("h2d")
    if h2d > 0 and step > 0 and ev.gpu:
        out.append(_copies(ev, h2d, step))
    return out


def _workers(ev: Evidence) -> int | None:
    """The loader workers the run used, where the trace says (None: unknown)."""
    given = ev.meta.get("loader_workers")
    if isinstance(given, int):
        return given
    if ev.named(MULTI):
        return None  # some, but the trace does not say how many
    if ev.named(SINGLE):
        return 0
    return None


def _loader(ev: Evidence, load: float, step: float) -> Advice:
    busy = load_busy_ns(ev.context)
    rest = max(step - load, 1.0)
    cpus = int(ev.meta.get("cpus") or 0) or None
    now = _workers(ev)
    # enough workers that one batch's loading, spread over them, fits beside the rest of the
    # step; at least two (one loads while the other hands its batch over); within the host
    k = max(2, math.ceil(busy / rest) + 1)
    if now:
        k = max(k, 2 * now)
    k = min(k, MAX_WORKERS, max(cpus or MAX_WORKERS, 2))
    pred = prefetch(ev.context, k)
    fw = ev.framework
    evidence: JSONObject = {"load_ns_per_step": load, "load_share": load / step,
                "load_busy_ns_per_step": busy, "rest_of_step_ns": rest,
                "loader_workers": now, "advised_workers": k, "cpus": cpus,
                "data_load_ns_per_step": float(ev.ops_per_step().get("data_load", 0.0))}
    if now is None and ev.named(MULTI):
        evidence["loader"] = "torch DataLoader with worker processes"
    elif now == 0:
        evidence["loader"] = "torch DataLoader in the training process (num_workers=0)"
    workers_text = ("none" if now == 0 else f"{now}" if now else
                    "some (the trace does not say how many)" if ev.named(MULTI) else "unknown")
    finding = (f"input-bound: the step waits {load / 1e6:,.1f} ms for its next batch "
               f"({load / step:.0%} of the step); loader workers: {workers_text}")
    if fw == "tf":
        action = (f"load in parallel and ahead: dataset.map(..., num_parallel_calls="
                  f"tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE) (about {k} parallel calls)")
    elif fw == "mxnet":
        action = f"gluon.data.DataLoader(..., num_workers={k}) so batches load ahead"
    else:
        action = (f"DataLoader(..., num_workers={k}, persistent_workers=True, "
                  "prefetch_factor=2) so batches load in worker processes ahead of the step")
        if now or (now is None and ev.named(MULTI)):
            action = (f"more DataLoader workers ({now or 'some'} → {k}) or a larger "
                      "prefetch_factor; move per-sample work (decoding, augmentation) out of "
                      "the step")
    confidence = "high" if busy / k <= rest else "medium"
    threads = resources(ev.meta).threads  # TensorFlow records its thread pools as a dict
    if not ev.gpu and threads and cpus and threads >= cpus:
        # the loader's processes would share the cores the step computes on
        confidence = "low"
        evidence["note"] = ("the step computes on every core: workers that decode on the CPU "
                            "slow it; the model assumes they do not")
    knob = Knob("--loader-workers", "loader_workers", k) if fw in ("torch", "mxnet") else None
    return Advice(NAME, finding, action, pred.saving_ns, pred.saving_ns / step, confidence,
                  evidence, pred.how, knob)


def _copies(ev: Evidence, h2d: float, step: float) -> Advice:
    pageable = ev.named(r"(?i)pageable")
    pred = h2d_hidden(ev.context)
    finding = (f"the step waits {h2d / 1e6:,.1f} ms for host-to-device copies "
               f"({h2d / step:.0%} of the step)"
               + ("; they copy from pageable memory" if pageable else ""))
    action = ("pin the batches' memory (DataLoader(pin_memory=True)) and copy them with "
              "tensor.to(device, non_blocking=True), so the copy runs beside compute")
    return Advice(NAME, finding, action, pred.saving_ns, pred.saving_ns / step,
                  "medium" if pageable else "low",
                  {"h2d_ns_per_step": h2d, "h2d_share": h2d / step,
                   "pageable_copies": pageable[:3]}, pred.how)
