"""ChainerMN data parallel as its examples write it: a communicator, the model's weights
broadcast from rank 0, a multi-node optimizer that all-reduces the gradients in update(),
each rank on its own shard. Run with `mpiexec -n 2 python chainermn_loop.py`."""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import chainermn
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch", type=int, default=16)
args = parser.parse_args()

comm = chainermn.create_communicator("naive")


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(256, 128)
            self.l2 = L.Linear(128, 10)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


model = MLP()
optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
optimizer.setup(model)
comm.bcast_data(model)
rng = np.random.default_rng(comm.rank)
for _ in range(args.steps):
    x = rng.normal(size=(args.batch, 256)).astype(np.float32)
    t = rng.integers(0, 10, args.batch).astype(np.int32)
    loss = F.softmax_cross_entropy(model(x), t)
    model.cleargrads()
    loss.backward()
    optimizer.update()
if comm.rank == 0:
    print(f"loss {float(loss.array):.4f}")
