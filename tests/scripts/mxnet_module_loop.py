"""A user's hand-written MXNet Module loop: ``forward_backward`` and ``update`` per batch
(``--kvstore dist_sync`` in a parameter-server job: see mxnet_ps.sh)."""

import argparse

import numpy as np

np.bool = bool  # MXNet 1.9 still uses the alias NumPy 1.24 removed
import mxnet as mx  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--kvstore", default="local", help="dist_sync in a parameter-server job")
args = parser.parse_args()

mx.random.seed(0)
rng = np.random.default_rng(0)
images = rng.standard_normal((args.batch_size * 8, 3, 32, 32)).astype("float32")
labels = rng.integers(0, 10, args.batch_size * 8).astype("float32")
train = mx.io.NDArrayIter(images, labels, batch_size=args.batch_size, shuffle=True,
                          last_batch_handle="discard")

data = mx.sym.Variable("data")
net = mx.sym.Convolution(data, num_filter=16, kernel=(3, 3), pad=(1, 1), name="conv1")
net = mx.sym.Activation(net, act_type="relu")
net = mx.sym.Pooling(net, kernel=(2, 2), stride=(2, 2), pool_type="max")
net = mx.sym.FullyConnected(mx.sym.Flatten(net), num_hidden=64, name="fc1")
net = mx.sym.Activation(net, act_type="relu")
net = mx.sym.FullyConnected(net, num_hidden=10, name="fc2")
net = mx.sym.SoftmaxOutput(net, name="softmax")

mod = mx.mod.Module(net, context=mx.cpu())
mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label)
mod.init_params(mx.init.Xavier())
mod.init_optimizer(kvstore=args.kvstore, optimizer="sgd",
                   optimizer_params={"learning_rate": 0.01, "momentum": 0.9})
metric = mx.metric.Accuracy()
step = 0
while step < args.steps:
    train.reset()
    for batch in train:
        mod.forward_backward(batch)
        mod.update()
        mod.update_metric(metric, batch.label)
        step += 1
        if step >= args.steps:
            break
mx.nd.waitall()
print(f"trained {step} steps, {metric.get()[0]} {metric.get()[1]:.3f}")
