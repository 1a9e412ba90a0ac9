"""The benchmark models in Chainer, the same networks as :mod:`.torch_models` (the
reference: layer and parameter counts match it), NCHW like torch.

Chainer's links keep torch's shapes (``Convolution2D`` weights out×in×kh×kw, ``Linear``
out×in); BatchNormalization has eps 1e-5 and keeps running statistics (not parameters);
``NStepLSTM`` holds per layer the same input and recurrent weights and two biases as torch's
LSTM. Chainer initializes its own way (LeCun normal weights, zero biases).
"""

from __future__ import annotations

from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
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


def _pool(x: Any, k: int, s: int) -> Any:
    return F.max_pooling_2d(x, k, s, pad=0, cover_all=False)


class LeNet5(chainer.Chain):
    def __init__(self, classes: int) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 6, 5)
            self.conv2 = L.Convolution2D(6, 16, 5)
            self.fc1 = L.Linear(400, 120)
            self.fc2 = L.Linear(120, 84)
            self.fc3 = L.Linear(84, classes)

    def forward(self, x: Any) -> Any:
        x = _pool(F.relu(self.conv1(x)), 2, 2)
        x = _pool(F.relu(self.conv2(x)), 2, 2)
        x = F.relu(self.fc1(x))
        return self.fc3(F.relu(self.fc2(x)))


class AlexNet(chainer.Chain):
    def __init__(self, classes: int) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 64, 5, stride=2, pad=2)
            self.conv2 = L.Convolution2D(64, 192, 5, pad=2)
            self.conv3 = L.Convolution2D(192, 384, 3, pad=1)
            self.conv4 = L.Convolution2D(384, 256, 3, pad=1)
            self.conv5 = L.Convolution2D(256, 256, 3, pad=1)
            self.fc1 = L.Linear(2304, 1024)
            self.fc2 = L.Linear(1024, 1024)
            self.fc3 = L.Linear(1024, classes)

    def forward(self, x: Any) -> Any:
        x = _pool(F.relu(self.conv1(x)), 3, 2)
        x = _pool(F.relu(self.conv2(x)), 3, 2)
        x = F.relu(self.conv3(x))
        x = F.relu(self.conv4(x))
        x = _pool(F.relu(self.conv5(x)), 3, 2)
        x = F.relu(self.fc1(F.dropout(x, 0.5)))
        x = F.relu(self.fc2(F.dropout(x, 0.5)))
        return self.fc3(x)


class FCN(chainer.Chain):
    def __init__(self, classes: int) -> None:
        super().__init__()
        with self.init_scope():
            self.hidden = chainer.ChainList(*[
                L.Linear(3 * 32 * 32 if i == 0 else FCN_WIDTH, FCN_WIDTH)
                for i in range(FCN_HIDDEN)])
            self.head = L.Linear(FCN_WIDTH, classes)

    def forward(self, x: Any) -> Any:
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.head(x)


class _Shortcut(chainer.Chain):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(cin, cout, 1, stride=stride, nobias=True)
            self.bn = L.BatchNormalization(cout, eps=1e-5)

    def forward(self, x: Any) -> Any:
        return self.bn(self.conv(x))


class BasicBlock(chainer.Chain):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(cin, planes, 3, stride=stride, pad=1, nobias=True)
            self.bn1 = L.BatchNormalization(planes, eps=1e-5)
            self.conv2 = L.Convolution2D(planes, planes, 3, pad=1, nobias=True)
            self.bn2 = L.BatchNormalization(planes, eps=1e-5)
            self.shortcut = (_Shortcut(cin, planes, stride)
                             if stride != 1 or cin != planes else None)

    def forward(self, x: Any) -> Any:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.shortcut(x) if self.shortcut is not None else x))


class Bottleneck(chainer.Chain):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        cout = planes * 4
        with self.init_scope():
            self.conv1 = L.Convolution2D(cin, planes, 1, nobias=True)
            self.bn1 = L.BatchNormalization(planes, eps=1e-5)
            self.conv2 = L.Convolution2D(planes, planes, 3, stride=stride, pad=1, nobias=True)
            self.bn2 = L.BatchNormalization(planes, eps=1e-5)
            self.conv3 = L.Convolution2D(planes, cout, 1, nobias=True)
            self.bn3 = L.BatchNormalization(cout, eps=1e-5)
            self.shortcut = (_Shortcut(cin, cout, stride)
                             if stride != 1 or cin != cout else None)

    def forward(self, x: Any) -> Any:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet(chainer.Chain):
    def __init__(self, block: type[BasicBlock] | type[Bottleneck], blocks: list[int],
                 classes: int) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 64, 3, pad=1, nobias=True)
            self.bn1 = L.BatchNormalization(64, eps=1e-5)
            cin, layers = 64, []
            for planes, count, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2),
                                             strict=True):
                for i in range(count):
                    layers.append(block(cin, planes, stride if i == 0 else 1))
                    cin = planes * block.expansion
            self.blocks = chainer.ChainList(*layers)
            self.fc = L.Linear(cin, classes)

    def forward(self, x: Any) -> Any:
        x = F.relu(self.bn1(self.conv1(x)))
        for b in self.blocks:
            x = b(x)
        return self.fc(F.mean(x, axis=(2, 3)))


class LSTMModel(chainer.Chain):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(vocab, EMBED_DIM)
            self.lstm = L.NStepLSTM(LSTM_LAYERS, EMBED_DIM, LSTM_HIDDEN, 0.0)
            self.head = L.Linear(LSTM_HIDDEN, vocab)

    def forward(self, tokens: Any) -> Any:
        x = self.embed(tokens)
        _, _, ys = self.lstm(None, None, list(F.separate(x, axis=0)))
        h = F.stack(ys, axis=0)
        return self.head(h, n_batch_axes=2)


class EncoderLayer(chainer.Chain):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.in_proj = L.Linear(D_MODEL, 3 * D_MODEL)
            self.out_proj = L.Linear(D_MODEL, D_MODEL)
            self.linear1 = L.Linear(D_MODEL, FF_DIM)
            self.linear2 = L.Linear(FF_DIM, D_MODEL)
            self.norm1 = L.LayerNormalization(D_MODEL, eps=1e-5)
            self.norm2 = L.LayerNormalization(D_MODEL, eps=1e-5)

    def attention(self, x: Any) -> Any:
        b, t, d = x.shape
        q, k, v = F.split_axis(self.in_proj(x, n_batch_axes=2), 3, axis=2)

        def heads(a: Any) -> Any:
            return F.transpose(F.reshape(a, (b, t, HEADS, d // HEADS)), (0, 2, 1, 3))

        scores = F.matmul(heads(q), heads(k), transb=True) / np.sqrt(d // HEADS)
        mask = np.tril(np.ones((t, t), bool))
        scores = F.where(np.broadcast_to(mask, scores.shape), scores,
                         np.full(scores.shape, -1e9, np.float32))
        out = F.matmul(F.softmax(scores, axis=3), heads(v))
        out = F.reshape(F.transpose(out, (0, 2, 1, 3)), (b, t, d))
        return self.out_proj(out, n_batch_axes=2)

    def _norm(self, link: Any, x: Any) -> Any:
        b, t, d = x.shape
        return F.reshape(link(F.reshape(x, (b * t, d))), (b, t, d))

    def forward(self, x: Any) -> Any:
        x = self._norm(self.norm1, x + self.attention(x))
        ff = self.linear2(F.relu(self.linear1(x, n_batch_axes=2)), n_batch_axes=2)
        return self._norm(self.norm2, x + ff)


class TransformerModel(chainer.Chain):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(vocab, D_MODEL)
            self.position = L.EmbedID(SEQ_LEN, D_MODEL)
            self.layers = chainer.ChainList(*[EncoderLayer() for _ in range(ENCODER_LAYERS)])
            self.head = L.Linear(D_MODEL, vocab)

    def forward(self, tokens: Any) -> Any:
        t = tokens.shape[1]
        x = self.embed(tokens) + F.broadcast_to(
            self.position(np.arange(t, dtype=np.int32))[None], (tokens.shape[0], t, D_MODEL))
        for layer in self.layers:
            x = layer(x)
        return self.head(x, n_batch_axes=2)


def build(name: str, classes: int) -> chainer.Chain:
    """The built-in model ``name`` (seeded by the caller through ``np.random.seed``)."""
    key = canonical_name(name)
    model: chainer.Chain
    if key == "lenet5":
        model = LeNet5(classes)
    elif key == "alexnet":
        model = AlexNet(classes)
    elif key == "fcn":
        model = FCN(classes)
    elif key == "lstm":
        model = LSTMModel(classes)
    elif key == "transformer":
        model = TransformerModel(classes)
    elif key == "resnet18":
        model = ResNet(BasicBlock, [2, 2, 2, 2], classes)
    else:
        model = ResNet(Bottleneck, [3, 4, 6, 3], classes)
    # Chainer creates a Linear's weights lazily without in_size: every link here has it.
    return model


def layer_counts(model: chainer.Chain) -> dict[str, int]:
    """Conv, fc and batchnorm layers and parameters, as torch_models.layer_counts counts
    them (an attention's projections are not fc)."""
    links = list(model.links())
    in_attention = {id(lk) for lk in links if isinstance(lk, EncoderLayer)
                    for lk in (lk.in_proj, lk.out_proj)}
    counts = {"conv": sum(isinstance(lk, L.Convolution2D) for lk in links),
              "fc": sum(isinstance(lk, L.Linear) and id(lk) not in in_attention
                        for lk in links),
              "batchnorm": sum(isinstance(lk, L.BatchNormalization) for lk in links),
              "params": int(sum(p.size for p in model.params()))}
    embedding = sum(isinstance(lk, L.EmbedID) for lk in links)
    if embedding:
        counts |= {"embedding": embedding,
                   "recurrent": sum(lk.n_layers for lk in links if isinstance(lk, L.NStepLSTM)),
                   "attention": sum(isinstance(lk, EncoderLayer) for lk in links),
                   "layernorm": sum(isinstance(lk, L.LayerNormalization) for lk in links)}
    return counts
