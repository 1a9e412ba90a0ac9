"""Size (and time) of the HTML report for large traces: it must stay "a few MB" whatever the
event count, because its charts are made from aggregates, never events.

    python benchmarks/bench_html.py             # the shared NCCL trace, 5x longer, 40 ranks
    python benchmarks/bench_html.py --ranks 80  # a bigger job

For each input: its complete events (the ``X`` events of the Kineto files), the wall time
of ``opprof report INPUT --format html -o FILE`` (a fresh process: start-up, import or
normalization, analysis, rendering), the file's size, and the size beside plotly.js (inlined
once, ~4.6 MB). Inputs are built from the real shared trace by benchmarks/bigtraces.py.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bigtraces import DEFAULT_SOURCE, build_job, build_long  # noqa: E402


def complete_events(path: Path) -> int:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        return sum(e.get("ph") == "X" for e in json.load(f)["traceEvents"])


def measure(label: str, inp: Path, events: int, out: Path) -> None:
    from plotly.offline import get_plotlyjs

    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "opprof", "report", str(inp), "--format", "html",
                          "-o", str(out)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"{label}: {res.stderr.strip()}")
    size = out.stat().st_size
    js = len(get_plotlyjs().encode())
    print(f"{label:<34} {events:>10,} {wall:>8.1f} {size / 2**20:>9.2f} "
          f"{(size - js) / 1024:>12.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=40, help="ranks of the job (default 40)")
    ap.add_argument("--long", type=int, default=5, help="copies of the long trace (default 5)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the built inputs")
    args = ap.parse_args()
    if not DEFAULT_SOURCE.exists():
        sys.exit(f"{DEFAULT_SOURCE}: the shared trace is not here")
    work = args.work or Path(tempfile.gettempdir()) / "opprof-bench-html"
    work.mkdir(parents=True, exist_ok=True)
    one = complete_events(DEFAULT_SOURCE)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} cores")
    print(f"{'input':<34} {'events':>10} {'wall s':>8} {'size MB':>9} {'beyond js kB':>12}")
    measure(DEFAULT_SOURCE.name, DEFAULT_SOURCE, one, work / "one.html")
    long = build_long(args.long, work / f"nccl-x{args.long}.json.gz")
    measure(long.name, long, complete_events(long), work / "long.html")
    job = work / f"job{args.ranks}"
    build_job(args.ranks, job)
    measure(f"{args.ranks}-rank job ({job.name}/)", job, one * args.ranks, work / "job.html")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
