"""Where a 2-worker FSDP step's exposed communication goes on gloo, per collective call, and
what the model takes for each part.

For every FSDP2 collective on the training thread (``FSDP::all_gather (unit)`` with its
copy-out, ``FSDP::post_backward_reduce (unit)``: :func:`opprof.model.sharded.fsdp_calls`)
it splits the measured time into the wait for the last rank to enter the same call and
what the call costs after it, and that cost into the pieces the trace shows — the training
thread's copy-in and FSDP's Python before the ``c10d::`` call, the call itself (for a
reduce-scatter: gloo's clone of the buffer), the hand-off to gloo's thread (the call's end to
gloo's span starting), gloo's span after the last rank's started (the transfer, gloo's own
copies inside), the hand-off back (gloo's end to the training thread's next event), what
follows in the range (the reduce-scatter's shard copy) and the copy-out; then FSDP's hooks
around the calls (the exposed comm no call covers). Per step, the mean over the worker
(rank, step)s, in ms; beside it the model of the run's 1-worker baseline with its network
file (``opprof model BASE --mode fsdp --network NET``): the waits (:func:`blocking_wait`) and
the calls' costs.

    python benchmarks/bench_fsdp_calls.py bench-model/torch-fsdp-1 bench-model/torch-fsdp-2

Each folder is one of ``bench_model.py``'s torch-fsdp cases (``torch-base.trace``,
``torch-fsdp-2w.trace``, ``torch-net.json``); ``--sizes`` adds each unit size's mean cost
per call, measured and calibrated; ``--steps`` each profiled step's exposed comm, its calls'
cost after the last rank in, the largest unit's part of it and its copy-in (the first touch
of the unit's new flat buffer), against the model's one figure per step.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from opprof.analysis.breakdown import step_breakdown
from opprof.loader import load
from opprof.model.commmodel import Network
from opprof.model.predict import baseline, plan
from opprof.model.sharded import fsdp_calls
from opprof.model.simulate import simulate
from opprof.trace import Trace

PIECES = ("copy-in", "call", "hand-off in", "transfer", "hand-off out", "after", "copy-out")


def pieces(trace: Trace, calls: pd.DataFrame) -> pd.DataFrame:
    """Each call's cost after the last rank entered, split as the module docstring says: the
    k-th ``c10d::`` call of a rank's training thread inside an FSDP range is the k-th
    ``gloo:`` span on its other threads (gloo runs one collective at a time, in order)."""
    ev = trace.events
    ev = ev[(ev["step"] >= 0) & (ev["kind"] != "memory")]
    name = ev["name"].astype(str)
    out = []
    for rank, c in calls.groupby("rank"):
        e = ev[ev["rank"] == rank]
        n = name[e.index]
        main = e.loc[n.str.startswith("ProfilerStep"), "tid"].iloc[0]
        on_main = e[e["tid"] == main]
        c10d = on_main[n[on_main.index].str.match(r"^c10d::_(?:allgather|reduce_scatter)_base_$")]
        gloo = e[(e["tid"] != main) & n.str.match(r"^gloo:")].sort_values("ts")
        c10d = c10d.sort_values("ts")
        c = c.sort_values("enter")
        # the c10d call inside each FSDP range (one per range), then its gloo span
        i = np.searchsorted(c10d["ts"].to_numpy(), c["enter"].to_numpy())
        call_ts = c10d["ts"].to_numpy()[i]
        call_end = call_ts + c10d["dur"].to_numpy()[i]
        order = np.searchsorted(c10d["ts"].to_numpy(), call_ts)
        g_ts = gloo["ts"].to_numpy()[order]
        g_end = g_ts + gloo["dur"].to_numpy()[order]
        starts = np.sort(on_main["ts"].to_numpy())
        resume = np.minimum(starts[np.minimum(np.searchsorted(starts, g_end), len(starts) - 1)],
                            c["exit"].to_numpy())
        out.append(c.assign(call_ts=call_ts, call_end=call_end, g_ts=g_ts, g_end=g_end,
                            resume=np.maximum(resume, g_end)))
    d = pd.concat(out, ignore_index=True)
    key = [d[k] for k in ("step", "kind", "unit")]
    d["k"] = d.groupby([*key, d["rank"]]).cumcount()
    last = d["enter"] + d["wait_ns"]  # the last rank's entry
    g_last = d.groupby([*key, d["k"]])["g_ts"].transform("max")
    after_last = np.maximum
    d["copy-in"] = after_last(0, d["call_ts"] - after_last(last, d["enter"]))
    d["call"] = d["call_end"] - after_last(d["call_ts"], last)
    d["hand-off in"] = after_last(0, d["g_ts"] - after_last(d["call_end"], last))
    d["transfer"] = d["g_end"] - after_last(g_last, after_last(d["g_ts"], last))
    d["hand-off out"] = d["resume"] - d["g_end"]
    d["after"] = d["exit"] - d["resume"]
    d["copy-out"] = d["copy_out_ns"]
    return d


def by_step(d: pd.DataFrame, steps: pd.DataFrame, model_comm_ms: float) -> pd.DataFrame:
    """Per profiled step (the mean over ranks, ms): exposed comm, the calls' cost after the
    last rank entered, the largest unit's calls and their copy-in, beside the model's comm."""
    big = d["bytes"] == d["bytes"].max()
    per = pd.DataFrame({
        "exposed comm": steps.groupby("step")["comm"].mean(),
        "calls": d.groupby("step")["ns"].sum() / d.groupby("step")["rank"].nunique(),
        "largest unit's calls": d[big].groupby("step")["ns"].sum()
        / d[big].groupby("step")["rank"].nunique(),
        "its copy-in": d[big].groupby("step")["copy-in"].sum()
        / d[big].groupby("step")["rank"].nunique()}) / 1e6
    per["model's comm"] = model_comm_ms
    return per


def run(folder: Path, sizes: bool, each_step: bool = False) -> None:
    """One bench_model torch-fsdp case: measured against the model."""
    trace = load(folder / "torch-fsdp-2w.trace")
    calls, spread = fsdp_calls(trace)
    steps = step_breakdown(trace)
    n = len(steps)
    d = pieces(trace, calls)
    per = {p: d[p].clip(lower=0).sum() / n / 1e6 for p in PIECES}
    wait, cost = calls["wait_ns"].sum() / n / 1e6, calls["ns"].sum() / n / 1e6
    comm = steps["comm"].mean() / 1e6
    net = Network.from_dict(json.loads((folder / "torch-net.json").read_text()))
    base = baseline(load(folder / "torch-base.trace"))
    p, _ = plan(base, 2, "fsdp", 1, net, straggler=True)
    sim = simulate(p)
    m_cost = sum(m["end_ns"] - m["start_ns"] for m in sim.messages) / 1e6
    m_copy = sim.phases["comm"] / 1e6 - m_cost - p.straggler_ns / 1e6
    print(f"\n{folder}  ({len(calls) // n} calls per step; the ranks' exits spread "
          f"{spread / 1e6:.2f} ms measured, {net.info.get('exit_spread_ns', 0) / 1e6:.2f} ms "
          "calibrated)")
    print(f"  {'ms per step':<38}{'measured':>10}{'model':>10}")
    rows = [("exposed comm", comm, sim.phases["comm"] / 1e6),
            ("  waits for the last rank in", wait, p.straggler_ns / 1e6),
            ("  the calls after it", cost, m_cost + m_copy),
            *[(f"    {k}", v, None) for k, v in per.items()],
            ("  FSDP's hooks around the calls", comm - wait - cost, 0.0)]
    for label, a, b in rows:
        print(f"  {label:<38}{a:>10,.1f}{'' if b is None else f'{b:>10,.1f}'}")
    if sizes:
        g = calls.groupby(["kind", "bytes"])["ns"].mean() / 1e6
        cal = [net.kind_cost_ns(k, b, 2) / 1e6 for k, b in g.index]
        t = pd.DataFrame({"measured ms": g, "calibrated ms": cal})
        print(t.round(2).to_string())
    if each_step:
        print(by_step(d, steps, sim.phases["comm"] / 1e6).round(1).to_string())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--sizes", action="store_true", help="each unit size's cost per call")
    ap.add_argument("--steps", action="store_true",
                    help="each profiled step's exposed comm and the largest unit's calls")
    args = ap.parse_args()
    print("load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    for folder in args.folders:
        run(folder, args.sizes, args.steps)


if __name__ == "__main__":
    main()
