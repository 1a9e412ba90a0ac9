"""A Chainer training loop as users write it: an MLP Chain, MomentumSGD, cleargrads() /
backward() / update() by hand. `opprof run` counts a step per optimizer.update()."""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch", type=int, default=32)
args = parser.parse_args()


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(784, 256)
            self.l2 = L.Linear(256, 256)
            self.l3 = L.Linear(256, 10)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


model = MLP()
optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
optimizer.setup(model)
rng = np.random.default_rng(0)
for step in range(args.steps):
    x = rng.normal(size=(args.batch, 784)).astype(np.float32)
    t = rng.integers(0, 10, args.batch).astype(np.int32)
    loss = F.softmax_cross_entropy(model(x), t)
    model.cleargrads()
    loss.backward()
    optimizer.update()
    if step % 5 == 0:
        print(f"step {step}: loss {float(loss.array):.4f}")
