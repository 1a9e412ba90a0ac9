"""The operator tables (``maps/<framework>.csv``): native name → family and operands, and the
cost of one call.

A row: ``pattern`` (a Python regular expression matched against the whole native name; the
first row that matches wins), ``name`` (a native name the row is the first to match: tested),
``family`` (a function of :mod:`opprof.flops.families`, or
``composite``: the operator costs what the operators it runs cost, each counted on its own),
``args`` (the roles of the call's positional inputs in order, ``_`` for one not read;
``role=out`` / ``role=outN`` an output, ``role=@name`` a named attribute), ``flags``
(space-separated variants), ``factor`` (FLOPs per element of a vector family), ``example`` (a
call, in the notation of :func:`parse_example`) and ``expect`` (its hardware FLOPs, model FLOPs
and bytes, ``?`` for unknown: each row is tested with it). Lines starting with ``"# "`` are
comments.

:func:`kineto_cost` costs a torch operator from Kineto's ``Input Dims``, ``Input type`` and
``Concrete Inputs``, once per distinct call (the costs are cached: a training step repeats the
same calls every step).
"""

from __future__ import annotations

import csv
import functools
import math
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from opprof.flops.families import (
    COMPOSITE,
    FAMILIES,
    LIST_DTYPE,
    MATMUL_FAMILIES,
    NAN,
    PRECISIONS,
    Call,
    Cost,
    Operand,
    Spec,
    Tensor,
)

#: What a row says about an operator's events: no row (``UNMODELED``), a ``composite`` row
#: (costs nothing itself, its operators count), or a cost that stands for everything inside the
#: operator (``COSTED``: nested events are not counted again; ``FORWARD``: and the operator is a
#: forward pass's only — a convolution, ``linear``, attention's forward — so that run inside a
#: backward operator it is recomputation: activation checkpointing re-running the forward).
UNMODELED, COMPOSITE_KIND, COSTED, FORWARD = 0, 1, 2, 3
#: The precision codes of the events table (-1: none).
PRECISION_CODE = {p: i for i, p in enumerate(PRECISIONS)}


@dataclass(frozen=True)
class Row:
    """One row of an operator table."""

    pattern: str
    family: str
    spec: Spec
    example: str
    expect: str
    line: int
    name: str = ""

    @property
    def kind(self) -> int:
        if self.family == COMPOSITE:
            return COMPOSITE_KIND
        return FORWARD if "forward" in self.spec.flags else COSTED

    @property
    def matmul(self) -> bool:
        return self.family in MATMUL_FAMILIES

    def cost(self, call: Call) -> Cost | None:
        """The cost of a call (None: the shapes it needs are missing; composite: zero)."""
        if self.family == COMPOSITE:
            return Cost(0.0, 0.0, 0.0, "")
        try:
            got = FAMILIES[self.family](call, self.spec)
        except (ValueError, IndexError, ZeroDivisionError, OverflowError, TypeError):
            return None
        if got is None or not self.matmul:
            return got if got is None or got.model_flops == 0 else Cost(
                got.flops, 0.0, got.bytes, got.precision)
        return got


def parse_args(text: str) -> dict[str, int | str]:
    """``"x,w,_,stride;out=out0"``-style roles → role → position / ``outN`` / ``@attr``."""
    roles: dict[str, int | str] = {}
    pos = 0
    for token in (t.strip() for t in text.split(",") if t.strip()):
        if "=" in token:
            role, where = (p.strip() for p in token.split("=", 1))
            roles[role] = where
            continue
        if token != "_":
            roles[token] = pos
        pos += 1
    return roles


class OperatorTable:
    """The rows of one framework, and the first row that matches a name (cached)."""

    def __init__(self, name: str, rows: list[Row]) -> None:
        self.name = name
        self.rows = rows
        self._match = [re.compile(r.pattern).fullmatch for r in rows]

    @functools.lru_cache(maxsize=1 << 14)  # noqa: B019 - one table per framework, kept
    def row(self, name: str) -> Row | None:
        """The row that models ``name`` (the first whose pattern matches), or None."""
        for row, match in zip(self.rows, self._match, strict=True):
            if match(name):
                return row
        return None


@functools.cache
def operator_table(framework: str) -> OperatorTable:
    """The table shipped as ``opprof/flops/maps/<framework>.csv``."""
    text = resources.files("opprof.flops").joinpath("maps").joinpath(
        f"{framework}.csv").read_text()
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1)
             if ln.strip() and not ln.startswith("# ")]
    rows = []
    reader = csv.DictReader([ln for _, ln in lines])
    for (n, _), rec in zip(lines[1:], reader, strict=True):
        family = rec["family"].strip()
        if family != COMPOSITE and family not in FAMILIES:
            raise ValueError(f"operator table {framework} line {n}: unknown family {family!r}")
        re.compile(rec["pattern"])
        spec = Spec(parse_args(rec.get("args") or ""),
                    frozenset((rec.get("flags") or "").split()),
                    float(rec.get("factor") or 1))
        rows.append(Row(rec["pattern"], family, spec, rec.get("example") or "",
                        rec.get("expect") or "", n, (rec.get("name") or "").strip()))
    return OperatorTable(framework, rows)


# ------------------------------------------------------------------ Kineto (torch)

#: Kineto's ``Input type`` → canonical dtype (a tensor); anything else is no tensor.
TORCH_DTYPES = {
    "float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "long int": "int64", "long": "int64", "int": "int32", "short int": "int16", "short": "int16",
    "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "c10::Float8_e8m0fnu": "fp8",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "Float": "fp32", "Double": "fp64", "Half": "fp16", "BFloat16": "bf16", "Long": "int64",
    "Int": "int32", "Bool": "bool", "unsigned short": "uint16", "unsigned int": "uint32",
    "unsigned long": "uint64",
}


def _shape(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return tuple(value)


def torch_call(dims: Any, types: Any, concrete: Any) -> Call | None:
    """A :class:`Call` of Kineto's per-input lists (None when they are not lists)."""
    if not isinstance(dims, list):
        return None
    if not isinstance(types, list):  # shapes without dtypes (nsys's NVTX ``sizes``)
        types = ["" if isinstance(d, list) and d and all(isinstance(v, int) for v in d)
                 else None for d in dims]
    concrete = concrete if isinstance(concrete, list) else []
    inputs: list[Operand] = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) and isinstance(types[i], str) else None
        dtype = TORCH_DTYPES.get(t) if t else ("" if t == "" and types[i] is not None
                                               and isinstance(d, list) and d else None)
        if t == "TensorList" or (isinstance(d, list) and d and all(isinstance(e, list)
                                                                  for e in d)):
            shapes = [_shape(e) for e in d] if isinstance(d, list) else []
            inputs.append(tuple(Tensor(s, LIST_DTYPE) for s in shapes if s is not None)
                          if all(s is not None for s in shapes) else None)
        elif dtype is not None:
            shape = _shape(d)
            inputs.append(Tensor(shape, dtype) if shape is not None else None)
        else:
            inputs.append(None)
    scalars = tuple(c if isinstance(c, str) else "" for c in concrete)
    return Call(tuple(inputs), scalars)


@functools.lru_cache(maxsize=1 << 16)
def torch_cost(name: str, key: bytes) -> tuple[float, float, float, int, int]:
    """:func:`kineto_cost` of a call whose args (``Input Dims``, ``Input type``, ``Concrete
    Inputs``) are ``key``, their JSON text (cached: a step repeats its calls)."""
    import msgspec

    row = operator_table("torch").row(name)
    if row is None:
        return NAN, NAN, NAN, -1, UNMODELED
    if not key:
        return NAN, NAN, NAN, -1, row.kind
    try:
        dims, types, concrete = msgspec.json.decode(key)
    except (msgspec.DecodeError, ValueError, TypeError):
        return NAN, NAN, NAN, -1, row.kind
    call = torch_call(dims, types, concrete)
    cost = row.cost(call) if call is not None else None
    if cost is None:
        return NAN, NAN, NAN, -1, row.kind
    return (cost.flops, cost.model_flops, cost.bytes, PRECISION_CODE.get(cost.precision, -1),
            row.kind)


def kineto_cost(name: str, dims: Any, types: Any, concrete: Any
                ) -> tuple[float, float, float, int, int]:
    """(hardware FLOPs, model FLOPs, bytes, precision code, kind) of one torch operator call
    from Kineto's args (NaN where unknown; kind :data:`UNMODELED`, :data:`COMPOSITE_KIND` or
    :data:`COSTED`)."""
    import msgspec

    if operator_table("torch").row(name) is None:
        return NAN, NAN, NAN, -1, UNMODELED
    try:
        key = msgspec.json.encode([dims, types, concrete])
    except (TypeError, msgspec.EncodeError, OverflowError):
        return NAN, NAN, NAN, -1, COSTED
    return torch_cost(name, key)


def is_modeled(framework: str, name: str) -> bool:
    """Whether the table of ``framework`` has a row for ``name``."""
    return operator_table(framework).row(name) is not None


# ------------------------------------------------------------------ the examples' notation

_TENSOR = re.compile(r"(\w+)\[([\d,\s]*)\]")


def _tensor(text: str) -> Tensor:
    m = _TENSOR.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a tensor: {text!r}")
    return Tensor(tuple(int(v) for v in m[2].split(",") if v.strip()), m[1])


def _split(text: str) -> list[str]:
    """Top-level space-separated tokens (spaces inside brackets or braces kept)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == " " and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def parse_example(text: str) -> Call:
    """A call in the tables' notation: positional inputs separated by spaces — a tensor
    ``bf16[4,512]``, a tensor list ``{fp32[3,4] fp32[4]}``, a non-tensor ``=text`` (its
    Concrete Inputs text: ``=[1,1]``, ``=True``), nothing ``-`` — then ``-> outputs`` and
    ``@name=value`` attributes."""
    head, _, tail = text.partition("->")
    inputs: list[Operand] = []
    scalars: list[str] = []
    attrs: dict[str, str] = {}
    for tok in _split(head):
        if tok.startswith("@"):
            k, _, v = tok[1:].partition("=")
            attrs[k] = v
            continue
        if tok.startswith("{"):
            inputs.append(tuple(_tensor(t) for t in _split(tok[1:-1])))
            scalars.append("")
        elif tok.startswith("="):
            inputs.append(None)
            scalars.append(tok[1:].replace(",", ", "))
        elif tok == "-":
            inputs.append(None)
            scalars.append("")
        else:
            inputs.append(_tensor(tok))
            scalars.append("")
    outputs = []
    for tok in _split(tail):
        if tok.startswith("@"):
            k, _, v = tok[1:].partition("=")
            attrs[k] = v
        else:
            outputs.append(_tensor(tok))
    return Call(tuple(inputs), tuple(scalars), tuple(outputs), attrs)


def parse_expect(text: str) -> tuple[float, float, float]:
    """``"flops model bytes"`` (``?`` for unknown) → numbers (NaN unknown)."""
    parts = text.split()
    if len(parts) != 3:
        raise ValueError(f"expect needs three numbers: {text!r}")
    return tuple(math.nan if p == "?" else float(p) for p in parts)  # type: ignore[return-value]
