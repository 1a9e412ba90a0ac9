"""A user's training loop (torch, TensorFlow or MXNet) whose memory jumps once, at a known
moment: at step ``--spike-at`` it fills ``--spike-mib`` MiB of fresh memory (numpy, so no
framework operator runs), holds it ``--hold`` seconds, frees it, then runs that step's forward
pass. The wall-clock window (``time.time_ns()`` before and after) goes to ``--window`` as JSON,
so a test can check that the sampled peak lands in this step and in its forward phase."""

import argparse
import json
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--fw", choices=["torch", "tf", "mxnet"], required=True)
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--spike-at", type=int, default=3)
parser.add_argument("--spike-mib", type=int, default=400)
parser.add_argument("--hold", type=float, default=0.4)
parser.add_argument("--window", required=True)
args = parser.parse_args()


def spike(step: int) -> None:
    if step != args.spike_at:
        return
    t0 = time.time_ns()
    block = np.ones(args.spike_mib * 2**20 // 8)  # every page written: resident
    time.sleep(args.hold)
    block[::4096] += 1.0
    del block
    t1 = time.time_ns()
    with open(args.window, "w") as f:
        json.dump({"start_ns": t0, "end_ns": t1, "step": step}, f)


x_np = np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32)
y_np = np.arange(8) % 10

if args.fw == "torch":
    import torch
    from torch import nn

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 32 * 32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    for step in range(args.steps):
        optimizer.zero_grad()
        spike(step)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
elif args.fw == "tf":
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(0.01)
    x, y = tf.constant(x_np.transpose(0, 2, 3, 1)), tf.constant(y_np)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x), from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for step in range(args.steps):
        spike(step)
        train_step(x, y)
else:
    if "bool" not in np.__dict__:
        np.bool = bool  # MXNet 1.9 uses the alias numpy removed
    import mxnet as mx
    from mxnet import autograd, gluon

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, padding=1, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = mx.nd.array(x_np), mx.nd.array(y_np)
    for step in range(args.steps):
        spike(step)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(8)
        mx.nd.waitall()
print(f"trained {args.steps} steps")
