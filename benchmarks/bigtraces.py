"""Build large inputs from real traces, for the benchmarks (and the scale tests).

- :func:`build_job`: an N-rank Kineto job, each rank a real trace (cycling through the
  sources) with its rank rewritten (``distributedInfo.rank``, ``world_size``) and its clock
  shifted (``baseTimeNanoseconds``, a few microseconds per rank, as unsynchronised hosts
  are), gzipped like the originals. Written once per (sources, N) and reused.
- :func:`build_long`: one rank's trace made K times longer: its events repeated K times,
  each copy shifted past the previous one, with correlation ids and step numbers renumbered
  (what a longer profiling window of the same job records).

    python benchmarks/bigtraces.py job 64 DIR [SOURCE.json.gz ...]
    python benchmarks/bigtraces.py long 5 OUT.json.gz [SOURCE.json.gz]
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1] / "fixtures" / "shared" / "kineto-gpu"
DEFAULT_SOURCE = SHARED / "nccl-2rank-rank0.json.gz"
_RANK, _BASE = "@@opprof-rank@@", "@@opprof-base@@"


def _load(path: Path) -> dict:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        return json.load(f)


def _template(doc: dict, world: int) -> tuple[bytes, int]:
    """The document as JSON with placeholders for the rank and the base time."""
    doc = dict(doc)
    base = int(doc.get("baseTimeNanoseconds") or 0)
    doc["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "rank": _RANK,
                              "world_size": world}
    doc["baseTimeNanoseconds"] = _BASE
    return json.dumps(doc).encode(), base


def shift_ns(rank: int) -> int:
    """The clock shift of a rank: a deterministic few microseconds."""
    return (rank * 7919) % 50_000


def build_job(n: int, out: Path, sources: list[Path] | None = None, level: int = 3) -> list[Path]:
    """Write an N-rank job into ``out`` (reused when already there); return its files."""
    sources = sources or [DEFAULT_SOURCE]
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"rank{r}.pt.trace.json.gz" for r in range(n)]
    stamp = out / "job.stamp"
    want = {"n": n, "sources": [str(s) for s in sources]}
    if stamp.exists() and json.loads(stamp.read_text()) == want and all(f.exists() for f in files):
        return files
    templates = [_template(_load(s), n) for s in sources]
    for r, f in enumerate(files):
        text, base = templates[r % len(templates)]
        body = (text.replace(f'"{_RANK}"'.encode(), str(r).encode())
                .replace(f'"{_BASE}"'.encode(), str(base + shift_ns(r)).encode()))
        with gzip.open(f, "wb", compresslevel=level) as g:
            g.write(body)
    stamp.write_text(json.dumps(want))
    return files


def build_long(k: int, out: Path, source: Path = DEFAULT_SOURCE) -> Path:
    """Write ``source`` made ``k`` times longer to ``out`` (gzipped when it ends in .gz)."""
    doc = _load(source)
    ev = doc["traceEvents"]
    timed = [e for e in ev if e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed)
    step = re.compile(r"^ProfilerStep#(\d+)$")
    events = []
    for c in range(k):
        for e in ev:
            if e.get("ph") == "M" and c:
                continue
            e2 = dict(e)
            if c:
                if "ts" in e2 and e.get("ph") != "M":
                    e2["ts"] = e["ts"] + c * (span + 1000)
                args = e2.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for key in ("correlation", "External id"):
                        if isinstance(args.get(key), int):
                            args[key] += c * 10_000_000
                    e2["args"] = args
                if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                    e2["id"] += c * 10_000_000
                m = step.match(str(e2.get("name", "")))
                if m:
                    e2["name"] = f"ProfilerStep#{int(m.group(1)) + 1000 * c}"
            events.append(e2)
    body = json.dumps({**doc, "traceEvents": events}).encode()
    if out.suffix == ".gz":
        with gzip.open(out, "wb", compresslevel=6) as g:
            g.write(body)
    else:
        out.write_bytes(body)
    return out


if __name__ == "__main__":
    what, count, dest, *src = sys.argv[1:]
    if what == "job":
        print(len(build_job(int(count), Path(dest), [Path(s) for s in src] or None)), "files")
    else:
        print(build_long(int(count), Path(dest), Path(src[0]) if src else DEFAULT_SOURCE))
