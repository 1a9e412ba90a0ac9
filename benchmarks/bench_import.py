"""Benchmark: one large Kineto trace — opprof import + phase breakdown vs plain `json.load` of
the same file, vs Holistic Trace Analysis (parse + temporal breakdown) when installed, and
the JSON decoders side by side.

    python benchmarks/bench_import.py                  # the shared NCCL trace made 5x longer
    python benchmarks/bench_import.py TRACE.json[.gz]  # or any Kineto trace
    python benchmarks/bench_import.py --record         # or a 30-step ResNet-18 torch run

Every measurement runs in a fresh process, is repeated (best of ``--repeat``), and reports
wall time, events/s and peak memory (the process and its children). Goals (issue #13):
import + breakdown <= 0.7x `json.load`, >= 6x faster than HTA, <= half HTA's memory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import DEFAULT_SOURCE, build_long  # noqa: E402
from measure import load_line, run  # noqa: E402

# Each child prints "<events> <seconds of work>": the work is timed after the imports, so
# it is what the tool spends on the file; the process's wall time (interpreter start and
# imports included) is measured from outside.
CHILD = {
    # plain json.load of the file (gunzipped as it streams), counting complete events
    "json.load": r"""
import gzip, json, sys, time
t0 = time.perf_counter()
path = sys.argv[1]
with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
    doc = json.load(f)
n = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
print(n, time.perf_counter() - t0)
""",
    # the decoders alone, on the gunzipped bytes
    "orjson.loads": r"""
import gzip, sys, time, orjson
t0 = time.perf_counter()
raw = open(sys.argv[1], "rb").read()
raw = gzip.decompress(raw) if sys.argv[1].endswith(".gz") else raw
doc = orjson.loads(raw)
n = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
print(n, time.perf_counter() - t0)
""",
    "msgspec typed (opprof's decoder)": r"""
import sys, time
from pathlib import Path
from opprof.normalizers import chrome, kineto
t0 = time.perf_counter()
p = Path(sys.argv[1])
doc = kineto.decode(chrome.read_bytes(p, open(p, "rb").read(4)), p)
n = sum(1 for c in kineto.event_chunks(doc) for e in c if e.ph == "X")
print(n, time.perf_counter() - t0)
""",
    # opprof: normalize + phase breakdown, in one process (the Python API)
    "opprof load+breakdown": r"""
import sys, time
import opprof.normalizers  # imported before the clock starts, as the others' modules are
from opprof.analysis.breakdown import step_breakdown
from opprof.loader import load
t0 = time.perf_counter()
tr = load(sys.argv[1])
step_breakdown(tr)
print(len(tr.events), time.perf_counter() - t0)
""",
    # HTA: parse (its own multi-process parser) + temporal breakdown
    "HTA parse+breakdown": r"""
import logging, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[2])
a.get_temporal_breakdown(visualize=False)
print(sum(len(df) for df in a.t.traces.values()), time.perf_counter() - t0)
""",
}


def hta_installed() -> bool:
    try:
        import hta  # noqa: F401
    except ImportError:
        return False
    return True


def record(steps: int, workdir: Path) -> Path:
    """A ResNet-18 torch run under the profiler; its native trace."""
    from opprof.collectors import RecordConfig
    from opprof.collectors import record as rec

    out = rec(RecordConfig(fw="torch", model="resnet18", steps=steps, warmup=1,
                           timing_steps=1), workdir, lambda *a: None)
    return out.native[0]


def best(cmd: list[str], repeat: int) -> tuple[float, int, str]:
    """(best wall s, largest peak bytes, the best run's output line)."""
    runs = [run(cmd) for _ in range(repeat)]
    bad = [r for r in runs if r.rc != 0]
    if bad:
        raise SystemExit(f"failed: {' '.join(cmd[:4])} …")
    b = min(runs, key=lambda r: r.wall_s)
    return b.wall_s, max(r.peak_bytes for r in runs), b.out


def work(out: str) -> float:
    """The seconds of work a child printed after its event count."""
    return min(float(x) for x in out.split()[1:]) if len(out.split()) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, help="a Kineto trace")
    ap.add_argument("--copies", type=int, default=5,
                    help="without a trace: the shared NCCL trace made this many times longer")
    ap.add_argument("--record", action="store_true", help="record a 30-step ResNet-18 run")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.trace:
            path = args.trace
        elif args.record:
            path = record(30, tmp)
        else:
            path = build_long(args.copies, tmp / f"nccl-x{args.copies}.json.gz", DEFAULT_SOURCE)
        hta_dir = tmp / "hta"
        hta_dir.mkdir()
        (hta_dir / path.name).symlink_to(path.resolve())
        size = path.stat().st_size
        rows = []
        for label, code in CHILD.items():
            if label.startswith("HTA") and not hta_installed():
                continue
            runs = [best([py, "-c", code, str(path), str(hta_dir)], 1)
                    for _ in range(args.repeat)]
            wall = min(r[0] for r in runs)
            secs = min(work(r[2]) for r in runs)
            rows.append((label, wall, max(r[1] for r in runs), runs[0][2].split()[0], secs))
        cli = tmp / "cli.trace"
        imp = best([py, "-m", "opprof", "import", str(path), "-o", str(cli)], args.repeat)
        rep = best([py, "-m", "opprof", "report", str(cli), "--format", "json"], args.repeat)
        direct = best([py, "-m", "opprof", "report", str(path), "--format", "json"], args.repeat)
    n = int(next(r[3] for r in rows if r[0] == "opprof load+breakdown"))
    print(f"trace: {path.name}  {size / 1e6:.1f} MB on disk, {n:,} events; {load_line()}")
    print("work s: after imports, timed inside the process; process s: the whole process "
          "(interpreter start and imports included)")
    print(f"{'':34}{'work s':>8}{'process s':>10}{'events/s':>11}{'peak MiB':>10}"
          f"{'x json.load':>12}")
    base = next(r for r in rows if r[0] == "json.load")
    for label, wall, peak, _, secs in rows:
        print(f"{label:34}{secs:8.3f}{wall:10.3f}{n / secs:11,.0f}{peak / 2**20:10.0f}"
              f"{secs / base[4]:12.2f}")
    for label, (wall, peak, _) in (("CLI: opprof import", imp),
                                   ("CLI: opprof report .trace", rep),
                                   ("CLI: import + report", (imp[0] + rep[0],
                                                             max(imp[1], rep[1]), "")),
                                   ("CLI: opprof report native", direct)):
        print(f"{label:34}{'':8}{wall:10.3f}{n / wall:11,.0f}{peak / 2**20:10.0f}"
              f"{wall / base[1]:12.2f}")
    ours = next(r for r in rows if r[0] == "opprof load+breakdown")
    hta = next((r for r in rows if r[0].startswith("HTA")), None)
    print(f"opprof import+breakdown: {ours[4] / base[4]:.2f}x json.load's work, "
          f"{ours[1] / base[1]:.2f}x its process (goal <= 0.7x)")
    if hta:
        print(f"vs HTA: {hta[4] / ours[4]:.1f}x faster work, {hta[1] / ours[1]:.1f}x faster "
              f"process (goal >= 6x); {ours[2] / hta[2]:.2f}x its peak memory (goal <= 0.5x)")


if __name__ == "__main__":
    main()
