"""Chainer's Trainer as its examples use it: a small CNN in a Classifier, a SerialIterator
over a TupleDataset, StandardUpdater, and extensions (LogReport, PrintReport, Evaluator every
few iterations). `opprof run` counts a step per optimizer update the updater makes."""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training
from chainer.training import extensions

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch", type=int, default=16)
args = parser.parse_args()


class CNN(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 8, 3, pad=1)
            self.bn = L.BatchNormalization(8)
            self.fc = L.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(h)


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 3, 16, 16)).astype(np.float32)
t = rng.integers(0, 10, 256).astype(np.int32)
train = chainer.datasets.TupleDataset(x[:192], t[:192])
test = chainer.datasets.TupleDataset(x[192:], t[192:])
model = L.Classifier(CNN())
optimizer = chainer.optimizers.Adam()
optimizer.setup(model)
train_iter = chainer.iterators.SerialIterator(train, args.batch)
test_iter = chainer.iterators.SerialIterator(test, args.batch, repeat=False, shuffle=False)
updater = training.updaters.StandardUpdater(train_iter, optimizer)
trainer = training.Trainer(updater, (args.steps, "iteration"), out="/tmp/opprof-chainer-result")
trainer.extend(extensions.Evaluator(test_iter, model), trigger=(5, "iteration"))
trainer.extend(extensions.LogReport(trigger=(5, "iteration")))
trainer.extend(extensions.PrintReport(["iteration", "main/loss", "validation/main/loss"]))
trainer.run()
