"""Convergence beside speed: the built-in data's learnability, and what keeping the loss of a
user's steps (`opprof run`) costs.

    python benchmarks/bench_converge.py                   # both parts, the three frameworks
    python benchmarks/bench_converge.py --fw torch --steps 400 --part accuracy
    python benchmarks/bench_converge.py --part loss-cost --blocks 15

1. **accuracy**: ``opprof record --fw F --model lenet5 --converge STEPS --eval-every K`` for
   each framework (as a user runs it); printed per framework: the first and final loss, the
   test accuracy at each evaluation, the time and step to 50/70/90%. It fails (exit 1) when a
   framework's loss does not fall or its test accuracy stays under 50%.
2. **loss-cost**: a torch training step (an MLP on random data, batch 64, 1 thread) timed in
   one process without :func:`opprof.collectors.torch.hook_loss`, with its
   ``torch.autograd.backward`` wrapper only, and with the :class:`LossLog` step end and
   batched reads too — rounds of 200 steps each, the order reversed every other round (so a
   change of the machine's load hits all alike); printed: the medians of the per-step
   means, the difference in µs and %; then the pieces' cost timed alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def accuracy(fws: list[str], steps: int, every: int) -> bool:
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for fw in fws:
            trace = Path(tmp) / f"{fw}.trace"
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "opprof", "record", "--fw", fw,
                                  "--model", "lenet5", "--converge", str(steps),
                                  "--eval-every", str(every), "-o", str(trace),
                                  "--format", "json"], capture_output=True, text=True)
            if res.returncode:
                print(f"{fw}: failed: {res.stderr.strip().splitlines()[-1:]}")
                ok = False
                continue
            rep = json.loads(res.stdout)
            s = rep["convergence_summary"]
            evals = [(r["step"], r["test_accuracy"]) for r in rep["convergence"]
                     if r["test_accuracy"] is not None]
            reached = ", ".join(f"{float(t):.0%}: {ns / 1e9:.2f} s (step "
                                f"{s['steps_to_accuracy'][t]})"
                                for t, ns in rep["time_to_accuracy"].items()) or "none"
            print(f"{fw}: loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}; test accuracy "
                  + " ".join(f"{a:.1%}@{k}" for k, a in evals)
                  + f"; reached {reached}; {s['time_ns'] / 1e9:.2f} s training, "
                  f"{time.perf_counter() - t0:.1f} s wall")
            if not (s["final_loss"] < s["first_loss"] and (s["best_test_accuracy"] or 0) >= 0.5):
                ok = False
    return ok


def loss_cost(blocks: int, hidden: int = 256, block: int = 200) -> None:
    import torch
    from torch import nn

    from opprof.collectors.torch import hook_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(4096, 64), torch.randint(0, 10, (4096,))
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plain = torch.autograd.backward
    log = hook_loss()
    hooked = torch.autograd.backward

    def run(mode: str) -> float:
        torch.autograd.backward = plain if mode == "off" else hooked
        t0 = time.perf_counter_ns()
        for _ in range(block):
            i = torch.randint(0, len(x), (64,))
            loss = nn.functional.cross_entropy(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if mode == "on":
                log.step_end(False)
        return (time.perf_counter_ns() - t0) / block

    modes = ["off", "wrapper", "on"]  # without; the backward() wrapper only; all of it
    for m in modes:
        run(m)  # warm each
    times: dict[str, list[float]] = {m: [] for m in modes}
    for k in range(blocks):  # the order reversed every other round: none always runs first
        for m in (modes if k % 2 == 0 else modes[::-1]):
            times[m].append(run(m))
    off, on = times["off"], times["on"]
    wrapper = statistics.median(times["wrapper"])
    a, b = statistics.median(off), statistics.median(on)
    # The pieces alone (steady, where the A/B above swings with the machine's load): a
    # backward() of a scalar with no graph work, through the wrappers and without, plus the
    # step end and the batched read.
    w = torch.ones(1, requires_grad=True)
    n = 20_000

    def backward_ns(fn: object) -> float:
        torch.autograd.backward = fn
        t0 = time.perf_counter_ns()
        for _ in range(n):
            (w * 1.0).sum().backward()
        return (time.perf_counter_ns() - t0) / n

    backward_ns(plain)
    pieces = statistics.median(backward_ns(hooked) - backward_ns(plain) for _ in range(5))
    t0 = time.perf_counter_ns()
    for _ in range(n):
        log.seen(w)
        log.step_end(False)
    ends = (time.perf_counter_ns() - t0) / n
    torch.autograd.backward = plain
    assert len(log.rows()) == log.steps and all(r["loss"] is not None for r in log.rows())
    print(f"loss capture: {blocks} rounds of {block} steps each way; step {a / 1e3:.1f} µs "
          f"without, {wrapper / 1e3:.1f} µs with the wrapper only, {b / 1e3:.1f} µs with all "
          f"of it: {(b - a) / 1e3:+.1f} µs per step "
          f"({(b - a) / a:+.2%}; MLP width {hidden}); load average {os.getloadavg()[0]:.1f}")
    print(f"loss capture, its pieces alone: the backward() wrapper {pieces / 1e3:.1f} µs, the "
          f"step end with its share of the batched read {ends / 1e3:.1f} µs: "
          f"{(pieces + ends) / 1e3:.1f} µs per step")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fw", default="torch,tf,mxnet")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--blocks", type=int, default=11)
    ap.add_argument("--hidden", type=int, default=256, help="the MLP's width (loss-cost)")
    ap.add_argument("--part", choices=["all", "accuracy", "loss-cost"], default="all")
    args = ap.parse_args()
    ok = True
    if args.part in ("all", "loss-cost"):
        loss_cost(args.blocks, args.hidden)
    if args.part in ("all", "accuracy"):
        ok = accuracy(args.fw.split(","), args.steps, args.eval_every)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
