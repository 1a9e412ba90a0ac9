"""Benchmark: import + phase breakdown of a large Kineto trace vs plain `json.load` of it.

    python benchmarks/bench_import.py                  # record a ResNet-18 run (30 steps) first
    python benchmarks/bench_import.py TRACE.json[.gz]  # or time an existing trace

Each measurement runs in a fresh process (so peak memory is its own) and is repeated; the
best of the repeats is reported. Target (issue #2): opprof's import + breakdown within 1.5x
of `json.load` of the same file, in time; peak memory is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time, gzip
from pathlib import Path
path, what = Path(sys.argv[1]), sys.argv[2]
t0, c0 = time.perf_counter(), time.process_time()
if what == "json":
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        doc = json.load(f)
    n = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
else:
    import opprof
    from opprof.analysis.breakdown import step_breakdown
    t0, c0 = time.perf_counter(), time.process_time()   # exclude the import of opprof itself
    tr = opprof.load(path)
    steps = step_breakdown(tr)
    n = len(tr.events)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
try:  # VmHWM is this process's own peak; ru_maxrss survives exec from a big parent
    status = Path("/proc/self/status").read_text()
    peak = int(next(l for l in status.splitlines() if l.startswith("VmHWM")).split()[1]) * 1024
except (OSError, StopIteration):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_bytes": peak, "events": n}))
"""


def measure(path: Path, what: str, repeat: int) -> dict:
    """Best-of-``repeat`` wall/CPU time and peak RSS of one measurement in a fresh process."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, str(path), what], check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["wall_s"])
    best["cpu_s"] = min(r["cpu_s"] for r in runs)
    return best


def record_large(steps: int, workdir: Path) -> Path:
    """Record a ResNet-18 torch run under the profiler and return its native trace."""
    from opprof.collectors import RecordConfig, record

    rec = record(RecordConfig(fw="torch", model="resnet18", steps=steps, warmup=1,
                              timing_steps=1), workdir, lambda *a: None)
    return rec.native[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, help="a Kineto trace (default: record one)")
    ap.add_argument("--steps", type=int, default=30, help="steps to record when no trace given")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace or record_large(args.steps, Path(tmp))
        size = path.stat().st_size
        base = measure(path, "json", args.repeat)
        ours = measure(path, "opprof", args.repeat)
    n = ours["events"]
    print(f"trace: {path.name}  {size / 1e6:.1f} MB  {base['events']:,} complete events")
    print(f"{'':26}{'wall s':>9}{'cpu s':>9}{'events/s':>14}{'peak MiB':>10}")
    for label, r in (("json.load", base), ("opprof import+breakdown", ours)):
        print(f"{label:26}{r['wall_s']:9.3f}{r['cpu_s']:9.3f}{n / r['wall_s']:14,.0f}"
              f"{r['peak_bytes'] / 2**20:10.0f}")
    ratio = ours["wall_s"] / base["wall_s"]
    cpu_ratio = ours["cpu_s"] / base["cpu_s"]
    verdict = "meets" if ratio <= 1.5 else "misses"
    print(f"ratio to json.load: {ratio:.2f}x wall, {cpu_ratio:.2f}x cpu "
          f"({verdict} the 1.5x target); memory {ours['peak_bytes'] / base['peak_bytes']:.2f}x")


if __name__ == "__main__":
    main()
