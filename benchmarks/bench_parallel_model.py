"""Predicted vs measured: the model-parallel model (opprof.model.parallel) against real
runs of the built-in transformer, with the opprof command line as a user runs it.

For each case it records, interleaved per repeat (so a change of the host's load falls on both):

- ``tp``: the built-in TP run, ``opprof record --mode tp --workers 2``, and the same model on
  one worker; ``opprof model TP --mode tp --workers 1 --check SINGLE``: the step without tensor
  parallelism predicted from the TP run (the sharded products doubled, DTensor's work and the
  collectives gone);
- ``pp``: the built-in PP run, ``opprof record --mode pp --workers 2`` (GPipe, 4 micro-batches),
  and the one-worker run; ``opprof model PP --mode pp --workers 1 --microbatches 1 --check
  SINGLE``;
- from the second repeat on, each 2-worker run predicted from the previous repeat's at its own
  layout (``--workers 2 --check``): what the calibration to a measured run leaves,

then prints each prediction, the measured step, the error, the host's load beside each
recording, and the median and largest error per case.

    python benchmarks/bench_parallel_model.py                 # transformer, batch 8, 2 repeats
    python benchmarks/bench_parallel_model.py --repeat 3 --steps 5 --network net.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def opprof(*args: str) -> subprocess.CompletedProcess:
    """Run the opprof command line (exit on failure, with its error)."""
    res = subprocess.run([sys.executable, "-m", "opprof", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"opprof {' '.join(args)} failed:\n{res.stderr.strip()[-2000:]}")
    return res


def load() -> str:
    """The host's load averages."""
    return "load " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def record(out: Path, args: argparse.Namespace, mode: str | None) -> Path:
    """One built-in run (``mode`` None: one worker)."""
    cmd = ["record", "--fw", "torch", "--model", args.model, "--batch-size",
           str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--timing-steps", "1", "--threads", "1", "-o", str(out), "--format", "json"]
    if mode:
        cmd += ["--workers", "2", "--mode", mode]
    t0 = time.time()
    opprof(*cmd)
    print(f"  recorded {out.name:<22} in {time.time() - t0:5.1f} s ({load()})", flush=True)
    return out


def model(base: Path, mode: str, measured: Path, workers: int, args: argparse.Namespace,
          microbatches: int | None = None) -> dict:
    """``opprof model BASE --mode MODE --workers N --check MEASURED --format json``."""
    cmd = ["model", str(base), "--mode", mode, "--workers", str(workers), "--check",
           str(measured), "--format", "json"]
    if microbatches:
        cmd += ["--microbatches", str(microbatches)]
    if args.network:
        cmd += ["--network", str(args.network)]
    check: dict = json.loads(opprof(*cmd).stdout)["check"]
    return check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--network", type=Path, default=None,
                        help="net.json from `opprof calibrate --fw torch --workers 2`")
    parser.add_argument("--keep", type=Path, default=None, help="keep the traces here")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"bench_parallel_model: {args.model}, batch {args.batch_size}, {args.steps} steps, "
          f"{args.repeat} repeat(s); {load()}; traces in {folder}")
    errors: dict[str, list[float]] = {}
    started = time.time()
    runs: dict[str, list[Path]] = {"tp": [], "pp": []}
    for r in range(args.repeat):
        print(f"repeat {r + 1}")
        single = record(folder / f"single-{r}.trace", args, None)
        for mode in ("tp", "pp"):
            runs[mode].append(record(folder / f"{mode}-{r}.trace", args, mode))
        for mode, m in (("tp", None), ("pp", 1)):
            c = model(runs[mode][-1], mode, single, 1, args, m)
            errors.setdefault(f"{mode} → 1 worker", []).append(c["error"])
            print(f"  {mode} → 1 worker: predicted {c['predicted_ns'] / 1e6:8.3f} ms, measured "
                  f"{c['measured_ns'] / 1e6:8.3f} ms, error {100 * c['error']:+6.1f}%")
        if r:
            for mode in ("tp", "pp"):
                c = model(runs[mode][-2], mode, runs[mode][-1], 2, args)
                errors.setdefault(f"{mode} 2 workers (other repeat)", []).append(c["error"])
                print(f"  {mode} 2 workers from the previous repeat: predicted "
                      f"{c['predicted_ns'] / 1e6:8.3f} ms, measured "
                      f"{c['measured_ns'] / 1e6:8.3f} ms, error {100 * c['error']:+6.1f}%")
    print("\ncase                               median |error|   largest |error|")
    for case, errs in errors.items():
        a = [abs(e) for e in errs]
        print(f"{case:<34} {100 * statistics.median(a):12.1f}%   {100 * max(a):14.1f}%")
    print(f"wall time {time.time() - started:.0f} s; {load()}")


if __name__ == "__main__":
    main()
