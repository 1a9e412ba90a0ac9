"""Predicted vs measured: the performance model against real multi-worker runs, the way users
run it.

For each case (framework × mode), configuration (profiled steps, warm-up) and repeat it runs,
with the opprof command line:

1. the 1-worker base ``opprof record --threads T`` (T = this host's CPUs ÷ N, what each of the
   N workers gets) — **alone** by default, as users record it (nothing else of the benchmark
   running); ``--baseline colocated`` records N such 1-worker runs at the same time and takes
   the first (one worker measured while N−1 neighbours compute beside it, each copy in its own
   session like the workers), ``--baseline both`` does both, reported apart;
2. the measured run ``opprof record --workers N --mode MODE --threads T``;
3. ``opprof calibrate --fw FW --workers N`` — the collective, the interference and the
   co-location loop on this host → net.json (torch FSDP: ``--mode fsdp --units MODEL``);
4. ``opprof model BASE --workers N --mode MODE --network net.json --check MEASURED
   --format json``,

and prints predicted vs measured per term with the error (``t_interf`` and ``t_coloc``
among them), the step predicted without the co-location term, the check's verdict on the
measured run's noise, then every run as one row, **the worst first**, and per configuration
and baseline the median and largest step error. The base and the measured run are recorded
back to back, in alternating order over repeats (base first on odd repeats), so a change in
the host's load falls on both; calibrate runs right after them. The host's load is sampled
every second during every recording (the 1-minute load average: its mean and maximum over the
recording; and the mean number of runnable processes from /proc/stat): on a shared machine
other processes change the numbers.

``--users`` is the users' check of issue #36, exactly their commands: ``opprof record --fw FW
--model lenet5 --steps 4 --warmup 1 --threads 1`` for one worker, then with ``--workers 2
--mode M``, then ``opprof calibrate --fw FW --workers 2 -o net.json``, then ``opprof model BASE
--workers 2 --mode M --network net.json --check TWO``, for torch allreduce, MXNet ps-sync and TF
allreduce, twice each (``--repeat`` for more).

    python benchmarks/bench_model.py --users                  # the users' check: 3 × 2 runs
    python benchmarks/bench_model.py                          # resnet18, 4 cases × short/long × 3
    python benchmarks/bench_model.py --cases torch-allreduce --configs short --repeat 5
    python benchmarks/bench_model.py --model lenet5 --batch-size 8 --configs short  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CASES = {"torch-allreduce": ("torch", "allreduce"), "mxnet-ps-sync": ("mxnet", "ps-sync"),
         "tf-allreduce": ("tf", "allreduce"), "torch-fsdp": ("torch", "fsdp")}
USERS_CASES = ("torch-allreduce", "mxnet-ps-sync", "tf-allreduce")
#: name → (profiled steps, warm-up steps): what users run, and the longer recording
CONFIGS = {"short": (4, 1), "long": (8, 2)}
TERMS = ("t_io", "t_f", "t_b", "t_interf", "t_coloc", "t_u", "t_comm", "other", "step")
LABELS = {"torch-allreduce": "torch allreduce", "mxnet-ps-sync": "MXNet ps-sync",
          "tf-allreduce": "TF allreduce", "torch-fsdp": "torch FSDP"}


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


def runnable() -> int:
    """Processes runnable right now (/proc/stat's procs_running; 0 where there is none)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@contextmanager
def sampled(into: dict, key: str) -> Iterator[None]:
    """Sample the host's load every second while the block runs: ``into[key]`` gets the
    1-minute load average at the start, its mean and maximum, and the mean of the runnable
    processes."""
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            samples.append((os.getloadavg()[0], runnable()))
            stop.wait(1.0)

    start = os.getloadavg()[0]
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        avg = [a for a, _ in samples] or [start]
        run_q = [r for _, r in samples] or [0]
        into[key] = {"start": round(start, 2), "mean": round(statistics.mean(avg), 2),
                     "max": round(max(avg), 2),
                     "runnable": round(statistics.mean(run_q), 2)}


def fmt_load(d: dict | str | None) -> str:
    """A recording's load: mean (max) of the 1-minute average during it."""
    if not isinstance(d, dict):
        return str(d or "-")
    return f"{d['mean']:.1f} ({d['max']:.1f})"


def record(out: Path, fw: str, args: argparse.Namespace, threads: int, steps: int,
           warmup: int, workers: int = 1, mode: str = "single") -> list[str]:
    """The ``opprof record`` argument list (``--users``: the users' command, nothing more)."""
    cmd = ["record", "--fw", fw, "--model", args.model, "--steps", str(steps), "--warmup",
           str(warmup), "--threads", str(threads)]
    if not args.users:
        cmd += ["--batch-size", str(args.batch_size), "--timing-steps", "2"]
    if workers > 1:
        cmd += ["--workers", str(workers), "--mode", mode]
    return [*cmd, "-o", str(out), "--format", "json"]


def baseline(path: Path, fw: str, args: argparse.Namespace, threads: int, workers: int,
             steps: int, warmup: int, colocated: bool) -> None:
    """The 1-worker base at ``path``, alone or with workers − 1 neighbours recorded at the same
    time."""
    copies = workers if colocated else 1
    procs = []
    for i in range(copies):
        out = path if i == 0 else path.with_name(f"{path.stem}-neighbour{i}.trace")
        # Each in its own session, as the launchers start every worker: with the kernel's
        # autogroup scheduling a session is one group that gets a fair share of the CPUs, so
        # N baseline copies in one session would get the share N workers get apiece.
        procs.append(subprocess.Popen([sys.executable, "-m", "opprof",
                                       *record(out, fw, args, threads, steps, warmup)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"baseline recording failed:\n{err.strip()[-2000:]}")


def retried(step: Callable[[], T]) -> T:
    """``step()``, once more if it fails (a framework crashing while it writes its profile —
    TensorFlow's profiler stop has segfaulted here — is not what the benchmark measures)."""
    try:
        return step()
    except SystemExit as exc:
        print(f"failed, once more: {str(exc).splitlines()[-1][:300]}", file=sys.stderr,
              flush=True)
        return step()


def calibrate(net: Path, fw: str, mode: str, n: int, threads: int,
              args: argparse.Namespace) -> None:
    """``opprof calibrate`` (``--users``: the users' command)."""
    cmd = ["calibrate", "--fw", fw, "--workers", str(n), "-o", str(net), "--format", "json"]
    if not args.users:
        repeat = args.fsdp_calib_repeat if mode == "fsdp" else args.calib_repeat
        cmd += ["--threads", str(threads), "--repeat", str(repeat), "--model", args.model,
                "--batch-size", str(args.batch_size)]
        if mode == "fsdp":
            cmd += ["--mode", "fsdp", "--units", args.model]
    opprof(*cmd)


def run_case(name: str, config: str, kind: str, folder: Path, args: argparse.Namespace,
             rep: int) -> dict:
    """One case: the base and the measured run back to back (in alternating order over
    repeats; ``--users``: the base first), calibrate, then model --check."""
    fw, mode = CASES[name]
    steps, warmup = CONFIGS[config]
    n = args.workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = args.threads or max(1, (cpus or 1) // n)
    folder.mkdir(parents=True, exist_ok=True)
    net = folder / f"{fw}-net.json"
    base = folder / f"{fw}-base.trace"
    measured = folder / f"{fw}-{mode}-{n}w.trace"
    loads: dict[str, object] = {}
    tag = f"[{name} {config} {kind} #{rep}]"
    t0 = time.time()

    def record_base() -> None:
        print(f"{tag} base, {kind} (load {load()})", file=sys.stderr, flush=True)
        with sampled(loads, "base"):
            retried(lambda: baseline(base, fw, args, threads, n, steps, warmup,
                                     kind == "colocated"))

    def record_measured() -> None:
        print(f"{tag} {n} workers {mode} (load {load()})", file=sys.stderr, flush=True)
        with sampled(loads, "measured"):
            retried(lambda: opprof(*record(measured, fw, args, threads, steps, warmup, n,
                                           mode)))

    if args.recheck:  # the recordings of an earlier run, checked with this model
        if not (base.exists() and measured.exists() and net.exists()):
            return {"case": name, "config": config, "baseline": kind, "rep": rep,
                    "error": f"no recordings in {folder}"}
        saved = folder / "loads.json"
        loads.update(json.loads(saved.read_text()) if saved.exists() else
                     {"base": "-", "measured": "-"})
    else:
        for record_one in ((record_base, record_measured) if rep % 2 or args.users else
                           (record_measured, record_base)):
            record_one()
        print(f"{tag} calibrate (load {load()})", file=sys.stderr, flush=True)
        with sampled(loads, "calibrate"):
            retried(lambda: calibrate(net, fw, mode, n, threads, args))
        (folder / "loads.json").write_text(json.dumps(loads) + "\n")
    res = opprof("model", str(base), "--workers", str(n), "--mode", mode, "--network",
                 str(net), "--check", str(measured), "--format", "json",
                 *(["--no-straggler"] if args.no_straggler else []), check=False)
    if res.returncode != 0:
        return {"case": name, "config": config, "baseline": kind, "rep": rep,
                "error": res.stderr.strip()}
    doc = json.loads(res.stdout)
    terms = {r["term"]: r for r in doc["check"]["terms"]}
    # What the model itself predicts — the communication, and the update a parameter server
    # moves onto the servers — against the measurement, relative to the measured step: the
    # step error the model would make if every worker computed exactly as measured.
    own = ("t_comm", "t_u")
    comm_error = (sum(terms[t]["predicted_ns"] - terms[t]["measured_ns"] for t in own)
                  / terms["step"]["measured_ns"])
    coloc = doc["check"].get("colocation") or {}
    info = json.loads(net.read_text()).get("info", {}).get("colocation") or {}
    return {"case": name, "config": config, "baseline": kind, "rep": rep, "threads": threads,
            "steps": steps, "warmup": warmup, "terms": terms,
            "base_step_ns": doc["base"]["step_ns"],
            "step_error": doc["check"]["error"], "comm_error": comm_error,
            "error_without_colocation": coloc.get("error_without"),
            "colocation": coloc, "calibrated_colocation": info.get("slowdown"),
            "spread": doc["check"].get("spread"),
            "interference": doc["predictions"][-1].get("interference"),
            "load_base": loads.get("base"), "load_measured": loads.get("measured"),
            "load_calibrate": loads.get("calibrate"),
            "network": {k: doc["network"][k] for k in ("alpha_ns", "beta_ns_per_byte")},
            "split": {"base": compute_split(base), "measured": compute_split(measured)},
            "seconds": round(time.time() - t0, 1)}


PHASES = ("forward", "backward", "update")


def compute_split(path: Path) -> dict:
    """Where a recording's compute went, per worker rank and phase (mean per step, ns): the
    phase's wall time (opprof's step breakdown), its operators' time (counted operators of
    the phase: the kernels and what the profiler times as them) and the rest, the time
    *between* operators (Python, dispatch, the framework's hooks, the profiler's own per-op
    work), and the operators per step. The two sides of a phase's growth beside a neighbour:
    the kernels, which calibrate's co-location loop times, and the gaps."""
    import numpy as np
    import pandas as pd

    from opprof.analysis.breakdown import step_breakdown
    from opprof.intervals import union_length
    from opprof.loader import load

    trace = load(path)
    steps = step_breakdown(trace)
    e = trace.events
    e = e[e["counted"].astype(bool) & e["step"].notna() & (e["step"] >= 0)
          & e["phase"].isin(PHASES) & (e["kind"] != "marker")]
    # the union of the phase's operators (threads overlap: torch's autograd thread, DDP's
    # hooks), one group per rank, step and phase (a few dozen groups), summed over the steps
    per_step = e.assign(end=e["ts"] + e["dur"]).groupby(["rank", "step", "phase"], observed=True)
    per_step = per_step.apply(lambda g: pd.Series({
        "sum": union_length(g["ts"].to_numpy(np.int64), g["end"].to_numpy(np.int64)),
        "count": len(g)}), include_groups=False)
    ops = per_step.groupby(level=["rank", "phase"]).sum()
    out: dict = {}
    for rank, rs in steps.groupby("rank"):
        n = max(len(rs), 1)
        row = {}
        for ph in PHASES:
            wall = float(rs[ph].sum()) / n
            op_ns, count = (ops.loc[(rank, ph)] / n if (rank, ph) in ops.index
                            else (0.0, 0.0))
            row[ph] = {"wall_ns": wall, "op_ns": min(float(op_ns), wall),
                       "between_ns": max(wall - float(op_ns), 0.0), "ops": float(count)}
        out[str(rank)] = row
    return out


def show_split(base: dict, measured: dict) -> None:
    """The base's and each measured rank's phases: wall = operators + between (ms/step)."""
    print("  where the compute went (ms/step: wall = operators + between them; ops/step):")
    for label, split in [("base", base), *((f"rank {k}", v) for k, v in measured.items())]:
        cells = [f"{ph[:3]} {split[ph]['wall_ns'] / 1e6:5.2f} = {split[ph]['op_ns'] / 1e6:5.2f}"
                 f" + {split[ph]['between_ns'] / 1e6:5.2f} ({split[ph]['ops']:.0f})"
                 for ph in PHASES]
        print(f"    {label:<7} " + " | ".join(cells))


def show(r: dict) -> None:
    """One run's table."""
    head = f"{r['case']} {r['config']} {r['baseline']} #{r['rep']}"
    if "error" in r:
        print(f"\n{head}: {r['error']}")
        return
    net = r["network"]
    print(f"\n{head}  ({r['steps']} profiled steps, {r['warmup']} warm-up, {r['threads']} "
          f"thread(s) per worker; load {fmt_load(r['load_base'])} base, "
          f"{fmt_load(r['load_measured'])} measured, {fmt_load(r.get('load_calibrate'))} "
          f"calibrate; α = {net['alpha_ns'] / 1e3:.1f} µs, β = {net['beta_ns_per_byte']:.3f} "
          "ns/B)")
    print(f"  {'term':<9}{'predicted ms':>14}{'measured ms':>14}{'error':>9}")
    for t in TERMS:
        row = r["terms"].get(t)
        if row is None:
            continue
        err = row["error"]
        e = "-" if err is None or isinstance(err, str) else f"{err:+.1%}"
        print(f"  {t:<9}{row['predicted_ns'] / 1e6:>14,.1f}{row['measured_ns'] / 1e6:>14,.1f}"
              f"{e:>9}")
    print(f"  step error with the measured compute (t_comm + t_u as predicted): "
          f"{r['comm_error']:+.1%}")
    c = r.get("colocation") or {}
    if c:
        print(f"  co-location: compute ×{1 + c.get('slowdown', 0.0):.3f} "
              f"({c.get('source', '')}); step error without it {c['error_without']:+.1%}, "
              f"with it {c['error']:+.1%}")
    if r.get("interference"):
        i = r["interference"]
        print(f"  interference: compute beside a collective ×{1 + i['slowdown']:.2f}, the "
              f"collective beside compute ×{1 + i.get('comm_slowdown', 0.0):.2f} "
              f"({i['source']})")
    if r.get("spread"):
        print(f"  measured run: {r['spread']['verdict']}")
    if r.get("split"):
        show_split(r["split"]["base"]["0"], r["split"]["measured"])


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


def worst_first(results: list[dict]) -> list[dict]:
    """The runs by |step error|, largest first (failed runs first of all)."""
    return sorted(results, key=lambda r: -abs(r["step_error"]) if "step_error" in r
                  else -float("inf"))


def table(results: list[dict]) -> None:
    """Every run as one row of docs/model.md's results table (markdown), the worst first."""
    print("\n| run | steps | load during base / measured (mean (max) of the 1-min average) | "
          "predicted step | measured step | error | without co-location | with measured "
          "compute | t_coloc predicted / measured | `--check` verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in worst_first(results):
        name = f"{LABELS.get(r['case'], r['case'])} #{r['rep']}"
        if "error" in r:
            print(f"| {name} | {r['config']} | - | - | - | failed: {r['error'][:80]} | - | - | "
                  "- | - |")
            continue
        step, coloc = r["terms"]["step"], r["terms"].get("t_coloc")
        c = (f"{coloc['predicted_ns'] / 1e6:,.1f} / {coloc['measured_ns'] / 1e6:,.1f} ms"
             if coloc else "-")
        without = r.get("error_without_colocation")
        print(f"| {name} | {r['steps']} + {r['warmup']} | {fmt_load(r['load_base'])} / "
              f"{fmt_load(r['load_measured'])} | {step['predicted_ns'] / 1e6:,.1f} ms | "
              f"{step['measured_ns'] / 1e6:,.1f} ms | {r['step_error']:+.1%} | "
              f"{'-' if without is None else f'{without:+.1%}'} | {r['comm_error']:+.1%} | "
              f"{c} | {verdict(r.get('spread'))} |")


def summary(results: list[dict]) -> None:
    """Per (configuration, baseline), then over all: median and largest |step error|, with and
    without the co-location term, and the noisy runs."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r["config"], r["baseline"]), []).append(r)
    for (config, kind), rs in [*sorted(groups.items()), (("all", "all"), results)]:
        if (config, kind) == ("all", "all") and len(groups) < 2:
            continue
        ok = [r for r in rs if "step_error" in r]
        if not ok:
            print(f"{config} / base {kind}: every run failed")
            continue
        err = [abs(r["step_error"]) for r in ok]
        wo = [abs(r["error_without_colocation"]) for r in ok
              if r.get("error_without_colocation") is not None]
        comm = [abs(r["comm_error"]) for r in ok]
        noisy = sum(bool(r.get("spread") and r["spread"]["noisy"]) for r in ok)
        print(f"{config} / base {kind}: step error over {len(err)} run(s): median "
              f"{statistics.median(err):.1%}, max {max(err):.1%} (goal: median ≤ 5%, max ≤ "
              f"10%)" + (f"; without co-location median {statistics.median(wo):.1%}, max "
                         f"{max(wo):.1%}" if wo else "")
              + f"; with the measured compute median {statistics.median(comm):.1%}, max "
                f"{max(comm):.1%}; {noisy} measured run(s) too noisy by --check's verdict")
        for name in dict.fromkeys(r["case"] for r in rs):
            errs = [f"{r['step_error']:+.1%}" for r in rs if r["case"] == name and
                    "step_error" in r]
            print(f"  {name:<16} {', '.join(errs) or 'failed'}")


def noise_floor(results: list[dict]) -> None:
    """What the host's own spread leaves to any model: per case (and configuration, baseline),
    each run's measured step over its base's, and the errors of a prediction that knew the
    median of those ratios (an oracle fitted to these very runs: base × median ratio) — a
    model from the base cannot do better than the ratio's run-to-run spread allows."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in results:
        if "step_error" in r and r.get("base_step_ns"):
            key = (r["case"], r["config"], r["baseline"])
            groups.setdefault(key, []).append(r["terms"]["step"]["measured_ns"]
                                              / r["base_step_ns"])
    if not groups:
        return
    print("\nthe host's noise floor: measured step ÷ base step per run, and the |error| of a "
          "prediction of base × the case's median ratio")
    every: list[float] = []
    for (case, config, kind), ratios in sorted(groups.items()):
        mid = statistics.median(ratios)
        errs = [abs(mid / x - 1) for x in ratios]
        every += errs
        print(f"  {case:<16} {config}/{kind}: ratios "
              f"{', '.join(f'{x:.2f}' for x in ratios)}; oracle |error| median "
              f"{statistics.median(errs):.1%}, max {max(errs):.1%}")
    print(f"  over every run ({len(every)}): oracle |error| median "
          f"{statistics.median(every):.1%}, max {max(every):.1%} (the goal: median ≤ 5%, "
          "max ≤ 10%)")


def floor_of(files: list[Path]) -> None:
    """``--floor``: :func:`noise_floor` over the results of earlier runs (their JSON files),
    the base's step taken from each run's folder where the file predates ``base_step_ns``."""
    results = []
    for f in files:
        for r in json.loads(f.read_text()):
            if "step_error" in r and not r.get("base_step_ns"):
                folder = f.parent / f"{r['case']}-{r['config']}-{r['baseline']}-{r['rep']}"
                base = folder / f"{CASES[r['case']][0]}-base.trace"
                r["base_step_ns"] = base_step_ns(base) if base.exists() else None
            results.append(r)
    noise_floor(results)


def base_step_ns(path: Path) -> float:
    """The base's step as `opprof model` takes it (its baseline's mean step: the
    ``base.step_ns`` a run's results keep)."""
    from opprof.loader import load
    from opprof.model.predict import baseline

    return baseline(load(path)).step_ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", action="store_true",
                    help="the users' check: lenet5, the 3 cases, short runs, the users' own "
                         "commands (record … --steps 4 --warmup 1 --threads 1, a plain "
                         "calibrate), base alone, 2 repeats unless --repeat")
    ap.add_argument("--model", default=None, help="default resnet18 (--users: lenet5)")
    ap.add_argument("--batch-size", type=int, default=16)
    known = ", ".join(f"{k} ({s} steps, {w} warm-up)" for k, (s, w) in CONFIGS.items())
    ap.add_argument("--configs", default=None,
                    help=f"comma-separated, of {known}; default all (--users: short)")
    ap.add_argument("--steps", type=int, default=None,
                    help="a configuration of your own: this many profiled steps (with --warmup)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cases", default=None)
    ap.add_argument("--repeat", type=int, default=None, help="default 3 (--users: 2)")
    ap.add_argument("--from-repeat", type=int, default=1,
                    help="start at this repeat (the earlier ones' recordings stay in --output)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads per worker for both runs (default: the host's CPUs ÷ workers; "
                         "--users: 1)")
    ap.add_argument("--calib-repeat", type=int, default=5)
    ap.add_argument("--fsdp-calib-repeat", type=int, default=15,
                    help="calibrate --mode fsdp: timed calls per unit size (cheap: the mean of "
                         "calls with a heavy tail needs more of them)")
    ap.add_argument("--baseline", choices=["alone", "colocated", "both"], default="alone")
    ap.add_argument("--no-straggler", action="store_true",
                    help="pass --no-straggler to opprof model")
    ap.add_argument("--recheck", action="store_true",
                    help="record nothing: check the recordings (and network files) an earlier "
                         "run left in --output with this opprof's model")
    ap.add_argument("-o", "--output", type=Path, default=None,
                    help="default bench-model (--users: bench-model-users)")
    ap.add_argument("--floor", type=Path, nargs="+", default=None, metavar="JSON",
                    help="record nothing: the host's noise floor over earlier runs' "
                         "bench_model.json / bench_model-recheck.json files")
    args = ap.parse_args()
    if args.floor:
        floor_of(args.floor)
        return
    args.model = args.model or ("lenet5" if args.users else "resnet18")
    args.repeat = args.repeat or (2 if args.users else 3)
    args.threads = args.threads or (1 if args.users else None)
    args.output = args.output or Path("bench-model-users" if args.users else "bench-model")
    if args.steps is not None:
        CONFIGS["custom"] = (args.steps, args.warmup)
    configs = [c.strip() for c in (args.configs or ("custom" if args.steps is not None else
                                                    "short" if args.users else
                                                    ",".join(CONFIGS))).split(",")]
    cases = [c.strip() for c in (args.cases or ",".join(USERS_CASES if args.users else CASES))
             .split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES] + [c for c in configs if c not in CONFIGS]
    if bad:
        raise SystemExit(f"unknown case(s) or configuration(s) {bad}; choose from "
                         f"{', '.join(CASES)} and {', '.join(CONFIGS)}")
    kinds = ["alone", "colocated"] if args.baseline == "both" else [args.baseline]
    results = []
    start = time.time()
    print(f"uptime at the start: {uptime()}", flush=True)
    for rep in range(args.from_repeat, args.repeat + 1):
        for config in configs:
            for kind in kinds:
                for name in cases:
                    folder = args.output / f"{name}-{config}-{kind}-{rep}"
                    r = run_case(name, config, kind, folder, args, rep)
                    show(r)
                    results.append(r)
    print(f"\nuptime at the end: {uptime()}; the whole benchmark took "
          f"{(time.time() - start) / 60:.1f} min")
    for kind in kinds:
        rs = [r for r in results if r["baseline"] == kind]
        print(f"\nbase recorded {kind}" + (" (as users record it)" if kind == "alone" else
                                            " (beside N−1 neighbours)"))
        table(rs)
    print()
    summary(results)
    noise_floor(results)
    out = "bench_model-recheck.json" if args.recheck else "bench_model.json"
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
