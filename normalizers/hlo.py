"""XLA's HLO instructions in xprof's categories (``HloInstruction::ToCategory``): shared by
the TensorFlow (:mod:`.xplane`) and JAX (:mod:`.jaxplane`) readers of XPlane files."""

from __future__ import annotations

from typing import Any

#: XLA's category (``HloInstruction::ToCategory``, the one xprof shows) of the opcodes that
#: are neither fusions nor named by their opcode.
_DATA_FORMATTING = {"transpose", "copy", "copy-start", "copy-done", "reshape",
                    "dynamic-reshape", "broadcast", "pad"}
_ELEMENTWISE = {
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "complex", "convert",
    "cosine", "divide", "erf", "exponential", "exponential-minus-one", "floor", "imag",
    "is-finite", "log", "log-plus-one", "logistic", "maximum", "minimum", "multiply", "negate",
    "not", "or", "popcnt", "power", "real", "reduce-precision", "remainder", "round-nearest-afz",
    "round-nearest-even", "rsqrt", "select", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "sine", "sqrt", "subtract", "tan", "tanh", "xor"}
_FUSION_KIND = {"kLoop": "loop fusion", "kInput": "input fusion", "kOutput": "output fusion",
                "kCustom": "custom fusion"}
_LEAF_OPCODES = {"parameter", "constant"}


def category(ins: Any, computations: dict[int, Any]) -> tuple[str, str]:
    """(xprof's HLO category, the called computation's name) of one HLO instruction. A
    fusion that wraps a single instruction (XLA's CPU backend wraps ops one by one:
    ``wrapped_reduce-window``, ``wrapped_scatter``) has that instruction's category."""
    called = [computations[c] for c in ins.called_computation_ids if c in computations]
    name = called[0].name if called else ""
    if ins.opcode == "fusion":
        inner = [i for c in called for i in c.instructions if i.opcode not in _LEAF_OPCODES]
        if len(inner) == 1 and inner[0].opcode != "fusion":
            return category(inner[0], computations)[0], name
        return _FUSION_KIND.get(ins.fusion_kind, "fusion"), name
    if ins.opcode in _DATA_FORMATTING:
        return "data formatting", name
    if ins.opcode in _ELEMENTWISE:
        return "non-fusion elementwise", name
    if ins.opcode == "custom-call":  # the target says what it is (__cublas$gemm, __cudnn$conv…)
        return f"custom-call {ins.custom_call_target}", name
    return ins.opcode, name
