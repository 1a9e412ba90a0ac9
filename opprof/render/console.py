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


def _header(meta: dict) -> Text:
    keys = [("framework", ""), ("model", ""), ("dataset", ""), ("batch_size", "batch "),
            ("workers", "workers "), ("mode", "mode "), ("device", "")]
    parts = [f"{p}{meta[k]}" for k, p in keys if meta.get(k) not in (None, "")]
    text = Text("opprof report  ", style="bold") + Text("  ·  ".join(parts))
    if meta.get("samples_per_s"):
        text += Text(f"\nunprofiled: {ms(meta.get('unprofiled_step_ns'))} ms/step, "
                     f"{meta['samples_per_s']:,.1f} samples/s")
    return text


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
    t = Table(title="Per rank (mean ms/step)", title_justify="left")
    t.add_column("rank", justify="right")
    t.add_column("steps", justify="right")
    t.add_column("step", justify="right")
    for p in PHASES:
        t.add_column(p, justify="right", style=PHASE_STYLE[p])
    for r in rep.ranks.to_dict("records"):
        t.add_row(str(int(r["rank"])), str(int(r["steps"])), ms(r["dur_ns"]),
                  *(ms(r[p]) for p in PHASES))
    return t


def step_table(rep: Report) -> Table:
    """Wall ms per phase for every (rank, step)."""
    t = Table(title="Per step (ms)", title_justify="left")
    for c in ["rank", "step", "step ms", *PHASES]:
        t.add_column(c, justify="right", style=PHASE_STYLE.get(c, ""))
    for r in rep.steps.to_dict("records"):
        t.add_row(str(int(r["rank"])), str(int(r["step"])), ms(r["dur_ns"]),
                  *(ms(r[p]) for p in PHASES))
    return t


def _render(*items: object, width: int = 120) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(Group(*items))
    return buf.getvalue()


def report(rep: Report, by: str = "phase", top: int | None = None) -> str:
    """The report for a terminal; ``by`` picks the main view."""
    items: list[object] = [_header(rep.meta)]
    if by == "op":
        items.append(op_table(rep.ops, top, "Host operators"))
    elif by == "rank":
        items.append(rank_table(rep))
    elif by == "step":
        items.append(step_table(rep))
    elif by == "device":
        items.append(op_table(rep.device_ops, top, "GPU kernels and copies by operator"))
    else:
        items.append(phase_table(rep))
        items.append(op_table(rep.ops, 10 if top is None else top, "Top host operators"))
        if not rep.device_ops.empty:
            items.append(op_table(rep.device_ops, 10 if top is None else top,
                                  "Top GPU operators (kernels, copies)"))
    return _render(*items)


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
    return _render(head, *tables, Text(d.summary, style="bold"))
