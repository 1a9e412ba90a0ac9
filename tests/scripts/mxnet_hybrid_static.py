"""A user's Gluon training loop on a hybridized block with a static graph
(``hybridize(static_alloc=True, static_shape=True)``) and Adam."""

import argparse

import numpy as np

np.bool = bool  # MXNet 1.9 still uses the alias NumPy 1.24 removed
import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()

mx.random.seed(0)
rng = np.random.default_rng(0)
images = rng.standard_normal((args.batch_size * 8, 3, 32, 32)).astype("float32")
labels = rng.integers(0, 10, args.batch_size * 8).astype("float32")
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(images, labels),
                               batch_size=args.batch_size, shuffle=True, last_batch="discard")
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(16, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
        gluon.nn.MaxPool2D(2),
        gluon.nn.Conv2D(32, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
        gluon.nn.MaxPool2D(2),
        gluon.nn.Flatten(), gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
net.hybridize(static_alloc=True, static_shape=True)
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.001})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

step = 0
while step < args.steps:
    for x, y in loader:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch_size)
        step += 1
        if step >= args.steps:
            break
mx.nd.waitall()
print(f"trained {step} steps, last loss {loss.mean().asscalar():.4f}")
