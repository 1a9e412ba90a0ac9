"""Which operators of a one-worker torch trace a tensor-parallel plan shards, what its
collectives carry, and what DTensor itself costs per sharded layer (measured from TP traces).

**The plan** (:func:`tp_plan`). Tensor parallel shards linear layers in pairs: the first
column-wise (each rank computes a slice of the output features), the second row-wise (each
rank its slice of the input features; the partial results summed by an all-reduce), with
what runs between them (the activation, attention's heads) on the slices.

- A built-in model (`opprof record --mode tp`, ``collectors/torch_parallel.py``) is split the
  way the recorder splits it: the transformer's feed-forward block in every encoder layer
  (``linear1`` column-wise, ``linear2`` row-wise: of each layer's four linear layers — the
  attention's in- and out-projections, then ``linear1``, ``linear2`` — the third and fourth;
  the output head stays whole); the fully connected network's hidden layers in pairs
  (``fc1`` / ``fc2``).
- Any other trace: **assumed** the Megatron-LM plan (said in the output): every linear layer
  of the forward pass but the last (the output head) is sharded, in consecutive pairs,
  column- then row-wise; between the two of a pair the operators run on the slices
  (attention split by heads, the activation); normalizations, residual additions,
  embeddings and the loss are replicated. A trace with an odd number of such layers leaves the
  last one whole.

The linear layers are the forward's ``fully_connected`` operators in order, and the backward's
in reverse order (autograd runs the backward of a sequential model in reverse): the sharded
operators are those of each pair's window — from the column-wise layer to the row-wise one in
the forward, from the row-wise layer's backward to the column-wise one's in the backward.

**The collectives**: per pair, one all-reduce of the row-wise layer's output in the forward
(its partial sums) and one of the column-wise layer's input gradient in the backward, each of
the activation's bytes: the row-wise layer's output elements (from the recorded input shapes:
``aten::linear``'s input and weight, ``addmm`` / ``mm`` / ``matmul``'s operands) × 4 B.

**DTensor's own cost** (:func:`dtensor_costs`, :func:`measure_dtensor`): every operator on a
DTensor pays DTensor's dispatch (sharding propagation, wrapping, the redistribution of its
inputs and outputs) on top of the work on its local shard. Measured from TP traces (the
``PythonSubclass`` dispatches and the ``_FromTorchTensor`` / ``_ToTorchTensor`` /
``Redistribute`` wrappers): per sharded pair, the forward's and the backward's, and per
optimizer call on a DTensor parameter; each the median per operator name, so a burst of the
host does not count. The table (``dtensor_costs.csv``) holds them for 3-D activations (a
sequence model: the built-in transformer's TP trace) and 2-D ones (an MLP: a user's script).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from opprof.filters import on_host, step_work
from opprof.intervals import Nesting, lane_ids
from opprof.model.baseops import FLOAT_BYTES, BaseOps, shapes
from opprof.taxonomy import COMM_OPS
from opprof.trace import Trace

if TYPE_CHECKING:
    from opprof.arrays import Array
    from opprof.meta import MetaMapping

#: Operators that stay replicated even inside a pair's window.
_REPLICATED = ("normalization", "normalization_backward", "embedding", "embedding_backward",
               "loss", "loss_backward")
#: The wrappers DTensor's parallel styles put around a module's inputs and outputs.
_WRAPPERS = (r"(?:autograd::engine::evaluate_function: )?(?:_FromTorchTensor|_ToTorchTensor|"
             r"Redistribute|NestedRedistribute)(?:Backward)?")


@dataclass
class TpPlan:
    """How a TP plan splits a one-worker trace (module docstring)."""

    source: str
    builtin: bool
    pairs: int
    #: per forward / backward operator of the base (:class:`BaseOps` order): sharded or not
    forward: Array
    backward: Array
    #: bytes of each of the pairs' activations (one all-reduce forward, one backward each)
    activation_bytes: list[int]
    #: the activations' dimensions (2: an MLP's [batch, features]; 3: a sequence model's)
    activation_ndim: int
    #: parameters of the sharded layers: elements (sliced over the ranks) and tensors (each
    #: a DTensor, the row-wise layer's bias too)
    sharded_params: float
    dtensor_params: int
    #: the forward / backward position of each collective (after its operator)
    forward_cuts: list[int] = field(default_factory=list)
    backward_cuts: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def builtin_pairs(model: str | None, linears: int) -> list[tuple[int, int]] | None:
    """The (column-wise, row-wise) pairs of the forward's linear layers (their indices in
    forward order) that `opprof record --mode tp` shards in a built-in ``model`` (None: not a
    built-in TP model). The transformer has four linear layers per encoder layer and the
    head; the fully connected network pairs its layers as ``_feed_forward_pairs`` does."""
    if model == "transformer":
        layers = (linears - 1) // 4
        return [(4 * i + 2, 4 * i + 3) for i in range(layers)]
    if model == "fcn":
        idx = list(range(linears))
        return list(zip(idx[0:-1:2], idx[1:-1:2], strict=False))
    return None


def _assumed_pairs(linears: int) -> list[tuple[int, int]]:
    """The Megatron-LM plan: all but the last linear layer, in consecutive pairs."""
    idx = list(range(max(0, linears - 1)))
    return list(zip(idx[0::2], idx[1::2], strict=False))


def tp_plan(base: BaseOps, meta: MetaMapping) -> TpPlan:
    """The :class:`TpPlan` of a one-worker trace (module docstring)."""
    fwd, bwd = base.of("forward"), base.of("backward")
    f_lin = np.flatnonzero((fwd["op"] == "fully_connected").to_numpy())
    b_lin = np.flatnonzero((bwd["op"] == "fully_connected_backward").to_numpy())
    model = meta.get("model") if str(meta.get("framework") or "") == "torch" else None
    pairs = builtin_pairs(str(model) if model else None, len(f_lin))
    notes: list[str] = []
    if pairs is not None:
        source = (f"the built-in {model}'s plan (record --mode tp): "
                  + ("each encoder layer's feed-forward block, linear1 column-wise and linear2 "
                     "row-wise" if model == "transformer" else
                     "the hidden linear layers in pairs, column- then row-wise"))
    else:
        pairs = _assumed_pairs(len(f_lin))
        source = ("assumed (the trace names no built-in model): the Megatron-LM plan — every "
                  "linear layer but the output head sharded, in pairs (column- then "
                  "row-wise), attention split by heads, norms, residuals, embeddings and "
                  "the loss replicated")
    forward = np.zeros(len(fwd), bool)
    backward = np.zeros(len(bwd), bool)
    ops_f, ops_b = fwd["op"].to_numpy(), bwd["op"].to_numpy()
    mirrored = len(b_lin) == len(f_lin)
    if not mirrored:
        notes.append(f"the backward has {len(b_lin)} linear layers' gradients for the "
                     f"forward's {len(f_lin)}: backward windows follow the forward's by share")
    nbytes, f_cuts, b_cuts = [], [], []
    numel, tensors, ndim = 0.0, 0, 2
    details = fwd["detail"].to_numpy()
    for col, row in pairs:
        a, b = int(f_lin[col]), int(f_lin[row])
        forward[a:b + 1] = True
        f_cuts.append(b)
        if mirrored:
            ra, rb = int(b_lin[len(f_lin) - 1 - row]), int(b_lin[len(f_lin) - 1 - col])
            backward[ra:rb + 1] = True
            b_cuts.append(rb)
        nbytes.append(_output_elements(details[b], str(fwd["name"].iloc[b])) * FLOAT_BYTES)
        first = shapes(details[a])
        ndim = max(ndim, len(first[0]) if first and first[0] else 2)
        for k in (a, b):
            n, t = _params(details[k], str(fwd["name"].iloc[k]))
            numel += n if k == a else n - _bias(details[k])  # the row-wise bias is replicated
            tensors += t
    forward &= ~np.isin(ops_f, _REPLICATED)
    backward &= ~np.isin(ops_b, _REPLICATED)
    if not mirrored and forward.any():
        share = float(fwd["dur_ns"].to_numpy()[forward].sum() / max(
            fwd["dur_ns"].to_numpy()[np.isin(ops_f, ("fully_connected", "attention",
                                                     "activation"))].sum(), 1.0))
        backward = np.isin(ops_b, ("fully_connected_backward", "attention_backward",
                                   "activation_backward")) & (np.arange(len(bwd)) < len(bwd) *
                                                              min(share, 1.0))
    if not pairs:
        notes.append("no pair of linear layers to shard: tensor parallel changes nothing but "
                     "adds DTensor's work")
    if any(n == 0 for n in nbytes):
        notes.append("an activation's size is not in the trace (record with record_shapes): "
                     "its all-reduce is taken as empty")
    return TpPlan(source, model is not None and pairs == builtin_pairs(str(model), len(f_lin)),
                  len(pairs), forward, backward, nbytes, ndim, numel, tensors, f_cuts, b_cuts,
                  notes)


def _output_elements(detail: object, name: str) -> int:
    """Elements of a linear layer's output from its recorded input shapes."""
    s = shapes(detail)
    if name.endswith("linear") and len(s) >= 2 and s[0] and s[1]:
        return math.prod(s[0][:-1]) * s[1][0]
    if name.endswith("addmm") and len(s) >= 3 and s[1] and s[2]:
        return s[1][0] * s[2][-1]
    if len(s) >= 2 and s[0] and s[1]:  # mm, matmul
        return math.prod(s[0][:-1]) * s[1][-1]
    return 0


def _params(detail: object, name: str) -> tuple[int, int]:
    """(elements, tensors) of a linear layer's weight and bias, from its recorded shapes."""
    s = shapes(detail)
    if name.endswith("linear") and len(s) >= 2:
        w = s[1]
        b = s[2] if len(s) > 2 else []
        return math.prod(w) + (math.prod(b) if b else 0), 1 + bool(b)
    if name.endswith("addmm") and len(s) >= 3:
        return math.prod(s[2]) + math.prod(s[0]), 2
    return (math.prod(s[1]), 1) if len(s) >= 2 and s[1] else (0, 0)


def _bias(detail: object) -> int:
    s = shapes(detail)
    return math.prod(s[2]) if len(s) > 2 and s[2] else 0


# --------------------------------------------------------------------------- DTensor's cost


@dataclass(frozen=True)
class DTensorCost:
    """DTensor's own time: per sharded pair in the forward and the backward, and per optimizer
    call on a DTensor parameter (ns), with the trace it was measured on."""

    forward_ns: float
    backward_ns: float
    update_call_ns: float
    source: str


@cache
def dtensor_costs() -> dict[int, DTensorCost]:
    """The measured table (``dtensor_costs.csv``): activation dimensions → costs."""
    text = resources.files("opprof.model").joinpath("dtensor_costs.csv").read_text()
    rows = [r for r in csv.DictReader(line for line in text.splitlines()
                                      if not line.startswith("# "))]
    out: dict[int, dict[str, float]] = {}
    src: dict[int, str] = {}
    for r in rows:
        nd = int(r["activations"])
        out.setdefault(nd, {})[r["phase"]] = float(r["ns"])
        src[nd] = r["source"]
    return {nd: DTensorCost(v["forward"], v["backward"], v["update"], src[nd])
            for nd, v in out.items()}


def dtensor_cost(ndim: int) -> DTensorCost:
    """The table's row for activations of ``ndim`` dimensions (3 for 3 or more)."""
    table = dtensor_costs()
    return table[min(max(ndim, 2), 3)]


def measure_dtensor(trace: Trace) -> DTensorCost:
    """DTensor's own time in a tensor-parallel trace (module docstring): every counted host
    operator that holds a DTensor dispatch or is one of its wrappers costs its duration less
    the work on local shards inside it (the operators a ``PythonSubclass`` dispatch calls) and
    the communication it waited for; per phase, the median of that per operator name times
    how often the name occurs per (rank, step), over the pairs (the forward all-reduces of
    DTensor per step); the update's per DTensor call (each ``PythonSubclass`` in the
    optimizer, from its dispatching operator)."""
    ev = trace.events
    h = ev[step_work(ev).to_numpy() & on_host(ev).to_numpy()
           & ev["kind"].isin(["cpu_op", "comm"]).to_numpy()]
    h = h[h["tid"].to_numpy() >= 0].reset_index(drop=True)
    steps = max(1, len(h.groupby(["rank", "step"]).size()))
    names = h["name"].astype(str)
    n = len(h)
    lane = lane_ids(h["rank"].to_numpy(np.int64), h["pid"].to_numpy(np.int64),
                    h["tid"].to_numpy(np.int64))
    ts = h["ts"].to_numpy(np.int64)
    dur = h["dur"].to_numpy(np.int64)
    depth = h["depth"].to_numpy(np.int64)
    nesting = Nesting(lane, ts, ts + dur)
    sub = (names == "PythonSubclass").to_numpy()
    wrap = names.str.fullmatch(_WRAPPERS).to_numpy()
    comm = h["op"].isin(sorted(COMM_OPS)).to_numpy() | (h["kind"] == "comm").to_numpy()
    top = h["counted"].to_numpy(bool) & (h["kind"] == "cpu_op").to_numpy()
    _, top_of = nesting.nest(top)
    _, sub_of = nesting.nest(sub)
    local = (sub_of >= 0) & ~sub & ~comm & (depth == depth[np.maximum(sub_of, 0)] + 1)
    _, local_of = nesting.nest(local)
    _, comm_of = nesting.nest(comm)
    idx = np.arange(n)
    involved = np.zeros(n, bool)
    involved[np.unique(top_of[(sub | wrap) & (top_of >= 0)])] = True
    # per top operator: its duration less its outermost local work and communication
    within = (top_of >= 0) & involved[np.maximum(top_of, 0)]
    minus = np.zeros(n)
    np.add.at(minus, top_of[within & (local & (local_of == idx))],
              dur[within & local & (local_of == idx)])
    np.add.at(minus, top_of[within & comm & (comm_of == idx) & (top_of != idx)],
              dur[within & comm & (comm_of == idx) & (top_of != idx)])
    own = pd.DataFrame({"phase": h["phase"].astype(str).to_numpy(), "name": names.to_numpy(),
                        "ns": dur - minus})[involved]
    tp_calls = (names.str.startswith("_c10d_functional::all_reduce")
                & (h["phase"].astype(str) == "comm")).to_numpy()
    pairs = max(1.0, tp_calls.sum() / steps / 2.0)
    per: dict[str, float] = {}
    for phase in ("forward", "backward"):
        p = own[own["phase"] == phase].groupby("name")["ns"].agg(["median", "size"])
        per[phase] = float((p["median"] * p["size"]).sum()) / steps / pairs
    # the optimizer: each DTensor call from the operator that dispatched it
    upd = sub & (h["phase"].astype(str) == "update").to_numpy()
    parent = _parents(lane, ts, depth)
    calls = np.flatnonzero(upd)
    outer = np.where(parent[calls] >= 0, parent[calls], calls)
    inner = np.zeros(n)
    np.add.at(inner, sub_of[local & (local_of == idx) & (sub_of >= 0)],
              dur[local & (local_of == idx) & (sub_of >= 0)])
    ns = dur[outer] - inner[calls]
    per["update"] = float(np.median(ns)) if len(ns) else 0.0
    return DTensorCost(per["forward"], per["backward"], per["update"],
                       str(trace.meta.get("command") or ""))


def _parents(lane: Array, ts: Array, depth: Array) -> Array:
    """Each event's enclosing event one level up on its lane (-1: none): the last event before
    it, in start order on the same lane, whose depth is one less."""
    order = np.lexsort((depth, ts, lane))
    out = np.full(len(ts), -1, np.int64)
    pos = np.empty(len(ts), np.int64)
    pos[order] = np.arange(len(ts))
    for d in np.unique(depth):
        if d <= 0:
            continue
        cand = order[depth[order] == d - 1]
        kids = np.flatnonzero(depth == d)
        if not len(cand):
            continue
        k = np.searchsorted(pos[cand], pos[kids]) - 1
        ok = k >= 0
        p = cand[np.maximum(k, 0)]
        ok &= lane[p] == lane[kids]
        out[kids[ok]] = p[ok]
    return out
