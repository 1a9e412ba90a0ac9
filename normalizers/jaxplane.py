"""JAX's profiles in the XPlane reader (:mod:`.xplane`): what tells a JAX profile from a
TensorFlow one, and the classification keys of its XLA operations.

JAX writes the same XPlane files as TensorFlow (``jax.profiler.trace(DIR)`` →
``DIR/plugins/profile/<run>/<host>.xplane.pb``, with JAX's own chrome-trace export
``<host>.trace.json.gz`` beside it, which the folder listing leaves out: the XPlane is the
source of truth). A profile is JAX's when its host events include JAX's dispatch of a compiled
function (``PjitFunction(f)``, ``PmapFunction(f)``, a ``PjRt*Executable::Execute*``) and no
TensorFlow op, or when opprof's ``opprof.clock`` annotation says ``framework=jax``.

**Operations.** XLA:CPU records one event per HLO instruction (``hlo_op``, ``hlo_module``
args) when the profile's host tracer level is 2 or more (``jax.profiler.ProfileOptions``;
``opprof run`` and ``record`` set it; ``jax.profiler.trace``'s default, 1, records the
compiled program's execution but none of its operations: such a profile gets one note
saying so). Each is classified, as TensorFlow's XLA operations are, by xprof's HLO category
and the name its HLO metadata keeps — for JAX the primitive under its transformation and
scope path: ``jit(train_step)/jvp(conv1)/conv_general_dilated`` is the forward pass of layer
``conv1``; ``jit(train_step)/transpose(jvp(conv1))/conv_general_dilated`` its gradient
(reverse mode is the transpose of the forward-mode derivative); in a program that computes a
gradient, what is under neither is the optimizer's update (optax's ``mul``, ``add``,
``sqrt`` …). The key is ``"XLA <category>: <op name> [train]"`` (``[plain]`` for a program
without a gradient: inference, preprocessing) and normalizers/maps/jax.csv maps it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from opprof.normalizers.hlo import category as hlo_category

#: The mapping table of JAX profiles (normalizers/maps/jax.csv).
TABLE = "jax"
#: Host events of JAX's dispatch of a compiled function.
DISPATCH = re.compile(r"(?:Pjit|Pmap)Function\(.*\)|PjRt\w*Executable::\w+")
#: A JAX op name that is part of a gradient computation (forward or backward).
GRAD = re.compile(r"(?:^|/)(?:transpose|jvp|vjp|linearize)\(")


def is_jax(name: pd.Series, args: pd.DataFrame) -> bool:
    """Whether one host's events are a JAX profile (see the module docstring)."""
    framework = args["framework"].dropna().astype(str) if "framework" in args else None
    if framework is not None and len(framework):
        return bool((framework == "jax").any())
    tf_ops = args["long_name"].notna().any()
    return bool(not tf_ops and name.str.fullmatch(DISPATCH.pattern).any())


def _text(col: pd.Series) -> pd.Series:
    return col.astype(object).where(col.notna(), "").astype(str)


def xla_keys(args: pd.DataFrame, hlo: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Classification key and detail of JAX's XLA operation events (see the module
    docstring): key ``"XLA <category>: <op name> [train|plain]"``, detail
    ``"<op name> @ <module>/<HLO op>[ = <fused computation>]"``."""
    trains = hlo.assign(grad=_text(hlo["tf_op"]).str.contains(GRAD.pattern)).groupby(
        "module")["grad"].any() if len(hlo) else pd.Series(dtype=bool)
    ev = pd.DataFrame({"module": _text(args["hlo_module"]).to_numpy(object),
                       "hlo_op": _text(args["hlo_op"]).to_numpy(object)})
    known = ev.merge(hlo, on=["module", "hlo_op"], how="left")
    category = _text(args["hlo_category"]).to_numpy(object)
    category = np.where(category != "", category, _text(known["category"]).to_numpy(object))
    category = np.where(category != "", category, "unknown")
    op = _text(args["tf_op"]).to_numpy(object)
    op = np.where(op != "", op, _text(known["tf_op"]).to_numpy(object))
    op = pd.Series(op, dtype=object).str.replace(r":[^/]*$", "", regex=True)
    tag = np.where(ev["module"].map(trains).fillna(False).astype(bool), " [train]", " [plain]")
    key = pd.Series("XLA " + category + ": " + op.to_numpy(object) + tag, dtype=object)
    called = _text(known["computation"])
    detail = (op + " @ " + ev["module"] + "/" + ev["hlo_op"]
              + np.where(called != "", " = " + called, ""))
    return key, detail


def module_rows(module: Any) -> list[tuple[str, str, str, str, str]]:
    """The rows of one HLO module (:func:`.xplane._hlo_instructions` for a JAX profile)."""
    computations = {c.id: c for c in module.computations}
    own = {(c.id, i.id): i.metadata.op_name for c in module.computations
           for i in c.instructions if i.metadata.op_name}

    def inner(ins: Any, seen: frozenset[int] = frozenset()) -> str | None:
        """The JAX name inside what a fusion or call runs (its root first)."""
        for cid in ins.called_computation_ids:
            comp = computations.get(cid)
            if comp is None or cid in seen:
                continue
            for i in reversed(comp.instructions):
                name = own.get((cid, i.id)) or inner(i, seen | {cid})
                if name:
                    return name
        return None

    rows = []
    for comp in module.computations:
        by_id = {i.id: i for i in comp.instructions}
        users: dict[int, list[int]] = {}
        for i in comp.instructions:
            for o in i.operand_ids:
                users.setdefault(o, []).append(i.id)
        name = {i.id: own[comp.id, i.id] for i in comp.instructions if (comp.id, i.id) in own}
        for i in comp.instructions:  # a fusion or call XLA made: the name of what it runs
            if i.id not in name and i.called_computation_ids and i.opcode != "while":
                found = inner(i)
                if found:
                    name[i.id] = found
        for i in comp.instructions:  # post order: operands first
            if i.id in name:
                continue
            grad = next((name[o] for o in i.operand_ids
                         if "transpose(" in name.get(o, "")), None)
            if grad is not None:
                name[i.id] = grad
        for i in reversed(comp.instructions):
            if i.id not in name:
                user = next((name[u] for u in users.get(i.id, []) if u in name), None)
                if user is not None:
                    name[i.id] = user
        for i in comp.instructions:
            if i.id not in name:
                first = next((name[o] for o in i.operand_ids if o in name), None)
                if first is not None:
                    name[i.id] = first
        for i in comp.instructions:
            category, called = hlo_category(i, computations)
            op_type = by_id[i.id].metadata.op_type
            rows.append((module.name, i.name, category, f"{name.get(i.id, '')}:{op_type}",
                         called))
    return rows


def call_steps(name: pd.Series, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Without step annotations and without XLA operation events: the end of each call of the
    compiled function called most often (``PjitFunction(f)``; ties: the most time) closes a
    step (``closes_step``)."""
    closes = np.zeros(len(name), bool)
    fn = name.str.extract(r"^(?:Pjit|Pmap)Function\((.*)\)$")[0]
    if fn.isna().all():
        return closes
    stats = pd.DataFrame({"fn": fn, "dur": dur}).dropna().groupby("fn")["dur"].agg(
        ["size", "sum"])
    main = stats.sort_values(["size", "sum"], ascending=False).index[0]
    sel = (fn == main).to_numpy()
    # a call nested in another of the same function (the dispatch's inner event) counts once
    idx = np.flatnonzero(sel)
    order = idx[np.argsort(ts[idx], kind="stable")]
    reach = np.maximum.accumulate(ts[order] + dur[order])
    outer = np.concatenate([[True], ts[order][1:] >= reach[:-1]])
    closes[order[outer]] = True
    return closes


NO_OPERATIONS = ("this JAX profile holds no XLA operation events: XLA:CPU records them only "
                 "at host_tracer_level 2 (jax.profiler.ProfileOptions; jax.profiler.trace's "
                 "default is 1), so each step's compiled program is one block of phase other; "
                 "record with host_tracer_level=2, or with `opprof run`, to see its operations")
