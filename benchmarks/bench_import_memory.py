"""What importing costs in memory before a report reads anything: the largest resident set
(ru_maxrss) of a fresh interpreter that imports numpy, pandas (which imports pyarrow itself
when it is installed), pandas with pyarrow hidden from it, and opprof's report path.

    python benchmarks/bench_import_memory.py [--repeat 3]

The figures docs/reader.md quotes ("`import pandas` alone is 108 MiB of RSS here, 68 MiB with
pyarrow hidden from it") come from this script.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CASES = {
    "python": "pass",
    "numpy + msgspec": "import numpy, msgspec",
    "pandas (imports pyarrow)": "import pandas",
    "pandas, pyarrow hidden": "import sys; sys.modules['pyarrow'] = None; import pandas",
    "opprof's report path": ("import opprof.cli, opprof.loader, opprof.analysis.report, "
                             "opprof.render.jsonfmt"),
}
_PEAK = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"


def peak_mib(code: str) -> float:
    """The largest resident set of a fresh interpreter running ``code``, in MiB."""
    out = subprocess.run([sys.executable, "-c", f"{code}\n{_PEAK}"], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[-1]) / 1024  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'imports':<28} {'peak RSS MiB (median)':>22}")
    for name, code in CASES.items():
        runs = [peak_mib(code) for _ in range(args.repeat)]
        print(f"{name:<28} {statistics.median(runs):>22.1f}")


if __name__ == "__main__":
    main()
