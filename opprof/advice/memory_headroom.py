"""Memory headroom: the step uses a small part of the memory it could, so a larger batch fits
and shares the step's fixed costs (the update, the gradients' communication, per-step
overheads) among more samples. Evidence: the device's capacity (the GPU's total memory, from
the trace) or the host's memory available when the run started, the run's peak, the memory one
batch takes (the allocator's peak while profiling on a CPU; on a GPU the allocator's peak less
the parameters, their gradients and the optimizer's state), the batch size. Action: a batch k×
larger (k a power of two that fits in 80% of the capacity). Saving: the phase model with the
per-sample phases × k and the update once, per sample
(:func:`opprof.model.knobs.batched`); the exposed communication is kept per sample (its
amortization is the exposed-communication rule's gradient accumulation, not counted twice).
A pipeline-parallel job is left to the pipeline rules: its larger batch is more micro-batches."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from opprof.advice.base import Advice, Knob
from opprof.model.knobs import batched

if TYPE_CHECKING:
    import pandas as pd

    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "memory-headroom"
NEEDS: tuple[str, ...] = ("memory",)
#: The part of the capacity a larger batch may fill.
FILL = 0.8
#: The largest factor advised at once.
MAX_FACTOR = 2
#: On a GPU, the parameters, their gradients and the optimizer's state: this × the
#: parameters' bytes (Adam keeps two moments).
STATE_COPIES = 4


def advise(ev: Evidence) -> list[Advice]:
    """The memory-headroom advice (see the module docstring)."""
    mem = ev.report.memory.ranks
    if mem.empty or ev.pipeline_job:
        # a pipeline's larger batch is more micro-batches: the pipeline rule's question
        return []
    workers = mem[mem["role"] == "worker"]
    if workers.empty:
        return []
    sized = _gpu(ev, workers) if ev.gpu else _host(ev, workers)
    if sized is None:
        return []
    capacity, used, per_batch, evidence = sized
    if per_batch <= 0 or capacity <= 0:
        return []
    room = FILL * capacity - used
    k_max = 1.0 + room / per_batch
    if k_max < 2:
        return []
    k = min(MAX_FACTOR, 2 ** int(math.floor(math.log2(k_max))))
    # the communication's share of the step stays per sample here: amortizing it over more
    # samples is the exposed-communication advice's (accumulation), not counted twice
    pred = batched(ev.context, k, ev.phase_ns("comm"))
    step = ev.step_ns
    batch = ev.meta.get("batch_size")
    evidence.update({"capacity_bytes": capacity, "used_bytes": used,
                     "batch_bytes": per_batch, "fits_batches": k_max, "factor": k,
                     "batch_size": batch})
    size = f"batch size {batch} → {k * int(batch)}" if batch else f"a batch {k}× larger"
    finding = (f"memory headroom: the run uses {used / 2 ** 30:,.2f} GiB of "
               f"{capacity / 2 ** 30:,.2f} GiB "
               f"({evidence['capacity']}); one batch takes about {per_batch / 2 ** 20:,.0f} "
               f"MiB, so about {k_max:,.1f}× the batch fits in {FILL:.0%} of it")
    action = (f"{size}: the update and the step's fixed costs are then paid once per "
              f"{k}× the samples (scale the learning rate with the batch)")
    knob = Knob("--batch-size", "batch_size", k * int(batch)) if batch else None
    return [Advice(NAME, finding, action, pred.saving_ns, pred.saving_ns / step if step else
                   0.0, "low", evidence, pred.how, knob)]


def _number(v: object) -> float | None:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) and f > 0 else None


def _host(ev: Evidence, workers: pd.DataFrame
          ) -> tuple[float, float, float, JSONObject] | None:
    host = ev.meta.get("host_memory")
    if not isinstance(host, dict):
        return None
    available = _number(host.get("available_bytes"))
    if available is None:
        return None
    rss = workers["peak_rss_bytes"].map(_number).dropna()
    alloc = workers["peak_allocated_bytes"].map(_number).dropna()
    if rss.empty or alloc.empty:
        return None
    used = float(rss.sum())  # every worker of the job (one host)
    per_batch = float(alloc.sum())
    # what the host could hold: what was free when the run started, and what the run took
    capacity = available
    return capacity, used, per_batch, {
        "capacity": "the host's memory available when the run started",
        "batch_bytes_source": "the CPU allocator's peak while profiling (what the steps "
                              "allocated)"}


def _gpu(ev: Evidence, workers: pd.DataFrame
         ) -> tuple[float, float, float, JSONObject] | None:
    capacity = _number(ev.meta.get("gpu_memory_bytes"))
    if capacity is None:
        return None
    on_gpu = workers[workers["allocated_device"].astype(str).str.startswith("cuda")]
    if on_gpu.empty:
        return None
    r = on_gpu.loc[on_gpu["peak_reserved_bytes"].map(_number).fillna(0).idxmax()]
    reserved = _number(r["peak_reserved_bytes"]) or _number(r["peak_allocated_bytes"])
    allocated = _number(r["peak_allocated_bytes"])
    params = _number(r["param_bytes"]) or _number(ev.meta.get("param_bytes")) or 0.0
    if reserved is None or allocated is None:
        return None
    per_batch = allocated - STATE_COPIES * params
    return capacity, reserved, per_batch, {
        "capacity": "the GPU's memory",
        "batch_bytes_source": f"the allocator's peak less {STATE_COPIES} × the parameters "
                              "(parameters, gradients, optimizer state)"}
