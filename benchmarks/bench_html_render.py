"""In-process time of the HTML renderer alone: ``opprof.render.html.report(rep, advice=…)`` on
a report already built (the trace read and analysed once, as ``opprof report`` does), three
calls in one fresh process (the first pays for lazy imports and loading).

    python benchmarks/bench_html_render.py [TRACE]   # default /tmp/opprof-bench/nccl-x5.json.gz
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from opprof.pipeline.report import ReportOptions, report


def main() -> None:
    trace = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/opprof-bench/nccl-x5.json.gz")
    t0 = time.perf_counter()
    result = report(ReportOptions((trace,), "phase", "html", "steps", None, None, True, None),
                    None)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"read and analysed {trace.name} in {time.perf_counter() - t0:.2f} s")
    from opprof.render import html

    for i in range(3):
        t0 = time.perf_counter()
        page = html.report(result.report, advice=result.advice)
        print(f"html.report call {i + 1}: {time.perf_counter() - t0:.3f} s ({len(page):,} chars)")


if __name__ == "__main__":
    main()
