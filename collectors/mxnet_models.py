"""The four benchmark models in MXNet Gluon, layer for layer the CIFAR forms of torch_models.

The architectures, input sizes and parameter counts are those documented in
:mod:`opprof.collectors.torch_models` (the reference); tests/test_model_parity.py checks that
both frameworks build the same conv / fc / batchnorm layers and parameter counts. Every layer
is given its input size up front (``in_channels`` / ``in_units``), so shapes and parameter
counts are known before the first forward pass. Differences that do not change the network:
Gluon's BatchNorm ``momentum=0.9`` is torch's ``momentum=0.1`` (the weight of the running
average); ``Dense`` flattens its input itself; the weight initializer is chosen to match
torch's default (uniform in ±1/sqrt(fan_in)).

The language models: Gluon's ``rnn.LSTM`` is MXNet's fused ``RNN`` operator with torch's
parameters (two biases per layer); Gluon has no attention layer, so multi-head self-attention
is built from a Dense for q, k, v (torch's ``in_proj``), ``batch_dot``, a masked ``softmax``
and a Dense output projection. Embeddings start as torch's, normal with standard deviation 1.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from opprof.collectors.config import INPUT_SIZE, canonical_name
from opprof.collectors.mxnet_lib import import_mxnet

mx = import_mxnet()
nn = mx.gluon.nn
HybridBlock: Any = nn.HybridBlock  # (MXNet ships no types: a base class of Any)

__all__ = ["INPUT_SIZE", "build", "canonical_name", "initializer", "layer_counts"]


def initializer() -> Any:
    """Weights uniform in ±1/sqrt(fan_in), as torch initializes conv and linear weights."""
    return mx.init.Xavier(rnd_type="uniform", factor_type="in", magnitude=1)


def _relu() -> Any:
    return nn.Activation("relu")


def lenet5(num_classes: int = 10) -> Any:
    """LeNet-5 for 32×32×3 input, with ReLU and max pooling."""
    net = nn.HybridSequential(prefix="lenet5_")
    with net.name_scope():
        net.add(
            nn.Conv2D(6, 5, in_channels=3), _relu(), nn.MaxPool2D(2, 2),
            nn.Conv2D(16, 5, in_channels=6), _relu(), nn.MaxPool2D(2, 2),
            nn.Dense(120, in_units=16 * 5 * 5), _relu(),
            nn.Dense(84, in_units=120), _relu(),
            nn.Dense(num_classes, in_units=84),
        )
    return net


def fcn(num_classes: int = 10) -> Any:
    """The fully connected network (torch_models.FCN): three hidden ReLU layers on the
    flattened image (Dense flattens its input)."""
    from opprof.collectors.config import FCN_HIDDEN as hidden
    from opprof.collectors.config import FCN_WIDTH as width

    net = nn.HybridSequential(prefix="fcn_")
    with net.name_scope():
        units = 3 * 32 * 32
        for _ in range(hidden):
            net.add(nn.Dense(width, in_units=units), _relu())
            units = width
        net.add(nn.Dense(num_classes, in_units=units))
    return net


def _embedding(rows: int, dim: int) -> Any:
    return nn.Embedding(rows, dim, weight_initializer=mx.init.Normal(1.0))


def lstm(vocab: int) -> Any:
    """The LSTM language model (torch_models.LSTMLanguageModel), batch-major (NTC)."""
    from opprof.collectors.config import EMBED_DIM, LSTM_HIDDEN, LSTM_LAYERS

    net = nn.HybridSequential(prefix="lstm_")
    with net.name_scope():
        net.add(_embedding(vocab, EMBED_DIM),
                mx.gluon.rnn.LSTM(LSTM_HIDDEN, num_layers=LSTM_LAYERS, layout="NTC",
                                  input_size=EMBED_DIM),
                nn.Dense(vocab, in_units=LSTM_HIDDEN, flatten=False))
    return net


class SelfAttention(HybridBlock):
    """Causal multi-head self-attention: one Dense for q, k and v, scaled dot products per
    head (``batch_dot``), a softmax masked to positions ≤ t, a Dense output projection."""

    def __init__(self, dim: int, heads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dim, self.heads = dim, heads
        with self.name_scope():
            self.qkv = nn.Dense(3 * dim, in_units=dim, flatten=False)
            self.out = nn.Dense(dim, in_units=dim, flatten=False)

    def hybrid_forward(self, F: ModuleType, x: Any) -> Any:  # noqa: N803 (Gluon's signature)
        heads, depth = self.heads, self.dim // self.heads
        qkv = self.qkv(x).reshape((0, 0, 3, heads, depth))  # N×T×3×H×D
        qkv = qkv.transpose((2, 0, 3, 1, 4)).reshape((3, -3, 0, 0))  # 3×(N·H)×T×D
        q, k, v = F.split(qkv, num_outputs=3, axis=0, squeeze_axis=True)
        scores = F.batch_dot(q, k, transpose_b=True) / float(np.sqrt(depth))  # (N·H)×T×T
        steps = F.contrib.arange_like(scores, axis=-1)
        causal = F.broadcast_lesser_equal(steps.reshape((1, -1)), steps.reshape((-1, 1)))
        scores = F.broadcast_add(scores, ((1 - causal) * -1e9).expand_dims(0))
        mixed = F.batch_dot(F.softmax(scores, axis=-1), v)  # (N·H)×T×D
        mixed = mixed.reshape((-4, -1, heads, 0, 0)).transpose((0, 2, 1, 3))
        return self.out(mixed.reshape((0, 0, -3)))


class EncoderLayer(HybridBlock):
    """Post-norm encoder layer: x + attention, LayerNorm; x + feed-forward, LayerNorm."""

    def __init__(self, dim: int, heads: int, ff: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.attention = SelfAttention(dim, heads)
            self.norm1 = nn.LayerNorm(epsilon=1e-5, in_channels=dim)
            self.ff1 = nn.Dense(ff, in_units=dim, flatten=False, activation="relu")
            self.ff2 = nn.Dense(dim, in_units=ff, flatten=False)
            self.norm2 = nn.LayerNorm(epsilon=1e-5, in_channels=dim)

    def hybrid_forward(self, F: ModuleType, x: Any) -> Any:  # noqa: N803 (Gluon's signature)
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.ff2(self.ff1(x)))


class TransformerLanguageModel(HybridBlock):
    """Token + position embedding → causal encoder layers → Dense to the vocabulary."""

    def __init__(self, vocab: int, **kwargs: Any) -> None:
        from opprof.collectors.config import D_MODEL, ENCODER_LAYERS, FF_DIM, HEADS, SEQ_LEN

        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = _embedding(vocab, D_MODEL)
            self.position = _embedding(SEQ_LEN, D_MODEL)
            self.layers = nn.HybridSequential()
            for _ in range(ENCODER_LAYERS):
                self.layers.add(EncoderLayer(D_MODEL, HEADS, FF_DIM))
            self.head = nn.Dense(vocab, in_units=D_MODEL, flatten=False)

    def hybrid_forward(self, F: ModuleType, tokens: Any) -> Any:  # noqa: N803 (Gluon's signature)
        positions = F.contrib.arange_like(tokens, axis=1)
        x = F.broadcast_add(self.embed(tokens), self.position(positions).expand_dims(0))
        return self.head(self.layers(x))


def alexnet(num_classes: int = 10) -> Any:
    """CIFAR-style AlexNet for 64×64×3 input: 5 conv + 3 fc, no BatchNorm."""
    net = nn.HybridSequential(prefix="alexnet_")
    with net.name_scope():
        net.add(
            nn.Conv2D(64, 5, strides=2, padding=2, in_channels=3), _relu(), nn.MaxPool2D(3, 2),
            nn.Conv2D(192, 5, padding=2, in_channels=64), _relu(), nn.MaxPool2D(3, 2),
            nn.Conv2D(384, 3, padding=1, in_channels=192), _relu(),
            nn.Conv2D(256, 3, padding=1, in_channels=384), _relu(),
            nn.Conv2D(256, 3, padding=1, in_channels=256), _relu(),
            nn.MaxPool2D(3, 2),
            nn.Dropout(0.5), nn.Dense(1024, in_units=256 * 3 * 3), _relu(),
            nn.Dropout(0.5), nn.Dense(1024, in_units=1024), _relu(),
            nn.Dense(num_classes, in_units=1024),
        )
    return net


def _bn(channels: int) -> Any:
    return nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=channels)


def _conv(channels: int, kernel: int, stride: int, in_channels: int) -> Any:
    return nn.Conv2D(channels, kernel, strides=stride, padding=kernel // 2,
                     in_channels=in_channels, use_bias=False)


def _shortcut(in_planes: int, out_planes: int, stride: int) -> Any:
    if stride == 1 and in_planes == out_planes:
        return None
    block = nn.HybridSequential(prefix="shortcut_")
    with block.name_scope():
        block.add(_conv(out_planes, 1, stride, in_planes), _bn(out_planes))
    return block


class BasicBlock(HybridBlock):
    """ResNet basic block: two 3×3 convs with BatchNorm, identity or 1×1-conv shortcut."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv1 = _conv(planes, 3, stride, in_planes)
            self.bn1 = _bn(planes)
            self.conv2 = _conv(planes, 3, 1, planes)
            self.bn2 = _bn(planes)
            self.shortcut = _shortcut(in_planes, planes, stride)

    def hybrid_forward(self, F: ModuleType, x: Any) -> Any:  # noqa: N803 (Gluon's signature)
        out = F.Activation(self.bn1(self.conv1(x)), act_type="relu")
        out = self.bn2(self.conv2(out))
        short = x if self.shortcut is None else self.shortcut(x)
        return F.Activation(out + short, act_type="relu")


class Bottleneck(HybridBlock):
    """ResNet bottleneck block (1×1, 3×3 with the stride, 1×1 ×4), BatchNorm after each."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv1 = _conv(planes, 1, 1, in_planes)
            self.bn1 = _bn(planes)
            self.conv2 = _conv(planes, 3, stride, planes)
            self.bn2 = _bn(planes)
            self.conv3 = _conv(planes * 4, 1, 1, planes)
            self.bn3 = _bn(planes * 4)
            self.shortcut = _shortcut(in_planes, planes * 4, stride)

    def hybrid_forward(self, F: ModuleType, x: Any) -> Any:  # noqa: N803 (Gluon's signature)
        out = F.Activation(self.bn1(self.conv1(x)), act_type="relu")
        out = F.Activation(self.bn2(self.conv2(out)), act_type="relu")
        out = self.bn3(self.conv3(out))
        short = x if self.shortcut is None else self.shortcut(x)
        return F.Activation(out + short, act_type="relu")


def resnet(block: Any, blocks: list[int], num_classes: int = 10, prefix: str = "resnet_") -> Any:
    """CIFAR ResNet: 3×3 stem (stride 1, no max pool), four stages, global average pool, fc."""
    net = nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(_conv(64, 3, 1, 3), _bn(64), _relu())
        in_planes = 64
        for planes, count, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2), strict=True):
            for i in range(count):
                net.add(block(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes * block.expansion
        net.add(nn.GlobalAvgPool2D(), nn.Dense(num_classes, in_units=in_planes))
    return net


def build(name: str, num_classes: int) -> Any:
    """An uninitialized Gluon network (call ``net.initialize(initializer())``)."""
    key = canonical_name(name)
    if key == "lenet5":
        return lenet5(num_classes)
    if key == "alexnet":
        return alexnet(num_classes)
    if key == "fcn":
        return fcn(num_classes)
    if key == "lstm":
        return lstm(num_classes)
    if key == "transformer":
        return TransformerLanguageModel(num_classes, prefix="transformer_")
    if key == "resnet18":
        return resnet(BasicBlock, [2, 2, 2, 2], num_classes, prefix="resnet18_")
    return resnet(Bottleneck, [3, 4, 6, 3], num_classes, prefix="resnet50_")


def _blocks(block: Any) -> list[Any]:
    out = [block]
    for child in block._children.values():
        out.extend(_blocks(child))
    return out


def layer_counts(net: Any) -> dict[str, int]:
    """Number of conv, fc and batchnorm layers, and trainable parameters (BatchNorm's running
    statistics, ``grad_req='null'``, are not counted — as torch's buffers are not)."""
    blocks = _blocks(net)
    params = net.collect_params().values()
    attention = [b for b in blocks if isinstance(b, SelfAttention)]
    inside = {id(b) for a in attention for b in _blocks(a) if b is not a}
    counts = {
        "conv": sum(isinstance(b, nn.Conv2D) for b in blocks),
        "fc": sum(isinstance(b, nn.Dense) and id(b) not in inside for b in blocks),
        "batchnorm": sum(isinstance(b, nn.BatchNorm) for b in blocks),
        "params": int(sum(np.prod(p.shape) for p in params if p.grad_req != "null")),
    }
    embedding = sum(isinstance(b, nn.Embedding) for b in blocks)
    if embedding:
        counts |= {
            "embedding": embedding,
            "recurrent": sum(b._num_layers for b in blocks
                             if isinstance(b, mx.gluon.rnn.LSTM)),
            "attention": len(attention),
            "layernorm": sum(isinstance(b, nn.LayerNorm) for b in blocks),
        }
    return counts
