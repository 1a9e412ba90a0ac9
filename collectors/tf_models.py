"""The benchmark models in Keras (TensorFlow backend), matching collectors/torch_models.py.

Same CIFAR forms, layer counts and trainable parameter counts as the PyTorch reference (its
docstring gives the exact layer configs). Differences that are TensorFlow idiom, not
architecture: inputs are NHWC; a torch ``conv(k, s, p=(k-1)/2)`` is a Keras ``Conv2D`` with
``padding="same"`` (same output size; for stride 2 TensorFlow pads 1 before and 2 after instead
of 2 and 2 — the padding split, not the shape, differs); BatchNormalization uses torch's
epsilon 1e-5 and momentum 0.1 (Keras ``momentum=0.9``), and Keras 3 computes it from
``moments`` (Mean / SquaredDifference / Rsqrt …), not a fused kernel. Keras has no ResNet-18
and its ResNet-50 is the ImageNet form, so both ResNets are built here by hand.

The language models: Keras' LSTM keeps one bias per gate where torch (and cuDNN) keep two
(input and recurrent), so the LSTM here is Keras' ``LSTMCell`` with torch's second bias added
(same parameters; on a CPU Keras runs the cell in a loop either way). Attention is Keras'
``MultiHeadAttention`` (4 heads of 16, causal mask), whose projections hold torch's in/out
projection parameters exactly. Embeddings start as torch's, normal with standard deviation 1
(Keras' default, uniform in ±0.05, leaves an LSTM's loss nearly flat for hundreds of steps).
"""

from __future__ import annotations

import keras
from keras import layers

from opprof.collectors.config import INPUT_SIZE, canonical_name

__all__ = ["INPUT_SIZE", "build", "layer_counts"]

_BN = {"epsilon": 1e-5, "momentum": 0.9}


def lenet5(num_classes: int) -> keras.Model:
    """LeNet-5 for 32×32×3 input, with ReLU and max pooling."""
    x = inp = keras.Input((32, 32, 3))
    x = layers.Conv2D(6, 5, activation="relu")(x)
    x = layers.MaxPooling2D(2, 2)(x)
    x = layers.Conv2D(16, 5, activation="relu")(x)
    x = layers.MaxPooling2D(2, 2)(x)
    x = layers.Flatten()(x)
    x = layers.Dense(120, activation="relu")(x)
    x = layers.Dense(84, activation="relu")(x)
    return keras.Model(inp, layers.Dense(num_classes)(x), name="lenet5")


def fcn(num_classes: int) -> keras.Model:
    """The fully connected network (torch_models.FCN): three hidden ReLU layers."""
    from opprof.collectors.config import FCN_HIDDEN, FCN_WIDTH

    x = inp = keras.Input((32, 32, 3))
    x = layers.Flatten()(x)
    for _ in range(FCN_HIDDEN):
        x = layers.Dense(FCN_WIDTH, activation="relu")(x)
    return keras.Model(inp, layers.Dense(num_classes)(x), name="fcn")


@keras.saving.register_keras_serializable(package="opprof")
class TwoBiasLSTMCell(layers.LSTMCell):
    """Keras' LSTM cell with a second (recurrent) bias, as torch's ``nn.LSTM`` has."""

    def build(self, input_shape: tuple[int, ...]) -> None:
        super().build(input_shape)
        self.recurrent_bias = self.add_weight(shape=(4 * self.units,), name="recurrent_bias",
                                              initializer="zeros")

    def call(self, inputs, states, training=False):  # noqa: ANN001, ANN201 (Keras' signature)
        h, c = states
        z = (keras.ops.matmul(inputs, self.kernel) + keras.ops.matmul(h, self.recurrent_kernel)
             + self.bias + self.recurrent_bias)
        i, f, g, o = keras.ops.split(z, 4, axis=-1)
        c = self.recurrent_activation(f) * c + self.recurrent_activation(i) * self.activation(g)
        h = self.recurrent_activation(o) * self.activation(c)
        return h, [h, c]


def _embedding(rows: int, dim: int) -> layers.Embedding:
    return layers.Embedding(rows, dim,
                            embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0))


def lstm(vocab: int) -> keras.Model:
    """The LSTM language model (torch_models.LSTMLanguageModel)."""
    from opprof.collectors.config import EMBED_DIM, LSTM_HIDDEN, LSTM_LAYERS, SEQ_LEN

    x = inp = keras.Input((SEQ_LEN,), dtype="int64")
    x = _embedding(vocab, EMBED_DIM)(x)
    for _ in range(LSTM_LAYERS):
        x = layers.RNN(TwoBiasLSTMCell(LSTM_HIDDEN), return_sequences=True)(x)
    return keras.Model(inp, layers.Dense(vocab)(x), name="lstm")


class PositionEmbedding(layers.Layer):
    """A learned embedding of each position 0..length-1, added to the token embedding."""

    def __init__(self, length: int, dim: int, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.table = _embedding(length, dim)

    def call(self, x):  # noqa: ANN001, ANN201
        return x + self.table(keras.ops.arange(keras.ops.shape(x)[1]))


def transformer(vocab: int) -> keras.Model:
    """The causal transformer encoder (torch_models.TransformerLanguageModel): post-norm
    layers, ReLU feed-forward, LayerNorm eps 1e-5, no dropout."""
    from opprof.collectors.config import D_MODEL, ENCODER_LAYERS, FF_DIM, HEADS, SEQ_LEN

    x = inp = keras.Input((SEQ_LEN,), dtype="int64")
    x = PositionEmbedding(SEQ_LEN, D_MODEL)(_embedding(vocab, D_MODEL)(x))
    for _ in range(ENCODER_LAYERS):
        attended = layers.MultiHeadAttention(HEADS, D_MODEL // HEADS)(x, x, use_causal_mask=True)
        x = layers.LayerNormalization(epsilon=1e-5)(x + attended)
        ff = layers.Dense(D_MODEL)(layers.Dense(FF_DIM, activation="relu")(x))
        x = layers.LayerNormalization(epsilon=1e-5)(x + ff)
    return keras.Model(inp, layers.Dense(vocab)(x), name="transformer")


def alexnet(num_classes: int) -> keras.Model:
    """CIFAR-style AlexNet for 64×64×3 input: 5 conv + 3 fc, no BatchNorm."""
    x = inp = keras.Input((64, 64, 3))
    x = layers.Conv2D(64, 5, strides=2, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(3, 2)(x)
    x = layers.Conv2D(192, 5, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(3, 2)(x)
    x = layers.Conv2D(384, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(256, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(256, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(3, 2)(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(1024, activation="relu")(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(1024, activation="relu")(x)
    return keras.Model(inp, layers.Dense(num_classes)(x), name="alexnet")


def _conv_bn(x, filters: int, kernel: int, stride: int = 1, relu: bool = True):
    x = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization(**_BN)(x)
    return layers.ReLU()(x) if relu else x


def _shortcut(x, in_planes: int, out_planes: int, stride: int):
    if stride == 1 and in_planes == out_planes:
        return x
    return _conv_bn(x, out_planes, 1, stride, relu=False)


def _basic_block(x, in_planes: int, planes: int, stride: int):
    out = _conv_bn(x, planes, 3, stride)
    out = _conv_bn(out, planes, 3, relu=False)
    out = layers.Add()([out, _shortcut(x, in_planes, planes, stride)])
    return layers.ReLU()(out), planes


def _bottleneck(x, in_planes: int, planes: int, stride: int):
    out = _conv_bn(x, planes, 1)
    out = _conv_bn(out, planes, 3, stride)
    out = _conv_bn(out, planes * 4, 1, relu=False)
    out = layers.Add()([out, _shortcut(x, in_planes, planes * 4, stride)])
    return layers.ReLU()(out), planes * 4


def resnet(kind: str, num_classes: int) -> keras.Model:
    """CIFAR ResNet-18 or -50: 3×3 stem (stride 1, no max pool), four stages, GAP, fc."""
    block, blocks = (_basic_block, (2, 2, 2, 2)) if kind == "resnet18" else (
        _bottleneck, (3, 4, 6, 3))
    x = inp = keras.Input((32, 32, 3))
    x = _conv_bn(x, 64, 3)
    in_planes = 64
    for planes, count, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2), strict=True):
        for i in range(count):
            x, in_planes = block(x, in_planes, planes, stride if i == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(num_classes)(x), name=kind)


def build(name: str, num_classes: int) -> keras.Model:
    """A freshly initialized Keras model (Keras' default initializers, seeded by the caller)."""
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
        return transformer(num_classes)
    return resnet(key, num_classes)


def layer_counts(model: keras.Model) -> dict[str, int]:
    """Number of conv, fc and batchnorm layers, and trainable parameters (BatchNorm moving
    statistics are not counted, like torch's buffers)."""
    kinds = [type(layer) for layer in model.layers]
    counts = {
        "conv": sum(issubclass(k, layers.Conv2D) for k in kinds),
        "fc": sum(issubclass(k, layers.Dense) for k in kinds),
        "batchnorm": sum(issubclass(k, layers.BatchNormalization) for k in kinds),
        "params": int(sum(int(w.numpy().size) for w in model.trainable_weights)),
    }
    embedding = sum(issubclass(k, layers.Embedding | PositionEmbedding) for k in kinds)
    if embedding:
        counts |= {
            "embedding": embedding,
            "recurrent": sum(issubclass(k, layers.RNN) for k in kinds),
            "attention": sum(issubclass(k, layers.MultiHeadAttention) for k in kinds),
            "layernorm": sum(issubclass(k, layers.LayerNormalization) for k in kinds),
        }
    return counts
