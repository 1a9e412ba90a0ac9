"""Benchmark: what turning MXNet's bulk execution off costs a static Gluon graph — the switch
opprof makes for the profiled steps of a ``hybridize(static_alloc=True, static_shape=True)``
block (opprof.collectors.mxnet_graphs) — measured without any profiler.

    python benchmarks/bench_mxnet_bulk.py [--rounds 6] [--steps 10] [--batch-size 16]

Two copies of the same small CNN (the one of tests/scripts/mxnet_hybrid_static.py), one
hybridized as the user wrote it, one with Gluon's ``forward_bulk_size=0`` /
``backward_bulk_size=0``, train in alternating rounds (order swapped every round, so machine
drift falls on both); prints the median step of each and their ratio (unbulked/bulked).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

np.bool = bool  # MXNet 1.9 still uses the alias NumPy 1.24 removed
import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402


def make(bulk_off: bool) -> tuple[gluon.HybridBlock, gluon.Trainer]:
    """The CNN, hybridized with a static graph (bulk execution off when ``bulk_off``)."""
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.MaxPool2D(2), gluon.nn.Conv2D(32, 3, padding=1), gluon.nn.BatchNorm(),
            gluon.nn.Activation("relu"), gluon.nn.MaxPool2D(2), gluon.nn.Flatten(),
            gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    flags = {"forward_bulk_size": 0, "backward_bulk_size": 0} if bulk_off else {}
    net.hybridize(static_alloc=True, static_shape=True, **flags)
    return net, gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.001})


def steps(net: gluon.HybridBlock, trainer: gluon.Trainer, x: mx.nd.NDArray, y: mx.nd.NDArray,
          n: int) -> list[float]:
    """``n`` training steps; each one's wall time in ms (waiting for the engine)."""
    loss_fn, out = gluon.loss.SoftmaxCrossEntropyLoss(), []
    for _ in range(n):
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        mx.nd.waitall()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.standard_normal((args.batch_size, 3, 32, 32)).astype("float32"))
    y = mx.nd.array(rng.integers(0, 10, args.batch_size).astype("float32"))
    runs = {"bulked": make(False), "unbulked": make(True)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for net, trainer in runs.values():
        steps(net, trainer, x, y, 3)  # build the graphs, warm up
    for r in range(args.rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            times[name] += steps(*runs[name], x, y, args.steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:9s} median {v:8.3f} ms/step over {len(times[k])} steps")
    print(f"unbulked/bulked {med['unbulked'] / med['bulked']:.2f}x (what the profiled steps of "
          "a static graph pay for one engine push per operator, before the profiler's own cost)")


if __name__ == "__main__":
    main()
