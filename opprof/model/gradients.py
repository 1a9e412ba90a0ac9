"""Gradients in backward order: when each layer's (or tensor's) gradient is ready within the
backward pass, how much backward work precedes it, and how many bytes it holds — what the
layer-wise pipeline of gradient communication needs.

Per worker (rank, step), a *gradient* is one of:

- **torch**: a ``torch::autograd::AccumulateGrad`` event — autograd writing one parameter's
  ``.grad`` (DistributedDataParallel's hooks fire right there). Its recorded input shape
  (``record_shapes``) gives the bytes: elements × 4 (float32). Ready = the event's end.
- **TensorFlow**: the gradient ops of one Keras layer (TF's op names
  ``gradients/<model>/<layer>/…``) of a parameter-holding kind (convolution, dense, batch
  norm, …). Ready = the end of the layer's last gradient op. The trace has no shapes.
- **anything else** (MXNet's ``_backward_Convolution`` …): each counted backward operator of a
  parameter-holding kind is one layer's gradient. Ready = its end. No shapes.

``ready_ns`` is measured from the start of the step's backward phase (its marker, or its first
backward operator), ``backward_ns`` is the backward time since the previous gradient was
ready (the layer's own backward work), and ``ready_frac`` is ``ready_ns`` over the backward
span (start to the end of the last backward event), so a simulation can replay the order with
another backward time. Where
the trace has no shapes, ``bytes`` is -1 and :func:`profile` takes the recorder's parameter
arrays (``meta["param_arrays"]``, MXNet's: a kvstore pushes one key per array, a layer's
weight and bias apart) — one gradient per array, ready with its layer — where every step has
one gradient per layer of them; else it spreads the model's gradient bytes (``meta["params"]``
× 4) evenly over the layers; ``bytes_source`` says which.

Collectives the trace already holds (DDP's buckets, TF's CollectiveReduce, MXNet's kvstore
windows) are listed beside them with their start relative to the backward start and their bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from opprof.filters import step_work
from opprof.trace import Trace

#: Backward ops of these canonical kinds produce parameter gradients.
PARAM_OPS = ("convolution_backward", "fully_connected_backward", "batch_norm_backward",
             "normalization_backward", "embedding_backward", "attention_backward",
             "recurrent_backward")
ACCUMULATE = "torch::autograd::AccumulateGrad"
FLOAT_BYTES = 4
_TF_LAYER = re.compile(r"^gradients/[^/]+/([^/]+)/")
_SHAPE = re.compile(r"\[\[([0-9, ]*)\]")
TENSOR_COLUMNS = ["rank", "step", "index", "name", "op", "ready_ns", "backward_ns", "ready_frac",
                  "bytes"]
COLLECTIVE_COLUMNS = ["rank", "step", "seq", "name", "start_ns", "dur_ns", "bytes"]


@dataclass
class GradientProfile:
    """Gradients of every (rank, step) in ready order, and the mean profile over them."""

    tensors: pd.DataFrame     # TENSOR_COLUMNS, one row per gradient per (rank, step)
    layers: pd.DataFrame      # index, name, op, ready_ns, backward_ns, ready_frac, bytes (mean)
    backward_ns: float        # mean backward span (first to last backward event) per step
    total_bytes: int          # gradient bytes per step of one worker
    source: str               # where the gradients come from
    bytes_source: str         # where their sizes come from
    collectives: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=COLLECTIVE_COLUMNS))  # the trace's own collectives, relative to backward start


def profile(trace: Trace) -> GradientProfile:
    """The gradient profile of a trace's worker ranks (see the module docstring)."""
    ev = trace.events
    ev = ev[step_work(ev)]
    spans = _backward_spans(ev)
    acc = ev[ev["name"] == ACCUMULATE]
    if len(acc):
        grads, source = _torch_tensors(acc), "torch AccumulateGrad (one row per parameter)"
    else:
        grads, source = _op_layers(ev)
    tensors = _relative(grads, spans)
    n_params = trace.meta.get("params")
    bytes_source = "parameter shapes in the trace (float32)"
    if len(tensors) and (tensors["bytes"] < 0).any():
        arrays = _by_arrays(tensors, trace.meta.get("param_arrays"))
        if arrays is not None:
            tensors = arrays
            source += ", each holding its layer's parameter arrays"
            bytes_source = ("the model's parameter arrays (meta param_arrays, float32): one "
                            "gradient per array, in its layer's place")
        elif n_params:
            per = tensors.groupby(["rank", "step"])["index"].transform("size")
            tensors["bytes"] = np.floor(int(n_params) * FLOAT_BYTES / per).astype(np.int64)
            bytes_source = (f"meta params ({int(n_params):,}) × 4 B, split evenly over the "
                            "layers (the trace has no shapes)")
        else:
            tensors["bytes"] = 0
            bytes_source = "unknown (no shapes in the trace and no meta params)"
    layers = _mean_layers(tensors)
    total = int(layers["bytes"].sum()) if len(layers) else 0
    if not len(tensors) and n_params:
        total = int(n_params) * FLOAT_BYTES
        bytes_source = f"meta params ({int(n_params):,}) × 4 B (no gradient events found)"
    backward = float(spans["span_ns"].mean()) if len(spans) else 0.0
    return GradientProfile(tensors, layers, backward, total, source, bytes_source,
                           _collectives(trace, spans))


def _collectives(trace: Trace, spans: pd.DataFrame) -> pd.DataFrame:
    """The collectives the trace holds (:func:`opprof.analysis.ranks.collectives`), each with
    its start relative to its step's backward start, in order."""
    from opprof.analysis.ranks import collectives

    timing, _ = collectives(trace)
    if timing.empty or spans.empty:
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    c = timing.merge(spans, on=["rank", "step"], how="inner")
    c = c.sort_values(["rank", "step", "ts"], kind="stable")
    c["seq"] = c.groupby(["rank", "step"]).cumcount()
    c["start_ns"] = c["ts"] - c["start"]
    c["dur_ns"] = c["dur"]
    return c[COLLECTIVE_COLUMNS].reset_index(drop=True)


def _backward_spans(ev: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): start and length of the backward phase (its events' envelope)."""
    b = ev[ev["phase"] == "backward"]
    if b.empty:
        return pd.DataFrame(columns=["rank", "step", "start", "span_ns"])
    end = b["ts"] + b["dur"]
    g = pd.DataFrame({"rank": b["rank"], "step": b["step"], "start": b["ts"], "end": end})
    out = g.groupby(["rank", "step"]).agg(start=("start", "min"), end=("end", "max"))
    out["span_ns"] = out["end"] - out["start"]
    return out.reset_index()[["rank", "step", "start", "span_ns"]]


def _torch_tensors(acc: pd.DataFrame) -> pd.DataFrame:
    """One gradient per AccumulateGrad: ready at its end, bytes from its input shape."""
    detail = acc["detail"].astype("string").fillna("")
    shape = detail.str.extract(_SHAPE, expand=False).fillna("")
    uniq = pd.unique(shape.to_numpy(dtype=object))
    numel = {s: _numel(s) for s in uniq}
    nbytes = shape.map(numel).to_numpy(np.int64) * FLOAT_BYTES
    name = shape.str.replace(", ", "x", regex=False).to_numpy(dtype=object)
    return pd.DataFrame({"rank": acc["rank"].to_numpy(), "step": acc["step"].to_numpy(),
                         "name": name, "op": "parameter", "ready": (acc["ts"] + acc["dur"])
                         .to_numpy(np.int64), "bytes": np.where(nbytes > 0, nbytes, -1)})


def _numel(shape: str) -> int:
    dims = [int(d) for d in shape.split(",") if d.strip()]
    return int(np.prod(dims)) if dims else 0


def _op_layers(ev: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Gradient-producing layers from backward operators (TensorFlow layers by op name, else
    one per parameter-holding backward operator)."""
    ops = ev[ev["counted"] & (ev["phase"] == "backward")]
    detail = ops["detail"].astype("string").fillna("")
    layer = detail.str.extract(_TF_LAYER, expand=False)
    if layer.notna().any():
        ops = ops.assign(layer=layer.to_numpy(dtype=object), end=ops["ts"] + ops["dur"])
        ops = ops[ops["layer"].notna()]
        kinds = ops[ops["op"].isin(PARAM_OPS)].groupby(["rank", "step", "layer"],
                                                        observed=True)["op"].first()
        ready = ops.groupby(["rank", "step", "layer"], observed=True)["end"].max()
        g = pd.concat([ready.rename("ready"), kinds.astype(str).rename("op")], axis=1,
                      join="inner").reset_index()
        g = g.rename(columns={"layer": "name"})
        g["bytes"] = -1
        return g[["rank", "step", "name", "op", "ready", "bytes"]], \
            "TensorFlow gradient ops grouped by layer"
    p = ops[ops["op"].isin(PARAM_OPS)]
    g = pd.DataFrame({"rank": p["rank"].to_numpy(), "step": p["step"].to_numpy(),
                      "name": p["name"].astype(str).to_numpy(), "op": p["op"].astype(str)
                      .to_numpy(), "ready": (p["ts"] + p["dur"]).to_numpy(np.int64),
                      "bytes": -1})
    return g, "parameter-holding backward operators (one per layer)"


def _by_arrays(tensors: pd.DataFrame, arrays: object) -> pd.DataFrame | None:
    """Layer-level gradients (no shapes in the trace) made one per parameter array from the
    recorder's ``param_arrays`` (``[layer, elements]`` in definition order: the layers'
    gradients come in the reverse), when every (rank, step) has one gradient per layer;
    else None. Each array is ready with its layer; the layer's backward work stays on its
    first array. (Where a block's branches interleave in backward — a ResNet block's
    shortcut — its layers' sizes follow the definition's order, not the trace's: the total
    and the key count hold.)"""
    if not isinstance(arrays, list) or not arrays:
        return None
    layers: dict[str, list[int]] = {}
    try:
        for layer, n in arrays:
            layers.setdefault(str(layer), []).append(int(n))
    except (TypeError, ValueError):
        return None
    sizes = list(layers.values())[::-1]  # backward order
    if not (tensors.groupby(["rank", "step"]).size() == len(sizes)).all():
        return None
    per = np.array([len(a) for a in sizes])
    pos = tensors["index"].to_numpy(np.int64)
    rows = tensors.iloc[np.repeat(np.arange(len(tensors)), per[pos])].reset_index(drop=True)
    within = np.concatenate([np.arange(k) for k in per[pos]])
    flat = np.concatenate([np.asarray(a, np.int64) for a in sizes])
    start = np.concatenate([[0], np.cumsum(per)[:-1]])
    layer_of = np.repeat(pos, per[pos])
    rows["bytes"] = flat[start[layer_of] + within] * FLOAT_BYTES
    names = np.array(list(layers)[::-1], dtype=object)
    rows["name"] = names[layer_of]
    rows["backward_ns"] = np.where(within == 0, rows["backward_ns"].to_numpy(np.int64), 0)
    rows["index"] = rows.groupby(["rank", "step"]).cumcount()
    return rows[TENSOR_COLUMNS]


def _relative(grads: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Ready times relative to the backward start, in ready order, indexed per (rank, step)."""
    if grads.empty or spans.empty:
        return pd.DataFrame(columns=TENSOR_COLUMNS)
    g = grads.merge(spans, on=["rank", "step"], how="inner")
    g["ready_ns"] = (g["ready"] - g["start"]).clip(lower=0).astype(np.int64)
    g["ready_frac"] = (g["ready_ns"] / g["span_ns"].where(g["span_ns"] > 0)).fillna(1.0)
    g["ready_frac"] = g["ready_frac"].clip(0.0, 1.0)
    g = g.sort_values(["rank", "step", "ready_ns"], kind="stable")
    g["index"] = g.groupby(["rank", "step"]).cumcount()
    g["backward_ns"] = g.groupby(["rank", "step"])["ready_ns"].diff().fillna(g["ready_ns"])
    g["backward_ns"] = g["backward_ns"].astype(np.int64)
    g["bytes"] = g["bytes"].astype(np.int64)
    return g[TENSOR_COLUMNS].reset_index(drop=True)


def _mean_layers(tensors: pd.DataFrame) -> pd.DataFrame:
    """The mean profile over the (rank, step)s that have the most common gradient count."""
    cols = ["index", "name", "op", "ready_ns", "backward_ns", "ready_frac", "bytes"]
    if tensors.empty:
        return pd.DataFrame(columns=cols)
    sizes = tensors.groupby(["rank", "step"]).size()
    modal = sizes.mode().iloc[0]
    keep = sizes[sizes == modal].index
    t = tensors.set_index(["rank", "step"]).loc[keep].reset_index()
    g = t.groupby("index")
    out = pd.DataFrame({"name": g["name"].first(), "op": g["op"].first(),
                        "ready_ns": g["ready_ns"].mean(), "backward_ns": g["backward_ns"].mean(),
                        "ready_frac": g["ready_frac"].mean(),
                        "bytes": g["bytes"].median().round().astype(np.int64)})
    return out.reset_index()[cols]
