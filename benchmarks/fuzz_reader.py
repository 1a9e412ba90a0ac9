"""Fuzz the reader: several hundred deterministic mutations of real traces of every format
(Kineto JSON and gzip, MXNet JSON, TensorFlow XPlane, nsys SQLite, opprof `.trace`), each
read as ``opprof report`` reads it, and a summary: outcomes, failures (traceback, hang,
multi-line or unnamed error, memory past 2 GiB, an unusable value read without a ⚠ line,
the report's numbers changed without a ⚠ line where the mutation was more than a valid
value's change), peak memory.

    python benchmarks/fuzz_reader.py                 # seed 1, ~500 cases
    python benchmarks/fuzz_reader.py --seed 7 --values 40 --damage 30
    python benchmarks/fuzz_reader.py --source /work/corpus/hta --values 10 --damage 10
                                                     # others' traces instead (file or folder)
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzzing import (  # noqa: E402
    FAILURES,
    all_cases,
    check,
    peak_rss_bytes,
    source_cases,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--values", type=int, default=40,
                    help="value mutations per JSON source (each owes a ⚠ or a refusal)")
    ap.add_argument("--damage", type=int, default=40,
                    help="byte-level damage per JSON source (truncations, flips, zeros)")
    ap.add_argument("--no-xplane", action="store_true", help="skip XPlane (imports TF)")
    ap.add_argument("--source", action="append", type=Path, default=[],
                    help="mutate this trace (Kineto JSON/.gz, nsys .sqlite, .trace) or each "
                         "in this folder instead of the repository's fixtures (repeatable)")
    ap.add_argument("--time-limit", type=int, default=60,
                    help="seconds a case may take before it is a hang")
    ap.add_argument("--list", action="store_true", help="print each failure's full detail")
    args = ap.parse_args()
    t0 = time.perf_counter()
    outcomes: Counter[str] = Counter()
    by_format: dict[str, Counter[str]] = {}
    failures = []
    warned = owed = 0
    baselines: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases = (itertools.chain.from_iterable(
            source_cases(s, Path(tmp) / str(i), args.seed, args.values, args.damage)
            for i, s in enumerate(args.source)) if args.source else
            all_cases(Path(tmp), args.seed, args.values, args.damage,
                      xplane=not args.no_xplane))
        for case in cases:
            r = check(case, time_limit_s=args.time_limit, baselines=baselines)
            source = case.name.split(":")[0]
            fmt = ("mxnet" if source.startswith("rank0_worker") else "kineto"
                   if source.endswith(".json.gz") else source.strip(".").split()[0])
            by_format.setdefault(fmt, Counter())[r.outcome] += 1
            outcomes[r.outcome] += 1
            owed += case.must_warn
            warned += case.must_warn and r.outcome == "ok" and bool(r.warnings)
            if r.outcome in FAILURES:
                failures.append(r)
    total = sum(outcomes.values())
    print(f"{total} cases in {time.perf_counter() - t0:.0f} s, peak memory "
          f"{peak_rss_bytes() / 2**20:.0f} MiB")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in outcomes.most_common()))
    for fmt, c in sorted(by_format.items()):
        print(f"  {fmt:10} " + ", ".join(f"{k} {v}" for k, v in c.most_common()))
    print(f"unusable values: {owed} cases, {warned} read with a ⚠ line, "
          f"{owed - warned - sum(r.outcome == 'silent' for r in failures)} refused, "
          f"{sum(r.outcome == 'silent' for r in failures)} silent")
    print(f"failures: {len(failures)}")
    for r in failures if args.list else failures[:20]:
        detail = r.detail.strip()
        print(f"  {r.outcome}: {r.case.name}: "
              f"{detail if args.list else detail.splitlines()[-1][:200]}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
