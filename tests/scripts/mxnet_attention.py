"""A user's Gluon self-attention classifier (no GluonNLP): scores and weighted sum by
``batch_dot``, a softmax, a dense head; Adam, ``autograd.record`` on random tokens. MXNet builds
``batch_dot``'s gradient from two ``batch_dot``s; ``--hybridize`` runs it as a static graph."""

import argparse

import numpy as np

np.bool = bool  # MXNet 1.9 still uses the alias NumPy 1.24 removed
import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--hybridize", action="store_true")
args = parser.parse_args()


class SelfAttention(gluon.HybridBlock):
    def __init__(self, units: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.units = units
        self.qkv = gluon.nn.Dense(3 * units, flatten=False)
        self.out = gluon.nn.Dense(units, flatten=False)

    def hybrid_forward(self, F, x):
        q, k, v = F.split(self.qkv(x), num_outputs=3, axis=-1)
        scores = F.batch_dot(q, k, transpose_b=True) / np.sqrt(self.units)
        return self.out(F.batch_dot(F.softmax(scores, axis=-1), v))


class Classifier(gluon.HybridBlock):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.embed = gluon.nn.Embedding(50, 32)
        self.attention = SelfAttention(32)
        self.head = gluon.nn.Dense(4)

    def hybrid_forward(self, F, tokens):
        return self.head(F.mean(self.attention(self.embed(tokens)), axis=1))


mx.random.seed(0)
rng = np.random.default_rng(0)
net = Classifier()
net.initialize(mx.init.Xavier())
if args.hybridize:
    net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 1e-3})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
for _ in range(args.steps):
    tokens = mx.nd.array(rng.integers(0, 50, (args.batch_size, 12)))
    labels = mx.nd.array(rng.integers(0, 4, args.batch_size))
    with autograd.record():
        loss = loss_fn(net(tokens), labels)
    loss.backward()
    trainer.step(args.batch_size)
print(f"trained {args.steps} steps, last loss {loss.mean().asscalar():.4f}")
