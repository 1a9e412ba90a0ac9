"""Benchmark: what shapes cost — recording them (torch.profiler's ``record_shapes``, which
`opprof record` and `opprof run` turn on) and costing them (opprof's FLOPs model while reading).

    python benchmarks/bench_record_shapes.py                       # both parts, defaults
    python benchmarks/bench_record_shapes.py --models lenet5,resnet18 --steps 6 --repeat 3
    python benchmarks/bench_record_shapes.py --read-copies 60      # a larger trace to read

1. **Recording**: a built-in model (``opprof.collectors.torch_models``) trains under
   ``torch.profiler.profile(activities=[CPU])`` with ``record_shapes`` off, then on, then off …
   (``--repeat`` rounds, alternating, so a change of the machine's load hits both), ``--steps``
   profiled steps each after one warm-up; per setting the median step time, and the trace's
   size and events (``export_chrome_trace``).
2. **Reading**: a trace with shapes (the Qwen H100 fixture by default) tiled ``--read-copies``
   times into one file is read by opprof's Kineto reader with its costs taken
   (``normalizers.kineto._chunk_costs``) and with that step left out (the function replaced by
   one that marks every event unknown): best of ``--repeat``, wall and CPU seconds.

Prints the machine's load beside the figures: on a busy machine compare CPU seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READ_DEFAULT = REPO / "fixtures" / "gpu-public" / "qwen1.5-0.5b-forward-h100.json.gz"


def record(model_name: str, steps: int, repeat: int, batch: int) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from opprof.collectors.torch_models import build

    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    model = build(model_name, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    lossf = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        lossf(model(x), y).backward()
        opt.step()

    step()
    times: dict[bool, list[float]] = {False: [], True: []}
    sizes: dict[bool, tuple[int, int]] = {}
    for _ in range(repeat):
        for shapes in (False, True):
            with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
                step()  # warm-up inside the profiler
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step()
                    times[shapes].append(time.perf_counter() - t0)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "t.json"
                prof.export_chrome_trace(str(path))
                n = sum(1 for e in json.loads(path.read_text())["traceEvents"]
                        if e.get("ph") == "X")
                sizes[shapes] = (path.stat().st_size, n)
    out = []
    for shapes in (False, True):
        out.append({"model": model_name, "record_shapes": shapes,
                    "step_ms": statistics.median(times[shapes]) * 1e3,
                    "trace_mib": sizes[shapes][0] / 2**20, "events": sizes[shapes][1]})
    return out


def tiled(path: Path, copies: int, out: Path) -> int:
    """``copies`` back-to-back copies of a Kineto trace's complete events (times shifted,
    correlation ids kept apart), the document's other fields kept."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in xs)
    span = max(e["ts"] + e.get("dur", 0) for e in xs) - t0 + 1000
    events = []
    for k in range(copies):
        for e in xs:
            c = dict(e, ts=e["ts"] + k * span)
            if "args" in e and "correlation" in e["args"]:
                c["args"] = dict(e["args"], correlation=e["args"]["correlation"] + k * 10**7)
            events.append(c)
    doc["traceEvents"] = events
    with gzip.open(out, "wt", compresslevel=1) as f:
        json.dump(doc, f)
    return len(events)


def read(path: Path, repeat: int) -> dict[str, float]:
    import numpy as np

    from opprof.normalizers import kineto, read_native

    real = kineto._chunk_costs

    def unknown(names, args):  # noqa: ANN001, ANN202 - the same columns, every event unknown
        n = len(names[0])
        return {"flops": np.full(n, np.nan), "model_flops": np.full(n, np.nan),
                "mem_bytes": np.full(n, np.nan), "precision": np.full(n, -1, np.int8),
                "cost_kind": np.zeros(n, np.int8)}

    out: dict[str, float] = {}
    for label, fn in (("without costs", unknown), ("with costs", real)):
        kineto._chunk_costs = fn
        best_wall = best_cpu = float("inf")
        for _ in range(repeat):
            from opprof.flops.table import torch_cost as _torch_cost

            _torch_cost.cache_clear()  # each read costs its calls afresh
            w0, c0 = time.perf_counter(), time.process_time()
            read_native(path, {}, detail=False)
            best_wall = min(best_wall, time.perf_counter() - w0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        out[f"{label} wall s"], out[f"{label} cpu s"] = best_wall, best_cpu
    kineto._chunk_costs = real
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="lenet5,resnet18")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--read", type=Path, default=READ_DEFAULT)
    p.add_argument("--read-copies", type=int, default=30)
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    print("1. recording (torch.profiler, CPU):")
    for m in args.models.split(","):
        rows = record(m.strip(), args.steps, args.repeat, args.batch_size)
        off, on = rows
        print(f"  {m}: step {off['step_ms']:.1f} ms without shapes, {on['step_ms']:.1f} ms "
              f"with ({on['step_ms'] / off['step_ms'] - 1:+.1%}); trace "
              f"{off['trace_mib']:.2f} → {on['trace_mib']:.2f} MiB, {on['events']} events",
              flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.json.gz"
        n = tiled(args.read, args.read_copies, big)
        got = read(big, args.repeat)
    print(f"2. reading {n:,} events ({args.read.name} × {args.read_copies}):")
    for k in ("without costs", "with costs"):
        print(f"  {k}: {got[k + ' wall s']:.2f} s wall, {got[k + ' cpu s']:.2f} s CPU")
    extra = got["with costs cpu s"] / got["without costs cpu s"] - 1
    print(f"  costing adds {extra:+.1%} CPU")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
