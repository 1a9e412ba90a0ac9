"""Pipeline parallelism: per stage and step, the schedule, the micro-batches, the forward and
backward time of each, and the bubble — the time the stage waits for its neighbour.

A rank is a pipeline stage when its steps send or receive (``send`` / ``recv``: the
activations going forward, the gradients coming back). Per rank and step:

- **chunks**: the micro-batch actions the stage ran, in order. ``torch.distributed.pipelining``
  marks them where its schedule does (``Forward 3`` / ``Backward 3`` in ``ScheduleGPipe``,
  ``PP:2F3`` — stage 2, forward, micro-batch 3 — in the interleaved and looped schedules):
  each such range is a chunk. ``ScheduleDualPipeV`` runs a forward and another stage's
  backward in one range (``PP:(0F3;3B1)OVERLAP_F_B``), one after the other on CPU: the range
  is cut where the first operator of the second action's phase starts (none: the first
  action's to its end), each part a chunk. Elsewhere (``Schedule1F1B``, a pipeline written by
  hand with ``dist.send`` / ``dist.recv``) a chunk is a run of forward (or backward) operators
  on the stage's threads that no send or receive and no switch between forward and backward
  interrupts and that runs a layer of the model (not only copies or element-wise work, such
  as making the batch or a receive buffer), numbered in order;
- **forward / backward per micro-batch**: the wall time inside each chunk that the step's
  breakdown gives to compute (forward, backward or update: :mod:`opprof.walltime`), so a
  receive waited for inside a chunk is not counted as its compute;
- **bubble** (``bubble_ns``): the instants of the step the breakdown gives to ``comm`` while
  a send or receive is in flight or being waited for — the stage idle because its neighbour
  has not sent what it needs, or has not taken what it sent (a subset of the ``comm`` phase:
  never forward, backward or update);
- **microbatches**: the forward chunks of the step per stage the rank holds;
- **schedule** (the job's, from the order of the chunks of every stage): ``gpipe`` when every
  stage runs all its forwards before its backwards, ``1f1b`` when a stage alternates them;
  with several stages per rank (``PP:`` markers), ``interleaved-1f1b`` or ``looped-bfs``; with
  split backwards (``I`` / ``W`` actions), ``zero-bubble``; with a forward and a backward run
  as one action (``OVERLAP_F_B``), ``dualpipev``;
- **stage**: the rank's place in its pipeline group (``meta.parallelism["pp"]``), or the
  stage the ``PP:`` markers name (several for a looped schedule);
- **ideal_bubble_share**: the schedule's textbook bubble, ``(p − 1) / (v·m + p − 1)`` for ``p``
  stages, ``m`` micro-batches and ``v`` stages per rank, beside the measured
  ``bubble_share`` (bubble / step).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.filters import counted, markers, on_host, workers
from opprof.intervals import Sweep
from opprof.trace import Trace
from opprof.walltime import (
    COMM_CODE,
    COMPUTE_CODES,
    PRIORITY,
    RankArrays,
    blocked_in_comm,
    functional_waits,
)

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.meta import MetaMapping

#: One row per (rank, step) of a pipeline stage (what ``--by pipeline`` shows).
COLUMNS = ["rank", "step", "stage", "stages", "schedule", "microbatches", "bubble_ns",
           "bubble_share", "step_ns", "forward_ns", "backward_ns", "forward_ns_per_microbatch",
           "backward_ns_per_microbatch", "microbatch_forward_ns", "microbatch_backward_ns",
           "order", "ideal_bubble_share"]
P2P = ("send", "recv")
_GPIPE_MARK = re.compile(r"^(Forward|Backward) (\d+)$")
_PP_MARK = re.compile(r"^PP:(\d+)(F|B|I|W)(\d+)$")
#: ``PP:(0F3;3B1)OVERLAP_F_B``: actions run one after the other inside one range.
_OVERLAP_MARK = re.compile(r"^PP:\(((?:\d+[FBIW]\d+;?)+)\)OVERLAP_F_B$")
_ACTION = re.compile(r"(\d+)([FBIW])(\d+)")
_FB = {"Forward": "F", "Backward": "B"}
#: Operators that run no layer of the model (copies, element-wise work, a loop's own).
_NOT_LAYER = ["memory", "memory_backward", "elementwise", "elementwise_backward", "other",
              "data_load", "h2d", "comm"]


def pipeline_part(trace: Trace) -> pd.DataFrame:
    """The chunks of every pipeline stage among the ranks of ``trace`` (usually one): one row
    per (rank, step, chunk) with its kind (F, B, I, W), stage, micro-batch, compute ns, and
    per (rank, step) the bubble (rows of kind ``-``); :func:`combine_pipeline` makes the
    table."""
    ev = trace.events
    worker = workers(ev)
    p2p = worker & counted(ev) & ev["op"].isin(P2P) & (ev["step"] >= 0)
    if not p2p.any():
        return pd.DataFrame(columns=_PART)
    bounds = trace.step_bounds()
    phased = ev["phase"].isin(PRIORITY)
    ops = ev.loc[worker & counted(ev) & phased, ["rank", "pid", "tid", "ts", "dur", "device",
                                                 "phase", "op", "name", "step"]]
    marks = ev.loc[worker & markers(ev), ["rank", "pid", "tid", "ts", "dur", "phase", "name",
                                          "step"]]
    blocked = blocked_in_comm(ops, functional_waits(ev))
    rows = []
    for rank in sorted(ev.loc[p2p, "rank"].unique()):
        b = bounds[bounds["rank"] == rank].sort_values("start")
        if b.empty:
            continue
        rows.append(_rank_part(int(rank), b, ops[ops["rank"] == rank],
                               marks[marks["rank"] == rank], blocked[blocked["rank"] == rank]))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=_PART)


_PART = ["rank", "step", "kind", "stage", "mb", "start", "end", "compute_ns", "bubble_ns",
         "step_ns", "paired"]
_CHUNK = ["kind", "stage", "mb", "start", "end", "paired"]


def _rank_part(rank: int, b: pd.DataFrame, o: pd.DataFrame, m: pd.DataFrame,
               blk: pd.DataFrame) -> pd.DataFrame:
    """One rank's chunks and bubbles (see :func:`pipeline_part`)."""
    phase_marks = m[m["phase"].isin(PRIORITY)]
    a = RankArrays.of(b, o, phase_marks, blk)
    chunks = _marked_chunks(m, o)
    if chunks.empty:
        chunks = _op_chunks(o)
    sweep = Sweep(a.starts, a.ends, a.s_start, a.s_end,
                  chunks["start"].to_numpy(np.int64), chunks["end"].to_numpy(np.int64))
    winner = a.winners(sweep)
    n = len(b)
    step_i = sweep.bins(a.s_start, a.s_end)
    is_p2p = np.concatenate([o["op"].isin(P2P).to_numpy(bool), np.zeros(len(phase_marks), bool)])
    p2p = a.cover(sweep, is_p2p & a.is_op)
    bubble = sweep.total((winner == COMM_CODE) & p2p, step_i, n)
    compute = np.isin(winner, COMPUTE_CODES)
    steps = b["step"].to_numpy(np.int64)
    out = [pd.DataFrame({"rank": rank, "step": steps, "kind": "-", "stage": -1, "mb": -1,
                         "start": a.s_start, "end": a.s_end, "compute_ns": 0,
                         "bubble_ns": bubble, "step_ns": a.s_end - a.s_start,
                         "paired": False})]
    if len(chunks):
        chunks = chunks.sort_values("start", kind="stable").reset_index(drop=True)
        # chunks of one rank do not overlap (one thread runs them): bins of the sweep
        c_end = np.maximum.accumulate(chunks["end"].to_numpy(np.int64))
        c_start = chunks["start"].to_numpy(np.int64)
        keep = np.r_[True, c_start[1:] >= c_end[:-1]]
        chunks = chunks[keep].reset_index(drop=True)
        c_i = sweep.bins(chunks["start"].to_numpy(np.int64), chunks["end"].to_numpy(np.int64))
        comp = sweep.total(compute, c_i, len(chunks))
        s_of = np.searchsorted(a.s_start, chunks["start"].to_numpy(np.int64), side="right") - 1
        inside = (s_of >= 0) & (chunks["start"].to_numpy(np.int64)
                                < a.s_end[np.maximum(s_of, 0)])
        out.append(pd.DataFrame({
            "rank": rank, "step": steps[np.maximum(s_of, 0)][inside],
            "kind": chunks["kind"].to_numpy(object)[inside],
            "stage": chunks["stage"].to_numpy(np.int64)[inside],
            "mb": chunks["mb"].to_numpy(np.int64)[inside],
            "start": chunks["start"].to_numpy(np.int64)[inside],
            "end": chunks["end"].to_numpy(np.int64)[inside],
            "compute_ns": comp[inside], "bubble_ns": 0, "step_ns": 0,
            "paired": chunks["paired"].to_numpy(bool)[inside]}))
    return pd.concat(out, ignore_index=True)[_PART]


def _marked_chunks(m: pd.DataFrame, o: pd.DataFrame) -> pd.DataFrame:
    """The micro-batch actions ``torch.distributed.pipelining`` marks (``Forward 3``,
    ``PP:2F3``, ``PP:(0F3;3B1)OVERLAP_F_B`` cut by the operators ``o``): kind, stage (-1: not
    named), micro-batch, start, end, paired (run in one range with another action)."""
    if m.empty:
        return pd.DataFrame(columns=_CHUNK)
    names = m["name"].astype(str)
    g = names.str.extract(_GPIPE_MARK)
    p = names.str.extract(_PP_MARK)
    both = names.str.extract(_OVERLAP_MARK)[0]
    is_g, is_p = g[0].notna().to_numpy(), p[0].notna().to_numpy()
    is_both = both.notna().to_numpy()
    use_p = is_p.any() or is_both.any()
    sel = is_p if use_p else is_g
    ts = m["ts"].to_numpy(np.int64)
    end = ts + m["dur"].to_numpy(np.int64)
    if use_p:
        kind = p[1].to_numpy(object)[sel]
        stage = p[0].to_numpy(object)[sel].astype(np.int64)
        mb = p[2].to_numpy(object)[sel].astype(np.int64)
    else:
        kind = np.array([_FB[k] for k in g[0].to_numpy(object)[sel]], dtype=object)
        stage = np.full(int(sel.sum()), -1, np.int64)
        mb = g[1].to_numpy(object)[sel].astype(np.int64)
    single = pd.DataFrame({"kind": kind, "stage": stage, "mb": mb, "start": ts[sel],
                           "end": end[sel], "paired": False})
    if not use_p or not is_both.any():
        return single
    return pd.concat([single, _paired_chunks(both[is_both].to_numpy(object), ts[is_both],
                                             end[is_both], o)], ignore_index=True)


def _paired_chunks(actions: Array, start: Array, end: Array, o: pd.DataFrame) -> pd.DataFrame:
    """The actions of ``OVERLAP_F_B`` ranges (``0F3;3B1`` each, run in that order): each
    range cut where the first host operator of the next action's phase (forward for F,
    backward for B, I, W) starts after the previous cut, else at the range's end."""
    host = o[on_host(o)]
    phase = host["phase"].astype(str).to_numpy()
    at = {ph: np.sort(host["ts"].to_numpy(np.int64)[phase == ph])
          for ph in ("forward", "backward")}
    rows = []
    for text, s, e in zip(actions, start, end, strict=True):
        parts = _ACTION.findall(str(text))
        cut = int(s)
        for k, (stage, kind, mb) in enumerate(parts):
            if k + 1 < len(parts):
                times = at["forward" if parts[k + 1][1] == "F" else "backward"]
                i = np.searchsorted(times, cut, side="left")
                nxt = int(times[i]) if i < len(times) and times[i] < e else int(e)
            else:
                nxt = int(e)
            rows.append((kind, int(stage), int(mb), cut, nxt, True))
            cut = nxt
    return pd.DataFrame(rows, columns=_CHUNK)


def _op_chunks(o: pd.DataFrame) -> pd.DataFrame:
    """Chunks from the operators alone: runs of forward (F) or backward (B) host operators
    that no send or receive and no switch between the two interrupts, on the threads that
    run the stage's compute, micro-batches numbered in order per kind and step."""
    host = o[on_host(o)]
    fb = host["phase"].isin(["forward", "backward"]).to_numpy()
    compute_lanes = host.loc[fb, ["pid", "tid"]].drop_duplicates()
    lane = host.merge(compute_lanes.assign(_c=True), on=["pid", "tid"], how="left")["_c"]
    host = host[lane.fillna(False).to_numpy(bool)]
    is_p2p = host["op"].isin(P2P).to_numpy()
    phase = host["phase"].astype(str).to_numpy()
    keep = is_p2p | np.isin(phase, ["forward", "backward"])
    host = host[keep].sort_values("ts", kind="stable")
    if host.empty:
        return pd.DataFrame(columns=_CHUNK)
    is_p2p = host["op"].isin(P2P).to_numpy()
    label = np.where(is_p2p, "P", np.where(host["phase"].astype(str).to_numpy() == "forward",
                                           "F", "B"))
    step = host["step"].to_numpy(np.int64)
    new = np.r_[True, (label[1:] != label[:-1]) | (step[1:] != step[:-1])] | is_p2p
    chunk = np.cumsum(new)
    op = host["op"].astype(str).to_numpy()
    df = pd.DataFrame({"chunk": chunk, "kind": label, "step": step,
                       "start": host["ts"].to_numpy(np.int64),
                       "end": host["ts"].to_numpy(np.int64) + host["dur"].to_numpy(np.int64),
                       "layer": ~np.isin(op, _NOT_LAYER)})
    df = df[df["kind"] != "P"]
    c = df.groupby("chunk", sort=True).agg(kind=("kind", "first"), step=("step", "first"),
                                          start=("start", "min"), end=("end", "max"),
                                          layer=("layer", "any"))
    if c["layer"].any():  # a micro-batch runs a layer: not the batch made, a buffer allocated
        c = c[c["layer"]]
    c["mb"] = c.groupby(["step", "kind"]).cumcount()
    c["stage"] = -1
    c["paired"] = False
    return c[_CHUNK].reset_index(drop=True)


def combine_pipeline(parts: list[pd.DataFrame], meta: MetaMapping) -> pd.DataFrame:
    """The ``--by pipeline`` table (:data:`COLUMNS`) from every rank's :func:`pipeline_part`:
    the schedule is the job's, read from the order of every stage's chunks."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.concat(parts, ignore_index=True)
    steps = df[df["kind"] == "-"]
    chunks = df[df["kind"] != "-"]
    degree, stage_of = _stages(meta, sorted(steps["rank"].unique().tolist()))
    schedule = infer_schedule(chunks)
    rows: list[dict[str, Any]] = []
    for (rank, step), s in steps.groupby(["rank", "step"], sort=True):
        c = chunks[(chunks["rank"] == rank) & (chunks["step"] == step)].sort_values("start")
        stages = sorted({int(x) for x in c["stage"] if x >= 0}) or [stage_of.get(int(rank), 0)]
        fwd = c[c["kind"] == "F"]
        bwd = c[c["kind"].isin(["B", "I", "W"])]
        v = max(len(stages), 1)
        m = int(len(fwd) / v) if len(fwd) else 0
        f_mb = fwd.groupby("mb", sort=True)["compute_ns"].sum()
        b_mb = bwd.groupby("mb", sort=True)["compute_ns"].sum()
        step_ns = int(s["step_ns"].iloc[0])
        bubble = int(s["bubble_ns"].iloc[0])
        p = max(degree, len(stages))
        rows.append({
            "rank": int(rank), "step": int(step), "stage": stages[0], "stages": stages,
            "schedule": schedule, "microbatches": m, "bubble_ns": bubble,
            "bubble_share": bubble / step_ns if step_ns else None, "step_ns": step_ns,
            "forward_ns": int(fwd["compute_ns"].sum()),
            "backward_ns": int(bwd["compute_ns"].sum()),
            "forward_ns_per_microbatch": float(f_mb.mean()) if len(f_mb) else None,
            "backward_ns_per_microbatch": float(b_mb.mean()) if len(b_mb) else None,
            "microbatch_forward_ns": [int(x) for x in f_mb.to_numpy()],
            "microbatch_backward_ns": [int(x) for x in b_mb.to_numpy()],
            "order": " ".join(f"{k}{mb}" for k, mb in zip(c["kind"], c["mb"], strict=True)),
            "ideal_bubble_share": ((p - 1) / (v * m + p - 1)) if m and p > 1 else None,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def _stages(meta: MetaMapping, ranks: list[int]) -> tuple[int, dict[int, int]]:
    """The pipeline's degree and each rank's stage: its place in its ``pp`` group
    (``meta.parallelism``), else in the ranks that send or receive."""
    par = (meta.get("parallelism") or {}).get("pp") if hasattr(meta, "get") else None
    groups = par.get("groups") if isinstance(par, dict) else None
    stage: dict[int, int] = {}
    if isinstance(par, dict) and isinstance(groups, list) and groups:
        for g in groups:
            for i, r in enumerate(sorted(g)):
                stage[int(r)] = i
        degree = int(par.get("degree") or max(len(g) for g in groups))
    else:
        degree = len(ranks)
    for i, r in enumerate(ranks):
        stage.setdefault(r, i)
    return degree, stage


def infer_schedule(chunks: pd.DataFrame) -> str:
    """The job's schedule from its stages' chunks (module docstring)."""
    if chunks.empty:
        return "unknown"
    if "paired" in chunks and chunks["paired"].astype(bool).any():
        return "dualpipev"
    if chunks["kind"].isin(["I", "W"]).any():
        return "zero-bubble"
    looped = bool((chunks[chunks["stage"] >= 0].groupby("rank")["stage"].nunique() > 1).any())
    alternates = False
    for _, c in chunks.groupby(["rank", "step"], sort=False):
        kinds = c.sort_values("start")["kind"].to_numpy(object)
        first_b = np.flatnonzero(kinds == "B")
        if len(first_b) and (kinds[first_b[0]:] == "F").any():
            alternates = True
            break
    if looped:
        return "interleaved-1f1b" if alternates else "looped-bfs"
    return "1f1b" if alternates else "gpipe"
