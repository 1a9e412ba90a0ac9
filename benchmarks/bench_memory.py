"""What measuring memory costs: reading a process's resident memory, the step time of training
with and without opprof's outside sampling, and the profiled step time with and without the
framework allocator's memory events.

    python benchmarks/bench_memory.py                       # torch lenet5, 5 repeats
    python benchmarks/bench_memory.py --fw torch,mxnet,tf --model lenet5,resnet18 --repeat 3

1. **Reading one process's memory** (µs per read, this process, 20,000 reads): ``pread`` of
   an open ``/proc/PID/status`` (what opprof's sampler does: VmRSS and VmHWM), opening and
   reading it each time, ``/proc/PID/statm`` (no high-water mark), psutil's ``memory_info``
   (no high-water mark either).
2. **Sampling's cost to training**: ``opprof record`` runs with ``--memory-interval 0`` (no
   sampling) and the default 20 ms, alternated, ``--repeat`` times each; the figure compared
   is the run's unprofiled step time (``meta["unprofiled_step_ns"]``: the mean of
   ``--timing-steps`` steps timed inside the training process, before its profiler starts),
   so the profiler plays no part in it.
3. **The allocator's memory events**: the same runs with ``--profile-memory`` and
   ``--no-profile-memory``; compared: the profiled step time (``profiled_wall_ns`` ÷ steps),
   the trace's rows and the `.trace` size. TensorFlow records its allocator either way.

Each record runs in its own process, its training on ``--threads`` threads (1 by default:
two frameworks' thread pools spinning against other jobs on a small shared machine make step
times swing tenfold); the load average is printed beside the numbers (they move with it: read
the medians and the spread, not one run).
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


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def read_costs(n: int = 20000) -> dict[str, float]:
    """µs per read of this process's memory, four ways."""
    from opprof.collectors.rss import read_status

    pid = os.getpid()
    fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)

    def reopen() -> None:
        with open(f"/proc/{pid}/status", "rb") as f:
            f.read()

    def statm() -> None:
        with open(f"/proc/{pid}/statm", "rb") as f:
            f.read()

    ways = {"pread /proc/PID/status (opprof)": lambda: read_status(fd),
            "open+read /proc/PID/status": reopen, "open+read /proc/PID/statm": statm}
    try:
        import psutil

        proc = psutil.Process(pid)
        ways["psutil memory_info()"] = proc.memory_info
    except ImportError:
        pass
    out = {}
    for name, fn in ways.items():
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t) / n * 1e6
    os.close(fd)
    return out


THREADS = 1


def record(fw: str, model: str, folder: Path, extra: list[str], timing_steps: int,
           steps: int) -> dict:
    """One `opprof record`; the trace's facts that the comparison needs."""
    import pyarrow.parquet as pq

    out = folder / f"{fw}-{model}.trace"
    cmd = [sys.executable, "-m", "opprof", "record", "--fw", fw, "--model", model,
           "--steps", str(steps), "--warmup", "2", "--timing-steps", str(timing_steps),
           "-o", str(out), "--format", "json", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)} if THREADS else None
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=folder, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip().splitlines()[-1:]}")
    meta = json.loads(pq.read_schema(out).metadata[b"opprof"])
    rows = pq.ParquetFile(out).metadata.num_rows
    return {"unprofiled_ms": meta["unprofiled_step_ns"] / 1e6,
            "profiled_ms": (meta.get("profiled_wall_ns") or 0) / 1e6 / steps,
            "rows": rows, "mib": out.stat().st_size / 2**20}


def compare(fw: str, model: str, variants: dict[str, list[str]], key: str, repeat: int,
            timing_steps: int, steps: int) -> None:
    """Alternate the variants ``repeat`` times; print the medians of ``key``."""
    got: dict[str, list[dict]] = {v: [] for v in variants}
    loads = []
    with tempfile.TemporaryDirectory(prefix="opprof-bench-memory-") as tmp:
        for _ in range(repeat):
            for name, extra in variants.items():
                loads.append(os.getloadavg()[0])
                got[name].append(record(fw, model, Path(tmp), extra, timing_steps, steps))
    print(f"\n{fw} {model}: {key.replace('_', ' ')} over {repeat} runs each "
          f"(load average during the runs {min(loads):.2f} … {max(loads):.2f} on "
          f"{os.cpu_count()} cores)")
    med = {}
    for name, runs in got.items():
        vals = [r[key] for r in runs]
        med[name] = statistics.median(vals)
        extra = (f"  rows {statistics.median([r['rows'] for r in runs]):,.0f}  .trace "
                 f"{statistics.median([r['mib'] for r in runs]):.2f} MiB"
                 if key == "profiled_ms" else "")
        print(f"  {name:<28} median {med[name]:9.2f} ms  runs "
              + ", ".join(f"{v:.2f}" for v in vals) + extra)
    names = list(med)
    print(f"  ratio {names[1]} / {names[0]}: {med[names[1]] / med[names[0]]:.3f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fw", default="torch")
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--timing-steps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--skip", default="", help="parts to skip: read,sampling,allocator")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS of the training processes (0: the frameworks' own "
                         "choice); one thread keeps a shared machine's noise down")
    args = ap.parse_args(argv)
    global THREADS
    THREADS = args.threads
    skip = set(args.skip.split(","))
    print(f"load average {load()} on {os.cpu_count()} cores")
    if "read" not in skip:
        print("\nreading one process's resident memory (µs per read, 20,000 reads)")
        for name, us in read_costs().items():
            print(f"  {name:<36} {us:7.1f}")
    for fw in args.fw.split(","):
        for model in args.model.split(","):
            if "sampling" not in skip:
                compare(fw, model, {"no sampling": ["--memory-interval", "0"],
                                    "sampling every 20 ms": ["--memory-interval", "0.02"]},
                        "unprofiled_ms", args.repeat, args.timing_steps, args.steps)
            if "allocator" not in skip and fw != "tf":
                compare(fw, model, {"--no-profile-memory": ["--no-profile-memory"],
                                    "--profile-memory": ["--profile-memory"]},
                        "profiled_ms", args.repeat, args.timing_steps, args.steps)
    print(f"\nload average {load()}")


if __name__ == "__main__":
    main()
