"""Predicted vs measured: the performance model against real multi-worker runs.

For each case (framework × mode) it runs, as a user would, with the opprof command line:

1. ``opprof calibrate --fw FW --workers N`` — the collective on this host → net.json (torch
   FSDP: ``--mode fsdp --units MODEL``, FSDP's calls at the model's unit sizes);
2. the 1-worker baseline ``opprof record --threads T`` (T = this host's CPUs ÷ N, what each of
   the N workers gets). ``--baseline colocated`` (the default) records N such 1-worker runs at
   the same time and takes the first: one worker measured while N−1 neighbours compute beside
   it, as the N workers of the measured run do on one host (shared memory bandwidth, caches
   and whatever else runs on the host), each copy in its own session like the workers (Linux
   autogroup scheduling shares the CPUs fairly among sessions); ``alone`` records it by itself;
3. the measured run ``opprof record --workers N --mode MODE --threads T``;
4. ``opprof model BASELINE --workers N --network net.json --check MEASURED --format json``,

and prints predicted vs measured per term with the error (the interference term
``t_interf`` among them), the check's verdict on the measured run's noise, then the median
and largest step error over all cases and repeats, and the whole benchmark's wall time. The
1-worker and N-worker recordings are interleaved — each repeat records a case's baseline and
its measured run back to back, in alternating order (baseline first on odd repeats, measured
first on even ones), so a change in the host's load falls on both. The host's load average
is printed beside every recording: on a shared machine other processes change the numbers.

    python benchmarks/bench_model.py                       # resnet18, 2 workers, 4 cases × 2
    python benchmarks/bench_model.py --workers 2 --cases torch-allreduce --repeat 3
    python benchmarks/bench_model.py --model lenet5 --steps 3 --batch-size 8   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CASES = {"torch-allreduce": ("torch", "allreduce"), "mxnet-ps-sync": ("mxnet", "ps-sync"),
         "tf-allreduce": ("tf", "allreduce"), "torch-fsdp": ("torch", "fsdp")}
TERMS = ("t_io", "t_f", "t_b", "t_interf", "t_u", "t_comm", "other", "step")


def opprof(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the opprof command line."""
    res = subprocess.run([sys.executable, "-m", "opprof", *args], capture_output=True,
                         text=True)
    if check and res.returncode != 0:
        raise SystemExit(f"opprof {' '.join(args)} failed:\n{res.stderr.strip()[-2000:]}")
    return res


def uptime() -> str:
    """The load averages (1, 5, 15 minutes), as `uptime` prints them."""
    return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def load() -> str:
    """The 1-minute load average."""
    return f"{os.getloadavg()[0]:.2f}"


def record(out: Path, fw: str, model: str, args: argparse.Namespace, threads: int,
           workers: int = 1, mode: str = "single") -> list[str]:
    """The ``opprof record`` argument list."""
    cmd = ["record", "--fw", fw, "--model", model, "--batch-size", str(args.batch_size),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--timing-steps", "2",
           "--threads", str(threads), "-o", str(out), "--format", "json"]
    if workers > 1:
        cmd += ["--workers", str(workers), "--mode", mode]
    return cmd


def baseline(folder: Path, fw: str, args: argparse.Namespace, threads: int,
             workers: int) -> Path:
    """The 1-worker baseline, alone or with workers − 1 neighbours recorded at the same time."""
    path = folder / f"{fw}-base.trace"
    copies = workers if args.baseline == "colocated" else 1
    procs = []
    for i in range(copies):
        out = path if i == 0 else folder / f"{fw}-neighbour{i}.trace"
        # Each in its own session, as the launchers start every worker: with the kernel's
        # autogroup scheduling a session is one group that gets a fair share of the CPUs, so
        # N baseline copies in one session would get the share N workers get apiece.
        procs.append(subprocess.Popen([sys.executable, "-m", "opprof",
                                       *record(out, fw, args.model, args, threads)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"baseline recording failed:\n{err.strip()[-2000:]}")
    return path


def retried(step: Callable[[], T]) -> T:
    """``step()``, once more if it fails (a framework crashing while it writes its profile —
    TensorFlow's profiler stop has segfaulted here — is not what the benchmark measures)."""
    try:
        return step()
    except SystemExit as exc:
        print(f"failed, once more: {str(exc).splitlines()[-1][:300]}", file=sys.stderr,
              flush=True)
        return step()


def run_case(name: str, folder: Path, args: argparse.Namespace, rep: int) -> dict:
    """One case: calibrate, then the baseline and the measured run back to back (in
    alternating order over repeats), then model --check."""
    fw, mode = CASES[name]
    n = args.workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = args.threads or max(1, (cpus or 1) // n)
    folder.mkdir(parents=True, exist_ok=True)
    net = folder / f"{fw}-net.json"
    t0 = time.time()
    if not args.recheck:
        print(f"[{name} #{rep}] calibrate (load {load()})", file=sys.stderr, flush=True)
        repeat = args.fsdp_calib_repeat if mode == "fsdp" else args.calib_repeat
        opprof("calibrate", "--fw", fw, "--workers", str(n), "--threads", str(threads),
               "--repeat", str(repeat), "-o", str(net), "--format", "json",
               *(["--mode", "fsdp", "--units", args.model] if mode == "fsdp" else []))
    measured = folder / f"{fw}-{mode}-{n}w.trace"
    loads: dict[str, str] = {}

    def record_base() -> Path:
        print(f"[{name} #{rep}] baseline, {args.baseline} (load {load()})", file=sys.stderr,
              flush=True)
        path = baseline(folder, fw, args, threads, n)
        loads["base"] = load()
        return path

    def record_measured() -> None:
        print(f"[{name} #{rep}] {n} workers {mode} (load {load()})", file=sys.stderr,
              flush=True)
        opprof(*record(measured, fw, args.model, args, threads, n, mode))
        loads["measured"] = load()

    if args.recheck:  # the recordings of an earlier run, checked with this model
        base = folder / f"{fw}-base.trace"
        if not (base.exists() and measured.exists() and net.exists()):
            return {"case": name, "rep": rep, "error": f"no recordings in {folder}"}
        saved = folder / "loads.json"
        loads.update(json.loads(saved.read_text()) if saved.exists() else
                     {"base": "-", "measured": "-"})
    elif rep % 2:
        base = record_base()
        record_measured()
    else:
        record_measured()
        base = record_base()
    if not args.recheck:
        (folder / "loads.json").write_text(json.dumps(loads) + "\n")
    l_base, l_meas = loads["base"], loads["measured"]
    res = opprof("model", str(base), "--workers", str(n), "--mode", mode, "--network",
                 str(net), "--check", str(measured), "--format", "json",
                 *(["--no-straggler"] if args.no_straggler else []), check=False)
    if res.returncode != 0:
        return {"case": name, "rep": rep, "error": res.stderr.strip()}
    doc = json.loads(res.stdout)
    terms = {r["term"]: r for r in doc["check"]["terms"]}
    # What the model itself predicts — the communication, and the update a parameter server
    # moves onto the servers — against the measurement, relative to the measured step: the
    # step error the model would make if every worker computed exactly as measured.
    own = ("t_comm", "t_u")
    comm_error = (sum(terms[t]["predicted_ns"] - terms[t]["measured_ns"] for t in own)
                  / terms["step"]["measured_ns"])
    return {"case": name, "rep": rep, "threads": threads, "terms": terms,
            "step_error": doc["check"]["error"], "comm_error": comm_error,
            "spread": doc["check"].get("spread"),
            "interference": doc["predictions"][-1].get("interference"),
            "load_base": l_base, "load_measured": l_meas,
            "network": {k: doc["network"][k] for k in ("alpha_ns", "beta_ns_per_byte")},
            "seconds": round(time.time() - t0, 1)}


def show(r: dict) -> None:
    """One case's table."""
    if "error" in r:
        print(f"\n{r['case']} #{r['rep']}: {r['error']}")
        return
    net = r["network"]
    print(f"\n{r['case']} #{r['rep']}  ({r['threads']} thread(s) per worker; load "
          f"{r['load_base']} baseline, {r['load_measured']} measured; α = "
          f"{net['alpha_ns'] / 1e3:.1f} µs, β = {net['beta_ns_per_byte']:.3f} ns/B)")
    print(f"  {'term':<8}{'predicted ms':>14}{'measured ms':>14}{'error':>9}")
    for t in TERMS:
        row = r["terms"].get(t)
        if row is None:
            continue
        err = row["error"]
        e = "-" if err is None or isinstance(err, str) else f"{err:+.1%}"
        print(f"  {t:<8}{row['predicted_ns'] / 1e6:>14,.1f}{row['measured_ns'] / 1e6:>14,.1f}"
              f"{e:>9}")
    print(f"  step error with the measured compute (t_comm + t_u as predicted): "
          f"{r['comm_error']:+.1%}")
    if r.get("interference"):
        i = r["interference"]
        print(f"  interference: compute beside a collective ×{1 + i['slowdown']:.2f}, the "
              f"collective beside compute ×{1 + i.get('comm_slowdown', 0.0):.2f} "
              f"({i['source']})")
    if r.get("spread"):
        print(f"  measured run: {r['spread']['verdict']}")


LABELS = {"torch-allreduce": "torch allreduce", "mxnet-ps-sync": "MXNet ps-sync",
          "tf-allreduce": "TF allreduce", "torch-fsdp": "torch FSDP"}


def verdict(spread: dict | None) -> str:
    """--check's verdict in a few words: too noisy (and why), within the noise, or off by
    the error with its interval."""
    if not spread:
        return "-"
    if spread["noisy"]:
        why = (f"cv {spread['cv']:.1%}" if spread["cv"] > 0.10 else
               f"mean ±{spread['half_width']:.1%}")
        return f"too noisy ({why})"
    lo, hi = spread["error_interval"]
    head = "within the noise" if lo <= 0 <= hi else "off"
    return f"{head} (interval {lo:+.1%} … {hi:+.1%})"


def table(results: list[dict]) -> None:
    """Every run as one row of docs/model.md's results table (markdown)."""
    print("\n| run | load (base / measured) | predicted step | measured step | error | with "
          "measured compute | t_interf predicted / measured | `--check` verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        name = f"{LABELS.get(r['case'], r['case'])} #{r['rep']}"
        if "error" in r:
            print(f"| {name} | - | - | - | failed: {r['error'][:80]} | - | - | - |")
            continue
        step, interf = r["terms"]["step"], r["terms"].get("t_interf")
        i = (f"{interf['predicted_ns'] / 1e6:,.1f} / {interf['measured_ns'] / 1e6:,.1f} ms"
             if interf else "-")
        print(f"| {name} | {r['load_base']} / {r['load_measured']} | "
              f"{step['predicted_ns'] / 1e6:,.1f} ms | {step['measured_ns'] / 1e6:,.1f} ms | "
              f"{r['step_error']:+.1%} | {r['comm_error']:+.1%} | {i} | "
              f"{verdict(r.get('spread'))} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--from-repeat", type=int, default=1,
                    help="start at this repeat (the earlier ones' recordings stay in --output)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads per worker for both runs (default: the host's CPUs ÷ workers)")
    ap.add_argument("--calib-repeat", type=int, default=5)
    ap.add_argument("--fsdp-calib-repeat", type=int, default=15,
                    help="calibrate --mode fsdp: timed calls per unit size (cheap: the mean of "
                         "calls with a heavy tail needs more of them)")
    ap.add_argument("--baseline", choices=["colocated", "alone"], default="colocated")
    ap.add_argument("--no-straggler", action="store_true",
                    help="pass --no-straggler to opprof model")
    ap.add_argument("--recheck", action="store_true",
                    help="record nothing: check the recordings (and network files) an earlier "
                         "run left in --output with this opprof's model")
    ap.add_argument("-o", "--output", type=Path, default=Path("bench-model"))
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit(f"unknown case(s) {bad}; choose from {', '.join(CASES)}")
    results = []
    start = time.time()
    print(f"uptime at the start: {uptime()}", flush=True)
    for rep in range(args.from_repeat, args.repeat + 1):
        for name in cases:
            r = run_case(name, args.output / f"{name}-{rep}", args, rep)
            show(r)
            results.append(r)
    errors = [abs(r["step_error"]) for r in results if "step_error" in r]
    print(f"\nuptime at the end: {uptime()}; the whole benchmark took "
          f"{(time.time() - start) / 60:.1f} min")
    table(results)
    for name in cases:
        errs = [f"{r['step_error']:+.1%}" for r in results
                if r["case"] == name and "step_error" in r]
        print(f"  {name:<16} {', '.join(errs) or 'failed'}")
    if errors:
        comm = [abs(r["comm_error"]) for r in results if "comm_error" in r]
        noisy = sum(bool(r.get("spread") and r["spread"]["noisy"]) for r in results)
        print(f"step error over {len(errors)} run(s): median {statistics.median(errors):.1%}, "
              f"max {max(errors):.1%}  (goal: median ≤ 5%, max ≤ 10%); {noisy} measured "
              "run(s) too noisy to judge by --check's verdict")
        print(f"with the measured compute: median {statistics.median(comm):.1%}, largest "
              f"{max(comm):.1%}")
    out = "bench_model-recheck.json" if args.recheck else "bench_model.json"
    (args.output / out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
