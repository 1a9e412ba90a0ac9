"""How a pipeline splits a one-worker torch trace into stages, and the schedule's simulation:
each stage's forward and backward per micro-batch, the activations sent between stages, the
wait for a neighbour (the bubble), the optimizer per stage.

**Stages** (:func:`pp_stages`). A built-in model (`opprof record --mode pp`,
``collectors/torch_parallel.py``) is cut the way the recorder cuts it:

- the transformer: its encoder layers in ``p`` consecutive shares (``_chunk``: the first
  stages take one more when they do not divide), the first stage with the token and position
  embeddings, the last with the output head and the loss. In the trace a layer ends at its
  second ``layer_norm`` (post-norm encoder layers) and, in the backward, begins at the first
  of its two ``layer_norm`` gradients;
- the fully connected network: its linear layers (each with its ReLU) in ``p`` consecutive
  shares; a layer begins at its linear layer in the forward and ends at its gradient in the
  backward.

Any other trace is **balanced by measured time** (said in the output): the forward's
operators cut into ``p`` consecutive parts of equal typical time, the backward's likewise in
reverse (its first part is the last stage's). The optimizer splits by the stages' parameter
tensors (the ``AccumulateGrad`` of each in its backward part): on a CPU an optimizer step of
small tensors is its calls. The activation crossing each cut is the input of the next stage's
first layer (its recorded shape × 4 B), split over the micro-batches.

**The schedule** (:func:`simulate`). ``p`` stages, ``m`` micro-batches, each stage one rank;
per step a stage runs what precedes the pipeline (loading the batch), its actions in the
schedule's order and its optimizer. A forward of micro-batch ``i`` on stage ``s > 0`` starts
once stage ``s − 1`` has done it and its activation has crossed (``x``: α + n·β of the
network for its bytes); a backward on stage ``s < p − 1`` once stage ``s + 1``'s backward of
``i`` and its gradient have. GPipe runs every forward, then every backward (``F0 … Fm−1 B0 …
Bm−1``, as ``ScheduleGPipe``); 1F1B runs ``min(m, p − s)`` forwards, then alternates one
backward and one forward, then the remaining backwards (``Schedule1F1B``). Several steps are
simulated back to back (a stage starts its next step when its optimizer is done); the step is
their period. What a stage spends neither computing, loading nor updating is its ``comm``:
waiting for a neighbour's activation or gradient — the bubble — and the transfers. For equal
stages of ``f + b`` per micro-batch the pipelined part is the textbook ``(m + p − 1)·(f + b)``
(plus the transfers), the bubble share ``(p − 1) / (m + p − 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.model.baseops import FLOAT_BYTES, BaseOps, shapes

if TYPE_CHECKING:
    from opprof.arrays import Array

SCHEDULES = ("gpipe", "1f1b")
_ACCUMULATE = "AccumulateGrad"


@dataclass
class Stages:
    """How a pipeline of ``p`` stages splits a one-worker trace (module docstring)."""

    p: int
    source: str
    builtin: bool
    #: the stage of each forward / backward operator of the base (:class:`BaseOps` order)
    forward: Array
    backward: Array
    #: each stage's share of the optimizer (its parameter tensors over all)
    update_share: Array
    #: bytes of the activation crossing each cut at the base's whole batch (p − 1 of them)
    boundary_bytes: list[int]
    notes: list[str] = field(default_factory=list)


def _chunks(n: int, p: int) -> list[int]:
    """Items per stage when ``n`` items are cut into ``p`` consecutive shares (``_chunk``)."""
    per, extra = divmod(n, p)
    return [per + (1 if s < extra else 0) for s in range(p)]


def _layer_bounds(base: BaseOps, model: str | None) -> tuple[list[int], list[int]] | None:
    """The first forward position of each layer and the first backward position of each
    layer's gradient (backward order, the last layer first), for a built-in ``model``; the
    prologue (embedding) before layer 0 and the epilogue (head, loss) after the last; None when
    the trace does not show the model's layers."""
    fwd, bwd = base.of("forward"), base.of("backward")
    f_op, b_op = fwd["op"].to_numpy(), bwd["op"].to_numpy()
    if model == "transformer":
        norms = np.flatnonzero(f_op == "normalization")
        b_norms = np.flatnonzero(b_op == "normalization_backward")
        lin = np.flatnonzero(f_op == "fully_connected")
        if len(norms) < 2 or len(norms) % 2 or len(b_norms) != len(norms) or not len(lin):
            return None
        layers = len(norms) // 2
        first = int(lin[0])
        while first > 0 and f_op[first - 1] == "memory":  # attention's transpose of its input
            first -= 1
        starts = [first] + [int(norms[2 * i + 1]) + 1 for i in range(layers - 1)]
        head = int(norms[-1]) + 1
        b_starts = [int(b_norms[2 * j]) for j in range(layers)]
        emb = np.flatnonzero(b_op == "embedding_backward")
        tail = int(emb[0]) if len(emb) else len(bwd)
        while tail > b_starts[-1] + 1 and b_op[tail - 1] == "elementwise_backward":
            tail -= 1
        return [*starts, head], [*b_starts, tail]
    if model == "fcn":
        lin = np.flatnonzero(f_op == "fully_connected")
        b_lin = np.flatnonzero(b_op == "fully_connected_backward")
        if not len(lin) or len(b_lin) != len(lin):
            return None
        # backward: layer k's gradient runs from after layer k+1's linear gradient to its own
        b_starts = [0] + [int(x) + 1 for x in b_lin[:-1]]
        return [*map(int, lin), len(fwd)], [*b_starts, len(bwd)]
    return None


def pp_stages(base: BaseOps, meta: object, p: int) -> Stages:
    """The :class:`Stages` of a one-worker trace cut into ``p`` (module docstring)."""
    fwd, bwd = base.of("forward"), base.of("backward")
    get = getattr(meta, "get", None)
    framework = str(get("framework") or "") if get else ""
    model = str(get("model") or "") if get else ""
    bounds = _layer_bounds(base, model if framework == "torch" else None)
    f_stage = np.zeros(len(fwd), np.int64)
    b_stage = np.zeros(len(bwd), np.int64)
    notes: list[str] = []
    if bounds is not None and len(bounds[0]) - 1 >= p:
        f_starts, b_starts = bounds
        layers = len(f_starts) - 1
        per = _chunks(layers, p)
        first = np.cumsum([0, *per])  # first layer of each stage
        for s in range(p):
            lo = 0 if s == 0 else f_starts[first[s]]
            hi = len(fwd) if s == p - 1 else f_starts[first[s + 1]]
            f_stage[lo:hi] = s
            # backward order: the last layer first; layer k's gradient from b_starts[L-1-k]
            b_lo = 0 if s == p - 1 else b_starts[layers - first[s + 1]]
            b_hi = len(bwd) if s == 0 else b_starts[layers - first[s]]
            b_stage[b_lo:b_hi] = s
        source = (f"the built-in {model}'s split (record --mode pp): its {layers} "
                  f"{'encoder ' if model == 'transformer' else 'linear '}layers in {p} "
                  f"consecutive shares ({'/'.join(map(str, per))})")
        builtin = True
    else:
        f_stage = _balanced(fwd["dur_ns"].to_numpy(np.float64), p)
        b_stage = p - 1 - _balanced(bwd["dur_ns"].to_numpy(np.float64), p)
        source = ("balanced by measured time (the trace names no built-in model the pipeline "
                  f"could cut by layers): the forward's and backward's operators in {p} "
                  "consecutive parts of equal typical time")
        builtin = False
        if bounds is not None:
            notes.append(f"{model} has {len(bounds[0]) - 1} layers, fewer than {p} stages: "
                         "cut by time instead")
    acc = bwd["name"].str.contains(_ACCUMULATE).to_numpy()
    tensors = np.bincount(b_stage[acc], minlength=p).astype(np.float64)
    share = tensors / tensors.sum() if tensors.sum() else np.full(p, 1.0 / p)
    details = fwd["detail"].to_numpy()
    ops = fwd["op"].to_numpy()
    cross = []
    for s in range(1, p):
        idx = np.flatnonzero(f_stage == s)
        layer = [i for i in idx if ops[i] in ("fully_connected", "convolution", "attention")]
        nbytes = 0
        for i in [*layer[:1], *idx]:
            sh = shapes(details[i])
            if sh and sh[0]:
                nbytes = int(np.prod(sh[0])) * FLOAT_BYTES
                break
        cross.append(nbytes)
    if any(n == 0 for n in cross):
        notes.append("an activation between stages has no recorded shape: its transfer is "
                     "taken as the network's latency alone")
    return Stages(p, source, builtin, f_stage, b_stage, share, cross, notes)


def _balanced(dur: Array, p: int) -> Array:
    """Each operator's part when ``dur`` is cut into ``p`` consecutive parts of equal time."""
    if not len(dur):
        return np.zeros(0, np.int64)
    mid = np.cumsum(dur) - dur / 2.0
    out: Array = np.minimum((mid / max(float(dur.sum()), 1.0) * p).astype(np.int64), p - 1)
    return out


# --------------------------------------------------------------------------- the schedule


@dataclass
class StageTimes:
    """One stage's work per step (ns): per micro-batch forward and backward, the optimizer,
    and what precedes the pipeline in its step (loading the batch, the rest)."""

    forward: float
    backward: float
    update: float
    before: float


@dataclass
class Schedule:
    """A simulated pipeline step: the period, and per stage its compute, its waits (``comm``:
    the bubble and the transfers) and its transfers' own time."""

    step_ns: float
    compute: Array  # per stage: m·(f + b) + update
    comm: Array  # per stage: the step less compute and before
    transfers: Array  # per stage: the activations and gradients it received, in flight
    overlap: Array  # per stage: the share of its compute with another stage computing


def order(schedule: str, stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """One stage's actions in its schedule's order: ("F", i) and ("B", i)."""
    if schedule == "1f1b":
        warm = min(m, stages - stage)
        out: list[tuple[str, int]] = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < m:
            out.append(("B", b))
            b += 1
            if f < m:
                out.append(("F", f))
                f += 1
        return out
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


#: Draws of the jittered schedule (:func:`simulate` with ``jitter``), and their seed: fixed,
#: so a prediction is the same every time.
JITTER_DRAWS = 48
JITTER_SEED = 30


def simulate(times: list[StageTimes], m: int, x_forward: list[float],
             x_backward: list[float], schedule: str = "gpipe", steps: int = 4,
             jitter: float = 0.0) -> Schedule:
    """The period of ``steps`` pipelined steps (module docstring); ``x_forward[s]`` /
    ``x_backward[s]``: one micro-batch's activation / gradient crossing the cut after stage
    ``s``. With ``jitter`` (the relative standard deviation of one forward or backward of a
    micro-batch), the mean over :data:`JITTER_DRAWS` schedules whose every action takes its
    time × (1 + jitter · a standard normal draw, at least −0.9): stages that drift apart wait
    for each other where the schedule joins them, which the schedule of mean times does not
    show."""
    if jitter <= 0 or len(times) < 2:
        return _simulate(times, m, x_forward, x_backward, schedule, steps, None)
    rng = np.random.default_rng(JITTER_SEED)
    runs = [_simulate(times, m, x_forward, x_backward, schedule, steps,
                      np.maximum(1.0 + jitter * rng.standard_normal((steps, len(times), 2, m)),
                                 0.1))
            for _ in range(JITTER_DRAWS)]
    return Schedule(float(np.mean([r.step_ns for r in runs])),
                    runs[0].compute, np.mean([r.comm for r in runs], axis=0),
                    np.mean([r.transfers for r in runs], axis=0),
                    np.mean([r.overlap for r in runs], axis=0))


def _simulate(times: list[StageTimes], m: int, x_forward: list[float],
              x_backward: list[float], schedule: str, steps: int,
              factor: Array | None) -> Schedule:
    """One schedule (:func:`simulate`); ``factor[k, s, 0 | 1, i]``: the forward's / backward's
    time of micro-batch ``i`` on stage ``s`` in step ``k`` × it (None: 1)."""
    p = len(times)
    acts = [order(schedule, s, p, m) for s in range(p)]
    done_f = np.full((steps, p, m), np.nan)
    done_b = np.full((steps, p, m), np.nan)
    free = np.zeros(p)
    ends = np.zeros((steps, p))
    busy: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    waiting = np.zeros(p)
    for k in range(steps):
        for s in range(p):
            free[s] += times[s].before
        pending = [list(a) for a in acts]
        # run actions whose dependencies are met, stage by stage, until all are done
        while any(pending):
            progressed = False
            for s in range(p):
                while pending[s]:
                    kind, i = pending[s][0]
                    if kind == "F":
                        if s > 0 and np.isnan(done_f[k, s - 1, i]):
                            break
                        ready = done_f[k, s - 1, i] + x_forward[s - 1] if s > 0 else 0.0
                        dur = times[s].forward * (factor[k, s, 0, i] if factor is not None
                                                  else 1.0)
                    else:
                        if s < p - 1 and np.isnan(done_b[k, s + 1, i]):
                            break
                        ready = done_b[k, s + 1, i] + x_backward[s] if s < p - 1 else 0.0
                        dur = times[s].backward * (factor[k, s, 1, i] if factor is not None
                                                   else 1.0)
                    start = max(free[s], ready)
                    if k == steps - 1:
                        waiting[s] += start - free[s]
                    end = start + dur
                    busy[s].append((start, end))
                    (done_f if kind == "F" else done_b)[k, s, i] = end
                    free[s] = end
                    pending[s].pop(0)
                    progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked")  # not for valid orders
        for s in range(p):
            free[s] += times[s].update
            ends[k, s] = free[s]
    period = float(np.mean(np.diff(ends, axis=0)[1:])) if steps > 2 else float(ends[-1].max())
    compute = np.array([m * (t.forward + t.backward) + t.update for t in times])
    before = np.array([t.before for t in times])
    transfers = np.array([m * ((x_forward[s - 1] if s > 0 else 0.0)
                               + (x_backward[s] if s < p - 1 else 0.0)) for s in range(p)])
    return Schedule(period, compute, np.maximum(period - compute - before, 0.0),
                    np.minimum(transfers, np.maximum(period - compute - before, 0.0)),
                    _overlap(busy, steps))


def _overlap(busy: list[list[tuple[float, float]]], steps: int) -> Array:
    """Per stage: the share of its compute time during which another stage computed."""
    out = np.zeros(len(busy))
    for s, mine in enumerate(busy):
        others = sorted(iv for t, b in enumerate(busy) if t != s for iv in b)
        total = sum(e - a for a, e in mine)
        if not total or not others:
            continue
        starts = np.array([a for a, _ in others])
        stops = np.array([e for _, e in others])
        shared = 0.0
        for a, e in mine:
            lo = np.maximum(starts, a)
            hi = np.minimum(stops, e)
            shared += float(np.clip(hi - lo, 0.0, None).sum())
        out[s] = min(1.0, shared / total)
    return out


def ideal_bubble_share(p: int, m: int, v: int = 1) -> float:
    """The schedule's textbook bubble ``(p − 1) / (v·m + p − 1)``."""
    return (p - 1) / (v * m + p - 1) if p > 1 else 0.0


def stage_table(stages: Stages, times: list[StageTimes]) -> pd.DataFrame:
    """Per stage: its operators, its per-micro-batch times, its optimizer (for the output)."""
    return pd.DataFrame([{"stage": s, "forward_ops": int((stages.forward == s).sum()),
                          "backward_ops": int((stages.backward == s).sum()),
                          "forward_ns_per_microbatch": t.forward,
                          "backward_ns_per_microbatch": t.backward, "update_ns": t.update,
                          "update_share": float(stages.update_share[s])}
                         for s, t in enumerate(times)])
