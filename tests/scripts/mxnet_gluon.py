"""A user's MXNet Gluon training loop: small CNN, autograd.record, gluon.Trainer."""

import argparse

import numpy as np

np.bool = bool  # MXNet 1.9 still uses the alias NumPy 1.24 removed
import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--kvstore", default="device", help="dist_sync in a parameter-server job")
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
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9},
                        kvstore=args.kvstore)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

step = 0
while step < args.steps:
    for x, y in loader:
        if step == args.fail_at:
            raise RuntimeError(f"mxnet_gluon.py: failing at step {step} as asked")
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch_size)
        step += 1
        if step >= args.steps:
            break
mx.nd.waitall()
print(f"trained {step} steps, last loss {loss.mean().asscalar():.4f}")
