"""Benchmark: one large Kineto trace — opprof import + phase breakdown vs plain `json.load` of
the same file, vs Holistic Trace Analysis (parse + temporal breakdown) when installed, and
the JSON decoders side by side.

    python benchmarks/bench_import.py                  # the shared NCCL trace 5x and 50x longer
    python benchmarks/bench_import.py TRACE.json[.gz]  # or any Kineto trace
    python benchmarks/bench_import.py --record         # or a 30-step ResNet-18 torch run
    python benchmarks/bench_import.py --hta-python /work/hta-venv/bin/python  # HTA beside

HTA is no opprof dependency: install it in a virtual environment of its own
(``python3 -m venv hta-venv && hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0``) and
name its python with ``--hta-python``.

Every measurement runs in a fresh process, is repeated (best of ``--repeat``; once on the
long copy), and reports the whole process's wall time as a user meets it (the headline:
``opprof report FILE --format json``), the work timed after imports beside it, its CPU
time, and peak memory (the process and its children). The report is also run in one process
(``OPPROF_READAHEAD=0``: no second process reading the trace while the first imports), to
show what the second process saves where a core is free and costs where none is. opprof's
modules are byte-compiled first, as ``pip install`` does (``--no-byte-compile``: not).
Goals (issue #24): ``opprof report`` <= 0.7x `json.load`'s process (at most 1.0x), >= 6x
faster than HTA (at least 4x), <= half HTA's memory; on a 10x longer copy, peak <= 0.25x
json.load's (at most 0.35x).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bigtraces import DEFAULT_SOURCE, build_long  # noqa: E402
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


def hta_python(given: str | None) -> str | None:
    """The interpreter to run HTA with: ``--hta-python`` (HTA in its own virtual
    environment: it is no opprof dependency and pins its own pandas and numpy), else this
    one when HTA is importable here; None without HTA."""
    if given:
        return given
    try:
        import hta  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def record(steps: int, workdir: Path) -> Path:
    """A ResNet-18 torch run under the profiler; its native trace."""
    from opprof.collectors import RecordConfig
    from opprof.collectors import record as rec

    out = rec(RecordConfig(fw="torch", model="resnet18", steps=steps, warmup=1,
                           timing_steps=1), workdir, lambda *a: None)
    return out.native[0]


def once(cmd: list[str], env: dict | None = None) -> tuple[float, int, str, float, int, int]:
    """(wall s, peak bytes (the tree's PSS), output line, CPU s, the process's own peak
    RSS bytes, the most processes at once) of one run."""
    r = run(cmd, env=env)
    if r.rc != 0:
        raise SystemExit(f"failed: {' '.join(cmd[:4])} …")
    return r.wall_s, r.peak_bytes, r.out, r.cpu_s, r.rss_bytes, r.procs


def byte_compile() -> None:
    """Byte-compile opprof's modules where Python looks for them (``__pycache__``, ignored
    by git), as ``pip install`` does: with ``PYTHONDONTWRITEBYTECODE`` set (as on a shared
    development machine) an editable install would otherwise compile them from source in
    every process measured (~0.05 s), which no installed copy does."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for folder in ("opprof", "normalizers", "collectors"):
        compileall.compile_dir(root / folder, quiet=1)


def work(out: str) -> float:
    """The seconds of work a child printed after its event count."""
    return min(float(x) for x in out.split()[1:]) if len(out.split()) > 1 else float("nan")


REPORT = "opprof report FILE --format json"
#: The same with opprof.readahead's second process whatever the load, and never: what the
#: second process saves where a core is free and costs where none is (the headline runs
#: it only when a core is idle as the command starts).
TWO_PROCESSES = "  the same, read-ahead forced"
ONE_PROCESS = "  the same, one process (no read-ahead)"


def measure_file(path: Path, hta_dir: Path, repeat: int, decoders: bool,
                 hta: str | None = None) -> dict:
    """Every figure for one file: per child, (work s, process s, peak bytes, events, CPU s),
    the best of ``repeat`` rounds (the largest peak). Each round runs every child once, in
    turn, so that a change in the machine's load falls on all of them alike.
    ``hta``: the interpreter HTA runs with (None: no HTA figures)."""
    cmds: dict[str, list[str]] = {}
    for label, code in CHILD.items():
        py = sys.executable
        if label.startswith("HTA"):
            if hta is None:
                continue
            py = hta
        if not decoders and label in ("orjson.loads", "msgspec typed (opprof's decoder)"):
            continue
        cmds[label] = [py, "-c", code, str(path), str(hta_dir)]
    cmds[REPORT] = [sys.executable, "-m", "opprof", "report", str(path), "--format", "json"]
    cmds[TWO_PROCESSES] = cmds[ONE_PROCESS] = cmds[REPORT]
    envs = {TWO_PROCESSES: {"OPPROF_READAHEAD": "1"}, ONE_PROCESS: {"OPPROF_READAHEAD": "0"}}
    runs: dict[str, list[tuple[float, int, str, float, int, int]]] = {k: [] for k in cmds}
    for _ in range(repeat):
        for label, cmd in cmds.items():
            runs[label].append(once(cmd, envs.get(label)))
    out: dict[str, tuple[float, float, int, str, float, int, str]] = {}
    for label, rs in runs.items():
        reports = (REPORT, TWO_PROCESSES, ONE_PROCESS)
        out[label] = (min(work(r[2]) for r in rs), min(r[0] for r in rs),
                      max(r[1] for r in rs),
                      rs[0][2].split()[0] if label not in reports else "",
                      min(r[3] for r in rs), max(r[4] for r in rs),
                      "/".join(str(r[5]) for r in rs))
    return out


def show(path: Path, rows: dict) -> None:
    """The headline (whole process, as a user runs it) and the work-only figures."""
    n = int(rows["opprof load+breakdown"][3])
    print(f"\n{path.name}: {path.stat().st_size / 1e6:.1f} MB on disk, {n:,} events; "
          f"{load_line()}")
    print(f"{'':40}{'process s':>10}{'work s':>8}{'CPU s':>7}{'peak MiB':>10}"
          f"{'RSS MiB':>9}{'x json.load':>12}{'x its CPU':>10}{'x its peak':>11}"
          f"  processes")
    base = rows["json.load"]
    for label, (secs, wall, peak, _, cpu, rss, procs) in rows.items():
        print(f"{label:40}{wall:10.2f}{secs:8.2f}{cpu:7.2f}{peak / 2**20:10.0f}"
              f"{rss / 2**20:9.0f}{wall / base[1]:12.2f}{cpu / base[4]:10.2f}"
              f"{peak / base[2]:11.2f}  {procs}")
    ours = rows[REPORT]
    work_ours = rows["opprof load+breakdown"]
    print(f"HEADLINE opprof report (whole process) {ours[1]:.2f} s = "
          f"{ours[1] / base[1]:.2f}x json.load's process {base[1]:.2f} s (goal <= 0.7x, at "
          f"most 1.0x; CPU {ours[4]:.2f} s = {ours[4] / base[4]:.2f}x its {base[4]:.2f} s); "
          f"peak {ours[2] / 2**20:.0f} MiB = {ours[2] / base[2]:.2f}x json.load's "
          f"(10x file: goal <= 0.25x, at most 0.35x)")
    print(f"work only: opprof load+breakdown {work_ours[0]:.2f} s = "
          f"{work_ours[0] / base[0]:.2f}x json.load's {base[0]:.2f} s")
    hta = next((v for k, v in rows.items() if k.startswith("HTA")), None)
    if hta:
        print(f"vs HTA: {hta[1] / ours[1]:.1f}x faster whole process ({hta[1]:.2f} s), "
              f"{hta[0] / work_ours[0]:.1f}x faster work, {hta[4] / ours[4]:.1f}x less CPU "
              f"(goal >= 6x, at least 4x); {ours[2] / hta[2]:.2f}x its peak memory "
              f"(goal <= 0.5x; its largest process's RSS: {ours[5] / hta[5]:.2f}x)")
    else:
        print("HTA not installed (pip install HolisticTraceAnalysis, or --hta-python PATH "
              "to a virtual environment's python that has it): no HTA figures")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, help="a Kineto trace")
    ap.add_argument("--copies", type=int, default=5,
                    help="without a trace: the shared NCCL trace made this many times longer")
    ap.add_argument("--long", type=int, default=10,
                    help="also a copy this many times longer again (0: none), for memory")
    ap.add_argument("--record", action="store_true", help="record a 30-step ResNet-18 run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hta-python", metavar="PATH",
                    help="the python of a virtual environment with HolisticTraceAnalysis "
                         "installed (e.g. /work/hta-venv/bin/python): HTA's figures beside")
    ap.add_argument("--decoders", action="store_true",
                    help="also time orjson and msgspec alone on the text")
    ap.add_argument("--no-byte-compile", action="store_true",
                    help="measure without byte-compiling opprof's modules first (see "
                         "byte_compile: an editable install under PYTHONDONTWRITEBYTECODE "
                         "compiles them in every process)")
    args = ap.parse_args()
    if not args.no_byte_compile:
        byte_compile()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.trace:
            path = args.trace
        elif args.record:
            path = record(30, tmp)
        else:
            path = build_long(args.copies, tmp / f"nccl-x{args.copies}.json.gz", DEFAULT_SOURCE)
        files = [path]
        if args.long and not args.trace and not args.record:
            k = args.copies * args.long
            files.append(build_long(k, tmp / f"nccl-x{k}.json.gz", DEFAULT_SOURCE))
        print("process s: the whole process as a user runs it (interpreter start and imports "
              "included); work s: timed inside it after its imports; CPU s: user + system "
              "of the process and its children (what it costs on a loaded machine). Peak: "
              "the process tree's PSS; RSS: the largest resident set of the process itself."
              + ("" if args.no_byte_compile else " opprof's modules byte-compiled first, "
                 "as pip install does (--no-byte-compile: not)."))
        for i, f in enumerate(files):
            hta_dir = tmp / f"hta{i}"
            hta_dir.mkdir()
            (hta_dir / f.name).symlink_to(f.resolve())
            show(f, measure_file(f, hta_dir, args.repeat if i == 0 else 1, args.decoders,
                                 hta_python(args.hta_python)))


if __name__ == "__main__":
    main()
