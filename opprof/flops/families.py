"""One small cost function per operator family: a call's shapes → its FLOPs and bytes.

A :class:`Call` is one operator call as a trace knows it: its positional inputs (a tensor, a
list of tensors, or nothing), the text of its non-tensor inputs (Kineto's ``Concrete Inputs``:
``"[1, 1]"``, ``"True"``, ``"0.1"``), and, where the source knows them (a TensorFlow or MXNet
graph), its outputs and named attributes. A :class:`Spec` (one row of a table in ``maps/``) says
where the family finds its operands: ``roles`` maps a role (``a``, ``b``, ``x``, ``w``,
``stride`` …) to a position, ``flags`` switch variants (``bt``: the second operand is a weight
stored transposed, as in ``linear``; ``blhd``: attention tensors laid out batch, length, heads,
dim; ``inplace``; ``recompute`` …), ``factor`` is the FLOPs per element of a vector operator.

Conventions (those of ``torch.utils.flop_counter``): a multiply-add is 2 FLOPs; bias additions
of GEMMs and convolutions are not counted; attention counts its two matmuls (``Q·Kᵀ`` and
``P·V``) forward and four backward, causal or not. *Model* FLOPs are the matmul-like work a
model needs (GEMM, convolution, attention, recurrent cells); *hardware* FLOPs add what the
hardware does besides — the vector work of elementwise, normalization, softmax, reductions and
optimizer updates (``factor`` FLOPs per element: estimates, documented per row) and recomputed
matmuls (flash attention's backward recomputes ``Q·Kᵀ``). Bytes are what an operator reads and
writes in memory, each tensor once (its inputs and outputs), caches ignored.

A function returns None when the shapes it needs are missing or inconsistent: the cost is then
unknown, never guessed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

#: Precisions FLOPs are counted in (the peak of each is a column of the peak table).
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
#: Bytes per element of the dtypes a trace names (canonical names).
DTYPE_BYTES = {
    "fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
    "uint16": 2, "uint32": 4, "uint64": 8,
}
#: The dtype of the elements of a tensor list, whose dtype Kineto does not record (the
#: optimizer's lists: parameters, gradients and their state, in practice fp32).
LIST_DTYPE = "fp32"
_FLOAT = {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8"}
NAN = math.nan


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor's shape and canonical dtype (``""`` when unknown)."""

    shape: tuple[int, ...]
    dtype: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> float:
        size = DTYPE_BYTES.get(self.dtype)
        return NAN if size is None else float(self.numel * size)


Operand = Tensor | tuple[Tensor, ...] | None


@dataclass(frozen=True, slots=True)
class Call:
    """One operator call: positional inputs, the text of its non-tensor inputs, and (where
    known) its outputs and named attributes."""

    inputs: tuple[Operand, ...] = ()
    scalars: tuple[str, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    attrs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Cost:
    """What one call costs: hardware FLOPs (all the work, recompute included), model FLOPs
    (the matmul-like work the model needs), bytes read and written, and the precision of its
    FLOPs (``""`` for none). NaN: unknown."""

    flops: float
    model_flops: float
    bytes: float
    precision: str = ""


@dataclass(frozen=True)
class Spec:
    """Where a family finds its operands in a call (one table row)."""

    roles: Mapping[str, int | str]
    flags: frozenset[str] = frozenset()
    factor: float = 1.0

    def at(self, call: Call, role: str) -> Operand:
        """The input playing ``role`` (``out`` and ``outN``: the call's outputs)."""
        pos = self.roles.get(role)
        if pos is None or (isinstance(pos, str) and not pos.startswith("out")):
            return None
        if isinstance(pos, str):  # an output
            k = int(pos[3:] or 0)
            return call.outputs[k] if k < len(call.outputs) else None
        return call.inputs[pos] if pos < len(call.inputs) else None

    def tensor(self, call: Call, role: str) -> Tensor | None:
        got = self.at(call, role)
        return got if isinstance(got, Tensor) else None

    def tensors(self, call: Call, role: str) -> tuple[Tensor, ...]:
        got = self.at(call, role)
        if isinstance(got, Tensor):
            return (got,)
        return got if isinstance(got, tuple) else ()

    def text(self, call: Call, role: str) -> str:
        """The text of a non-tensor role: a named attribute (``@name`` positions) or the
        scalar at its position."""
        pos = self.roles.get(role)
        if isinstance(pos, str) and pos.startswith("@"):
            return call.attrs.get(pos[1:], "")
        if isinstance(pos, int) and pos < len(call.scalars):
            return call.scalars[pos]
        return ""


# ------------------------------------------------------------------ small helpers

_INTS = re.compile(r"-?\d+")


def ints(text: str) -> list[int] | None:
    """The integers of ``"[1, 2]"`` / ``"3"`` / ``"(1, 1)"``; None for empty or other text."""
    text = text.strip()
    if not text or not re.fullmatch(r"[\[\(]?\s*(-?\d+\s*,?\s*)*[\]\)]?", text):
        return None
    return [int(v) for v in _INTS.findall(text)]


def flag(text: str) -> bool | None:
    t = text.strip().lower()
    return True if t in ("true", "1") else False if t in ("false", "0") else None


def bools(text: str) -> list[bool] | None:
    """``"[False, True, True]"`` → [False, True, True]."""
    parts = [flag(p) for p in text.strip("[]() ").split(",") if p.strip()]
    return None if not parts or any(p is None for p in parts) else [bool(p) for p in parts]


def _per_dim(values: list[int] | None, n: int, default: int) -> list[int] | None:
    if values is None or not values:
        return [default] * n
    if len(values) == 1:
        return values * n
    return values if len(values) == n else None


def precision(*tensors: Tensor | None) -> str:
    """The precision of a call's FLOPs: that of its first floating-point operand."""
    for t in tensors:
        if t is not None and t.dtype in _FLOAT:
            return t.dtype
        if t is not None and t.dtype == "int8":
            return "int8"
    return ""


def total_bytes(*tensors: Tensor | None) -> float:
    return float(sum(t.nbytes for t in tensors if t is not None))


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The broadcast of shapes (None when they do not broadcast)."""
    n = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(n):
        dims = {s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0} - {1}
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _like(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    return Tensor(shape, t.dtype)


# ------------------------------------------------------------------ matmul-like families


def gemm(call: Call, spec: Spec) -> Cost | None:
    """``a @ b`` with matmul's broadcasting (mm, bmm, addmm, baddbmm, matmul, linear with the
    ``bt`` flag: ``b`` is a weight stored ``[n, k]``); ``c`` (bias or accumulator) is read."""
    a, b, c = spec.tensor(call, "a"), spec.tensor(call, "b"), spec.tensor(call, "c")
    if a is None or b is None or not a.shape or not b.shape:
        return None
    bs = b.shape
    if "bt" in spec.flags:
        bs = bs[::-1] if len(bs) == 2 else bs  # [n, k] → [k, n]; a 1-D weight is a vector
    if flag(spec.text(call, "ta")) and len(a.shape) > 1:  # TF's transpose_a / adj_x
        a = Tensor((*a.shape[:-2], a.shape[-1], a.shape[-2]), a.dtype)
    if flag(spec.text(call, "tb")) and len(bs) > 1:
        bs = (*bs[:-2], bs[-1], bs[-2])
    a2 = a.shape if len(a.shape) > 1 else (1, a.shape[0])
    b2 = bs if len(bs) > 1 else (bs[0], 1)
    m, k = a2[-2], a2[-1]
    k2, n = b2[-2], b2[-1]
    if k != k2:
        return None
    batch = broadcast([a2[:-2], b2[:-2]])
    if batch is None:
        return None
    flops = 2.0 * math.prod(batch) * m * n * k * (2 if "backward" in spec.flags else 1)
    out_shape = (*batch, *([m] if len(a.shape) > 1 else []), *([n] if len(bs) > 1 else []))
    out = Tensor(out_shape, a.dtype)
    return Cost(flops, flops, total_bytes(a, b, c, out), precision(a, b))


def conv_flops(x: Tensor, w: Tensor, stride: list[int] | None, padding: str,
               dilation: list[int] | None, transposed: bool,
               output_padding: list[int] | None, groups: int) -> tuple[float, Tensor] | None:
    """(FLOPs, output) of a convolution: ``2 · N · prod(w) · prod(S)`` where ``S`` is the
    output's spatial size (the input's for a transposed convolution), as
    ``torch.utils.flop_counter`` counts it (``w`` is ``[C_out, C_in/groups, k…]``, or
    ``[C_in, C_out/groups, k…]`` transposed)."""
    d = len(w.shape) - 2
    if d < 1:
        return None
    if len(x.shape) == d + 2:
        n, spatial = x.shape[0], list(x.shape[2:])
    elif len(x.shape) == d + 1:  # unbatched
        n, spatial = 1, list(x.shape[1:])
    else:
        return None
    kernel = list(w.shape[2:])
    s = _per_dim(stride, d, 1)
    dil = _per_dim(dilation, d, 1)
    op = _per_dim(output_padding, d, 0)
    if s is None or dil is None or op is None:
        return None
    pad_text = padding.strip().strip("'\"").lower()
    if pad_text == "same":
        out = spatial
    else:
        p = [0] * d if pad_text == "valid" else _per_dim(ints(padding), d, 0)
        if p is None:
            return None
        if transposed:
            out = [(i - 1) * st - 2 * pp + dd * (k - 1) + o + 1
                   for i, st, pp, dd, k, o in zip(spatial, s, p, dil, kernel, op, strict=True)]
        else:
            out = [(i + 2 * pp - dd * (k - 1) - 1) // st + 1
                   for i, st, pp, dd, k in zip(spatial, s, p, dil, kernel, strict=True)]
    if any(o <= 0 for o in out):
        return None
    c_out = w.shape[1] * groups if transposed else w.shape[0]
    conv_shape = spatial if transposed else out
    flops = 2.0 * n * math.prod(w.shape) * math.prod(conv_shape)
    return flops, Tensor((n, c_out, *out), x.dtype)


def _conv_args(call: Call, spec: Spec) -> tuple[list[int] | None, str, list[int] | None, bool,
                                                list[int] | None, int]:
    transposed = "transposed" in spec.flags or bool(flag(spec.text(call, "transposed")))
    groups = (ints(spec.text(call, "groups")) or [1])[0]
    return (ints(spec.text(call, "stride")), spec.text(call, "padding"),
            ints(spec.text(call, "dilation")), transposed, ints(spec.text(call, "output_padding")),
            groups)


def conv(call: Call, spec: Spec) -> Cost | None:
    """A convolution forward (any dimensionality, groups, dilation, transposed)."""
    x, w, b = spec.tensor(call, "x"), spec.tensor(call, "w"), spec.tensor(call, "b")
    if x is None or w is None:
        return None
    if any(r in spec.roles and not spec.text(call, r) for r in ("stride", "padding",
                                                                "dilation")):
        return None  # (a trace that names the shapes but not the strides: nsys's NVTX)
    out_t = spec.tensor(call, "out")
    got = conv_flops(x, w, *_conv_args(call, spec))
    if got is None:
        return None
    flops, out = got
    return Cost(flops, flops, total_bytes(x, w, b, out_t or out), precision(x, w))


def conv_backward(call: Call, spec: Spec) -> Cost | None:
    """``convolution_backward``: the input's gradient (a transposed convolution of the
    output's gradient) and the weight's each cost the forward's FLOPs, as the output mask asks;
    the bias gradient is a reduction of the output's gradient (hardware FLOPs only)."""
    gy, x, w = spec.tensor(call, "gy"), spec.tensor(call, "x"), spec.tensor(call, "w")
    if gy is None or x is None or w is None:
        return None
    transposed = "transposed" in spec.flags or bool(flag(spec.text(call, "transposed")))
    d = len(w.shape) - 2
    if d < 1 or len(gy.shape) != len(x.shape):
        return None
    n = x.shape[0] if len(x.shape) == d + 2 else 1
    spatial = x.shape[-d:] if transposed else gy.shape[-d:]
    fwd = 2.0 * n * math.prod(w.shape) * math.prod(spatial)
    mask = bools(spec.text(call, "mask")) or [True, True, True]
    mask = (mask + [True, True, True])[:3]
    if "no_input_grad" in spec.flags:
        mask[0] = False
    model = fwd * (int(mask[0]) + int(mask[1]))
    flops = model + (gy.numel if mask[2] else 0)
    nbytes = gy.nbytes + (x.nbytes + w.nbytes if mask[0] else 0) + (
        x.nbytes + w.nbytes if mask[1] else 0)
    return Cost(flops, model, nbytes, precision(gy, x, w))


def by_output(call: Call, spec: Spec) -> Cost | None:
    """A convolution or dense layer counted from its output and weight: ``2 · numel(y) ·
    prod(w) / C_out`` — each output element is a dot product over ``prod(w) / C_out`` weights
    (a kernel window × input channels per group) — where ``y`` is the output (or, for the
    gradients, the output's gradient) and ``w`` the weight (or its gradient). ``C_out`` is
    ``w``'s first axis with ``cout_first`` (OIHW, [out, in]), else its last (TensorFlow's HWIO);
    ``depthwise``: the last two (HWIM). With ``backward``: the input's and the weight's
    gradients, one pass each (the input's left out where the ``mask`` says so)."""
    y, w = spec.tensor(call, "y"), spec.tensor(call, "w")
    if y is None or w is None or len(w.shape) < 2:
        return None
    if "depthwise" in spec.flags:
        cout = w.shape[-1] * w.shape[-2]
    else:
        cout = w.shape[0] if "cout_first" in spec.flags else w.shape[-1]
    if cout <= 0:
        return None
    fwd = 2.0 * y.numel * math.prod(w.shape) / cout
    passes = 1
    if "backward" in spec.flags:
        mask = bools(spec.text(call, "mask")) or [True, True]
        passes = int(mask[0]) + int(mask[1] if len(mask) > 1 else True)
    model = fwd * passes
    x = spec.tensor(call, "x")
    nbytes = total_bytes(y, w, x) * (2 if "backward" in spec.flags else 1)
    return Cost(model, model, nbytes, precision(x, w, y))


def _attention_dims(q: Tensor, k: Tensor, v: Tensor, blhd: bool
                    ) -> tuple[int, int, int, int, int] | None:
    """(batch × heads, L, S, E, Ev) of attention operands ``[B, H, L, E]`` (``[B, L, H, E]``
    with ``blhd``); grouped-query K/V (fewer heads) are broadcast to the query's heads."""
    if blhd:
        if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
            return None  # varlen ([total, H, E]) needs the sequences' lengths
        (b, lq, h, e), (_, s, _, _), ev = q.shape, k.shape, v.shape[-1]
        return b * h, lq, s, e, ev
    if len(q.shape) < 2 or len(k.shape) < 2 or len(v.shape) < 2:
        return None
    bh = math.prod(q.shape[:-2])
    return bh, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]


def attention(call: Call, spec: Spec) -> Cost | None:
    """Scaled dot-product attention forward (SDPA, flash, memory-efficient, cuDNN):
    ``2·BH·L·S·E + 2·BH·L·S·Ev``."""
    q, k, v = spec.tensor(call, "q"), spec.tensor(call, "k"), spec.tensor(call, "v")
    if q is None or k is None or v is None:
        return None
    dims = _attention_dims(q, k, v, "blhd" in spec.flags)
    if dims is None:
        return None
    bh, lq, s, e, ev = dims
    flops = 2.0 * bh * lq * s * (e + ev)
    out = Tensor((bh, lq, ev), q.dtype)
    # the softmax over the scores: a few FLOPs per score, on the hardware only
    hw = flops + spec.factor * bh * lq * s
    return Cost(hw, flops, total_bytes(q, k, v, out), precision(q, k, v))


def attention_backward(call: Call, spec: Spec) -> Cost | None:
    """Attention backward: four matmuls (``dV``, ``dP``, ``dQ``, ``dK``), twice the forward;
    kernels that do not keep the scores (``recompute``: flash, memory-efficient, cuDNN) compute
    ``Q·Kᵀ`` again, a fifth matmul counted as ``torch.utils.flop_counter`` counts these
    kernels."""
    gy, q, k, v = (spec.tensor(call, r) for r in ("gy", "q", "k", "v"))
    if q is None or k is None or v is None:
        return None
    dims = _attention_dims(q, k, v, "blhd" in spec.flags)
    if dims is None:
        return None
    bh, lq, s, e, ev = dims
    model = 4.0 * bh * lq * s * (e + ev) + (2.0 * bh * lq * s * e
                                            if "recompute" in spec.flags else 0.0)
    hw = model + spec.factor * bh * lq * s
    nbytes = 2 * total_bytes(q, k, v) + 2 * (gy.nbytes if gy is not None else q.nbytes)
    return Cost(hw, model, nbytes, precision(q, k, v))


def recurrent(call: Call, spec: Spec) -> Cost | None:
    """A fused recurrent layer (mkldnn's, cuDNN's, MIOpen's LSTM/GRU/RNN): every token goes
    through every 2-D weight (input-to-hidden and hidden-to-hidden, each layer and direction):
    ``2 · tokens · Σ numel(W)``; backward (``backward`` flag) twice that (the inputs' and
    the weights' gradients)."""
    x = spec.tensor(call, "x")
    weights = [t for r in ("w", "w2", "weights") for t in spec.tensors(call, r)]
    mats = [t for t in weights if len(t.shape) == 2]
    if x is None or not x.shape or not mats:
        return None
    tokens = x.numel // x.shape[-1] if x.shape[-1] else 0
    fwd = 2.0 * tokens * sum(t.numel for t in mats)
    model = fwd * (2 if "backward" in spec.flags else 1)
    hidden = min(t.shape[1] for t in mats)
    out = Tensor((tokens, hidden), x.dtype)
    dtype = x.dtype or LIST_DTYPE
    wbytes = sum(t.numel for t in weights) * DTYPE_BYTES.get(dtype, 4)
    scale = 2 if "backward" in spec.flags else 1
    nbytes = scale * (x.nbytes + out.nbytes + wbytes)
    return Cost(model, model, nbytes, precision(x) or precision(Tensor((1,), dtype)))


# ------------------------------------------------------------------ vector families


def _tensor_inputs(call: Call, spec: Spec) -> list[Tensor]:
    """The tensors of the roles a vector family reads (every input when no roles are named)."""
    if spec.roles:
        return [t for r in spec.roles for t in spec.tensors(call, r) if r != "out"]
    return [t for op in call.inputs for t in ((op,) if isinstance(op, Tensor)
                                              else op if isinstance(op, tuple) else ())]


def eltwise(call: Call, spec: Spec) -> Cost | None:
    """An elementwise operator (unary, binary, ternary; in place or not; softmax, activations,
    dropout): ``factor`` FLOPs per output element; reads its tensor inputs, writes the
    broadcast output."""
    ins = _tensor_inputs(call, spec)
    if not ins:
        return None
    shape = broadcast([t.shape for t in ins])
    if shape is None:
        return None
    out_t = spec.tensor(call, "out")
    dtype = next((t.dtype for t in ins if t.dtype in _FLOAT), ins[0].dtype)
    out = out_t or Tensor(shape, dtype)
    flops = spec.factor * out.numel
    extra = float(out.numel) if "mask" in spec.flags else 0.0  # dropout's boolean mask
    return Cost(flops, 0.0, total_bytes(*ins) + out.nbytes + extra, precision(*ins))


def reduce(call: Call, spec: Spec) -> Cost | None:
    """A reduction (sum, mean, max, norm, var …): ``factor`` FLOPs per input element; writes
    the reduced tensor (over ``dim``, else everything)."""
    x = spec.tensor(call, "x")
    if x is None:
        return None
    dims = ints(spec.text(call, "dim"))
    out_t = spec.tensor(call, "out")
    if out_t is None:
        keep = bool(flag(spec.text(call, "keepdim")))
        if dims:
            nd = len(x.shape)
            red = {d % nd for d in dims} if nd else set()
            shape = tuple(1 if i in red else s for i, s in enumerate(x.shape)
                          if keep or i not in red)
        else:
            shape = ()
        out_t = Tensor(shape, x.dtype)
    return Cost(spec.factor * x.numel, 0.0, x.nbytes + out_t.nbytes, precision(x))


def norm(call: Call, spec: Spec) -> Cost | None:
    """Normalization forward (batch, layer, group, instance, RMS): ``factor`` FLOPs per
    element; reads the input (twice with ``stats``: batch norm's training statistics) and its
    parameters, writes the output."""
    x = spec.tensor(call, "x")
    if x is None:
        return None
    params = [t for r in ("w", "b", "rm", "rv") for t in spec.tensors(call, r)]
    reads = 2 if "stats" in spec.flags else 1
    nbytes = reads * x.nbytes + x.nbytes + total_bytes(*params)
    if "residual" in spec.flags:  # a fused add: the residual is read and written back too
        nbytes += 2 * x.nbytes
    return Cost(spec.factor * x.numel, 0.0, nbytes, precision(x))


def grad(call: Call, spec: Spec) -> Cost | None:
    """The backward of a vector operator (normalization, pooling, activation, softmax):
    ``factor`` FLOPs per element of ``x``; reads its tensor inputs, writes ``x``'s gradient
    (and the parameters' with ``params``)."""
    ins = _tensor_inputs(call, spec)
    x = spec.tensor(call, "x") or (max(ins, key=lambda t: t.numel) if ins else None)
    if x is None:
        return None
    params = [t for r in ("w", "b") for t in spec.tensors(call, r)]
    nbytes = total_bytes(*ins) + x.nbytes + total_bytes(*params)
    return Cost(spec.factor * x.numel, 0.0, nbytes, precision(x))


def pool(call: Call, spec: Spec) -> Cost | None:
    """Pooling forward: ``factor`` FLOPs per window element of each output; reads the input,
    writes the output (and max pooling's indices)."""
    x = spec.tensor(call, "x")
    if x is None or len(x.shape) < 2:
        return None
    out_t = spec.tensor(call, "out")
    if "adaptive" in spec.flags:
        size = ints(spec.text(call, "output_size")) or []
        d = len(size)
        if not d or len(x.shape) < d + 1:
            return None
        spatial = x.shape[-d:]
        window = math.prod(-(-i // o) for i, o in zip(spatial, size, strict=True) if o > 0)
        out = Tensor((*x.shape[:-d], *size), x.dtype)
    else:
        kernel = ints(spec.text(call, "kernel"))
        if not kernel:
            return None
        d = len(kernel) if len(kernel) > 1 else max(len(x.shape) - 2, 1)
        k = _per_dim(kernel, d, 1)
        st = _per_dim(ints(spec.text(call, "stride")) or k, d, 1)
        p = _per_dim(ints(spec.text(call, "padding")), d, 0)
        dil = _per_dim(ints(spec.text(call, "dilation")), d, 1)
        if k is None or st is None or p is None or dil is None or len(x.shape) < d + 1:
            return None
        ceil = bool(flag(spec.text(call, "ceil")))
        outs = []
        for i, kk, ss, pp, dd in zip(x.shape[-d:], k, st, p, dil, strict=True):
            span = i + 2 * pp - dd * (kk - 1) - 1
            o = (-(-span // ss) if ceil else span // ss) + 1
            if ceil and (o - 1) * ss >= i + pp:
                o -= 1
            outs.append(o)
        if any(o <= 0 for o in outs):
            return None
        window = math.prod(k)
        out = Tensor((*x.shape[:-d], *outs), x.dtype)
    out = out_t or out
    idx = out.numel * 8 if "indices" in spec.flags else 0
    return Cost(spec.factor * out.numel * window, 0.0, x.nbytes + out.nbytes + idx,
                precision(x))


def copy(call: Call, spec: Spec) -> Cost | None:
    """A copy (``copy_``, ``clone``, ``_to_copy``, ``cat``, ``stack``, layout changes): reads
    its sources, writes the destination (``dst``; else as much as it read, in ``dtype``'s
    size where the call names a ScalarType)."""
    src = [t for r in spec.roles if r not in ("dst", "dtype", "out")
           for t in spec.tensors(call, r)]
    if not spec.roles:
        src = _tensor_inputs(call, spec)
    dst = spec.tensor(call, "dst") or spec.tensor(call, "out")
    if not src and dst is None:
        return None
    read = total_bytes(*src)
    if dst is not None:
        write = dst.nbytes
    else:
        size = _SCALAR_TYPE.get((ints(spec.text(call, "dtype")) or [-1])[0])
        numel = sum(t.numel for t in src)
        write = numel * DTYPE_BYTES[size] if size else read
    return Cost(0.0, 0.0, read + write, "")


def fill(call: Call, spec: Spec) -> Cost | None:
    """Writing a tensor (``zero_``, ``fill_``, ``zeros``, ``ones``, ``full``): its bytes."""
    x = spec.tensor(call, "x")
    if x is not None:
        return Cost(0.0, 0.0, x.nbytes, "")
    size = ints(spec.text(call, "size"))
    if size is None:
        return None
    dtype = _SCALAR_TYPE.get((ints(spec.text(call, "dtype")) or [6])[0], "fp32")
    return Cost(0.0, 0.0, float(math.prod(size) * DTYPE_BYTES[dtype]), "")


def free(call: Call, spec: Spec) -> Cost | None:
    """No work: views, aliases, allocations, metadata (known to cost nothing)."""
    return Cost(0.0, 0.0, 0.0, "")


def embedding(call: Call, spec: Spec) -> Cost | None:
    """An embedding lookup: reads the indices and the rows they pick, writes them."""
    w, idx = spec.tensor(call, "w"), spec.tensor(call, "idx")
    if w is None or idx is None or len(w.shape) != 2:
        return None
    rows = idx.numel * w.shape[1] * DTYPE_BYTES.get(w.dtype, 4)
    return Cost(0.0, 0.0, idx.nbytes + 2.0 * rows, "")


def embedding_backward(call: Call, spec: Spec) -> Cost | None:
    """An embedding's gradient: reads the output's gradient and the indices, accumulates into
    the table's gradient (``num_weights`` rows), one add per element."""
    gy, idx = spec.tensor(call, "gy"), spec.tensor(call, "idx")
    if gy is None or idx is None or not gy.shape:
        return None
    rows = (ints(spec.text(call, "num_weights")) or [0])[0]
    table = rows * gy.shape[-1] * DTYPE_BYTES.get(gy.dtype, 4)
    return Cost(float(gy.numel), 0.0, 2 * gy.nbytes + idx.nbytes + table, precision(gy))


def foreach(call: Call, spec: Spec) -> Cost | None:
    """A ``_foreach_*`` operator over tensor lists: ``factor`` FLOPs per element of the first
    list; reads every list, writes the first (in place) or an output list of its size. List
    elements are taken to be :data:`LIST_DTYPE` (Kineto records no dtype for a list)."""
    lists = [op for op in call.inputs if isinstance(op, tuple) and op]
    if not lists:
        return None
    size = DTYPE_BYTES[LIST_DTYPE]
    numel = [sum(t.numel for t in lst) for lst in lists]
    if any(len(lst) != len(lists[0]) for lst in lists):
        return None
    return Cost(spec.factor * numel[0], 0.0, float((sum(numel) + numel[0]) * size),
                LIST_DTYPE)


def optimizer(call: Call, spec: Spec) -> Cost | None:
    """A fused optimizer step (``_fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``; TF's and
    MXNet's update kernels): ``factor`` FLOPs per parameter element; reads the parameters,
    gradients and state (the roles named), writes the parameters and state (every role but
    ``g``)."""
    per_role = {r: spec.tensors(call, r) for r in spec.roles}
    params = per_role.get("p", ())
    if not params:
        return None
    numel = sum(t.numel for t in params)

    def nbytes(ts: tuple[Tensor, ...]) -> float:
        return float(sum(t.numel * DTYPE_BYTES.get(t.dtype or LIST_DTYPE, 4) for t in ts))

    read = sum(nbytes(ts) for ts in per_role.values())
    write = sum(nbytes(ts) for r, ts in per_role.items() if r != "g")
    return Cost(spec.factor * numel, 0.0, read + write, params[0].dtype or LIST_DTYPE)


def gather(call: Call, spec: Spec) -> Cost | None:
    """A gather by index (``nll_loss``: one element per row): reads the indices and the
    gathered elements, writes them."""
    x, idx = spec.tensor(call, "x"), spec.tensor(call, "idx")
    if x is None or idx is None:
        return None
    size = DTYPE_BYTES.get(x.dtype, 4)
    return Cost(float(idx.numel), 0.0, idx.nbytes + 2.0 * idx.numel * size, precision(x))


#: c10::ScalarType codes (the ``dtype`` of ``_to_copy``, ``zeros`` …) → canonical dtypes.
_SCALAR_TYPE = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "fp16",
                6: "fp32", 7: "fp64", 9: "complex64", 10: "complex128", 11: "bool",
                15: "bf16", 23: "fp8", 24: "fp8", 25: "fp8", 26: "fp8"}

#: ``composite`` rows: an operator whose cost is that of the operators it runs, each counted
#: on its own (``einsum``: Kineto records no equation; ``reshape`` copies only sometimes).
COMPOSITE = "composite"

Family = Callable[[Call, Spec], "Cost | None"]
FAMILIES: dict[str, Family] = {
    "gemm": gemm, "conv": conv, "conv_backward": conv_backward, "by_output": by_output,
    "attention": attention,
    "attention_backward": attention_backward, "recurrent": recurrent, "eltwise": eltwise,
    "reduce": reduce, "norm": norm, "grad": grad, "pool": pool, "copy": copy, "fill": fill,
    "free": free, "embedding": embedding, "embedding_backward": embedding_backward,
    "foreach": foreach, "optimizer": optimizer, "gather": gather,
}
#: The families whose FLOPs are the model's (matmul-like).
MATMUL_FAMILIES = frozenset({"gemm", "conv", "conv_backward", "by_output", "attention",
                             "attention_backward", "recurrent"})
