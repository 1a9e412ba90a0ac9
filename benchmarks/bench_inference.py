"""Benchmark: what phase inference costs when importing a large trace with no opprof markers.

    python benchmarks/bench_inference.py                 # tile fixtures/unmarked/torch-loop
    python benchmarks/bench_inference.py --copies 400    # ~450k events
    python benchmarks/bench_inference.py TRACE.json.gz   # tile another Kineto trace

A user's Kineto trace (no opprof marker) is repeated ``--copies`` times one after another
(timestamps shifted, correlation ids kept apart) into one large trace, which is then imported
(``opprof.normalizers.normalize``) and broken down (``step_breakdown``). The time spent in
the inference functions of ``opprof.normalizers.events`` (steps from the optimizer, the gap
spans, the phases of operators without one) is measured beside the whole, each best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "fixtures" / "unmarked" / "torch-loop" / "rank0.pt.trace.json.gz"


def tiled(path: Path, copies: int, out: Path) -> int:
    """Write ``copies`` back-to-back copies of the trace's events to ``out``; return the
    number of complete events."""
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
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
    out.write_text(json.dumps({**{k: v for k, v in doc.items() if k != "traceEvents"},
                               "traceEvents": events}))
    return len(events)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", type=Path, default=DEFAULT)
    p.add_argument("--copies", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()

    from opprof.analysis.breakdown import step_breakdown
    from opprof.normalizers import events, normalize

    spent = {"inference": 0.0}
    for name in ("infer_phase_spans", "next_phase", "_leads", "optimizer_steps",
                 "_launchers_of_copies", "_span_events"):
        fn = getattr(events, name)

        def timed(*args, _fn=fn, **kw):
            t = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                spent["inference"] += time.perf_counter() - t

        setattr(events, name, timed)

    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.json"
        n = tiled(a.trace, a.copies, big)
        best = None
        for _ in range(a.repeat):
            spent["inference"] = 0.0
            t = time.perf_counter()
            trace = normalize([big])
            t_norm = time.perf_counter() - t
            steps = step_breakdown(trace)
            t_all = time.perf_counter() - t
            row = (t_all, t_norm, spent["inference"])
            best = row if best is None or row < best else best
    t_all, t_norm, t_inf = best
    print(f"{a.trace.name} x{a.copies}: {n:,} native events, {len(steps)} steps, "
          f"inferred ranks {trace.meta.get('inferred_phases')}")
    print(f"import {t_norm:.2f} s + breakdown {t_all - t_norm:.2f} s = {t_all:.2f} s; "
          f"inference {t_inf:.2f} s ({t_inf / t_norm:.1%} of the import), "
          f"{n / t_all / 1e3:.0f}k events/s overall (best of {a.repeat})")


if __name__ == "__main__":
    sys.exit(main())
