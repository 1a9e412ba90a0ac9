"""Benchmark: the reader on every real trace there is — the repository's (fixtures/,
examples/), ../shared/traces, and public traces of real jobs recorded by others
(benchmarks/corpus.json: their repository, commit, path, license and sha256) — each timed as a
user runs it against ``json.load`` of the same file and against Holistic Trace Analysis.

    python benchmarks/corpus.py fetch --git /work/.mirror --dir ~/opprof-corpus   # once
    python benchmarks/corpus.py run --dir ~/opprof-corpus --repeat 5 \\
        --hta-python /work/hta-venv/bin/python [--min-mb 20] [--long 10]

Every figure is a fresh process (benchmarks/measure.py: wall, CPU, peak PSS of the process
tree), the whole process as a user meets it: ``opprof report FILE --format json`` (stdout
to /dev/null), ``python -c 'json.load(...)'`` of the same file (gunzipped as it streams), and
HTA 0.5's ``TraceAnalysis(trace_dir=DIR)`` (its parse) on a folder holding only that file.
The runs are interleaved: each round runs every tool on every file once, in turn, so that a
change in the machine's load falls on all alike; each file's ratio to ``json.load`` is taken
within a round and reported worst / median / best over the rounds (worst first), with the
load average of the machine beside each file. ``--long K`` also times a copy of the largest
Kineto trace made K times longer (benchmarks/jobs.py build_long), once, for peak memory.

Goals (issue #35), for the Kineto traces of at least 20 MB of JSON: worst <= 1.0x json.load,
median <= 0.7x, at least 4x faster than HTA on each; the long copy's peak <= 0.35x
json.load's; a small trace (0.3 MB) <= 0.3 s.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import load_line, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: ../shared/traces beside the repository (or beside a folder above a worktree)
SHARED = next((d / "shared" / "traces" for d in ROOT.parents
               if (d / "shared" / "traces").is_dir()), ROOT.parent / "shared" / "traces")
MANIFEST = Path(__file__).resolve().parent / "corpus.json"

JSON_LOAD = r"""
import gzip, json, sys
p = sys.argv[1]
with (gzip.open(p, "rb") if p.endswith(".gz") else open(p, "rb")) as f:
    json.load(f)
"""
HTA = r"""
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
"""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(git_root: Path, dest: Path) -> None:
    """Take every file of the manifest out of a clone of its repository under ``git_root``
    (``owner+name`` or ``owner+name/repo``, or ``name``), at its commit; check its sha256."""
    doc = json.loads(MANIFEST.read_text())
    for f in doc["files"]:
        out = dest / f["name"]
        if out.exists() and _sha256(out) == f["sha256"]:
            continue
        owner, name = f["repo"].split("/")
        clones = [git_root / f"{owner}+{name}" / "repo", git_root / f"{owner}+{name}",
                  git_root / name]
        clone = next((c for c in clones if c.exists()), None)
        if clone is None:
            print(f"skipped {f['name']}: no clone of {f['repo']} under {git_root}")
            continue
        data = subprocess.run(["git", "-C", str(clone), "show", f"{f['commit']}:{f['path']}"],
                              capture_output=True, check=False).stdout
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            print(f"skipped {f['name']}: not the manifest's content (sha256) in {clone}")
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        print(f"{f['name']}: {len(data) / 1e6:.1f} MB ({f['license']})")


@functools.cache
def _json_bytes(path: Path) -> int:
    """The size of a file's JSON text (inflated)."""
    if path.suffix != ".gz":
        return path.stat().st_size
    n = 0
    with gzip.open(path, "rb") as g:
        while chunk := g.read(1 << 20):
            n += len(chunk)
    return n


def _kind(path: Path) -> str | None:
    """``kineto``, ``json`` (another chrome-trace JSON: MXNet), ``sqlite``, ``trace``,
    ``xplane`` or None (not a trace)."""
    name = path.name
    if name.endswith(".sqlite"):
        return "sqlite"
    if name.endswith(".trace"):
        return "trace"
    if name.endswith(".xplane.pb"):
        return "xplane"
    if not (name.endswith(".json") or name.endswith(".json.gz")) or "key_averages" in name:
        return None
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rb") as f:
        head = f.read(1 << 20)
    if b"traceEvents" not in head and b"schemaVersion" not in head:
        return None
    return "json" if b'"Python"' in head or "_worker" in name or "_server" in name \
        else "kineto"


def corpus(folder: Path | None) -> list[tuple[str, Path]]:
    """(origin, path) of every trace: the repository's, ../shared/traces', the folder's."""
    out: list[tuple[str, Path]] = []
    roots = [("fixtures", ROOT / "fixtures"), ("examples", ROOT / "examples"),
             ("shared", SHARED)]
    if folder is not None:
        roots.append(("public", folder))
    seen: set[str] = set()
    for origin, root in roots:
        if not root.exists():
            continue
        for p in sorted(root.rglob("*")):
            if not p.is_file() or _kind(p) is None:
                continue
            digest = _sha256(p)
            if digest in seen:  # one copy of a file that is in two places
                continue
            seen.add(digest)
            out.append((origin, p))
    return out


def _stats(xs: list[float]) -> tuple[float, float, float]:
    """(worst, median, best): the largest, the median, the smallest."""
    return max(xs), statistics.median(xs), min(xs)


def _wmb(xs: list[float]) -> str:
    w, m, b = _stats(xs)
    return f"{w:6.2f} {m:6.2f} {b:6.2f}"


def measure(files: list[tuple[str, Path]], repeat: int, hta: str | None,
            tmp: Path) -> list[dict]:
    """Interleaved rounds over every file and tool; one dict of runs per file."""
    rows = []
    for origin, p in files:
        kind = _kind(p)
        row = {"origin": origin, "path": str(p), "kind": kind, "mb_json":
               _json_bytes(p) / 1e6 if kind in ("kineto", "json") else p.stat().st_size / 1e6,
               "runs": {"opprof": [], "json.load": [], "hta": []}, "load": []}
        if kind == "kineto" and hta:
            d = tmp / f"hta{len(rows)}"
            d.mkdir()
            (d / p.name).symlink_to(p.resolve())
            row["hta_dir"] = str(d)
        rows.append(row)
    py = sys.executable
    for r in range(repeat):
        for row in rows:
            p = row["path"]
            cmds = {"opprof": [py, "-m", "opprof", "report", p, "--format", "json"]}
            if row["kind"] in ("kineto", "json"):
                cmds["json.load"] = [py, "-c", JSON_LOAD, p]
            if "hta_dir" in row and hta:
                cmds["hta"] = [hta, "-c", HTA, row["hta_dir"]]
            row["load"].append(load_line())
            for tool, cmd in cmds.items():
                m = run(cmd, timeout=1800)
                row["runs"][tool].append({"wall": m.wall_s, "cpu": m.cpu_s, "peak": m.peak_bytes,
                                          "rc": m.rc})
            print(f"  round {r + 1}/{repeat} {Path(p).name}: " + ", ".join(
                f"{t} {v[-1]['wall']:.2f} s" for t, v in row["runs"].items() if v), flush=True)
    return rows


def show(rows: list[dict], min_mb: float) -> dict:
    """The table, worst first, and the summary against the goals."""
    print(f"\n{'file':58}{'MB':>6} {'opprof s w/med/b':>20} {'x json.load w/med/b':>21}"
          f" {'HTA/opprof w/med/b':>20} {'x peak':>7}  load")
    big_ratios, big_medians, hta_min, small = [], [], [], []
    failed = []
    for row in sorted(rows, key=lambda r: -r["mb_json"]):
        op = row["runs"]["opprof"]
        if any(x["rc"] != 0 for x in op):
            failed.append(row["path"])
        walls = [x["wall"] for x in op]
        jl = row["runs"]["json.load"]
        ratio = [a["wall"] / b["wall"] for a, b in zip(op, jl, strict=False)] if jl else []
        ht = row["runs"]["hta"]
        speed = [b["wall"] / a["wall"] for a, b in zip(op, ht, strict=False)
                 if b["rc"] == 0] if ht else []
        peak = (max(x["peak"] for x in op) / max(x["peak"] for x in jl)) if jl else float("nan")
        name = f"{row['origin']}/{Path(row['path']).name}"[-57:]
        print(f"{name:58}{row['mb_json']:6.1f} {_wmb(walls):>20} "
              f"{_wmb(ratio) if ratio else '':>21} {_wmb(speed) if speed else '':>20} "
              f"{peak:7.2f}  {row['load'][0].split(' on ')[0].replace('load average ', '')}")
        if row["kind"] == "kineto" and row["mb_json"] >= min_mb and ratio:
            big_ratios.append(max(ratio))
            big_medians.append(statistics.median(ratio))
            if speed:
                hta_min.append(min(speed))
        if row["mb_json"] <= 0.5:
            small.append(statistics.median(walls))
    out = {}
    if big_ratios:
        out = {"files": len(big_ratios), "worst_x_json_load": max(big_ratios),
               "median_x_json_load": statistics.median(big_medians),
               "least_x_faster_than_hta": min(hta_min) if hta_min else None}
        print(f"\nKineto traces >= {min_mb:g} MB of JSON ({len(big_ratios)}): worst "
              f"{max(big_ratios):.2f}x json.load (goal <= 1.0x), median of the files' medians "
              f"{statistics.median(big_medians):.2f}x (goal <= 0.7x)"
              + (f"; at least {min(hta_min):.1f}x faster than HTA (goal >= 4x)"
                 if hta_min else "; no HTA figures (--hta-python)"))
    if small:
        print(f"traces <= 0.5 MB of JSON ({len(small)}): opprof median "
              f"{statistics.median(small):.2f} s, slowest file's median {max(small):.2f} s "
              "(goal <= 0.3 s)")
    if failed:
        print("FAILED (non-zero exit): " + ", ".join(failed))
    print(load_line())
    return out


def long_copy(src: Path, k: int, tmp: Path) -> None:
    """The largest Kineto trace made ``k`` times longer: opprof's peak against json.load's."""
    from bigtraces import build_long

    out = build_long(k, tmp / f"long-x{k}.json.gz", src)
    py = sys.executable
    mj = run([py, "-c", JSON_LOAD, str(out)], timeout=3600)
    mo = run([py, "-m", "opprof", "report", str(out), "--format", "json"], timeout=3600)
    print(f"\n{src.name} x{k} ({_json_bytes(out) / 1e6:.0f} MB of JSON): json.load "
          f"{mj.wall_s:.1f} s, peak {mj.peak_bytes / 2**20:.0f} MiB; opprof report "
          f"{mo.wall_s:.1f} s ({mo.wall_s / mj.wall_s:.2f}x), peak {mo.peak_bytes / 2**20:.0f} MiB"
          f" = {mo.peak_bytes / mj.peak_bytes:.2f}x json.load's (goal <= 0.35x); {load_line()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="take the manifest's public traces out of git clones")
    f.add_argument("--git", type=Path, required=True,
                   help="a folder of clones (owner+name[/repo] or name)")
    f.add_argument("--dir", type=Path, required=True, help="where the traces go")
    r = sub.add_parser("run", help="time every trace")
    r.add_argument("--dir", type=Path, help="the fetched public traces (fetch --dir)")
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--min-mb", type=float, default=0.0,
                   help="only traces of at least this many MB of JSON (the goals: 20)")
    r.add_argument("--only", nargs="*", default=[], help="only files whose name has one of these")
    r.add_argument("--hta-python", metavar="PATH",
                   help="the python of a virtual environment with HolisticTraceAnalysis")
    r.add_argument("--long", type=int, default=0,
                   help="also the largest Kineto trace made this many times longer")
    r.add_argument("--json", type=Path, help="write every run's figures here")
    args = ap.parse_args()
    if args.cmd == "fetch":
        fetch(args.git, args.dir)
        return
    import compileall

    for folder in ("opprof", "normalizers", "collectors"):  # as pip install does
        compileall.compile_dir(ROOT / folder, quiet=1)
    files = corpus(args.dir)
    if args.min_mb > 0:  # the goals' files: Kineto traces of that much JSON
        files = [(o, p) for o, p in files
                 if _kind(p) == "kineto" and _json_bytes(p) / 1e6 >= args.min_mb]
    if args.only:
        files = [(o, p) for o, p in files if any(s in p.name for s in args.only)]
    print(f"{len(files)} traces; {load_line()}; started {time.strftime('%Y-%m-%d %H:%M:%S')}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(files, args.repeat, args.hta_python, Path(tmp))
        summary = show(rows, args.min_mb or 20.0)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
        if args.long:
            kineto = [Path(r["path"]) for r in rows if r["kind"] == "kineto"]
            if kineto:
                big = max(kineto, key=lambda p: _json_bytes(p))
                long_copy(big, args.long, Path(tmp))


if __name__ == "__main__":
    main()
