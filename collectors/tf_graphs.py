"""TensorFlow: the shapes of the operations a process ran, from its traced function graphs.

The TensorFlow profiler records no shapes for TF ops (not at any host tracer level), but every
``tf.function`` the process traced keeps its graph: each operation's type, input and output
shapes and dtypes (static shapes, as the graph knows them), its attributes (strides, padding,
transposes …) and which operations feed it. At the end of a profile the adapter writes them,
for every graph alive in the process, beside the XPlane (:data:`SHAPES_FILE`), keyed by the
operation's name — the name the trace gives the op that ran (``long_name``'s op part); a name
two graphs give different shapes is kept as ambiguous, never guessed. The normalizer costs the
trace's ops from it (:mod:`opprof.flops.tensorflow`).

Importing this module imports no TensorFlow.
"""

from __future__ import annotations

import gc
import gzip
import json
from pathlib import Path
from typing import Any

from opprof.flops.tensorflow import SHAPES_FILE, SHAPES_KIND

#: Operations that cost nothing or are not ops of the model's step (kept out of the file).
_SKIP = frozenset({
    "Const", "Identity", "IdentityN", "NoOp", "Placeholder", "ReadVariableOp", "VarHandleOp",
    "StatefulPartitionedCall", "PartitionedCall", "Shape", "ShapeN",
    "Size", "Rank", "StopGradient", "_Arg", "_Retval", "VarIsInitializedOp",
    "DestroyResourceOp", "ZerosLike", "OnesLike",
})
_ATTRS = ("strides", "padding", "data_format", "dilations", "transpose_a", "transpose_b",
          "adj_x", "adj_y", "ksize", "explicit_paddings", "is_training", "epsilon")


def _shape(t: Any) -> list[int | None] | None:
    try:
        if t.shape.rank is None:
            return None
        return [d if d is None else int(d) for d in t.shape.as_list()]
    except (ValueError, AttributeError):
        return None


def _dtype(t: Any) -> str:
    try:
        return str(t.dtype.name)
    except AttributeError:
        return ""


def _attr(op: Any, key: str) -> str | None:
    if key not in op.node_def.attr:
        return None
    try:
        value = op.get_attr(key)
    except (ValueError, TypeError):
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v.decode() if isinstance(v, bytes) else v)
                               for v in value) + "]"
    return str(value)


def _known(rec: dict[str, Any]) -> int:
    """How many dimensions of a record's shapes are known."""
    return sum(1 for side in ("in", "out") for s, _ in rec[side] if s for d in s
               if d is not None)


def graph_ops() -> dict[str, dict[str, Any]]:
    """Every operation of every function graph alive in this process (the skipped types left
    out), by name: ``type``, ``in`` / ``out`` ([shape or None, dtype] each; a dimension the
    graph does not know is None), ``attrs``, ``src`` (the names of the ops feeding its inputs);
    ``ambiguous`` where graphs disagree on the shapes of one name."""
    try:
        from tensorflow.python.framework.func_graph import FuncGraph
    except ImportError:
        return {}
    graphs = [o for o in gc.get_objects() if isinstance(o, FuncGraph)]
    out: dict[str, dict[str, Any]] = {}
    for g in graphs:
        try:
            ops = g.get_operations()
        except Exception:  # noqa: BLE001 - a graph being built or finalized elsewhere
            continue
        for op in ops:
            if op.type in _SKIP:
                continue
            rec = {"type": op.type,
                   "in": [[_shape(t), _dtype(t)] for t in op.inputs],
                   "out": [[_shape(t), _dtype(t)] for t in op.outputs],
                   "attrs": {k: v for k in _ATTRS if (v := _attr(op, k)) is not None},
                   "src": [t.op.name for t in op.inputs]}
            old = out.get(op.name)
            if old is None:
                out[op.name] = rec
            elif old["type"] != rec["type"]:
                old["ambiguous"] = True
            elif (old["in"], old["out"]) != (rec["in"], rec["out"]):
                # the same op traced twice, once with fewer shapes known: keep the fuller;
                # two graphs that know different shapes for one name: no shapes
                if _conflict(old, rec):
                    old["ambiguous"] = True
                elif _known(rec) > _known(old):
                    out[op.name] = {**rec, **({"ambiguous": True} if old.get("ambiguous")
                                              else {})}
    return out


def _conflict(a: dict[str, Any], b: dict[str, Any]) -> bool:
    for side in ("in", "out"):
        for (sa, _), (sb, _) in zip(a[side], b[side], strict=False):
            if sa is None or sb is None or len(sa) != len(sb):
                continue
            if any(x is not None and y is not None and x != y for x, y in zip(sa, sb,
                                                                                strict=True)):
                return True
    return False


def write_shapes(folders: list[Path]) -> None:
    """Write the graphs' operations beside each XPlane folder (gzipped JSON)."""
    ops = graph_ops()
    if not ops:
        return
    data = gzip.compress(json.dumps({"kind": SHAPES_KIND, "ops": ops},
                                    separators=(",", ":")).encode(), compresslevel=6)
    for folder in folders:
        try:
            (Path(folder) / SHAPES_FILE).write_bytes(data)
        except OSError:
            continue
