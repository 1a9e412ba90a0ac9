"""Predicted vs measured: the model-parallel models against real runs of the built-in
transformer, with the opprof command line as a user runs it.

**The users' direction** (the default; issue #30's bar: within 10%): a one-worker recording
predicts the tensor- and pipeline-parallel runs on 2 workers. Per repeat:

1. ``opprof calibrate --fw torch --workers 2 -o net.json`` (the users' command: gloo's
   all-reduce, its interference and co-location loops on this host);
2. for each configuration (``short``: 4 profiled steps after 1 warm-up, what users record;
   ``long``: 8 after 2) and each case, the one-worker base ``opprof record --fw torch --model
   transformer --batch-size 8 --threads 1`` and the measured run, the same with ``--workers 2
   --mode tp`` (or ``pp``: GPipe, 4 micro-batches) — back to back, in alternating order over
   repeats so a change of the host's load falls on both;
3. ``opprof model BASE --mode tp --workers 2 --network net.json --check TP2.trace`` (``pp``:
   the check takes the measured run's micro-batches and schedule).

It prints every run — the worst first — with the host's load sampled during each recording
(the 1-minute load average's mean and maximum), the predicted and measured step, the error,
the error without the co-location term, the host's noise in the two runs (their compute over
their typical operators: 1 on a quiet host), the error at the measured run's noise (the
predicted compute moved from the base's noise to the measured run's: what is left is the
model's, the rest the two runs meeting different loads) and the check's verdict; then the
median and the largest error per case. ``--rescore FOLDER`` prints the table again from a kept
folder's traces with this worktree's model (no recording: a model change judged on the same
runs).

**The other direction** (``--direction from-parallel``, the previous benchmark): the
2-worker TP and PP runs predict the one-worker step (``opprof model TP --mode tp --workers 1
--check SINGLE``), and from the second repeat each 2-worker run predicts the next repeat's.

    python benchmarks/bench_parallel_model.py                      # 2 cases × short/long × 3
    python benchmarks/bench_parallel_model.py --configs short --repeat 1   # a quick look
    python benchmarks/bench_parallel_model.py --direction from-parallel --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CASES = ("tp", "pp")
#: name → (profiled steps, warm-up steps): what users record, and a longer recording
CONFIGS = {"short": (4, 1), "long": (8, 2)}


def opprof(*args: str) -> subprocess.CompletedProcess:
    """Run the opprof command line (exit on failure, with its error)."""
    res = subprocess.run([sys.executable, "-m", "opprof", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"opprof {' '.join(args)} failed:\n{res.stderr.strip()[-2000:]}")
    return res


def load() -> str:
    """The host's load averages."""
    return "load " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


@contextmanager
def sampled(into: dict, key: str) -> Iterator[None]:
    """Sample the 1-minute load average every second while the block runs: ``into[key]``
    gets its mean and maximum."""
    samples: list[float] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            samples.append(os.getloadavg()[0])
            stop.wait(1.0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        got = samples or [os.getloadavg()[0]]
        into[key] = {"mean": round(statistics.mean(got), 2), "max": round(max(got), 2)}


def fmt_load(d: dict | None) -> str:
    """mean (max) of the 1-minute load average during a recording."""
    return "-" if not d else f"{d['mean']:.1f} ({d['max']:.1f})"


def record(out: Path, args: argparse.Namespace, mode: str | None, steps: int,
           warmup: int) -> Path:
    """One built-in run (``mode`` None: one worker)."""
    cmd = ["record", "--fw", "torch", "--model", args.model, "--batch-size",
           str(args.batch_size), "--steps", str(steps), "--warmup", str(warmup),
           "--threads", "1", "-o", str(out), "--format", "json"]
    if mode:
        cmd += ["--workers", "2", "--mode", mode]
    t0 = time.time()
    opprof(*cmd)
    print(f"  recorded {out.name:<26} in {time.time() - t0:5.1f} s ({load()})", flush=True)
    return out


def check(base: Path, mode: str, measured: Path, workers: int, net: Path | None,
          microbatches: int | None = None) -> dict:
    """``opprof model BASE --mode MODE --workers N [--network] --check MEASURED``, JSON."""
    cmd = ["model", str(base), "--mode", mode, "--workers", str(workers), "--check",
           str(measured), "--format", "json"]
    if microbatches:
        cmd += ["--microbatches", str(microbatches)]
    if net is not None:
        cmd += ["--network", str(net)]
    doc: dict = json.loads(opprof(*cmd).stdout)
    return doc


# --------------------------------------------------------------------------- users' direction


def users(args: argparse.Namespace, folder: Path) -> None:
    """The users' direction (module docstring)."""
    results: list[dict] = []
    for rep in range(args.repeat):
        print(f"repeat {rep + 1}", flush=True)
        loads: dict[str, dict] = {}
        net = args.network
        if net is None:
            net = folder / f"net-{rep}.json"
            with sampled(loads, "calibrate"):
                opprof("calibrate", "--fw", "torch", "--workers", "2", "-o", str(net))
            print(f"  calibrated {net.name} ({load()})", flush=True)
        for config in args.configs:
            steps, warmup = CONFIGS[config]
            for case in args.cases:
                tag = f"{case}-{config}-{rep}"
                base, run = folder / f"single-{tag}.trace", folder / f"{case}2-{tag}.trace"
                order = [("base", base, None), ("measured", run, case)]
                for key, path, mode in order if rep % 2 == 0 else order[::-1]:
                    with sampled(loads, f"{tag}-{key}"):
                        record(path, args, mode, steps, warmup)
                results.append(scored(case, config, rep, base, run, net, loads))
                show(results[-1])
    report(results)
    (folder / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"results in {folder / 'results.json'}")


def scored(case: str, config: str, rep: int, base: Path, run: Path, net: Path,
           loads: dict[str, dict]) -> dict:
    """One run's ``--check``, with the loads its recordings met."""
    steps, warmup = CONFIGS[config]
    tag = f"{case}-{config}-{rep}"
    doc = check(base, case, run, 2, net)
    c = doc["check"]
    out = {"case": case, "config": config, "repeat": rep + 1, "steps": steps,
           "warmup": warmup, "base_step_ns": doc["base"]["step_ns"],
           "predicted_ns": c["predicted_ns"],
           "measured_ns": c["measured_ns"], "error": c["error"],
           "error_without": c["colocation"]["error_without"],
           "noise": c.get("noise") or {}, "verdict": c["spread"]["verdict"],
           "terms": c["terms"], "load_base": loads.get(f"{tag}-base"),
           "load_measured": loads.get(f"{tag}-measured"),
           "load_calibrate": loads.get("calibrate"),
           "microbatches": c.get("microbatches"), "schedule": c.get("schedule")}
    out["error_at_noise"] = at_measured_noise(out)
    return out


def rescore(folder: Path, network: Path | None) -> None:
    """The kept folder's runs checked again with this worktree's model (no recording)."""
    old = json.loads((folder / "results.json").read_text())
    results = []
    for r in old:
        rep, case, config = r["repeat"] - 1, r["case"], r["config"]
        tag = f"{case}-{config}-{rep}"
        loads = {f"{tag}-base": r["load_base"], f"{tag}-measured": r["load_measured"],
                 "calibrate": r["load_calibrate"]}
        results.append(scored(case, config, rep, folder / f"single-{tag}.trace",
                              folder / f"{case}2-{tag}.trace",
                              network or folder / f"net-{rep}.json", loads))
        show(results[-1])
    report(results)


def at_measured_noise(r: dict) -> float:
    """The error had the base met the measured run's host: the predicted compute (``t_f``,
    ``t_b``, ``t_u`` and ``t_coloc``, all in proportion to the base's noise — its compute over
    its typical operators) moved to the measured run's noise. What is left is the model's; the
    rest is the two runs meeting different loads. NaN without both noises."""
    n = r["noise"]
    base, measured = n.get("base"), n.get("measured")
    if not base or not measured or measured != measured:
        return float("nan")
    compute = sum(t["predicted_ns"] for t in r["terms"]
                  if t["term"] in ("t_f", "t_b", "t_u", "t_coloc"))
    predicted = r["predicted_ns"] - compute * (1 - measured / base)
    return (predicted - r["measured_ns"]) / r["measured_ns"]


def show(r: dict) -> None:
    """One run, term by term."""
    print(f"  {r['case']} {r['config']} #{r['repeat']}: predicted "
          f"{r['predicted_ns'] / 1e6:8.2f} ms, measured {r['measured_ns'] / 1e6:8.2f} ms, "
          f"error {100 * r['error']:+6.1f}% (without co-location "
          f"{100 * r['error_without']:+6.1f}%; at the measured run's noise "
          f"{100 * r['error_at_noise']:+6.1f}%); load {fmt_load(r['load_base'])} base, "
          f"{fmt_load(r['load_measured'])} measured", flush=True)
    for t in r["terms"]:
        e = t["error"]
        err = "-" if e is None or e != e or abs(e) == float("inf") else f"{100 * e:+.1f}%"
        print(f"      {t['term']:<8} predicted {t['predicted_ns'] / 1e6:8.3f}  measured "
              f"{t['measured_ns'] / 1e6:8.3f}  {err}")


def report(results: list[dict]) -> None:
    """Every run as a markdown row, the worst first; the median and largest error per case."""
    print("\n| run | steps | load during base / measured (mean (max) of the 1-min average) "
          "| predicted step | measured step | error | without co-location | host's noise "
          "base / measured | at the measured noise | `--check` verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(results, key=lambda r: -abs(r["error"])):
        n = r["noise"]
        noise = (f"×{n['base']:.2f} / ×{n['measured']:.2f}" if n.get("base") and
                 n.get("measured") == n.get("measured") else "-")
        verdict = r["verdict"].split(":")[0].split(" (")[0]
        print(f"| {r['case']} {r['config']} #{r['repeat']} | {r['steps']} + {r['warmup']} | "
              f"{fmt_load(r['load_base'])} / {fmt_load(r['load_measured'])} | "
              f"{r['predicted_ns'] / 1e6:,.1f} ms | {r['measured_ns'] / 1e6:,.1f} ms | "
              f"{100 * r['error']:+.1f}% | {100 * r['error_without']:+.1f}% | {noise} | "
              f"{100 * r['error_at_noise']:+.1f}% | {verdict} |")
    print("\ncase         runs   median |error|   largest |error|   (without co-location: "
          "median, largest; at the measured run's noise: median, largest)")
    for case in sorted({r["case"] for r in results}):
        for config in [None, *sorted({r["config"] for r in results})]:
            rs = [r for r in results if r["case"] == case and config in (None, r["config"])]
            a = [abs(r["error"]) for r in rs]
            w = [abs(r["error_without"]) for r in rs]
            z = [abs(r["error_at_noise"]) for r in rs if r["error_at_noise"] == r["error_at_noise"]]
            at = (f"; {100 * statistics.median(z):.1f}%, {100 * max(z):.1f}%" if z else "")
            print(f"{case + (' ' + config if config else ''):<12} {len(rs):4d}   "
                  f"{100 * statistics.median(a):12.1f}%   {100 * max(a):14.1f}%   "
                  f"({100 * statistics.median(w):.1f}%, {100 * max(w):.1f}%{at})")
    noise_floor(results)


def noise_floor(results: list[dict]) -> None:
    """What the host's own spread leaves to any model: per case and configuration, each
    run's measured step over its base's, and the errors of a prediction that knew the median of
    those ratios (an oracle fitted to these very runs: base × median ratio) — a model from the
    base cannot do better than the ratio's run-to-run spread allows."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in results:
        if r.get("base_step_ns"):
            groups.setdefault((r["case"], r["config"]), []).append(
                r["measured_ns"] / r["base_step_ns"])
    if not groups:
        return
    print("\nthe host's noise floor: measured step ÷ base step per run, and the |error| of a "
          "prediction of base × the case's median ratio")
    every: dict[str, list[float]] = {}
    for (case, config), ratios in sorted(groups.items()):
        mid = statistics.median(ratios)
        errs = [abs(mid / x - 1) for x in ratios]
        every.setdefault(case, []).extend(errs)
        print(f"  {case} {config:<6} ratios {', '.join(f'{x:.2f}' for x in ratios)}; oracle "
              f"|error| median {statistics.median(errs):.1%}, max {max(errs):.1%}")
    for case, errs in every.items():
        print(f"  {case} over every run ({len(errs)}): oracle |error| median "
              f"{statistics.median(errs):.1%}, max {max(errs):.1%} (the goal: median ≤ 10%)")


# --------------------------------------------------------------------------- the other direction


def from_parallel(args: argparse.Namespace, folder: Path) -> None:
    """The 2-worker runs predict the one-worker step (module docstring)."""
    steps, warmup = CONFIGS[args.configs[0]]
    errors: dict[str, list[float]] = {}
    runs: dict[str, list[Path]] = {"tp": [], "pp": []}
    for r in range(args.repeat):
        print(f"repeat {r + 1}")
        single = record(folder / f"single-{r}.trace", args, None, steps, warmup)
        for mode in args.cases:
            runs[mode].append(record(folder / f"{mode}-{r}.trace", args, mode, steps, warmup))
        for mode in args.cases:
            c = check(runs[mode][-1], mode, single, 1, args.network,
                      1 if mode == "pp" else None)["check"]
            errors.setdefault(f"{mode} → 1 worker", []).append(c["error"])
            print(f"  {mode} → 1 worker: predicted {c['predicted_ns'] / 1e6:8.3f} ms, measured "
                  f"{c['measured_ns'] / 1e6:8.3f} ms, error {100 * c['error']:+6.1f}%")
        if r:
            for mode in args.cases:
                c = check(runs[mode][-2], mode, runs[mode][-1], 2, args.network)["check"]
                errors.setdefault(f"{mode} 2 workers (other repeat)", []).append(c["error"])
                print(f"  {mode} 2 workers from the previous repeat: predicted "
                      f"{c['predicted_ns'] / 1e6:8.3f} ms, measured "
                      f"{c['measured_ns'] / 1e6:8.3f} ms, error {100 * c['error']:+6.1f}%")
    print("\ncase                               median |error|   largest |error|")
    for case, errs in errors.items():
        a = [abs(e) for e in errs]
        print(f"{case:<34} {100 * statistics.median(a):12.1f}%   {100 * max(a):14.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--direction", choices=["users", "from-parallel"], default="users")
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--configs", default="short,long",
                        help="comma-separated: short (4 + 1 steps), long (8 + 2)")
    parser.add_argument("--cases", default="tp,pp", help="comma-separated: tp, pp")
    parser.add_argument("--network", type=Path, default=None,
                        help="net.json to use throughout (default: `opprof calibrate --fw "
                             "torch --workers 2` at the start of every repeat)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the traces here")
    parser.add_argument("--rescore", type=Path, default=None,
                        help="a folder kept with --keep: check its runs again with this "
                             "worktree's model, recording nothing")
    args = parser.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    args.cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in args.configs if c not in CONFIGS] + [c for c in args.cases
                                                           if c not in CASES]
    if bad:
        raise SystemExit(f"unknown: {', '.join(bad)}")
    if args.rescore is not None:
        rescore(args.rescore, args.network)
        return
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    print(f"bench_parallel_model ({args.direction}): {args.model}, batch {args.batch_size}, "
          f"{'/'.join(args.configs)}, {args.repeat} repeat(s); {load()}; traces in {folder}")
    if args.direction == "users":
        users(args, folder)
    else:
        from_parallel(args, folder)
    print(f"wall time {time.time() - started:.0f} s; {load()}")


if __name__ == "__main__":
    main()
