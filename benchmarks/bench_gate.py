"""The regression gate on this machine: the same job recorded N+1 times, each run gated
against the next (`opprof diff A B --fail-above 5%`: every one of the N must pass, no false
alarm), and a clearly slower version of it (a sleep in every step) gated against every run of
the job (every one must fail, exit 1).

    python benchmarks/bench_gate.py                       # 11 runs of torch_loop.py + 1 slow
    python benchmarks/bench_gate.py --runs 21 --threshold 5% --sleep-ms 300 --out gate-bench

Prints one row per gate (delta, the runs' noise, p, verdict, exit code), the false alarms and
the detections, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "torch_loop.py"


def record(out: Path, steps: int, sleep_ms: float, timing: int) -> None:
    """One `opprof run` of the job into ``out``."""
    cmd = [sys.executable, "-m", "opprof", "run", "--timing-steps", str(timing), "-o",
           str(out), "--", sys.executable, str(SCRIPT), "--steps", str(steps)]
    if sleep_ms:
        cmd += ["--sleep-ms", str(sleep_ms)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"recording {out} failed: {res.stderr[-2000:]}")


def gate(base: Path, new: Path, threshold: str) -> tuple[int, dict]:
    """`opprof diff BASE NEW --fail-above THRESHOLD --format json`: (exit code, gate)."""
    res = subprocess.run([sys.executable, "-m", "opprof", "diff", str(base), str(new),
                          "--fail-above", threshold, "--format", "json"],
                         capture_output=True, text=True, timeout=600)
    if res.returncode not in (0, 1):
        raise SystemExit(f"diff {base} {new}: {res.stderr}")
    return res.returncode, json.loads(res.stdout)["gate"]


def row(kind: str, a: str, b: str, code: int, g: dict) -> str:
    return (f"| {kind} | {a} → {b} | {g['delta']:+.1%} | {g['noise']:.0%} | "
            f"{g['p_value']:.3g} | {g['verdict']} | {code} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=11, help="runs of the job (N+1 for N gates)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--timing-steps", type=int, default=3)
    ap.add_argument("--sleep-ms", type=float, default=300.0,
                    help="the slower version's sleep in every step")
    ap.add_argument("--threshold", default="5%")
    ap.add_argument("--out", type=Path, default=None, help="keep the traces here")
    args = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        runs = []
        for i in range(args.runs):
            path = folder / f"run{i:02d}.trace"
            record(path, args.steps, 0.0, args.timing_steps)
            runs.append(path)
            print(f"recorded {path.name} (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
        slow = folder / "slow.trace"
        record(slow, args.steps, args.sleep_ms, args.timing_steps)
        print("| gate | runs | delta | noise | p | verdict | exit |")
        print("|---|---|---:|---:|---:|---|---:|")
        alarms = 0
        for a, b in zip(runs, runs[1:], strict=False):
            code, g = gate(a, b, args.threshold)
            alarms += code != 0
            print(row("same job", a.stem, b.stem, code, g))
        caught = 0
        for a in runs:
            code, g = gate(a, slow, args.threshold)
            caught += code == 1
            print(row("slower", a.stem, slow.stem, code, g))
    load1 = os.getloadavg()
    n = args.runs - 1
    print(f"\nfalse alarms: {alarms} of {n} gates of the same job; slower run caught: "
          f"{caught} of {args.runs} (threshold {args.threshold}, sleep {args.sleep_ms:g} ms "
          f"per step)")
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
