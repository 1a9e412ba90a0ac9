"""What one blocking collective costs on this host, after a burst of compute on both ranks:
the figures docs/parallelism.md quotes for issue #30 (the tail of the host's wake-ups).

Two local processes (gloo on loopback, one thread each) compute ``--burst`` ms, then call a
16 KiB all-reduce — plain ``dist.all_reduce`` and DTensor's functional one (``all_reduce`` +
``wait_tensor``) — ``--calls`` times; a call's cost is its end minus the later rank's start
(both on the host's monotonic clock). Printed per case, the worst mean first: median, mean,
90th and 99th percentile and maximum, with the load average before and after.

``--traces T.trace …`` prints the same for the functional all-reduces of recorded tensor-
parallel runs (``opprof record --mode tp``: ``wait_tensor``'s end against the later rank's
``_c10d_functional::all_reduce``), to set beside them.

    python benchmarks/bench_blocking_call.py                      # bursts 0.5 and 2 ms
    python benchmarks/bench_blocking_call.py --burst 0.5 2 8 --calls 600
    python benchmarks/bench_blocking_call.py --traces tp1.trace tp2.trace
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, bursts: list[float], calls: int, out: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as fc

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    a, x = torch.randn(256, 256), torch.ones(4096)  # 16 KiB
    for burst in bursts:
        for kind in ("plain", "functional"):
            rows = []
            for _ in range(calls + 20):
                t = time.perf_counter()
                while (time.perf_counter() - t) * 1e3 < burst:
                    a @ a
                enter = time.monotonic_ns()
                if kind == "plain":
                    dist.all_reduce(x)
                else:
                    fc.wait_tensor(fc.all_reduce(x, "sum", dist.group.WORLD))
                rows.append((enter, time.monotonic_ns()))
            out[(rank, burst, kind)] = rows[20:]  # the first 20 warm up
    dist.barrier()
    dist.destroy_process_group()


def _run(rank: int, port: int, bursts: list[float], calls: int, queue: object) -> None:
    out: dict = {}
    _worker(rank, port, bursts, calls, out)
    queue.put(out)  # type: ignore[attr-defined]


def _stats(ms: np.ndarray) -> str:
    q = np.percentile(ms, [50, 90, 99])
    return (f"median {q[0]:6.3f}  mean {ms.mean():6.3f}  p90 {q[1]:6.3f}  p99 {q[2]:6.3f}  "
            f"max {ms.max():7.3f} ms  ({len(ms)} calls)")


def measure(bursts: list[float], calls: int) -> list[tuple[str, np.ndarray]]:
    """(case, per-call cost in ms) for every burst and kind of all-reduce."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_run, args=(r, port, bursts, calls, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    got: dict = {}
    for _ in procs:
        got.update(queue.get(timeout=900))
    for p in procs:
        p.join(60)
    cases = []
    for burst in bursts:
        for kind in ("plain", "functional"):
            r0, r1 = (np.array(got[(r, burst, kind)], np.int64) for r in (0, 1))
            last = np.maximum(r0[:, 0], r1[:, 0])
            after = np.concatenate([r0[:, 1] - last, r1[:, 1] - last]) / 1e6
            cases.append((f"{kind:10} all_reduce 16 KiB after {burst:g} ms", after))
    return cases


def from_traces(paths: list[str]) -> list[tuple[str, np.ndarray]]:
    """(trace, per-call cost in ms) of the functional all-reduces of 2-rank TP traces."""
    from opprof.loader import load

    cases = []
    for path in paths:
        ev = load(path).events
        names = ev["name"].astype(str)
        calls = ev[names == "_c10d_functional::all_reduce"]
        waits = ev[names == "_c10d_functional::wait_tensor"]
        costs: list[float] = []
        for step in sorted(calls["step"].unique()):
            if step < 0:
                continue
            enter = [calls[(calls["rank"] == r) & (calls["step"] == step)].sort_values("ts")
                     ["ts"].to_numpy() for r in (0, 1)]
            w = [waits[(waits["rank"] == r) & (waits["step"] == step)].sort_values("ts")
                 for r in (0, 1)]
            done = [(x["ts"] + x["dur"]).to_numpy() for x in w]
            n = min(len(e) for e in (*enter, *done))
            last = np.maximum(enter[0][:n], enter[1][:n])
            costs += [*(done[0][:n] - last) / 1e6, *(done[1][:n] - last) / 1e6]
        cases.append((os.path.basename(path), np.array(costs)))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burst", type=float, nargs="+", default=[0.5, 2.0],
                    help="ms of compute on both ranks before each call")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--traces", nargs="*", default=[], help="2-rank TP .trace files")
    args = ap.parse_args()
    print(f"load before: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    cases = from_traces(args.traces) if args.traces else measure(args.burst, args.calls)
    for name, ms in sorted(cases, key=lambda c: -float(c[1].mean()) if len(c[1]) else 0.0):
        print(f"{name:45} {_stats(ms) if len(ms) else 'no functional all-reduce'}")
    print(f"load after:  {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
