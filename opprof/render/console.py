"""Rich terminal output for people: phase bars, operator tables, the diff and its sentence."""

from __future__ import annotations

import io
import math

import pandas as pd
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.taxonomy import PHASES

PHASE_STYLE = {"load": "cyan", "h2d": "bright_cyan", "forward": "green", "backward": "yellow",
               "update": "magenta", "comm": "red", "other": "grey50"}
BAR_WIDTH = 30


def ms(ns: float | None) -> str:
    """Nanoseconds as milliseconds text."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    return f"{ns / 1e6:,.3f}"


def pct(x: float | None) -> str:
    """A fraction as a percentage."""
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "-"
    return f"{x:.1%}"


def bar(share: float, style: str) -> Text:
    """A horizontal bar of BAR_WIDTH cells."""
    share = 0.0 if share is None or math.isnan(share) else max(0.0, min(1.0, share))
    n = int(round(share * BAR_WIDTH))
    return Text("█" * n + "·" * (BAR_WIDTH - n), style=style)


def _header(meta: dict, noise: dict | None = None) -> Text:
    keys = [("framework", ""), ("model", ""), ("dataset", ""), ("batch_size", "batch "),
            ("workers", "workers "), ("mode", "mode "), ("device", "")]
    parts = [f"{p}{meta[k]}" for k, p in keys if meta.get(k) not in (None, "")]
    text = Text("opprof report  ", style="bold") + Text("  ·  ".join(parts))
    if meta.get("unprofiled_step_ns"):
        text += Text(f"\nunprofiled: {ms(meta.get('unprofiled_step_ns'))} ms/step"
                     + (f", {meta['samples_per_s']:,.1f} samples/s"
                        if meta.get("samples_per_s") else "") + _spread(noise))
    for line in quality_lines(noise) + partial_lines(meta):
        text += Text("\n" + line, style="bold yellow")
    return text


def _spread(noise: dict | None) -> str:
    if not noise:
        return ""
    out = (f" (median of {noise['samples']} timed steps, IQR {ms(noise['q1_ns'])}–"
           f"{ms(noise['q3_ns'])} ms")
    if noise.get("overhead"):
        out += f"; profiled steps {noise['overhead']:.2f}x"
    return out + ")"


def quality_lines(noise: dict | None) -> list[str]:
    """One warning line per flag of a run's timing (opprof.analysis.noise)."""
    if not noise:
        return []
    lim, out = noise["limits"], []
    if "noisy" in noise["flags"]:
        why = []
        if noise.get("spread") is not None and noise["spread"] > lim["spread"]:
            why.append(f"the unprofiled steps vary by {noise['spread']:.0%} (IQR / median; "
                       f"limit {lim['spread']:.0%})")
        if noise.get("drift") is not None and abs(noise["drift"]) > lim["drift"]:
            how = "slower" if noise["drift"] > 0 else "faster"
            why.append(f"they ran {abs(noise['drift']):.0%} {how} after the profile than "
                       f"before (limit {lim['drift']:.0%})")
        out.append(f"⚠ noisy timing: {' and '.join(why)}; the machine was busy: compare "
                   "these numbers with care")
    if "overhead" in noise["flags"]:
        out.append(f"⚠ profiler overhead: the profiled steps took {noise['overhead']:.2f}x the "
                   f"unprofiled ones (limit {lim['overhead']:.2f}x); operator times are "
                   "inflated")
    return out


def partial_lines(meta: dict) -> list[str]:
    """A line for a recording cut short (``meta["partial"]``)."""
    part = meta.get("partial")
    if not isinstance(part, dict):
        return []
    kept = part.get("kept_steps") or {}
    of = f" of {part['target_steps']}" if part.get("target_steps") else ""
    each = ", ".join(f"rank {r} {n}{of}" for r, n in sorted(kept.items(), key=lambda x: str(x[0])))
    return [f"partial: {part.get('reason', 'cut short')}; only the complete profiled steps are "
            "here" + (f" ({each})" if each else "")]


def phase_table(rep: Report) -> Table:
    """Wall time per phase with bars (phases sum to the step time)."""
    n_steps = len(rep.steps)
    mean_step = rep.steps["dur_ns"].mean() if n_steps else float("nan")
    t = Table(title=f"Step breakdown — {n_steps} step(s), mean {ms(mean_step)} ms/step",
              title_justify="left")
    for col, just in [("phase", "left"), ("ms/step", "right"), ("share", "right"),
                      ("", "left"), ("busy ms/step", "right")]:
        t.add_column(col, justify=just)
    for p in PHASES:
        row = rep.phases.loc[p]
        busy = row["busy_ns_per_step"]
        t.add_row(Text(p, style=PHASE_STYLE[p]), ms(row["ns_per_step"]), pct(row["share"]),
                  bar(row["share"], PHASE_STYLE[p]),
                  "" if busy is None or busy != busy else ms(busy))
    t.add_row(Text("step", style="bold"), ms(mean_step), "100.0%", "", "")
    if rep.comm_overlap is not None:
        t.caption = f"communication hidden behind compute: {pct(rep.comm_overlap)}"
    return t


def op_table(ops: pd.DataFrame, top: int | None, title: str) -> Table:
    """Operator table: count, totals, percentiles, share of phase."""
    t = Table(title=title, title_justify="left")
    for col in ["op", "phase", "count", "ms/step", "total ms", "mean ms", "p50 ms", "p95 ms",
                "share of phase"]:
        t.add_column(col, justify="left" if col in ("op", "phase") else "right")
    shown = ops if top is None else ops.head(top)
    for r in shown.to_dict("records"):
        t.add_row(r["op"], Text(r["phase"], style=PHASE_STYLE.get(r["phase"], "")),
                  f"{int(r['count']):,}", ms(r["ns_per_step"]), ms(r["total_ns"]),
                  ms(r["mean_ns"]), ms(r["p50_ns"]), ms(r["p95_ns"]), pct(r["share_of_phase"]))
    if top is not None and len(ops) > top:
        t.caption = f"top {top} of {len(ops)} (op, phase) rows; --top N for more"
    return t


def rank_table(rep: Report) -> Table:
    """Mean wall ms per phase, one row per rank."""
    t = Table(title="Per rank (mean ms/step; the phases sum to the step)", title_justify="left")
    t.add_column("rank", justify="right")
    t.add_column("steps", justify="right")
    t.add_column("step", justify="right")
    for p in PHASES:
        t.add_column(p, justify="right", style=PHASE_STYLE[p])
    t.add_column("own", justify="right")
    for r in rep.ranks.to_dict("records"):
        t.add_row(str(int(r["rank"])), str(int(r["steps"])), ms(r["dur_ns"]),
                  *(ms(r[p]) for p in PHASES), ms(r.get("own_ns")))
    t.caption = "own = step − waiting for other ranks in collectives"
    return t


def _size(n: float | None, unit: str = "B") -> str:
    if n is None or n != n or n == 0:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {prefix}{unit}"
    return f"{n:,.0f} {unit}"


def rank_comm_tables(rep: Report) -> list[Table]:
    """Communication per rank (wait vs transfer, overlap, bytes, bandwidth) and the
    straggler of each step."""
    t = Table(title="Communication per rank (mean per step)", title_justify="left")
    for c in ["rank", "collectives", "comm ms", "wait ms", "transfer ms", "wait share",
              "hidden", "bytes", "bandwidth"]:
        t.add_column(c, justify="right")
    for r in rep.ranks.to_dict("records"):
        t.add_row(str(int(r["rank"])), f"{r['collectives']:,.1f}", ms(r["comm_ns"]),
                  ms(r["wait_ns"]), ms(r["transfer_ns"]), pct(r["wait_share"]),
                  pct(r["overlap"]), _size(r["bytes"]), _size(r["bandwidth_Bps"], "B/s"))
    t.caption = ("wait = in a collective before the last rank entered it; transfer = the rest; "
                 "hidden = comm while computing; bandwidth = bytes / transfer time")
    s = Table(title="Straggler per step (the rank with the most own time)",
              title_justify="left")
    for c in ["step", "ranks", "slowest rank", "own ms", "median own ms", "excess ms",
              "excess"]:
        s.add_column(c, justify="right")
    for r in rep.stragglers.to_dict("records"):
        s.add_row(str(int(r["step"])), str(int(r["ranks"])), str(int(r["slowest_rank"])),
                  ms(r["own_ns"]), ms(r["median_own_ns"]), ms(r["excess_ns"]),
                  pct(r["excess_share"]))
    if rep.stragglers.empty:
        s.caption = "needs the same steps on at least two ranks"
    return [t, s]


DEVICE_STYLE = {"compute": "green", "comm": "red", "memcpy": "bright_cyan", "idle": "grey50"}


def device_tables(rep: Report) -> list[Table]:
    """Per GPU: wall time split into compute / comm / memcpy / idle (summing to the span,
    with bars), busy and summed time per category, overlap and what idle time waited for."""
    if rep.devices.empty:
        return [Table(title="GPU time per device: no GPU kernels, copies or memsets in this "
                            "trace", title_justify="left")]
    tables = []
    for r in rep.devices.to_dict("records"):
        span = r["span_ns"] or 1
        scope = ("complete steps" if rep.device_span == "steps" else "whole trace")
        left = int(r.get("left_out") or 0)
        scope += f", {left:,} events of the last step left out" if left else ""
        t = Table(title=f"GPU time — rank {int(r['rank'])} {r['device']}: span {ms(span)} ms "
                        f"({scope}), {int(r['kernels']):,} kernels, {int(r['memcpys']):,} "
                        f"copies, {int(r['memsets']):,} sets on {int(r['streams'])} stream(s)",
                  title_justify="left")
        for col, just in [("category", "left"), ("ms", "right"), ("share", "right"),
                          ("", "left"), ("busy ms", "right"), ("sum ms", "right")]:
            t.add_column(col, justify=just)
        for c in ("compute", "comm", "memcpy", "idle"):
            t.add_row(Text(c, style=DEVICE_STYLE[c]), ms(r[f"{c}_ns"]), pct(r[f"{c}_ns"] / span),
                      bar(r[f"{c}_ns"] / span, DEVICE_STYLE[c]),
                      ms(r.get(f"busy_{c}_ns")) if c != "idle" else "",
                      ms(r.get(f"sum_{c}_ns")) if c != "idle" else "")
        t.add_row(Text("span", style="bold"), ms(span), "100.0%", "", "", "")
        overlap = r["comm_overlap"]
        hidden = "" if overlap is None or overlap != overlap else f" ({pct(overlap)} of comm)"
        t.caption = (f"comm ∩ compute on separate streams: {ms(r['comm_overlap_ns'])} ms{hidden}"
                     f"; idle waiting on the host {ms(r['idle_host_ns'])} ms, on other work "
                     f"{ms(r['idle_other_ns'])} ms, unattributed "
                     f"{ms(r['idle_unattributed_ns'])} ms ({int(r['idle_gaps']):,} gaps)")
        tables.append(t)
    return tables


def step_table(rep: Report) -> Table:
    """Wall ms per phase for every (rank, step)."""
    t = Table(title="Per step (ms)", title_justify="left")
    for c in ["rank", "step", "step ms", *PHASES]:
        t.add_column(c, justify="right", style=PHASE_STYLE.get(c, ""))
    for r in rep.steps.to_dict("records"):
        t.add_row(str(int(r["rank"])), str(int(r["step"])), ms(r["dur_ns"]),
                  *(ms(r[p]) for p in PHASES))
    return t


def render(*items: object, width: int = 120) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(Group(*items))
    return buf.getvalue()


def report(rep: Report, by: str = "phase", top: int | None = None) -> str:
    """The report for a terminal; ``by`` picks the main view."""
    items: list[object] = [_header(rep.meta, rep.noise)]
    if by == "op":
        items.append(op_table(rep.ops, top, "Host operators"))
    elif by == "rank":
        items.append(rank_table(rep))
        items.extend(rank_comm_tables(rep))
    elif by == "step":
        items.append(step_table(rep))
    elif by == "device":
        items.extend(device_tables(rep))
        items.append(op_table(rep.device_ops, top, "GPU kernels and copies by operator"))
    else:
        items.append(phase_table(rep))
        items.append(op_table(rep.ops, 10 if top is None else top, "Top host operators"))
        if not rep.device_ops.empty:
            items.append(op_table(rep.device_ops, 10 if top is None else top,
                                  "Top GPU operators (kernels, copies)"))
    return render(*items)


def diff(d: Diff, top: int | None = None) -> str:
    """The diff for a terminal."""
    head = Text(f"opprof diff  A = {d.a_label}  ·  B = {d.b_label}\n", style="bold")
    head += Text(f"step: A {ms(d.a_step_ns)} ms, B {ms(d.b_step_ns)} ms, "
                 f"A/B = {d.step_ratio:.2f}x")
    tables = []
    for df, key, title in [(d.phases, "phase", "Phases (wall ms/step)"),
                           (d.ops if top is None else d.ops.head(top), "op",
                            "Operators (host ms/step), by share of the gap")]:
        t = Table(title=title, title_justify="left")
        for c in [key, "A", "B", "A/B", "A−B ms", "share of gap"]:
            t.add_column(c, justify="left" if c == key else "right")
        for r in df.to_dict("records"):
            ratio = r["ratio"]
            rtxt = "-" if ratio != ratio else ("∞" if math.isinf(ratio) else f"{ratio:.2f}x")
            t.add_row(str(r[key]), ms(r["a_ns_per_step"]), ms(r["b_ns_per_step"]), rtxt,
                      ms(r["delta_ns"]), pct(r["share_of_gap"]))
        tables.append(t)
    notes = [Text(f"{side} ({name}): {line}", style="bold yellow")
             for side, name, noise in (("A", d.a_label, d.a_noise), ("B", d.b_label, d.b_noise))
             for line in quality_lines(noise)]
    return render(head, *tables, Text(d.summary, style="bold"), *notes)


def bench_tables(table: pd.DataFrame, ratios: pd.DataFrame) -> list[Table]:
    """Runs, their phase breakdown, and the operator-ratio table for a terminal."""
    t = Table(title="opprof bench — runs", title_justify="left")
    p = Table(title="Phase breakdown (ms per profiled step, mean over ranks; sums to the step)",
              title_justify="left")
    key = ["fw", "model", "workers", "mode"]
    for c in [*key, "status", "samples/s", "step ms", "profiled ms", "scaling", "flags"]:
        t.add_column(c, justify="left" if c in ("fw", "model", "mode", "status", "flags")
                     else "right", no_wrap=c == "samples/s")  # a range stays on one line
    for c in [*key, *PHASES, "step"]:
        p.add_column(c, justify="left" if c in ("fw", "model", "mode") else "right",
                     style=PHASE_STYLE.get(c, ""))
    notes = []
    for r in table.to_dict("records"):
        ok = r["status"] in ("ok", "resumed")
        sps, eff = r["samples_per_s"], r["scaling_efficiency"]
        head = [r["fw"], r["model"], str(r["workers"]), r["mode"]]
        style = "green" if ok else ("red" if r["status"] == "failed" else "grey50")
        t.add_row(*head, Text(r["status"], style=style), _sps(r) if ok and sps else "-",
                  ms(r["unprofiled_step_ns"]) if ok else "-", ms(r["step_ns"]) if ok else "-",
                  pct(eff) if eff is not None and eff == eff else "-",
                  Text(_flags(r), style="bold yellow") if ok else "")
        if ok:
            p.add_row(*head, *(ms(r[ph]) for ph in PHASES), ms(r["step_ns"]))
        if r["reason"]:
            notes.append(f"{r['fw']} {r['model']} x{r['workers']} {r['mode']}: {r['reason']}")
    t.caption = "\n".join(["step ms: unprofiled; scaling = samples/s ÷ (workers × samples/s of "
                           "1 worker)", *_flag_notes(table), *notes])
    o = Table(title="Operators with the largest cross-framework ratios (host ms per rank-step)",
              title_justify="left")
    for c in ["model", "workers", "op", "slower", "faster", "slower ms", "faster ms", "ratio"]:
        o.add_column(c, justify="right" if c.endswith(("ms", "ratio", "workers")) else "left")
    for r in ratios.to_dict("records"):
        o.add_row(r["model"], str(r["workers"]), r["op"], r["slower"], r["faster"],
                  ms(r["slower_ns_per_step"]), ms(r["faster_ns_per_step"]), f"{r['ratio']:.2f}x")
    if ratios.empty:
        o.caption = "needs two frameworks recorded with the same model, batch size and workers"
    return [t, p, o]


def _sps(r: dict) -> str:
    """samples/s, with the range over repetitions (``bench --repeat``)."""
    text = f"{r['samples_per_s']:,.1f}"
    low, high = r.get("samples_per_s_min"), r.get("samples_per_s_max")
    if (r.get("repeats") or 1) > 1 and low is not None and high is not None:
        text += f" ({low:,.1f}–{high:,.1f})"
    return text


def _flags(r: dict) -> str:
    """A run's noise flags (opprof.analysis.noise), with the overhead when flagged."""
    flags = [f for f in str(r.get("flags") or "").split(",") if f]
    return ", ".join(f"overhead {r['overhead']:.1f}x" if f == "overhead" and r.get("overhead")
                     else f for f in flags)


def _flag_notes(table: pd.DataFrame) -> list[str]:
    """What the flags mean, when some run has one (thresholds from opprof.analysis.noise)."""
    from opprof.analysis.noise import NOISE_DRIFT, NOISE_SPREAD, OVERHEAD_LIMIT

    if "flags" not in table or not table["flags"].fillna("").astype(bool).any():
        return []
    return [f"flags: noisy = the unprofiled steps' IQR over {NOISE_SPREAD:.0%} of their median, "
            f"a change over {NOISE_DRIFT:.0%} from before to after the profile, or repetitions' "
            f"samples/s over {NOISE_SPREAD:.0%} apart; overhead = profiled steps over "
            f"{OVERHEAD_LIMIT:g}x the unprofiled — compare these runs with care"]
