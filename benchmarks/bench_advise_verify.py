"""`opprof advise --verify` on built-in CPU runs: each case recorded, advised, and its first
actions applied by their record options (`--loader-workers`, `--bucket-mb`, `--batch-size`)
beside the baseline recorded again; the predicted saving of each beside the achieved one, and
the median error over every applied action.

    python benchmarks/bench_advise_verify.py                    # every case
    python benchmarks/bench_advise_verify.py --case lenet5-b8 --actions 2 --out verify-bench

The error is the achieved saving minus the predicted one, in points of the step (both as
shares of their own baseline: the prediction of the profiled step, the achievement of the
unprofiled one per sample). Run it on a quiet machine: on a busy one the runs' own noise
(printed with each) dwarfs the savings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: name → `opprof record` options (CPU, small: a few steps each).
CASES = {
    "lenet5-b8": ["--fw", "torch", "--model", "lenet5", "--batch-size", "8"],
    "lenet5-ddp2": ["--fw", "torch", "--model", "lenet5", "--batch-size", "16", "--workers",
                    "2", "--mode", "allreduce", "--threads", "1"],
    "alexnet-b16": ["--fw", "torch", "--model", "alexnet", "--batch-size", "16"],
    "mxnet-lenet5-b8": ["--fw", "mxnet", "--model", "lenet5", "--batch-size", "8"],
}
COMMON = ["--steps", "3", "--warmup", "2", "--timing-steps", "4"]


def opprof(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "opprof", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=3600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", action="append", choices=sorted(CASES), default=None)
    ap.add_argument("--actions", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every configuration")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here")
    args = ap.parse_args()
    cases = args.case or list(CASES)
    errors: list[float] = []
    print("| case | action | predicted | achieved | error (points) | load |")
    print("|---|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for name in cases:
            folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            res = opprof("record", *CASES[name], *COMMON, "-o", "base.trace", cwd=folder)
            if res.returncode != 0:
                print(f"| {name} | record failed: {res.stderr.strip().splitlines()[-1]} |")
                continue
            res = opprof("advise", "base.trace", "--verify", "--actions", str(args.actions),
                         "--repeat", str(args.repeat),
                         "--format", "json", cwd=folder)
            if res.returncode != 0:
                print(f"| {name} | advise failed: {res.stderr.strip().splitlines()[-1]} |")
                continue
            doc = json.loads(res.stdout)
            ver = doc.get("verify", {})
            for act in ver.get("actions", []):
                errors.append(act["error"])
                print(f"| {name} | {act['rule']}: {act['knob']['option']} "
                      f"{act['knob']['value']} | {act['predicted_saving_share']:+.1%} | "
                      f"{act['achieved_saving_share']:+.1%} | {act['error'] * 100:+.1f} | "
                      f"{ver.get('load', '')} |")
            if not ver.get("actions"):
                print(f"| {name} | nothing applied: {'; '.join(ver.get('not_applied', []))} "
                      "| | | | |")
    if errors:
        med = statistics.median(abs(e) for e in errors)
        print(f"\nmedian |error| over {len(errors)} applied actions: {med * 100:.1f} points "
              f"of the step (signed median {statistics.median(errors) * 100:+.1f})")
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
