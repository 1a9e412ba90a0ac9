"""What `report --by critical` and `report --format html` cost beside `report --format json`:
their own analysis (the critical path, the page's charts) only, the trace read once (issue #34:
each at most 1.5x the JSON report's time on a large trace).

    python benchmarks/bench_report_views.py           # the fixtures' GPU traces and a large one
    python benchmarks/bench_report_views.py --repeat 5 --long 5
    python benchmarks/bench_report_views.py --python OTHER/.venv/bin/python   # another checkout

Inputs: every trace of fixtures/shared/kineto-gpu and fixtures/gpu (real Kineto traces and
`.trace` files), and the shared NCCL trace made ``--long`` times longer by
benchmarks/bigtraces.py (5x: 54 MB of JSON, 200k events). Each command runs in a fresh process
(start-up, read, analysis, rendering: what a user waits for), the three interleaved, ``--repeat``
times. Per input and view: the median wall and CPU seconds, and the ratio to the JSON report's
(median over median; the worst pair of one round beside it). Inputs are listed worst ratio
first; the machine's load is printed beside every line (on a loaded machine the CPU time says
what the program costs, the wall time how busy the machine was).

Before timing, the interpreter's opprof packages are compiled to bytecode, as ``pip install``
does for an installed package: an editable checkout run with ``PYTHONDONTWRITEBYTECODE`` (this
machine sets it) compiles every module it imports on every run, and the HTML page imports more
of them than the JSON report (~0.3 s of the page's time; ``--no-compile`` leaves that in).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bigtraces import DEFAULT_SOURCE, build_long  # noqa: E402
from measure import load_line, run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURE_DIRS = (REPO / "fixtures" / "shared" / "kineto-gpu", REPO / "fixtures" / "gpu")
VIEWS = {"json": ["--format", "json"],
         "--by critical": ["--by", "critical", "--format", "json"],
         "html": ["--format", "html", "-o", "{html}"]}
LIMIT = 1.5


def inputs(long: int) -> list[Path]:
    """The fixtures' GPU traces, and the NCCL trace ``long`` times longer (0: none)."""
    found = sorted(p for d in FIXTURE_DIRS for p in d.iterdir()
                   if p.name.endswith((".json.gz", ".trace")) and "key_averages" not in p.name)
    if long:
        cache = Path(tempfile.gettempdir()) / "opprof-bench" / f"nccl-x{long}.json.gz"
        if not cache.exists():  # built once, reused by the next runs
            cache.parent.mkdir(exist_ok=True)
            build_long(long, cache, DEFAULT_SOURCE)
        found.append(cache)
    return found


def compile_packages(python: str) -> None:
    """Compile the opprof packages ``python`` imports to bytecode (what an install does)."""
    where = subprocess.run(
        [python, "-c", "import collectors, normalizers, opprof\n"
         "for m in (collectors, normalizers, opprof): print(m.__path__[0])"],
        capture_output=True, text=True, check=True).stdout.split()
    subprocess.run([python, "-m", "compileall", "-q", *where], check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--long", type=int, default=5,
                    help="the NCCL trace this many times longer (0: leave it out)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter that runs opprof (another checkout's venv)")
    ap.add_argument("--only", nargs="*", default=None, help="only inputs whose name has these")
    ap.add_argument("--no-compile", action="store_true",
                    help="time the modules' compilation too (no bytecode written first)")
    args = ap.parse_args()
    if not args.no_compile:
        compile_packages(args.python)
    with tempfile.TemporaryDirectory() as tmp:
        files = inputs(args.long)
        if args.only:
            files = [f for f in files if any(s in f.name for s in args.only)]
        rows = []
        for f in files:
            wall: dict[str, list[float]] = {v: [] for v in VIEWS}
            cpu: dict[str, list[float]] = {v: [] for v in VIEWS}
            loads = []
            for _ in range(args.repeat):  # interleaved: a change of load hits every view
                for view, extra in VIEWS.items():
                    cmd = [args.python, "-m", "opprof", "report", str(f),
                           *[a.format(html=Path(tmp) / "r.html") for a in extra]]
                    m = run(cmd, memory=False)  # (the memory watcher takes CPU)
                    if m.rc != 0:
                        raise SystemExit(f"{' '.join(cmd)} failed ({m.rc})")
                    wall[view].append(m.wall_s)
                    cpu[view].append(m.cpu_s)
                loads.append(load_line())
            rows.append((f, wall, cpu, loads[-1]))

        def worst(row: tuple) -> float:
            _, wall, _, _ = row
            base = statistics.median(wall["json"])
            return max(statistics.median(wall[v]) / base for v in VIEWS if v != "json")

        print(f"python: {args.python}; {args.repeat} rounds; limit {LIMIT}x the JSON report")
        print(f"{'input':40} {'view':14} {'wall s':>8} {'cpu s':>7} {'x json wall':>12} "
              f"{'x json cpu':>11} {'worst round':>12}")
        for f, wall, cpu, load in sorted(rows, key=worst, reverse=True):
            size = f.stat().st_size / 2**20
            name = f"{f.name} ({size:.1f} MiB)"
            base_w, base_c = statistics.median(wall["json"]), statistics.median(cpu["json"])
            for view in VIEWS:
                w, c = statistics.median(wall[view]), statistics.median(cpu[view])
                rounds = max(a / b for a, b in zip(wall[view], wall["json"], strict=True))
                flag = "" if view == "json" or w / base_w <= LIMIT else "  over"
                print(f"{name:40} {view:14} {w:8.2f} {c:7.2f} {w / base_w:12.2f} "
                      f"{c / base_c:11.2f} {rounds:12.2f}{flag}")
                name = ""
            print(f"{'':40} ({load})", flush=True)


if __name__ == "__main__":
    main()
