"""Benchmark: an N-rank job built from real traces — opprof against Holistic Trace Analysis.

    python benchmarks/bench_scale.py                    # N = 8, 64, 256 from the NCCL trace
    python benchmarks/bench_scale.py --ranks 8 64 --source A.json.gz B.json.gz
    python benchmarks/bench_scale.py --no-hta --jobs 1  # opprof alone, one process
    python benchmarks/bench_scale.py --ranks 64 256 --no-hta --only-dir --critical

Each rank is a real trace (cycling through the sources; default the shared 2-rank NCCL trace,
40k events) with its rank rewritten and its clock shifted (benchmarks/bigtraces.py); the jobs
are written once under ``--cache`` and reused. Every measurement runs in a fresh process
and reports wall time, events/s and peak memory of the process and all its children
(opprof's pool workers, HTA's parser processes) together:

- ``opprof report DIR --by rank``: normalize and analyze rank by rank, never holding the job;
- ``opprof import DIR -o job.trace`` then ``opprof report job.trace --by rank``;
- HTA (when installed): ``TraceAnalysis(trace_dir=DIR)`` (parse) then
  ``get_temporal_breakdown()``;
- with ``--critical``: ``opprof report DIR --by critical`` and ``--format html`` beside the
  plain report (issue #35: each at most 1.5x its time and 2x its peak).

Goals (issue #13): time linear in ranks using the cores, peak memory flat in ranks,
>= 6x faster than HTA and <= half its memory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bigtraces import DEFAULT_SOURCE, build_job  # noqa: E402
from measure import load_line, run  # noqa: E402

HTA = r"""
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
print(sum(len(df) for df in a.t.traces.values()))
"""

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--source", type=Path, nargs="+", default=[DEFAULT_SOURCE])
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "opprof-jobs")
    ap.add_argument("--no-hta", action="store_true", help="do not run HTA even if installed")
    ap.add_argument("--jobs", type=int, default=None, help="opprof worker processes")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--critical", action="store_true",
                    help="also the critical path (--by critical, --format html) of DIR")
    ap.add_argument("--only-dir", action="store_true",
                    help="only the reports of DIR (no import, no .trace)")
    args = ap.parse_args()
    try:
        import hta  # noqa: F401
        with_hta = not args.no_hta
    except ImportError:
        with_hta = False
    py = sys.executable
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []
    print(f"sources: {', '.join(s.name for s in args.source)}; {load_line()}")
    print(f"{'ranks':>5} {'tool':32}{'wall s':>9}{'events/s':>12}{'peak MiB':>10}"
          f"{'s/rank':>8}")
    for n in args.ranks:
        folder = args.cache / f"{'+'.join(s.stem.split('.')[0] for s in args.source)}-{n}"
        build_job(n, folder, args.source)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "job.trace"
            runs = [("opprof import",
                     [py, "-m", "opprof", "import", str(folder), "-o", str(out), *jobs]),
                    ("opprof report job.trace --by rank",
                     [py, "-m", "opprof", "report", str(out), "--by", "rank", "--format",
                      "json", *jobs]),
                    ("opprof report DIR --by rank",
                     [py, "-m", "opprof", "report", str(folder), "--by", "rank", "--format",
                      "json", *jobs])]
            if args.only_dir:
                runs = runs[2:]
            if args.critical:
                runs += [("opprof report DIR --by critical",
                          [py, "-m", "opprof", "report", str(folder), "--by", "critical",
                           "--format", "json", *jobs]),
                         ("opprof report DIR --format html",
                          [py, "-m", "opprof", "report", str(folder), "--format", "html",
                           "-o", str(Path(tmp) / "job.html"), *jobs])]
            if with_hta:
                runs.append(("HTA parse + temporal breakdown", [py, "-c", HTA, str(folder)]))
            plain: tuple[float, int] | None = None
            events = None
            for label, cmd in runs:
                m = run(cmd, timeout=args.timeout)
                if m.rc != 0:
                    print(f"{n:>5} {label:32} failed (exit {m.rc})")
                    continue
                if label == "opprof import":
                    events = int(m.out.split(":")[1].split()[0].replace(",", ""))
                if label == "opprof report DIR --by rank":
                    plain = (m.wall_s, m.peak_bytes)
                ev = events or 0
                vs = (f"  {m.wall_s / plain[0]:.2f}x its time, {m.peak_bytes / plain[1]:.2f}x "
                      "its peak" if plain and "critical" in label or plain and "html" in label
                      else "")
                print(f"{n:>5} {label:32}{m.wall_s:9.2f}{ev / m.wall_s:12,.0f}"
                      f"{m.peak_bytes / 2**20:10.0f}{m.wall_s / n:8.3f}{vs}", flush=True)
        print(f"      ({load_line()})", flush=True)


if __name__ == "__main__":
    main()
