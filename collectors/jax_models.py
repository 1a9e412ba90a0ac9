"""The benchmark models in plain JAX (no Flax), the same networks as :mod:`.torch_models`
(the reference: layer and parameter counts match it), in JAX's own layouts: NHWC
activations, HWIO convolution kernels, in×out dense weights (no transpose per step, as JAX
users write them).

A model is a :class:`Model`: ``init(key)`` gives its parameters (a nested dict, one entry
per layer, each layer's arrays named as torch names them, in JAX's layouts) and its state
(BatchNorm's running statistics); ``apply(params, state, x, train, key)`` the logits and the
new state. Every layer runs under ``jax.named_scope(<layer name>)`` (``conv1``, ``bn1``,
``fc``, ``pool1`` …), so the HLO ops XLA compiles keep the layer in their metadata's op name
(``jit(train_step)/transpose(jvp(bn1))/…``): opprof's mapping table (normalizers/maps/jax.csv)
reads the layer from there, as TensorFlow's reads Keras' layer scopes. Initialization is
torch's default (uniform ±1/√fan_in for weights and biases; BatchNorm γ = 1, β = 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from opprof.collectors.config import (
    D_MODEL,
    EMBED_DIM,
    ENCODER_LAYERS,
    FCN_HIDDEN,
    FCN_WIDTH,
    FF_DIM,
    HEADS,
    LSTM_HIDDEN,
    LSTM_LAYERS,
    SEQ_LEN,
    canonical_name,
)

Params = dict[str, Any]
BN_EPS, BN_MOMENTUM, LN_EPS = 1e-5, 0.1, 1e-5


@dataclass
class Model:
    """A network: its layers' shapes (``init``) and its forward pass (``apply``)."""

    name: str
    shapes: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    fan_in: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # layer → conv, fc, batchnorm …
    forward: Callable[..., Any] | None = None

    def layer(self, name: str, kind: str, fan_in: int, **shapes: tuple[int, ...]) -> str:
        self.shapes[name], self.fan_in[name], self.kinds[name] = dict(shapes), fan_in, kind
        return name

    def init(self, key: jax.Array) -> tuple[Params, Params]:
        """(parameters, state): torch's default initialization, seeded by ``key``."""
        params: Params = {}
        state: Params = {}
        for i, (name, shapes) in enumerate(self.shapes.items()):
            kind, bound = self.kinds[name], 1.0 / math.sqrt(max(self.fan_in[name], 1))
            layer: dict[str, jax.Array] = {}
            for j, (arr, shape) in enumerate(shapes.items()):
                k = jax.random.fold_in(key, i * 16 + j)
                if kind in ("batchnorm", "layernorm"):
                    layer[arr] = jnp.ones(shape) if arr == "weight" else jnp.zeros(shape)
                elif kind == "embedding":
                    layer[arr] = jax.random.normal(k, shape)
                else:
                    layer[arr] = jax.random.uniform(k, shape, minval=-bound, maxval=bound)
            params[name] = layer
            if kind == "batchnorm":
                c = shapes["weight"][0]
                state[name] = {"mean": jnp.zeros(c), "var": jnp.ones(c)}
        return params, state

    def apply(self, params: Params, state: Params, x: jax.Array, train: bool,
              key: jax.Array | None = None) -> tuple[jax.Array, Params]:
        """Logits and the new state (BatchNorm's running statistics when ``train``)."""
        assert self.forward is not None
        ctx = _Ctx(params, dict(state), train, key)
        return self.forward(ctx, x), ctx.new_state


@dataclass
class _Ctx:
    params: Params
    state: Params
    train: bool
    key: jax.Array | None
    new_state: Params = field(default_factory=dict)
    drops: int = 0

    def __post_init__(self) -> None:
        self.new_state = dict(self.state)


# ------------------------------------------------------------------ layers


def conv(c: _Ctx, name: str, x: jax.Array, stride: int, pad: int) -> jax.Array:
    """2-D convolution (kernel kh×kw×I×O), NHWC in and out."""
    p = c.params[name]
    with jax.named_scope(name):
        y = jax.lax.conv_general_dilated(
            x, p["weight"], (stride, stride), [(pad, pad), (pad, pad)],
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + p["bias"] if "bias" in p else y


def dense(c: _Ctx, name: str, x: jax.Array) -> jax.Array:
    """Fully connected layer (weights in×out)."""
    p = c.params[name]
    with jax.named_scope(name):
        return x @ p["weight"] + p["bias"]


def relu(x: jax.Array) -> jax.Array:
    return jax.nn.relu(x)


def maxpool(name: str, x: jax.Array, k: int, s: int) -> jax.Array:
    """Max pooling, no padding, floor rounding."""
    with jax.named_scope(name):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, k, k, 1), (1, s, s, 1),
                                     "VALID")


def batchnorm(c: _Ctx, name: str, x: jax.Array) -> jax.Array:
    """BatchNorm over N, H, W: batch statistics in training (the running ones updated, as
    torch does, with the unbiased variance), the running ones otherwise."""
    p = c.params[name]
    with jax.named_scope(name):
        if c.train:
            mean = x.mean(axis=(0, 1, 2))
            var = x.var(axis=(0, 1, 2))
            n = x.size // x.shape[-1]
            old = c.state[name]
            c.new_state[name] = {
                "mean": (1 - BN_MOMENTUM) * old["mean"] + BN_MOMENTUM * mean,
                "var": (1 - BN_MOMENTUM) * old["var"] + BN_MOMENTUM * var * n / max(n - 1, 1)}
        else:
            mean, var = c.state[name]["mean"], c.state[name]["var"]
        return (x - mean) * jax.lax.rsqrt(var + BN_EPS) * p["weight"] + p["bias"]


def dropout(c: _Ctx, name: str, x: jax.Array, rate: float) -> jax.Array:
    if not c.train or c.key is None:
        return x
    with jax.named_scope(name):
        c.drops += 1
        keep = jax.random.bernoulli(jax.random.fold_in(c.key, c.drops), 1 - rate, x.shape)
        return jnp.where(keep, x / (1 - rate), 0.0)


def layernorm(c: _Ctx, name: str, x: jax.Array) -> jax.Array:
    p = c.params[name]
    with jax.named_scope(name):
        mean = x.mean(-1, keepdims=True)
        var = x.var(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + LN_EPS) * p["weight"] + p["bias"]


# ------------------------------------------------------------------ the networks


def _conv_layer(m: Model, name: str, cin: int, cout: int, k: int, bias: bool) -> None:
    shapes: dict[str, tuple[int, ...]] = {"weight": (k, k, cin, cout)}
    if bias:
        shapes["bias"] = (cout,)
    m.layer(name, "conv", cin * k * k, **shapes)


def _fc_layer(m: Model, name: str, din: int, dout: int) -> None:
    m.layer(name, "fc", din, weight=(din, dout), bias=(dout,))


def _bn_layer(m: Model, name: str, c: int) -> None:
    m.layer(name, "batchnorm", c, weight=(c,), bias=(c,))


def lenet5(classes: int) -> Model:
    m = Model("lenet5")
    _conv_layer(m, "conv1", 3, 6, 5, True)
    _conv_layer(m, "conv2", 6, 16, 5, True)
    for name, din, dout in (("fc1", 400, 120), ("fc2", 120, 84), ("fc3", 84, classes)):
        _fc_layer(m, name, din, dout)

    def forward(c: _Ctx, x: jax.Array) -> jax.Array:
        x = maxpool("pool1", relu(conv(c, "conv1", x, 1, 0)), 2, 2)
        x = maxpool("pool2", relu(conv(c, "conv2", x, 1, 0)), 2, 2)
        x = x.reshape(x.shape[0], -1)
        x = relu(dense(c, "fc1", x))
        x = relu(dense(c, "fc2", x))
        return dense(c, "fc3", x)

    m.forward = forward
    return m


def alexnet(classes: int) -> Model:
    m = Model("alexnet")
    convs = (("conv1", 3, 64, 5), ("conv2", 64, 192, 5), ("conv3", 192, 384, 3),
             ("conv4", 384, 256, 3), ("conv5", 256, 256, 3))
    for name, cin, cout, k in convs:
        _conv_layer(m, name, cin, cout, k, True)
    for name, din, dout in (("fc1", 2304, 1024), ("fc2", 1024, 1024), ("fc3", 1024, classes)):
        _fc_layer(m, name, din, dout)

    def forward(c: _Ctx, x: jax.Array) -> jax.Array:
        x = maxpool("pool1", relu(conv(c, "conv1", x, 2, 2)), 3, 2)
        x = maxpool("pool2", relu(conv(c, "conv2", x, 1, 2)), 3, 2)
        x = relu(conv(c, "conv3", x, 1, 1))
        x = relu(conv(c, "conv4", x, 1, 1))
        x = maxpool("pool3", relu(conv(c, "conv5", x, 1, 1)), 3, 2)
        x = x.reshape(x.shape[0], -1)
        x = relu(dense(c, "fc1", dropout(c, "dropout1", x, 0.5)))
        x = relu(dense(c, "fc2", dropout(c, "dropout2", x, 0.5)))
        return dense(c, "fc3", x)

    m.forward = forward
    return m


def fcn(classes: int) -> Model:
    m = Model("fcn")
    width = 3 * 32 * 32
    names = []
    for i in range(FCN_HIDDEN):
        _fc_layer(m, f"fc{i + 1}", width, FCN_WIDTH)
        names.append(f"fc{i + 1}")
        width = FCN_WIDTH
    _fc_layer(m, "head", width, classes)

    def forward(c: _Ctx, x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0], -1)
        for name in names:
            x = relu(dense(c, name, x))
        return dense(c, "head", x)

    m.forward = forward
    return m


def resnet(name: str, bottleneck: bool, blocks: list[int], classes: int) -> Model:
    m = Model(name)
    _conv_layer(m, "conv1", 3, 64, 3, False)
    _bn_layer(m, "bn1", 64)
    expansion = 4 if bottleneck else 1
    plan: list[tuple[str, int, int, bool]] = []  # block prefix, stride, in planes, shortcut
    cin = 64
    for s, (planes, count, stride) in enumerate(zip((64, 128, 256, 512), blocks, (1, 2, 2, 2),
                                                    strict=True)):
        for b in range(count):
            st = stride if b == 0 else 1
            pre = f"layer{s + 1}.{b}"
            cout = planes * expansion
            if bottleneck:
                _conv_layer(m, f"{pre}.conv1", cin, planes, 1, False)
                _bn_layer(m, f"{pre}.bn1", planes)
                _conv_layer(m, f"{pre}.conv2", planes, planes, 3, False)
                _bn_layer(m, f"{pre}.bn2", planes)
                _conv_layer(m, f"{pre}.conv3", planes, cout, 1, False)
                _bn_layer(m, f"{pre}.bn3", cout)
            else:
                _conv_layer(m, f"{pre}.conv1", cin, planes, 3, False)
                _bn_layer(m, f"{pre}.bn1", planes)
                _conv_layer(m, f"{pre}.conv2", planes, planes, 3, False)
                _bn_layer(m, f"{pre}.bn2", planes)
            short = st != 1 or cin != cout
            if short:
                _conv_layer(m, f"{pre}.shortcut.conv", cin, cout, 1, False)
                _bn_layer(m, f"{pre}.shortcut.bn", cout)
            plan.append((pre, st, cin, short))
            cin = cout
    _fc_layer(m, "fc", cin, classes)

    def block(c: _Ctx, pre: str, st: int, short: bool, x: jax.Array) -> jax.Array:
        if bottleneck:
            out = relu(batchnorm(c, f"{pre}.bn1", conv(c, f"{pre}.conv1", x, 1, 0)))
            out = relu(batchnorm(c, f"{pre}.bn2", conv(c, f"{pre}.conv2", out, st, 1)))
            out = batchnorm(c, f"{pre}.bn3", conv(c, f"{pre}.conv3", out, 1, 0))
        else:
            out = relu(batchnorm(c, f"{pre}.bn1", conv(c, f"{pre}.conv1", x, st, 1)))
            out = batchnorm(c, f"{pre}.bn2", conv(c, f"{pre}.conv2", out, 1, 1))
        if short:
            x = batchnorm(c, f"{pre}.shortcut.bn", conv(c, f"{pre}.shortcut.conv", x, st, 0))
        return relu(out + x)

    def forward(c: _Ctx, x: jax.Array) -> jax.Array:
        x = relu(batchnorm(c, "bn1", conv(c, "conv1", x, 1, 1)))
        for pre, st, _, short in plan:
            x = block(c, pre, st, short, x)
        with jax.named_scope("avgpool"):
            x = x.mean(axis=(1, 2))
        return dense(c, "fc", x)

    m.forward = forward
    return m


def lstm_model(vocab: int) -> Model:
    m = Model("lstm")
    m.layer("embed", "embedding", 1, weight=(vocab, EMBED_DIM))
    din = EMBED_DIM
    for i in range(LSTM_LAYERS):
        m.layer(f"lstm{i}", "recurrent", LSTM_HIDDEN, weight_ih=(din, 4 * LSTM_HIDDEN),
                weight_hh=(LSTM_HIDDEN, 4 * LSTM_HIDDEN), bias_ih=(4 * LSTM_HIDDEN,),
                bias_hh=(4 * LSTM_HIDDEN,))
        din = LSTM_HIDDEN
    _fc_layer(m, "head", LSTM_HIDDEN, vocab)

    def forward(c: _Ctx, tokens: jax.Array) -> jax.Array:
        with jax.named_scope("embed"):
            x = c.params["embed"]["weight"][tokens]
        for i in range(LSTM_LAYERS):
            p = c.params[f"lstm{i}"]
            with jax.named_scope(f"lstm{i}"):
                def cell(carry: tuple[jax.Array, jax.Array], xt: jax.Array,
                         p: Params = p) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
                    h, cc = carry
                    g = xt @ p["weight_ih"] + p["bias_ih"] + h @ p["weight_hh"] + p["bias_hh"]
                    i_, f_, g_, o_ = jnp.split(g, 4, axis=-1)
                    cc = jax.nn.sigmoid(f_) * cc + jax.nn.sigmoid(i_) * jnp.tanh(g_)
                    h = jax.nn.sigmoid(o_) * jnp.tanh(cc)
                    return (h, cc), h

                zeros = jnp.zeros((x.shape[0], LSTM_HIDDEN), x.dtype)
                _, hs = jax.lax.scan(cell, (zeros, zeros), x.transpose(1, 0, 2))
                x = hs.transpose(1, 0, 2)
        return dense(c, "head", x)

    m.forward = forward
    return m


def transformer_model(vocab: int) -> Model:
    m = Model("transformer")
    m.layer("embed", "embedding", 1, weight=(vocab, D_MODEL))
    m.layer("position", "embedding", 1, weight=(SEQ_LEN, D_MODEL))
    for i in range(ENCODER_LAYERS):
        m.layer(f"layer{i}.attention", "attention", D_MODEL,
                in_proj_weight=(D_MODEL, 3 * D_MODEL), in_proj_bias=(3 * D_MODEL,),
                out_proj_weight=(D_MODEL, D_MODEL), out_proj_bias=(D_MODEL,))
        _fc_layer(m, f"layer{i}.linear1", D_MODEL, FF_DIM)
        _fc_layer(m, f"layer{i}.linear2", FF_DIM, D_MODEL)
        for n in ("norm1", "norm2"):
            m.layer(f"layer{i}.{n}", "layernorm", D_MODEL, weight=(D_MODEL,), bias=(D_MODEL,))
    _fc_layer(m, "head", D_MODEL, vocab)

    def attention(c: _Ctx, name: str, x: jax.Array) -> jax.Array:
        p = c.params[name]
        b, t, d = x.shape
        with jax.named_scope(name):
            q, k, v = jnp.split(x @ p["in_proj_weight"] + p["in_proj_bias"], 3, axis=-1)

            def heads(a: jax.Array) -> jax.Array:
                return a.reshape(b, t, HEADS, d // HEADS).transpose(0, 2, 1, 3)

            scores = heads(q) @ heads(k).transpose(0, 1, 3, 2) / math.sqrt(d // HEADS)
            mask = jnp.tril(jnp.ones((t, t), bool))
            scores = jnp.where(mask, scores, -jnp.inf)
            out = jax.nn.softmax(scores, axis=-1) @ heads(v)
            out = out.transpose(0, 2, 1, 3).reshape(b, t, d)
            return out @ p["out_proj_weight"] + p["out_proj_bias"]

    def forward(c: _Ctx, tokens: jax.Array) -> jax.Array:
        with jax.named_scope("embed"):
            x = c.params["embed"]["weight"][tokens] + c.params["position"]["weight"][
                jnp.arange(tokens.shape[1])]
        for i in range(ENCODER_LAYERS):
            pre = f"layer{i}"
            x = layernorm(c, f"{pre}.norm1", x + attention(c, f"{pre}.attention", x))
            ff = dense(c, f"{pre}.linear2", relu(dense(c, f"{pre}.linear1", x)))
            x = layernorm(c, f"{pre}.norm2", x + ff)
        return dense(c, "head", x)

    m.forward = forward
    return m


def build(name: str, classes: int) -> Model:
    """The built-in model ``name`` for ``classes`` classes (the vocabulary for the language
    models)."""
    key = canonical_name(name)
    if key == "lenet5":
        return lenet5(classes)
    if key == "alexnet":
        return alexnet(classes)
    if key == "fcn":
        return fcn(classes)
    if key == "lstm":
        return lstm_model(classes)
    if key == "transformer":
        return transformer_model(classes)
    if key == "resnet18":
        return resnet("resnet18", False, [2, 2, 2, 2], classes)
    return resnet("resnet50", True, [3, 4, 6, 3], classes)


def layer_counts(model: Model) -> dict[str, int]:
    """Conv, fc and batchnorm layers and parameters (running statistics not counted), as
    :func:`opprof.collectors.torch_models.layer_counts` counts them."""
    kinds = list(model.kinds.values())
    counts = {"conv": kinds.count("conv"), "fc": kinds.count("fc"),
              "batchnorm": kinds.count("batchnorm"),
              "params": int(sum(int(np.prod(s)) for shapes in model.shapes.values()
                                for s in shapes.values()))}
    if "embedding" in kinds:
        counts |= {"embedding": kinds.count("embedding"), "recurrent": kinds.count("recurrent"),
                   "attention": kinds.count("attention"), "layernorm": kinds.count("layernorm")}
    return counts
