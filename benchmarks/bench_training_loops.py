"""The phase shares of every training loop under `opprof run` (Lightning, the Hugging Face
`Trainer`, Accelerate — the scripts of tests/scripts/), as the figures of docs/frameworks.md.

    python benchmarks/bench_training_loops.py                       # every loop
    python benchmarks/bench_training_loops.py --only lightning-fit,hf-trainer-gpt2 --steps 10

Each loop runs as a user runs it, ``opprof run --steps S --warmup W -o LOOP.trace --format json
-- COMMAND`` (with ``HF_HUB_OFFLINE=1``), in a temporary folder; printed per loop: its
processes and steps per process, each phase's share of the step (all ranks), operator
`other`'s share, whether every step's phases sum to it, the mean step, and the machine's
load average (these are timings: run on a quiet machine for figures to quote). Exit 1 when a
loop fails or breaks a rule the tests assert (forward and backward in every step, phases
summing to the step, operator `other` ≤ 10%).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "scripts"
PHASES = ("load", "h2d", "forward", "backward", "update", "comm", "other")
ACCELERATE = ([shutil.which("accelerate")] if shutil.which("accelerate")
              else [sys.executable, "-m", "accelerate.commands.accelerate_cli"])


def loops(steps: int) -> dict[str, list[str]]:
    """Each loop's command; ``steps``: the optimizer steps the script runs."""
    py, n = sys.executable, str(steps)
    fit, manual = str(SCRIPTS / "lightning_fit.py"), str(SCRIPTS / "lightning_manual.py")
    hf, acc = str(SCRIPTS / "hf_trainer.py"), str(SCRIPTS / "accelerate_loop.py")
    return {
        "lightning-fit": [py, fit, "--steps", n],
        "lightning-fit-clip": [py, fit, "--steps", n, "--clip", "1.0"],
        "lightning-accumulate": [py, fit, "--steps", n, "--accumulate", "2"],
        "lightning-manual": [py, manual, "--steps", n],
        "lightning-ddp": [py, fit, "--steps", n, "--devices", "2", "--strategy", "ddp"],
        "lightning-ddp-spawn": [py, fit, "--steps", n, "--devices", "2", "--strategy",
                                "ddp_spawn"],
        "hf-trainer-gpt2": [py, hf, "--steps", n],
        "hf-trainer-gpt2-accumulate": [py, hf, "--steps", n, "--accumulate", "2"],
        "hf-trainer-bert": [py, hf, "--steps", n, "--model", "bert"],
        "accelerate": [py, acc, "--steps", n],
        "accelerate-accumulate": [py, acc, "--steps", n, "--accumulate", "2"],
        "accelerate-launch-2": [*ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2",
                                "--num_machines", "1", "--mixed_precision", "no",
                                "--dynamo_backend", "no", acc, "--steps", n],
    }


def measure(name: str, command: list[str], steps: int, warmup: int, tmp: Path) -> dict:
    """One loop under `opprof run`: its figures (or ``error``)."""
    trace = tmp / f"{name}.trace"
    res = subprocess.run([sys.executable, "-m", "opprof", "run", "--steps", str(steps),
                          "--warmup", str(warmup), "-o", str(trace), "--format", "json", "--",
                          *command], cwd=tmp, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=1800)
    if res.returncode != 0 or not res.stdout.strip():
        return {"loop": name, "error": (res.stderr.strip().splitlines() or ["?"])[-1]}
    report = json.loads(res.stdout)
    rows = report["steps"]
    ranks = sorted({s["rank"] for s in rows})
    step_ns = sum(s["dur_ns"] for s in rows) / len(rows)
    other_op = sum(o["ns_per_step"] for o in report["ops"] if o["op"] == "other") / step_ns
    return {"loop": name, "ranks": len(ranks), "steps": len(rows) // len(ranks),
            "mode": report["meta"].get("mode"),
            **{p: report["phases"][p]["share"] for p in PHASES},
            "op_other": other_op, "step_ms": step_ns / 1e6,
            "sums": all(sum(s["phases"][p] for p in PHASES) == s["dur_ns"] for s in rows),
            "fwd_bwd_every_step": all(s["phases"]["forward"] > 0 and s["phases"]["backward"] > 0
                                      for s in rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated loop names (default: all)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (opprof run)")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    script_steps = args.warmup + 3 + 1 + args.steps + 4  # warm-up, timing, settle, profile
    table = loops(script_steps)
    names = args.only.split(",") if args.only else list(table)
    ok = True
    print(f"{'loop':28} {'ranks':>5} {'steps':>5} " + " ".join(f"{p:>8}" for p in PHASES)
          + f" {'op other':>8} {'ms/step':>9}  sums  load average")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            r = measure(name, table[name], args.steps, args.warmup, Path(tmp))
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            if "error" in r:
                ok = False
                print(f"{name:28} failed: {r['error']}")
                continue
            ok &= r["sums"] and r["fwd_bwd_every_step"] and r["op_other"] <= 0.10
            print(f"{name:28} {r['ranks']:>5} {r['steps']:>5} "
                  + " ".join(f"{100 * r[p]:>7.1f}%" for p in PHASES)
                  + f" {100 * r['op_other']:>7.2f}% {r['step_ms']:>9.1f}  {str(r['sums']):5} "
                  + load, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
