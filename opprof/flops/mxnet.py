"""MXNet operators' costs: a profiler dump's operator events joined with the graph's shapes.

MXNet's profiler records an operator's name only (``Convolution``, ``_backward_FullyConnected``),
no shapes and no node; the shapes come from the network's symbol, whose shapes MXNet infers from
the input's. opprof's MXNet adapter writes its nodes — operator, input and output shapes,
attributes — beside the dump (``rankR_worker.shapes.gz``): for the built-in models, the
network's symbol; under `opprof run`, every hybridized Gluon block's cached graph (an imperative
block has no symbol: its operators' costs stay unknown).

Since an event names no node, every event of an operator gets the mean cost of the graph's nodes
of that operator: a step runs each node once, so a step's (and an operator's) total is exact;
a ``_backward_X`` event gets that of the ``X`` nodes' gradients (the input's gradient left out
for a node whose input is the network's input: MXNet does not compute it).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from opprof.flops.families import Call, Tensor
from opprof.flops.table import PRECISION_CODE, UNMODELED, operator_table

SHAPES_KIND = "opprof-mxnet-shapes"
MX_DTYPES = {"float32": "fp32", "float16": "fp16", "float64": "fp64", "bfloat16": "bf16",
             "int32": "int32", "int64": "int64", "int8": "int8", "uint8": "uint8"}


def shapes_path(trace: Path) -> Path:
    """The shapes file beside a dump (``rank0_worker.json[.gz]`` → ``rank0_worker.shapes.gz``;
    not ``.json``: a folder import reads only traces)."""
    return trace.with_name(trace.name.split(".json")[0] + ".shapes.gz")


def read_nodes(trace: Path) -> list[dict[str, Any]] | None:
    """The graph nodes written beside a dump (None without them)."""
    try:
        doc = json.loads(gzip.decompress(shapes_path(trace).read_bytes()))
    except (OSError, ValueError, EOFError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") != SHAPES_KIND or not isinstance(
            doc.get("nodes"), list):
        return None
    return [n for n in doc["nodes"] if isinstance(n, dict) and isinstance(n.get("op"), str)]


def write_nodes(nodes: list[dict[str, Any]], trace: Path) -> None:
    """Write a dump's graph nodes beside it (gzipped JSON)."""
    shapes_path(trace).write_bytes(gzip.compress(json.dumps(
        {"kind": SHAPES_KIND, "nodes": nodes}, separators=(",", ":")).encode()))


def _tensor(entry: Any) -> Tensor | None:
    if not isinstance(entry, list) or len(entry) != 2:
        return None
    shape, dtype = entry
    if not isinstance(shape, list) or not shape or any(
            not isinstance(d, int) or d <= 0 for d in shape):
        return None
    return Tensor(tuple(shape), MX_DTYPES.get(str(dtype), ""))


def node_call(node: dict[str, Any]) -> Call:
    """A :class:`Call` of a node (a shape MXNet could not infer is no tensor)."""
    inputs = tuple(_tensor(e) for e in node.get("in") or [])
    outputs = tuple(t for t in (_tensor(e) for e in node.get("out") or []) if t is not None)
    attrs = {str(k): str(v) for k, v in (node.get("attrs") or {}).items()}
    return Call(inputs, ("",) * len(inputs), outputs, attrs)


def costs(names: list[str], nodes: list[dict[str, Any]] | None
          ) -> dict[str, list[float] | list[int]]:
    """Per event (its operator name): hardware FLOPs, model FLOPs, bytes, precision code, cost
    kind — the mean over the graph's nodes of that operator (``_backward_X``: of ``X``)."""
    table = operator_table("mxnet")
    by_op: dict[str, list[dict[str, Any]]] = {}
    for n in nodes or []:
        by_op.setdefault(n["op"], []).append(n)
    cache: dict[str, tuple[float, float, float, int, int]] = {}
    nan = math.nan
    out: dict[str, list[Any]] = {"flops": [], "model_flops": [], "mem_bytes": [],
                                 "precision": [], "cost_kind": []}
    for name in names:
        got = cache.get(name)
        if got is None:
            row = table.row(name)
            forward = next((f[3:] for f in row.spec.flags if f.startswith("of:")),
                           name.removeprefix("_backward_")) if row else name
            graph = by_op.get(forward, [])
            if row is None:
                got = (nan, nan, nan, -1, UNMODELED)
            elif row.family == "free":
                got = (0.0, 0.0, 0.0, -1, row.kind)
            elif not graph:
                got = (nan, nan, nan, -1, row.kind)
            else:
                each = [row.cost(node_call(n)) for n in graph]
                if any(c is None for c in each):
                    got = (nan, nan, nan, -1, row.kind)
                else:
                    k = len(each)
                    prec = next((c.precision for c in each if c and c.precision), "")
                    got = (sum(c.flops for c in each if c) / k,
                           sum(c.model_flops for c in each if c) / k,
                           sum(c.bytes for c in each if c) / k,
                           PRECISION_CODE.get(prec, -1), row.kind)
            cache[name] = got
        for col, v in zip(out, got, strict=True):
            out[col].append(v)
    return out
