"""TensorFlow ops' costs: an XPlane's op events joined with the shapes of their graphs.

The profiler records an op's type as it ran (``_MklNativeFusedConv2D``, ``Conv2DBackpropFilter``)
and its name (``lenet5/conv2d/BiasAdd``); the shapes come from the graphs the process traced,
which opprof's TensorFlow adapter writes beside the XPlane (:data:`SHAPES_FILE`, see
``opprof.collectors.tf_graphs``). The op is costed by its runtime type's row of ``maps/tf.csv``
with the shapes of the graph op of its name. A fused op (grappler's and oneDNN's
``_FusedConv2D``, ``_MklNativeFusedMatMul``) carries the name of the last op it absorbed (the
``BiasAdd`` or ``Relu`` after a convolution): the convolution is found by following the graph
back through what was fused. An op of a function inlined into its caller runs under the
call's name (``StatefulPartitionedCall/sequential/conv2d/BiasAdd``): its trailing parts name
the graph op. An op whose name no graph holds (or two graphs hold with
different shapes) has an unknown cost; so have the ops of a logdir without the shapes file
(one not recorded by opprof), and XLA's compiled ops.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from opprof.flops.families import Call, Tensor
from opprof.flops.table import PRECISION_CODE, UNMODELED, operator_table

SHAPES_FILE = "opprof.shapes.gz"  # (not .json.gz: no trace file a folder import looks at)
SHAPES_KIND = "opprof-tf-shapes"
TF_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
             "half": "fp16", "float64": "fp64", "double": "fp64", "int32": "int32",
             "int64": "int64", "int16": "int16", "int8": "int8", "uint8": "uint8",
             "bool": "bool", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}
#: Graph op types a fused op may carry the name of (what grappler and oneDNN fuse after a
#: convolution or a matmul).
FUSED_AFTER = frozenset({"BiasAdd", "BiasAddV1", "Relu", "Relu6", "Elu", "LeakyRelu", "Selu",
                         "Sigmoid", "Tanh", "Add", "AddV2", "AddN", "FusedBatchNorm",
                         "FusedBatchNormV3", "Mul", "Gelu", "Swish", "Identity"})
#: The graph op types a fused matmul-like op stands for.
COMPUTE = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul",
                     "BatchMatMulV2", "BatchMatMulV3", "Conv2DBackpropInput",
                     "Conv2DBackpropFilter", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
                     "DepthwiseConv2dNativeBackpropInput",
                     "DepthwiseConv2dNativeBackpropFilter"})


def read_shapes(folder: Path) -> dict[str, Any] | None:
    """The graph ops written beside an XPlane (None when there is no such file)."""
    path = Path(folder) / SHAPES_FILE
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") != SHAPES_KIND or not isinstance(
            doc.get("ops"), dict):
        return None
    ops: dict[str, Any] = doc["ops"]
    return ops


def _tensor(entry: Any) -> Tensor | None:
    if not isinstance(entry, list) or len(entry) != 2:
        return None
    shape, dtype = entry
    if not isinstance(shape, list) or any(not isinstance(d, int) or d < 0 for d in shape):
        return None
    return Tensor(tuple(shape), TF_DTYPES.get(str(dtype), ""))


def graph_call(rec: dict[str, Any]) -> Call:
    """A :class:`Call` of a graph op's record (a shape not fully known is no tensor)."""
    inputs = tuple(_tensor(e) for e in rec.get("in") or [])
    outputs = tuple(t for t in (_tensor(e) for e in rec.get("out") or []) if t is not None)
    attrs = {str(k): str(v) for k, v in (rec.get("attrs") or {}).items()}
    return Call(inputs, ("",) * len(inputs), outputs, attrs)


def _base(name: str, ops: dict[str, Any], fused: bool) -> dict[str, Any] | None:
    """The graph op of an event named ``name``; for a matmul-like runtime op (``fused``) whose
    name is that of an op fused after a convolution or matmul, the compute op found by following
    its first input back (at most four ops). A function's ops inlined into its caller run under
    the call's name (``StatefulPartitionedCall/…``, Keras ``fit``): the name's trailing parts
    are tried too."""
    rec = ops.get(name)
    parts = name.split("/")
    for k in range(1, len(parts)):
        if rec is not None:
            break
        rec = ops.get("/".join(parts[k:]))
    for _ in range(4):
        if not isinstance(rec, dict) or rec.get("ambiguous"):
            return None
        if not fused or rec.get("type") in COMPUTE or rec.get("type") not in FUSED_AFTER:
            return rec
        src = rec.get("src") or []
        rec = ops.get(src[0]) if src else None
    return None


def costs(types: list[str], names: list[str], ops: dict[str, Any] | None
          ) -> dict[str, list[float] | list[int]]:
    """Per event (its runtime op type and op name): hardware FLOPs, model FLOPs, bytes,
    precision code, cost kind (the raw cost columns, :mod:`opprof.flops.attribute`)."""
    table = operator_table("tf")
    cache: dict[tuple[str, str], tuple[float, float, float, int, int]] = {}
    out: dict[str, list[Any]] = {"flops": [], "model_flops": [], "mem_bytes": [],
                                 "precision": [], "cost_kind": []}
    nan = math.nan
    for t, n in zip(types, names, strict=True):
        key = (t, n)
        got = cache.get(key)
        if got is None:
            row = table.row(t)
            if row is None:
                got = (nan, nan, nan, -1, UNMODELED)
            else:
                rec = _base(n, ops, row.matmul) if ops and n else None
                if rec is None and row.family == "free":
                    rec = {}  # no work: no shapes needed
                cost = row.cost(graph_call(rec)) if rec is not None else None
                got = (nan, nan, nan, -1, row.kind) if cost is None else (
                    cost.flops, cost.model_flops, cost.bytes,
                    PRECISION_CODE.get(cost.precision, -1), row.kind)
            cache[key] = got
        for col, v in zip(out, got, strict=True):
            out[col].append(v)
    return out

