"""MXNet: the nodes of a network's symbol with the shapes MXNet infers for them.

The profiler's operator events carry no shapes; the symbol does. For the built-in models the
network (a Gluon ``HybridBlock``) is called on a symbol; under `opprof run`, every hybridized
block's cached graph (the shapes of the inputs it was built with are kept by
:func:`opprof.collectors.mxnet_graphs.track_blocks`). Each node: its operator, the shapes of
its inputs and outputs (``None`` where MXNet could not infer one), its attributes, and
``mask`` ``[False, True]`` where its data input is a network input (no gradient is computed for
it). The adapter writes them beside its dump (:func:`opprof.flops.mxnet.write_nodes`).

Importing this module imports no MXNet.
"""

from __future__ import annotations

import json
from typing import Any

#: Operators whose first input is data and whose gradient MXNet skips for a network input.
_WEIGHTED = frozenset({"Convolution", "Deconvolution", "FullyConnected"})


def _shape(s: Any) -> list[int] | None:
    if not s:
        return None
    dims = [int(d) for d in s]
    return None if any(d <= 0 for d in dims) else dims


def symbol_nodes(sym: Any, shapes: dict[str, tuple[int, ...]],
                 dtype: str = "float32") -> list[dict[str, Any]]:
    """The operator nodes of ``sym`` with their inferred shapes, given its inputs' shapes."""
    internals = sym.get_internals()
    try:
        args, outs, aux = internals.infer_shape_partial(**shapes)
    except Exception:  # noqa: BLE001 - MXNet raises MXNetError for shapes it cannot infer
        return []
    known: dict[str, Any] = {}
    known.update(zip(internals.list_arguments(), args or [], strict=False))
    known.update(zip(internals.list_auxiliary_states(), aux or [], strict=False))
    known.update(zip(internals.list_outputs(), outs or [], strict=False))
    nodes = json.loads(sym.tojson())["nodes"]
    inputs = set(shapes)

    def entry(nid: int, idx: int) -> Any:
        node = nodes[nid]
        if node["op"] == "null":
            return known.get(node["name"])
        name = node["name"]
        return known.get(f"{name}_output") if idx == 0 and f"{name}_output" in known \
            else known.get(f"{name}_output{idx}")

    out = []
    for nid, node in enumerate(nodes):
        if node["op"] == "null":
            continue
        ins = [[_shape(entry(e[0], e[1])), dtype] for e in node.get("inputs", [])]
        attrs = {str(k): str(v) for k, v in (node.get("attrs") or node.get("attr")
                                             or node.get("param") or {}).items()}
        first = node.get("inputs") or []
        if node["op"] in _WEIGHTED and first and nodes[first[0][0]]["op"] == "null" and \
                nodes[first[0][0]]["name"] in inputs:
            attrs["mask"] = "[False, True]"
        out.append({"op": node["op"], "name": node["name"], "in": ins,
                    "out": [[_shape(entry(nid, 0)), dtype]], "attrs": attrs})
    return out


def net_nodes(mx: Any, net: Any, data_shape: tuple[int, ...], loss: Any = None,
              label_shape: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    """The nodes of a Gluon network called on a symbol of ``data_shape`` (and of its ``loss``
    on a label of ``label_shape``, when given)."""
    try:
        sym = net(mx.sym.var("data"))
        if isinstance(sym, (list, tuple)):
            sym = mx.sym.Group(list(sym))
        shapes = {"data": tuple(data_shape)}
        if loss is not None and label_shape is not None:
            sym = loss(sym, mx.sym.var("label"))
            shapes["label"] = tuple(label_shape)
    except Exception:  # noqa: BLE001 - a block that cannot run on symbols (imperative code)
        return []
    return symbol_nodes(sym, shapes)


def block_nodes(blocks: list[Any]) -> list[dict[str, Any]]:
    """The nodes of hybridized blocks' cached graphs, with the input shapes they were built
    with (``_opprof_shapes``)."""
    out: list[dict[str, Any]] = []
    for block in blocks:
        graph = getattr(block, "_cached_graph", None)
        shapes = getattr(block, "_opprof_shapes", None)
        if not graph or not shapes:
            continue
        inputs, sym = graph
        names = [getattr(i, "name", None) for i in (inputs if isinstance(inputs, (list, tuple))
                                                   else [inputs])]
        known = {n: tuple(s) for n, s in zip(names, shapes, strict=False) if n and s}
        out.extend(symbol_nodes(sym, known))
    return out
