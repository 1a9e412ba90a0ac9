"""Co-location with and without the profiler: does a *profiled* training step slow more
beside a neighbour than the unprofiled step `opprof calibrate`'s co-location loop times?

Issue #36: on a quiet host the users' lenet5 check predicts every 2-worker step too low; the
heavy kernels slowed beside the other worker about as much as calibrate's loop measures
(×1.065) while whole phases grew far more. A recording runs its step under the framework's
profiler (per-operator records, timestamps, allocations); the loop does not. This benchmark
times the framework's own training step of ``--model`` (as `opprof record` builds it, one
thread, the same code calibrate's loop runs: :func:`opprof.collectors.netbench.train_step`)
in fresh processes: one alone, then ``--workers`` at once, with the profiler off and on (the
order alternating over rounds), each phase ``--seconds`` of back-to-back steps, and prints
every round's median step and ratio (together ÷ alone) with the load, then the median ratio
over rounds per profiler setting. A ratio is taken within seconds, so a load that drifts
moves both sides; on a busy host the rounds still scatter — read the medians, and rerun it
on a quiet one.

    python benchmarks/bench_coloc.py                         # torch, tf, mxnet; 4 rounds
    python benchmarks/bench_coloc.py --fw torch --rounds 8 --seconds 3
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def profiled(fw: str) -> Iterator[None]:
    """The framework's profiler on, as a recording runs it (CPU activities), its output
    discarded."""
    folder = tempfile.mkdtemp(prefix="opprof-bench-coloc-")
    if fw == "torch":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            yield
    elif fw == "tf":
        import tensorflow as tf

        tf.profiler.experimental.start(folder)
        try:
            yield
        finally:
            tf.profiler.experimental.stop(save=False)
    else:
        import mxnet as mx

        mx.profiler.set_config(profile_all=True, filename=os.path.join(folder, "p.json"))
        mx.profiler.set_state("run")
        try:
            yield
        finally:
            mx.profiler.set_state("stop")


def worker(fw: str, model: str, batch: int, prof: bool, seconds: float, go: Any,
           out: Any) -> None:
    """One process: build the step, warm it up, wait for the others, time ``seconds`` of
    steps (profiled or not) and put the median step (ms) on ``out``."""
    from opprof.collectors.netbench import Job, train_step

    if fw == "torch":  # one thread, as calibrate's workers (its OMP_NUM_THREADS: main())
        import torch

        torch.set_num_threads(1)
    job = Job(fw=fw, workers=1, servers=0, sizes=(4,), repeat=1, threads=1, timeout_s=300,
              extra={"colocation": {"model": model, "batch_size": batch}})
    step = train_step(fw, job)
    for _ in range(3):
        step()
    go.wait()
    times: list[int] = []
    with profiled(fw) if prof else contextlib.nullcontext():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 5:
            t0 = time.perf_counter_ns()
            step()
            times.append(time.perf_counter_ns() - t0)
    out.put(statistics.median(times[1:]) / 1e6)


def phase(fw: str, k: int, prof: bool, args: argparse.Namespace) -> list[float]:
    """``k`` processes at once: each one's median step (ms)."""
    out: Any = mp.Queue()
    go = mp.Barrier(k)
    procs = [mp.Process(target=worker, args=(fw, args.model, args.batch_size, prof,
                                             args.seconds, go, out)) for _ in range(k)]
    for p in procs:
        p.start()
    res = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fw", default="torch,tf,mxnet")
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    mp.set_start_method("spawn")
    # one thread per worker, as calibrate gives them (the children inherit it): without it each
    # framework took every core, and two workers at once ran ×2 to ×56 slower
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                       "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"})
    print(f"uptime at the start: {os.getloadavg()}", flush=True)
    for fw in [f.strip() for f in args.fw.split(",") if f.strip()]:
        ratios: dict[bool, list[float]] = {False: [], True: []}
        for rnd in range(args.rounds):
            for prof in (False, True) if rnd % 2 == 0 else (True, False):
                alone = phase(fw, 1, prof, args)[0]
                together = phase(fw, args.workers, prof, args)
                ratio = statistics.mean(together) / alone
                ratios[prof].append(ratio)
                print(f"{fw} round {rnd} profiler {'on ' if prof else 'off'}: alone "
                      f"{alone:6.2f} ms, {args.workers} at once "
                      f"{', '.join(f'{t:.2f}' for t in together)} ms: ×{ratio:.3f} "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
        print(f"{fw} {args.model} batch {args.batch_size}: median ×"
              f"{statistics.median(ratios[False]):.3f} unprofiled, ×"
              f"{statistics.median(ratios[True]):.3f} profiled over {args.rounds} rounds "
              f"(load {os.getloadavg()})", flush=True)


if __name__ == "__main__":
    main()
