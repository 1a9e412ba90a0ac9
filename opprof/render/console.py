"""Rich terminal output for people: phase bars, operator tables, the diff and its sentence."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.kinds import DONE, Mode, RunStatus
from opprof.model.commmodel import FIT_LIMIT, Network
from opprof.model.predict import Check, ModelResult
from opprof.model.whatif import WhatIf
from opprof.render import verdicts
from opprof.render.efficiency import headline as efficiency_headline
from opprof.render.paralleltables import (
    comm_diff_table,
    expert_tables,
    layout_line,
    pipeline_table,
)
from opprof.render.text import render as render
from opprof.render.units import ab_ratio, mib, rate, ratio, share, size
from opprof.render.views import ALL_VIEWS
from opprof.taxonomy import PHASES

if TYPE_CHECKING:
    from opprof.advice.base import AdviseResult, Advisory, Verification
    from opprof.analysis.convergence import Summary
    from opprof.analysis.gate import Check as GateCheck
    from opprof.analysis.gate import Gate
    from opprof.analysis.noise import Noise
    from opprof.meta import MetaMapping

#: The views this format renders (all views) and its file type.
VIEWS = ALL_VIEWS
EXTENSION = ".txt"

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


def _header(meta: MetaMapping, noise: Noise | None = None) -> Text:
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
    for line in graph_lines(meta):
        text += Text("\n" + line, style="grey50")
    return text


def graph_lines(meta: MetaMapping) -> list[str]:
    """What the recording switched in the framework's compiled graphs for the profiled
    steps (``meta["graphs"]``, MXNet's bulk execution), and what that cost by itself."""
    if not meta.get("graphs"):
        return []
    line = f"note: {meta['graphs']}"
    off, base = meta.get("unbulked_step_ns"), meta.get("unprofiled_step_ns")
    if off and base:
        line += (f"; one step so, unprofiled, took {ms(off)} ms against {ms(base)} ms "
                 f"({off / base:.2f}x)")
    return [line]


def _spread(noise: Noise | None) -> str:
    if not noise:
        return ""
    out = (f" (median of {noise.samples} timed steps, IQR {ms(noise.q1_ns)}–"
           f"{ms(noise.q3_ns)} ms")
    if noise.overhead:
        out += f"; {ratio(noise.overhead, 'profiled/unprofiled')}"
    return out + ")"


def quality_lines(noise: Noise | None) -> list[str]:
    """One warning line per flag of a run's timing (opprof.analysis.noise)."""
    if not noise:
        return []
    lim, out = noise.limits, []
    if "noisy" in noise.flags:
        why = []
        if noise.spread is not None and noise.spread > lim["spread"]:
            why.append(f"the unprofiled steps vary by {noise.spread:.0%} (IQR / median; "
                       f"limit {lim['spread']:.0%})")
        if noise.drift is not None and abs(noise.drift) > lim["drift"]:
            how = "slower" if noise.drift > 0 else "faster"
            why.append(f"they ran {abs(noise.drift):.0%} {how} after the profile than "
                       f"before (limit {lim['drift']:.0%})")
        out.append(f"⚠ noisy timing: {' and '.join(why)}; the machine was busy: compare "
                   "these numbers with care")
    if "overhead" in noise.flags and noise.overhead is not None:
        out.append(f"⚠ profiler overhead: the profiled steps took {noise.overhead:.2f}x the "
                   f"unprofiled ones (limit {lim['overhead']:.2f}x); operator times are "
                   "inflated")
    return out


def partial_lines(meta: MetaMapping) -> list[str]:
    """A line for a recording cut short (``meta["partial"]``)."""
    part = meta.get("partial")
    if not isinstance(part, dict):
        return []
    kept = part.get("kept_steps") or {}
    of = f" of {part['target_steps']}" if part.get("target_steps") else ""
    each = ", ".join(f"rank {r} {n}{of}" for r, n in sorted(kept.items(), key=lambda x: str(x[0])))
    return [f"partial: {part.get('reason', 'cut short')}; only the complete profiled steps are "
            "here" + (f" ({each})" if each else "")]


def replica_lines(rep: Report) -> list[str]:
    """A warning line for a job of several data-parallel workers that ran no collective in
    its profiled steps: each trained a replica of its own (e.g. Accelerate's plain
    ``Accelerator()`` on a CPU under torchrun stays non-distributed)."""
    workers = rep.meta.get("workers")
    if (not isinstance(workers, int) or workers < 2 or rep.meta.get("mode") != "allreduce"
            or not rep.collectives.empty or rep.phases.loc["comm", "ns_per_step"] > 0):
        return []
    return [f"⚠ no collective: the {workers} workers ran no communication in their profiled "
            "steps — each trained its own replica, not data parallel (mode allreduce is how "
            "the job was launched); check that the training loop wraps the model for "
            "distributed training"]


def compile_lines(rep: Report) -> list[str]:
    """One warning line naming the steps that compiled a graph (torch.compile's first
    compilation or a recompilation): their time is compile time, not training."""
    c = rep.compile_steps
    if c is None or c.empty:
        return []
    ranks = c["rank"].nunique()
    where = ", ".join(f"step {int(r['step'])}" + (f" of rank {int(r['rank'])}" if ranks > 1
                                                   else "")
                      for r in c.sort_values(["rank", "step"]).to_dict("records"))
    whose = "those steps'" if len(c) > 1 else "that step's"
    return [f"⚠ compilation in {where} ({ms(c['compile_ns'].sum())} ms compiling a graph): "
            f"{whose} time is compile time, not training; profile after more warm-up steps"]


#: How many of a fused row's kernels ``--by op`` lists under it.
FUSED_DETAIL = 5


def phase_table(rep: Report) -> Table:
    """Wall time per phase with bars (phases sum to the step time)."""
    n_steps = len(rep.steps)
    mean_step = rep.steps["dur_ns"].mean() if n_steps else float("nan")
    t = Table(title=f"Step breakdown — {n_steps} step(s), mean {ms(mean_step)} ms/step",
              title_justify="left")
    for col, right in [("phase", False), ("ms/step", True), ("share", True), ("", False),
                       ("busy ms/step", True)]:
        t.add_column(col, justify="right" if right else "left")
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


def op_table(ops: pd.DataFrame, top: int | None, title: str,
             kernels: pd.DataFrame | None = None) -> Table:
    """Operator table: count, totals, percentiles, share of phase; with ``kernels``
    (opprof.analysis.compiled), each fused row is followed by its largest kernels by name."""
    t = Table(title=title, title_justify="left")
    for col in ["op", "phase", "count", "ms/step", "total ms", "mean ms", "p50 ms", "p95 ms",
                "share of phase"]:
        t.add_column(col, justify="left" if col in ("op", "phase") else "right",
                     overflow="fold" if col == "op" else "ellipsis")
    shown = ops if top is None else ops.head(top)
    for r in shown.to_dict("records"):
        t.add_row(r["op"], Text(r["phase"], style=PHASE_STYLE.get(r["phase"], "")),
                  f"{int(r['count']):,}", ms(r["ns_per_step"]), ms(r["total_ns"]),
                  ms(r["mean_ns"]), ms(r["p50_ns"]), ms(r["p95_ns"]), pct(r["share_of_phase"]))
        if kernels is not None and len(kernels):
            mine = kernels[(kernels["op"] == r["op"]) & (kernels["phase"] == r["phase"])]
            for k in mine.head(FUSED_DETAIL).to_dict("records"):
                # no space after the arrow: a long kernel name folds, not onto a line of its own
                t.add_row(Text(f"  ↳{k['name']}", style="dim"), "", f"{int(k['count']):,}",
                          ms(k["ns_per_step"]), ms(k["total_ns"]),
                          ms(k["total_ns"] / max(int(k["count"]), 1)), "", "",
                          pct(k["total_ns"] / r["total_ns"] if r["total_ns"] else None))
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
                  pct(r["overlap"]), size(r["bytes"]), rate(r["bandwidth_Bps"]))
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
    tables = [t]
    if len(rep.collective_kinds):
        k = Table(title="Communication by collective (mean per rank and step)",
                  title_justify="left")
        for c in ["collective", "calls", "time ms", "wait ms", "transfer ms", "wait share",
                  "hidden"]:
            k.add_column(c, justify="left" if c == "collective" else "right")
        for r in rep.collective_kinds.to_dict("records"):
            k.add_row(str(r["op"]), f"{r['calls']:,.1f}", ms(r["comm_ns"]), ms(r["wait_ns"]),
                      ms(r["transfer_ns"]), pct(r["wait_share"]), pct(r["hidden"]))
        k.caption = ("time = the union of its calls; wait and transfer summed over them; "
                     "hidden = its time while computing")
        tables.append(k)
    return [*tables, s]


def collective_table(rep: Report) -> Table | Text:
    """Communication per collective (opprof.analysis.collectives): calls, bytes, time,
    algorithm and bus bandwidth, hidden share."""
    c = rep.collectives
    if c.empty:
        return Text("no collectives in the trace's steps")
    t = Table(title="Collectives (per step; bandwidth by the nccl-tests convention)",
              title_justify="left")
    for col in ["collective", "dim", "group", "n", "calls", "bytes/call", "ms/step", "wait",
                "algbw", "busbw", "hidden"]:
        t.add_column(col, justify="left" if col in ("collective", "dim", "group") else "right")
    for r in c.to_dict("records"):
        wait = r["wait_ns"] / r["time_ns"] if r["time_ns"] else None
        t.add_row(r["op"], r.get("dim") or "-", r["group"] or "-", str(int(r["size"])),
                  f"{r['calls_per_step']:,.1f}", size(r["bytes_per_call"]),
                  ms(r["ns_per_step"]), pct(wait), rate(r["algbw_Bps"]),
                  rate(r["busbw_Bps"]), pct(r["hidden"]))
    t.caption = ("dim = the parallel dimension it serves (dp, fsdp, pp, tp, ep); "
                 "n = ranks in the group; calls and ms/step are per rank and step of the "
                 "whole job (a group's over every rank, so the rows of a dimension add up to "
                 "a rank's mean); ms/step = time one was in flight (overlapping ones, as "
                 "asynchronous sends, counted once); wait = share "
                 "of the calls' time before the last rank entered; algbw = bytes / "
                 "transfer time; busbw = algbw × 2(n−1)/n for all_reduce, (n−1)/n for "
                 "all_gather, reduce_scatter, all_to_all, 1 otherwise; hidden = time computing "
                 "beside it (GPU: compute kernels)")
    return t


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
        for col, right in [("category", False), ("ms", True), ("share", True), ("", False),
                           ("busy ms", True), ("sum ms", True)]:
            t.add_column(col, justify="right" if right else "left")
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


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[int | None]) -> str:
    """One character per value, from ▁ (the smallest) to █ (the largest); blank for none."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo, hi = min(known), max(known)
    span = max(hi - lo, 1)
    return "".join(" " if v is None else SPARKS[min(int((v - lo) * len(SPARKS) / span),
                                                    len(SPARKS) - 1)] for v in values)


#: What the allocator figure counts, per source (and device for torch).
ALLOCATOR_NOTE = {
    ("kineto", "cpu"): "torch's CPU allocator: bytes allocated while the profiler ran "
                       "(parameters and optimizer state allocated earlier not included)",
    ("kineto", "gpu"): "torch's CUDA caching allocator: all allocated bytes",
    ("mxnet", "cpu"): "MXNet's storage allocator: bytes allocated while the profiler ran",
    ("mxnet", "gpu"): "MXNet's storage allocator: bytes allocated while the profiler ran",
    ("xprof", "cpu"): "TensorFlow's oneDNN CPU allocator (xprof memory profile): tensors of "
                      "256 KiB and more, all of them (smaller ones are not traced)",
    ("xprof", "gpu"): "TensorFlow's allocator (xprof memory profile): all allocated bytes",
    ("nsys", "gpu"): "CUDA memory as Nsight Systems sees it (cudaMalloc − cudaFree)",
}


def _allocator_notes(mem: pd.DataFrame) -> list[str]:
    notes = []
    for r in mem.dropna(subset=["allocated_source"]).drop_duplicates(
            ["allocated_source", "allocated_device"]).to_dict("records"):
        kind = "cpu" if r["allocated_device"] == "cpu" else "gpu"
        note = ALLOCATOR_NOTE.get((r["allocated_source"], kind))
        if note and f"allocated: {note}" not in notes:
            notes.append(f"allocated: {note}")
    return notes


#: Why a TensorFlow CPU run has no allocator figure (the run's fact ``onednn`` is false).
NO_ONEDNN_NOTE = ("no allocator figure: TensorFlow traces its CPU allocations only with oneDNN, "
                  "off in this run (TF_ENABLE_ONEDNN_OPTS=1 turns it on)")


def _no_allocator_note(rep: Report, mem: pd.DataFrame) -> list[str]:
    """The reason there is no allocator figure, when opprof knows it."""
    if rep.meta.get("onednn") is False and not mem["peak_allocated_bytes"].notna().any():
        return [NO_ONEDNN_NOTE]
    return []


def _no_memory_reason(rep: Report) -> str:
    """Why a trace has no memory rows, where its recording says."""
    if rep.meta.get("memory_interval_s") != 0:
        return "record with opprof record / opprof run, or a profiler's memory events"
    why = "recorded with --memory-interval 0: no resident samples"
    if rep.meta.get("framework") == "tf":
        return why + ("; TensorFlow's allocator traced no allocation (with oneDNN it traces "
                      "tensors of 256 KiB and more, without it none)")
    return why + "; no allocator events (--profile-memory records them)"


def _known(v: object) -> bool:
    return v is not None and not pd.isna(v)


def memory_line(rep: Report) -> Text | None:
    """One line for the default report: the largest worker's resident and allocator peaks,
    the parameters, and where to look further."""
    mem = rep.memory.ranks
    if mem.empty:
        return None
    workers = mem[mem["role"] == "worker"]
    rows = workers if len(workers) else mem
    key = "peak_rss_bytes" if rows["peak_rss_bytes"].notna().any() else "peak_allocated_bytes"
    values = pd.to_numeric(rows[key], errors="coerce")
    top = rows.loc[values.idxmax()] if values.notna().any() else rows.iloc[0]
    parts = []
    where = f"rank {int(top['rank'])}" + (
        f", step {int(top['peak_step'])}" if _known(top["peak_step"]) else "")
    if _known(top["peak_rss_bytes"]) and _known(top["unprofiled_rss_bytes"]):
        growth = top["peak_rss_bytes"] - top["unprofiled_rss_bytes"]
        parts.append(f"peak resident {mib(top['unprofiled_rss_bytes'])} unprofiled, "
                     f"{mib(top['peak_rss_bytes'])} while profiling ({where}; "
                     f"{'+' if growth >= 0 else ''}{mib(growth)} is the profiler's own)")
    elif _known(top["peak_rss_bytes"]):
        parts.append(f"peak resident {mib(top['peak_rss_bytes'])} while profiling ({where}; "
                     "the profiler's buffers included, no unprofiled peak)")
    if _known(top["peak_allocated_bytes"]):
        parts.append(f"allocator {mib(top['peak_allocated_bytes'])} "
                     f"({top['allocated_device']})")
    if _known(top["param_bytes"]):
        parts.append(f"parameters {mib(top['param_bytes'])}")
    if len(mem) > 1 and mem["peak_rss_bytes"].notna().any():
        parts.append(f"all {len(mem)} processes "
                     f"{mib(pd.to_numeric(mem['peak_rss_bytes']).sum())}")
    parts.extend(_no_allocator_note(rep, mem))
    return Text("memory: " + "; ".join(parts) + "  (--by memory for more)")


def memory_tables(rep: Report) -> list[RenderableType]:
    """Per rank: resident, kernel and allocator peaks, parameters, the peak's step; the
    peak by phase; a timeline of the main series over the profiled steps."""
    mem = rep.memory.ranks
    if mem.empty:
        return [Text(f"Memory: this trace has no memory rows ({_no_memory_reason(rep)})")]
    t = Table(title="Memory per rank (peaks)", title_justify="left")
    for c in ["rank", "role", "resident", "kernel peak", "unprofiled", "allocated", "reserved",
              "parameters", "peak step", "samples"]:
        t.add_column(c, justify="left" if c == "role" else "right")
    for r in mem.to_dict("records"):
        step = r["peak_step"]
        t.add_row(str(int(r["rank"])), r["role"], mib(r["peak_rss_bytes"]), mib(r["hwm_bytes"]),
                  mib(r["unprofiled_rss_bytes"]), mib(r["peak_allocated_bytes"]),
                  mib(r["peak_reserved_bytes"]),
                  mib(r["param_bytes"]), str(int(step)) if _known(step) else "-",
                  f"{int(r['samples']):,}")
    t.caption = "\n".join(["peaks until the end of the profiled steps; resident: the largest "
                           "VmRSS sample (from outside the process); kernel peak: VmHWM then; "
                           "unprofiled: resident peak before the profiler started (start-up, "
                           "warm-up, timing steps); peak step: of the main series (resident, "
                           "else allocated)",
                           *_allocator_notes(mem), *_no_allocator_note(rep, mem)])
    p = Table(title="Peak by phase (the largest sample of the main series in each phase's "
                    "wall time)", title_justify="left")
    p.add_column("rank", justify="right")
    p.add_column("series")
    for ph in PHASES:
        p.add_column(ph, justify="right", style=PHASE_STYLE[ph])
    for r in mem.to_dict("records"):
        p.add_row(str(int(r["rank"])), str(r["series"] or "-"),
                  *(mib(r[f"peak_{ph}_bytes"]) for ph in PHASES))
    p.caption = "- : no sample fell in that phase (a phase shorter than the sampling interval)"
    lines = [Text("Timeline over the profiled steps (largest sample per bin)", style="bold")]
    for r in rep.memory.timeline.to_dict("records"):
        known = [v for v in r["bins"] if v is not None]
        lines.append(Text(f"rank {int(r['rank']):>3} {r['series']:<9} "
                          f"{sparkline(r['bins'])}  {mib(min(known))} … {mib(max(known))}"))
    return [t, p, *(lines if len(lines) > 1 else [])]


def step_table(rep: Report) -> Table:
    """Wall ms per phase for every (rank, step)."""
    t = Table(title="Per step (ms)", title_justify="left")
    for c in ["rank", "step", "step ms", *PHASES]:
        t.add_column(c, justify="right", style=PHASE_STYLE.get(c, ""))
    for r in rep.steps.to_dict("records"):
        t.add_row(str(int(r["rank"])), str(int(r["step"])), ms(r["dur_ns"]),
                  *(ms(r[p]) for p in PHASES))
    return t


def convergence_line(c: Summary) -> Text:
    """The convergence curve in one line (`record --converge`)."""
    def acc(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    head = (f"convergence: {c.steps} steps, {c.time_ns / 1e9:.2f} s; loss "
            f"{c.first_loss:.3f} → {c.final_loss:.3f} (mean of the last steps)")
    if c.best_test_accuracy is None:  # `opprof run`: the loss only
        return Text(head + "; no accuracy (the loss backward() ran on, per step: --format "
                    "json)")
    reached = c.time_to_accuracy
    targets = ", ".join(f"{float(t):.0%} at {ns / 1e9:.2f} s (step {c.steps_to_accuracy[t]})"
                        for t, ns in reached.items()) or "none of 50/70/90% reached"
    return Text(f"{head}; best test accuracy {acc(c.best_test_accuracy)} (train "
                f"{acc(c.best_train_accuracy)}); time to test accuracy: {targets}")


def critical_table(rep: Report) -> Table:
    """What bound each step on each rank: the critical path's bound-by split (ms, share)."""
    from opprof.analysis.critpath import BOUND_BY

    t = Table(title="Critical path: what bound each step (ms; the parts sum to the step)",
              caption="docs/critical-path.md: the graph and what each part holds")
    for c in ("rank", "step", "step ms", "path ms", *BOUND_BY, "bound by"):
        t.add_column(c, justify="left" if c == "bound by" else "right", no_wrap=True)
    for r in rep.critical.to_dict("records"):
        step = max(int(r["step_ns"]), 1)
        top = max(BOUND_BY, key=lambda k: r[k])
        t.add_row(str(r["rank"]), str(r["step"]), f"{r['step_ns'] / 1e6:.3f}",
                  f"{r['path_ns'] / 1e6:.3f}", *(f"{r[k] / 1e6:.3f}" for k in BOUND_BY),
                  f"{top} {r[top] / step:.0%}")
    return t


def side(kernels: pd.DataFrame, where: str) -> pd.DataFrame:
    """The rows of a fused-kernel table (opprof.analysis.compiled) of one side, host or device
    (a report's default, empty table has no columns: itself)."""
    return kernels[kernels["where"] == where] if "where" in kernels else kernels


def report(rep: Report, by: str = "phase", top: int | None = None,
           advice: Advisory | None = None) -> str:
    """The report for a terminal; ``by`` picks the main view; ``advice`` comes first."""
    items: list[RenderableType] = [_header(rep.meta, rep.noise)]
    layout = layout_line(rep.meta)
    if layout is not None:
        items.append(layout)
    items += [Text(line, style="bold yellow") for line in replica_lines(rep)
              + compile_lines(rep)]
    items += [Text(line) for line in efficiency_headline(rep)]
    if advice is not None:
        items.extend(advice_items(advice, top=ADVICE_IN_REPORT, brief=True))
    if by == "roofline":
        items.extend(roofline_tables(rep, top))
    elif by == "op":
        items.append(op_table(rep.ops, top, "Host operators", side(rep.fused_kernels, "host")))
        if not rep.device_ops.empty:
            items.append(op_table(rep.device_ops, top, "GPU kernels and copies by operator",
                                  side(rep.fused_kernels, "device")))
        if not rep.collectives.empty:
            items.append(collective_table(rep))
    elif by == "rank":
        items.append(rank_table(rep))
        items.extend(rank_comm_tables(rep))
        if not rep.collectives.empty:
            items.append(collective_table(rep))
    elif by == "comm":
        items.append(collective_table(rep))
    elif by == "critical" and rep.critical.empty:
        items.append(Text("no profiled steps on a worker rank: no critical path to follow"))
    elif by == "critical":
        items.append(critical_table(rep))
    elif by == "step":
        items.append(step_table(rep))
    elif by == "device" and rep.devices.empty and rep.device_ops.empty:
        items.append(Text(f"no device activity in this trace (no GPU kernels, copies or "
                          f"memsets; device: {rep.meta.get('device') or 'unknown'}): --by op "
                          "shows its host operators"))
    elif by == "device":
        items.extend(device_tables(rep))
        items.append(op_table(rep.device_ops, top, "GPU kernels and copies by operator",
                              side(rep.fused_kernels, "device")))
    elif by == "memory":
        items.extend(memory_tables(rep))
    elif by == "pipeline":
        items.append(pipeline_table(rep))
    elif by == "experts":
        items.extend(expert_tables(rep))
    else:
        line = memory_line(rep)
        if line is not None:
            items.append(line)
        if rep.convergence:
            items.append(convergence_line(rep.convergence))
        items.append(phase_table(rep))
        items.append(op_table(rep.ops, 10 if top is None else top, "Top host operators"))
        if not rep.device_ops.empty:
            items.append(op_table(rep.device_ops, 10 if top is None else top,
                                  "Top GPU operators (kernels, copies)"))
    return render(*items)


def roofline_tables(rep: Report, top: int | None) -> list[RenderableType]:
    """`--by roofline`: per operator, per GPU kernel, and MFU per rank."""
    from opprof.render.efficiency import rank_rows, roofline_rows

    eff = rep.efficiency
    if eff is None:
        return []
    out: list[RenderableType] = []
    peak = eff.peak
    ridge = (f"; ridge at {peak.flops_per_s / peak.bytes_per_s:,.1f} FLOP/byte"
             if peak.flops_per_s and peak.bytes_per_s else "")
    for title, df, kernel in (("Roofline by operator", eff.roofline, False),
                              ("Roofline by GPU kernel", eff.kernels, True)):
        if df.empty:
            continue
        head, rows = roofline_rows(df, top, kernel)
        t = Table(title=title + ridge, title_justify="left")
        for h in head:
            t.add_column(h, justify="left" if h in ("op", "phase", "kernel", "bound")
                         else "right", no_wrap=True, overflow="ellipsis")
        for r in rows:
            t.add_row(*r)
        out.append(t)
    head, rows = rank_rows(eff)
    t = Table(title="MFU per rank (profiled steps)", title_justify="left")
    for h in head:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*r)
    out.append(t)
    return out


def step_lines(d: Diff) -> list[str]:
    """The step times of a diff, unprofiled beside profiled, and which the headline uses."""
    lines = []
    if d.basis == "unprofiled":
        lines.append(f"step, unprofiled: A {ms(d.a_unprofiled_ns)} ms, B {ms(d.b_unprofiled_ns)} "
                     f"ms → {ratio(d.headline_ratio, 'A/B')} (the headline)")
    lines.append(f"step, profiled:   A {ms(d.a_step_ns)} ms, B {ms(d.b_step_ns)} ms → "
                 f"{ratio(d.step_ratio, 'A/B')}")
    if d.basis == "unprofiled":
        what = "profiled/unprofiled"
        lines.append(f"profiler overhead: A {ratio(d.overhead('a'), what)}, "
                     f"B {ratio(d.overhead('b'), what)}")
    else:
        lines.append("(no unprofiled timing in "
                     + " and ".join(s for s, u in (("A", d.a_unprofiled_ns),
                                                    ("B", d.b_unprofiled_ns)) if not u)
                     + ": the headline compares profiled steps)")
    return lines


def diff(d: Diff, top: int | None = None) -> str:
    """The diff for a terminal."""
    head = Text(f"opprof diff  A = {d.a_label}  ·  B = {d.b_label}\n", style="bold")
    head += Text("\n".join(step_lines(d)))
    for line in verdicts.mismatch_lines(d):
        head += Text("\n" + line, style="bold yellow")
    tables = []
    for df, key, title in [(d.phases, "phase", "Phases (wall ms/step, profiled)"),
                           (d.ops if top is None else d.ops.head(top), "op",
                            "Operators (host ms/step, profiled), by share of the gap")]:
        t = Table(title=title, title_justify="left")
        for c in [key, "A", "B", "A/B", "A−B ms", "share of gap"]:
            t.add_column(c, justify="left" if c == key else "right")
        for r in df.to_dict("records"):
            t.add_row(str(r[key]), ms(r["a_ns_per_step"]), ms(r["b_ns_per_step"]),
                      ab_ratio(r["a_ns_per_step"], r["b_ns_per_step"]),
                      ms(r["delta_ns"]), pct(r["share_of_gap"]))
        tables.append(t)
    if not d.comm.empty:
        tables.append(comm_diff_table(d.comm))
    items: list[RenderableType] = [head, *tables, *memory_diff(d), *efficiency_diff(d, top),
                                   Text(verdicts.diff_sentence(d), style="bold")]
    if d.convergence:
        items.append(Text(verdicts.convergence_sentence(d.convergence), style="bold"))
    items += [Text(f"{side} ({name}): {line}", style="bold yellow")
              for side, name, noise in (("A", d.a_label, d.a_noise), ("B", d.b_label, d.b_noise))
              for line in quality_lines(noise)]
    if d.whatif is not None:
        items.append(whatif_swaps_table(d, top))
    if d.gate is not None:
        items += [Text(line, style="bold red" if i == 0 and d.gate.verdict == "fail"
                       else "bold green" if i == 0 else "")
                  for i, line in enumerate(gate_lines(d.gate))]
    return render(*items)


def efficiency_diff(d: Diff, top: int | None) -> list[RenderableType]:
    """Which run uses its machine better: MFU of each against its peak, and per operator the
    achieved FLOP/s and share of peak that explain the difference."""
    from opprof.render.efficiency import diff_rows

    e = d.efficiency
    if e is None:
        return []
    out: list[RenderableType] = []
    head, rows = diff_rows(e, 5 if top is None else min(top, 10))
    if rows:
        t = Table(title="Efficiency (model FLOPs), by share of the MFU difference",
                  title_justify="left")
        for h in head:
            t.add_column(h, justify="left" if h == "op" else "right")
        for r in rows:
            t.add_row(*r)
        out.append(t)
    out.append(Text(verdicts.efficiency_sentence(e, d.a_label, d.b_label), style="bold"))
    return out


#: How the diff names the run memory metrics.
MEMORY_METRIC = {"peak_rss": "resident peak (largest worker)",
                 "unprofiled_rss": "resident peak before profiling (largest worker)",
                 "job_rss": "resident, all processes (sum of peaks)",
                 "peak_allocated": "allocator peak (largest worker)",
                 "peak_reserved": "reserved peak (largest worker)",
                 "param": "parameters"}


def memory_diff(d: Diff) -> list[RenderableType]:
    """Memory beside time: each run's peaks, A/B and A−B, and one line on the resident peak."""
    if d.memory.empty:
        return []
    t = Table(title="Memory", title_justify="left")
    for c in ["", "A", "B", "A/B", "A−B"]:
        t.add_column(c, justify="left" if not c else "right")
    for r in d.memory.to_dict("records"):
        name = MEMORY_METRIC.get(r["metric"]) or (
            f"peak in {r['metric'].removeprefix('peak_')} (largest worker)")
        t.add_row(name, mib(r["a_bytes"]), mib(r["b_bytes"]),
                  "-" if pd.isna(r["ratio"]) else ratio(r["ratio"]), mib(r["delta_bytes"]))
    alloc = d.memory[d.memory["metric"].isin(["peak_allocated", "peak_reserved"])]
    if len(alloc) and alloc["a_bytes"].notna().all() and alloc["b_bytes"].notna().all() \
            and alloc["ratio"].isna().all():
        t.caption = ("allocator peaks not compared: the two runs' allocators count different "
                     "things (--by memory on each says what)")
    verdict = verdicts.memory_verdict(d)
    return [t, Text(verdict, style="bold")] if verdict else [t]


def whatif_swaps_table(d: Diff, top: int | None) -> Table:
    """``diff --whatif``: A's step if each operator ran at B's speed, largest saving first."""
    t = Table(title=f"What if A ran each operator at B's speed (A's step {ms(d.a_step_ns)} ms)",
              title_justify="left")
    for c in ["op", "A ms", "B ms", "A/B", "A's step ms", "saving ms", "saving"]:
        t.add_column(c, justify="left" if c == "op" else "right")
    assert d.whatif is not None  # (diff --whatif)
    rows = d.whatif if top is None else d.whatif.head(top)
    for r in rows.to_dict("records"):
        t.add_row(r["op"], ms(r["a_ns_per_step"]), ms(r["b_ns_per_step"]),
                  ab_ratio(r["a_ns_per_step"], r["b_ns_per_step"]), ms(r["whatif_step_ns"]),
                  ms(r["saving_ns"]), pct(r["saving_share"]))
    t.caption = ("re-simulated: A's other operators, overlap and communication kept; "
                 "saving = A's step − the what-if step")
    return t


def sweep_tables(swept: Mapping[str, object]) -> list[Table | Text]:
    """`bench --threads` / `--batch-size`: time per mini-batch, samples/s, speed-up and
    efficiency along each swept dimension, then where each run stops scaling."""
    out: list[Table | Text] = []
    for dim, title in (("threads", "threads"), ("batch_size", "batch size")):
        frame = swept.get(dim)
        if not isinstance(frame, pd.DataFrame) or frame.empty:
            continue
        other = "batch_size" if dim == "threads" else "threads"
        t = Table(title=f"Time per mini-batch against the {title} (unprofiled)",
                  title_justify="left")
        cols = ["fw", "model", "workers", "mode", other.replace("_", " "), title, "ms/step",
                "samples/s", "speed-up", "efficiency"]
        for c in cols:
            t.add_column(c, justify="left" if c in ("fw", "model", "mode") else "right")
        for r in frame.to_dict("records"):
            fixed = r.get(other)
            t.add_row(r["fw"], r["model"], str(r["workers"]), r["mode"],
                      str(int(fixed)) if fixed is not None and fixed == fixed else "-",
                      str(int(r[dim])), ms(r["step_ns"]),
                      f"{r['samples_per_s']:,.1f}" if _known(r.get("samples_per_s")) else "-",
                      f"{r['speedup']:.2f}x" if _known(r.get("speedup")) else "-",
                      pct(r["efficiency"]) if _known(r.get("efficiency")) else "-")
        out.append(t)
    stops = swept.get("stops")
    if isinstance(stops, list) and stops:
        out.append(Text("\n".join(str(s["sentence"]) for s in stops if isinstance(s, dict))))
    return out


def bench_tables(table: pd.DataFrame, ratios: pd.DataFrame) -> list[Table]:
    """Runs (with their noise flags), the model's predictions and memory, their phase
    breakdown, and the operator-ratio table for a terminal."""
    t = Table(title="opprof bench — runs", title_justify="left")
    m = Table(title="Predicted scaling and memory", title_justify="left")
    p = Table(title="Phase breakdown (ms per profiled step, mean over ranks; sums to the step)",
              title_justify="left")
    key = ["fw", "model", "workers", "mode"]
    # the sweeps' dimensions (`bench --batch-size 16,64 --threads 1,2`), when swept
    key += [c for c in ("batch_size", "threads") if c in table and table[c].nunique() > 1]
    # samples/s keeps its full width: a `--repeat` range below the median is never cut
    sps_width = max([len(line) for r in table.to_dict("records")
                     if r["status"] in DONE and r["samples_per_s"]
                     for line in _sps(r).splitlines()] + [len("samples/s")])
    for c in [*key, "status", "samples/s", "unprofiled ms", "profiled ms",
              "profiled/\nunprofiled", "scaling", "MFU", "flags"]:
        t.add_column(c, justify="left" if c in ("fw", "model", "mode", "status", "flags")
                     else "right", no_wrap=c == "samples/s",
                     min_width=sps_width if c == "samples/s" else max(map(len, c.split())))
    for c in [*key, "predicted ms", "predicted scaling", "error", "mem", "mem/leanest",
              "profiled mem"]:
        m.add_column(c, justify="left" if c in ("fw", "model", "mode") else "right")
    for c in [*key, *PHASES, "step"]:
        p.add_column(c, justify="left" if c in ("fw", "model", "mode") else "right",
                     style=PHASE_STYLE.get(c, ""))
    notes, model_notes = [], []
    for r in table.to_dict("records"):
        ok = r["status"] in DONE
        sps, eff = r["samples_per_s"], r["scaling_efficiency"]
        head = [str(r[c]) if r[c] is not None and r[c] == r[c] else "-" for c in key]
        style = "green" if ok else ("red" if r["status"] == RunStatus.FAILED else "grey50")
        pred = r.get("predicted_step_ns")
        has = ok and pred is not None and pred == pred
        t.add_row(*head, Text(r["status"], style=style), _sps(r) if ok and sps else "-",
                  ms(r["unprofiled_step_ns"]) if ok else "-", ms(r["step_ns"]) if ok else "-",
                  _overhead(r) if ok else "-",
                  pct(eff) if eff is not None and eff == eff else "-",
                  share(r.get("mfu")) if ok and _known(r.get("mfu")) else "-",
                  Text(_flags(r), style="bold yellow") if ok else "")
        if ok:
            m.add_row(*head, ms(pred) if has else "-",
                      f"{pct(r['predicted_scaling'])} vs {pct(r['profiled_scaling'])}" if has
                      else "-", f"{r['prediction_error']:+.1%}" if has else "-",
                      mib(r.get("unprofiled_rss_bytes")),
                      f"{r['rss_ratio']:.2f}x" if _known(r.get("rss_ratio")) else "-",
                      mib(r.get("peak_rss_bytes")))
        if ok and r.get("workers", 1) > 1 and not has and r.get("prediction_note"):
            model_notes.append(f"{r['fw']} {r['model']} x{r['workers']} {r['mode']}: no "
                               f"prediction — {r['prediction_note']}")
        if ok:
            p.add_row(*head, *(ms(r[ph]) for ph in PHASES), ms(r["step_ns"]))
        if r["reason"]:
            notes.append(f"{r['fw']} {r['model']} x{r['workers']} {r['mode']}: {r['reason']}")
    t.caption = "\n".join(["unprofiled ms: the timed steps without the profiler (samples/s and "
                           "scaling come from them); profiled ms: the profiled steps (the "
                           "phase and operator tables); scaling = samples/s ÷ (workers × "
                           "samples/s of 1 worker)", *_flag_notes(table), *notes])
    m.caption = "\n".join(["predicted: the model from the 1-worker run (profiled ms; scaling = "
                           "step(1) ÷ step(N), predicted vs measured; error of the predicted "
                           "step); mem: resident peak of the largest worker before profiling "
                           "(profiled mem: until the last profiled step, the profiler's buffers "
                           "included); mem/leanest: mem over the leanest run of the same model "
                           "and workers", *model_notes])
    o = Table(title="Operators with the largest cross-framework ratios (host ms per rank-step)",
              title_justify="left")
    for c in ["model", "workers", "op", "slower", "faster", "slower ms", "faster ms", "ratio"]:
        o.add_column(c, justify="right" if c.endswith(("ms", "ratio", "workers")) else "left")
    for r in ratios.to_dict("records"):
        o.add_row(r["model"], str(r["workers"]), r["op"], r["slower"], r["faster"],
                  ms(r["slower_ns_per_step"]), ms(r["faster_ns_per_step"]), f"{r['ratio']:.2f}x")
    if ratios.empty:
        o.caption = "needs two frameworks recorded with the same model, batch size and workers"
    conv = convergence_table(table)
    return [t, m, p, *([conv] if conv is not None else []), o]


def convergence_table(table: pd.DataFrame) -> Table | None:
    """`bench --converge`: each run's final loss, best test accuracy and training time to
    each target accuracy (None when no run has a convergence table)."""
    if "best_test_accuracy" not in table or table["best_test_accuracy"].isna().all():
        return None
    targets = [c for c in table.columns if c.startswith("time_to_") and c.endswith("_s")]
    t = Table(title="Convergence (--converge): training seconds to each test accuracy",
              title_justify="left")
    for c in ["fw", "model", "workers", "mode", "final loss", "best test acc",
              *(f"to {c[8:-2]}% s" for c in targets)]:
        t.add_column(c, justify="left" if c in ("fw", "model", "mode") else "right")

    def num(v: object, fmt: str) -> str:
        return "-" if v is None or v != v else format(v, fmt)

    for r in table.to_dict("records"):
        best = r.get("best_test_accuracy")
        if best is None or best != best:
            continue
        t.add_row(r["fw"], r["model"], str(r["workers"]), r["mode"], num(r["final_loss"], ".3f"),
                  num(r["best_test_accuracy"], ".1%"), *(num(r[c], ".2f") for c in targets))
    t.caption = ("with --repeat: medians over the repetitions; '-': the target was not "
                 "reached")
    return t


def _overhead(r: dict[str, Any]) -> str:
    """A run's profiled step over its unprofiled one."""
    if _known(r.get("overhead")):  # median profiled / median unprofiled, as the report's
        return ratio(r["overhead"])
    u, p = r.get("unprofiled_step_ns"), r.get("step_ns")
    return ratio(p / u) if _known(u) and _known(p) and u else "-"


def _sps(r: dict[str, Any]) -> str:
    """samples/s, with the range over repetitions below it (``bench --repeat``)."""
    text = f"{r['samples_per_s']:,.1f}"
    low, high = r.get("samples_per_s_min"), r.get("samples_per_s_max")
    if (r.get("repeats") or 1) > 1 and low is not None and high is not None:
        text += f"\n({low:,.1f}–{high:,.1f})"
    return text


def _flags(r: dict[str, Any]) -> str:
    """A run's noise flags (opprof.analysis.noise), with the overhead when flagged."""
    flags = [f for f in str(r.get("flags") or "").split(",") if f]
    return ", ".join(f"overhead {r['overhead']:.1f}x" if f == "overhead" and r.get("overhead")
                     else f for f in flags)


def _flag_notes(table: pd.DataFrame) -> list[str]:
    """What the flags mean, when some run has one (thresholds from opprof.analysis.noise)."""
    from opprof.analysis.noise import NOISE_DRIFT, NOISE_SPREAD, OVERHEAD_LIMIT

    if "flags" not in table or not table["flags"].fillna("").astype(bool).any():
        return []
    return [f"flags: noisy = the unprofiled steps' IQR over "
            f"{NOISE_SPREAD:.0%} of their median, a change over {NOISE_DRIFT:.0%} from before "
            f"to after the profile, or repetitions' "
            f"samples/s over {NOISE_SPREAD:.0%} apart; overhead = profiled steps over "
            f"{OVERHEAD_LIMIT:g}x the unprofiled — compare these runs with care"]


def _us(ns: float | None) -> str:
    return "-" if ns is None or ns != ns else f"{ns / 1e3:,.1f} µs"


def network_line(net: Network, note: str = "") -> Text:
    """α, β and bandwidth of a network, and where they come from."""
    bw = rate(net.bandwidth_Bps) if net.bandwidth_Bps else "no limit"
    text = Text(f"{net.collective}: α = {_us(net.alpha_ns)}, β = {net.beta_ns_per_byte:.4g} ns/B "
                f"({bw})")
    if note:
        text += Text(f" — {note}", style="grey50")
    return text


def model(result: ModelResult) -> str:
    """`opprof model` for a terminal: the base's terms, the network, the predictions and the
    check."""
    from opprof.render.modeltables import predictions_table, terms_table

    b = result.base
    head = Text("opprof model  ", style="bold") + Text(
        f"{b.label}  ·  "
        f"{' '.join(x for x in (b.framework, b.meta.model) if x) or 'unknown framework'}"
        "  ·  "
        f"base: {b.workers} worker{'s' if b.workers != 1 else ''} ({b.mode})  ·  "
        f"{ms(b.step_ns)} ms/step over {b.terms.steps} rank-step(s)")
    head += Text(f"\nper-worker resources: {b.resources.describe()} — the prediction holds for "
                 "workers with these resources", style="grey50")
    t = Table(title="Terms of the base (ms per step; t_io … other sum to the step)",
              title_justify="left")
    for c in ["term", "phase", "mean", "std", "min", "max", "cv"]:
        t.add_column(c, justify="left" if c in ("term", "phase") else "right")
    for r in terms_table(result).to_dict("records"):
        t.add_row(r["term"], Text(r["phase"], style=PHASE_STYLE.get(r["phase"], "")),
                  ms(r["mean_ns"]), ms(r["std_ns"]), ms(r["min_ns"]), ms(r["max_ns"]),
                  pct(r["cv"]))
    g = b.gradients
    grads = Text(f"gradients: {len(g.layers)} in backward order, {size(g.total_bytes)} per "
                 f"step ({g.source}; sizes: {g.bytes_source})")
    if len(g.collectives):
        c = g.collectives
        first = c[(c["rank"] == c["rank"].min()) & (c["step"] == c["step"].min())]
        sizes = ", ".join(size(n) for n in first["bytes"] if n) or "sizes not recorded"
        grads += Text(f"\nthe trace's collectives: {len(c) / max(b.terms.steps, 1):.1f} per "
                      f"rank-step (first: {sizes})")
    grads += Text(f"\npipeline: {result.policy.describe}\nnetwork ")
    grads += network_line(result.network, result.network_note)
    p = Table(title=f"Predicted step ({result.mode}"
                    f"{f', {result.servers} server(s)' if result.servers else ''}; ms)",
              title_justify="left")
    for c in ["workers", "step", "speed-up", "efficiency", "exposed comm", "comm busy",
              "wait", "interference", "co-location", "compute"]:
        p.add_column(c, justify="right")
    for r in predictions_table(result).to_dict("records"):
        compute = r["step_ns"] - r["exposed_comm_ns"]
        p.add_row(str(r["workers"]), ms(r["step_ns"]), f"{r['speedup']:.2f}x",
                  pct(r["efficiency"]), ms(r["exposed_comm_ns"]), ms(r["comm_busy_ns"]),
                  ms(r["wait_ns"]), ms(r["t_interf"]), ms(r["t_coloc"]), ms(compute))
    p.caption = ("speed-up = N × step(1) / step(N); wait = expected wait for the slowest "
                 "worker (inside exposed comm); interference = backward time lost to compute "
                 "slowed beside collectives (t_interf); co-location = compute time lost to the "
                 "other processes computing on the worker's host (t_coloc); both inside compute")
    last = result.predictions[-1].interference if result.predictions else None
    if last is not None:
        p.caption += (f"\ninterference at {result.predictions[-1].workers} workers: compute "
                      f"beside a collective ×{1 + last.slowdown:.2f}, the collective beside "
                      f"compute ×{1 + last.comm_slowdown:.2f} ({last.source})")
    coloc = result.predictions[-1].colocation if result.predictions else None
    if coloc is not None:
        from opprof.render.modeltables import colocation_line

        p.caption += f"\n{colocation_line(coloc, result.predictions[-1].workers)}"

    items: list[RenderableType] = [head, t, grads, _messages_table(result), p]
    items += [Text(f"note: {n}", style="bold yellow" if "⚠" in n else "grey50")
              for n in verdicts.model_notes(result)]
    if result.check is not None:
        items.extend(_check_items(result.check))
    return render(*items)


def _messages_table(result: ModelResult) -> Table:
    """The messages the pipeline sends per step: gradients grouped as the framework groups
    them, with when they are ready in the base's backward pass."""
    from opprof.model.simulate import messages

    g = result.base.gradients
    units = result.base.units
    if result.mode == Mode.FSDP and units is not None and len(units.bytes):
        t = Table(title=f"FSDP units, forward order ({result.policy.name})",
                  title_justify="left")
        for c in ["unit", "bytes", "share of compute"]:
            t.add_column(c, justify="right")
        for i, (n, share) in enumerate(zip(units.bytes, units.share, strict=True)):
            t.add_row("root" if i == 0 else str(i), size(n), pct(share))
        t.caption = ("per step: each all-gathered before forward and (but the root) before "
                     "backward, reduce-scattered after backward")
        return t
    t = Table(title=f"Messages per step ({result.policy.name})", title_justify="left")
    for c in ["#", "bytes", "ready ms", "ready"]:
        t.add_column(c, justify="right")
    t.caption = "ready: when its last gradient is, into backward"
    if not len(g.layers):
        t.caption = "no gradients found in the trace"
        return t
    for i, (frac, n) in enumerate(messages(g.layers["ready_frac"].to_numpy(),
                                           g.layers["bytes"].to_numpy(), result.policy)):
        t.add_row(str(i), size(n), ms(frac * g.backward_ns), pct(frac))
    return t


def _check_items(c: Check) -> list[RenderableType]:
    t = Table(title=f"Check against {c.label} (ms per step)", title_justify="left")
    for col in ["term", "predicted", "measured", "error ms", "error"]:
        t.add_column(col, justify="left" if col == "term" else "right")
    for r in c.terms.to_dict("records"):
        err = r["error"]
        t.add_row(r["term"], ms(r["predicted_ns"]), ms(r["measured_ns"]), ms(r["error_ns"]),
                  "-" if err != err or math.isinf(err) else f"{err:+.1%}")
    line = Text(f"predicted {ms(c.predicted_step_ns)} ms vs measured {ms(c.measured_step_ns)} "
                f"ms per step: error {c.error:+.1%}", style="bold")
    if c.spread is not None:
        sp = c.spread
        line += Text(f"\npredicted {ms(sp.interval_ns[0])} … {ms(sp.interval_ns[1])} ms (± the "
                     f"measured mean's 95% interval, {sp.steps} rank-steps, cv {sp.cv:.1%}): "
                     f"{verdicts.check_verdict(sp)}", style="bold yellow" if sp.noisy else "")
    if c.colocation is not None:
        from opprof.render.modeltables import colocation_verdict

        line += Text(f"\n{colocation_verdict(c.colocation)}")
    return [t, line]


def whatif(w: WhatIf) -> str:
    """`opprof whatif` for a terminal: phases before and after, and each change's effect."""
    head = Text("opprof whatif  ", style="bold") + Text(
        f"{w.label}  ·  step {ms(w.base_step_ns)} → {ms(w.step_ns)} ms "
        f"({w.delta_ns / 1e6:+,.3f} ms, {w.delta_ns / w.base_step_ns:+.1%})"
        if w.base_step_ns else f"{w.label}")
    t = Table(title="Phases (wall ms per step; sum to the step)", title_justify="left")
    for c in ["phase", "measured", "what-if", "delta"]:
        t.add_column(c, justify="left" if c == "phase" else "right")
    for p in PHASES:
        t.add_row(Text(p, style=PHASE_STYLE[p]), ms(w.base_phases[p]), ms(w.phases[p]),
                  f"{(w.phases[p] - w.base_phases[p]) / 1e6:+,.3f}")
    t.add_row(Text("step", style="bold"), ms(w.base_step_ns), ms(w.step_ns),
              f"{w.delta_ns / 1e6:+,.3f}")
    s = Table(title="Changes (each alone)", title_justify="left")
    for c in ["change", "value", "factor", "wall ms/step", "step delta ms"]:
        s.add_column(c, justify="left" if c in ("change", "value") else "right")
    for ch in w.scenario:
        s.add_row(f"{ch.kind} {ch.target}" if ch.kind == "op" else ch.kind, ch.value,
                  "-" if ch.factor is None else f"{ch.factor:.3g}x", ms(ch.wall_ns),
                  f"{ch.delta_ns / 1e6:+,.3f}")
    if not w.scenario:
        s.caption = "no change asked for: the measured step"
    items: list[RenderableType] = [head, t, s]
    if w.network_note:
        items.append(Text(f"network: {w.network_note}", style="grey50"))
    if w.engine == "graph":
        items.append(Text("step: the trace's dependency graph replayed with the changes "
                          "(docs/critical-path.md); phases: the phase model's, carrying it",
                          style="grey50"))
    items += [Text(f"note: {n}", style="grey50") for n in verdicts.whatif_notes(w)]
    return render(*items)


def calibration(net: Network) -> str:
    """`opprof calibrate` for a terminal: the fit and the measured sizes."""
    from opprof.render.modeltables import samples_table

    head = Text("opprof calibrate  ", style="bold") + Text(
        f"{net.framework} · {net.backend} · {net.workers} workers"
        f"{f', {net.servers} server(s)' if net.servers else ''}\n") + network_line(net)
    rs = net.info.get("reduce_scatter") or {}
    t = Table(title=f"Message sizes ({net.fit.get('center', 'median')} per size"
                    f"{'; all-gather, then reduce-scatter' if rs else ''})", title_justify="left")
    for c in ["size", "calls", "measured", "α–β fit", "fit error", ""]:
        t.add_column(c, justify="right")
    rows = samples_table(net).to_dict("records")
    if rs.get("samples"):
        rows += samples_table(list(rs["samples"])).to_dict("records")
    for r in rows:
        err = (r["predicted_ns"] - r["ns"]) / r["ns"] if r["ns"] else float("nan")
        t.add_row(size(r["bytes"]), str(int(r["calls"])), _us(r["ns"]), _us(r["predicted_ns"]),
                  f"{err:+.1%}", Text("⚠", style="bold yellow") if abs(err) > FIT_LIMIT else "")
    f = net.fit
    t.caption = (f"fit: relative RMS error {f.get('rel_rmse', float('nan')):.1%} over "
                 f"{f.get('points', 0)} sizes; ⚠ = off by more than ±{FIT_LIMIT:.0%}"
                 + (f"; {f['note']}" if f.get("note") else ""))
    warning = verdicts.fit_warning(net)
    items: list[RenderableType] = [head, t]
    coloc = net.info.get("colocation")
    if isinstance(coloc, dict) and coloc.get("slowdown"):
        items.append(_colocation_table(coloc))
    feed = net.info.get("distributed_input")
    if isinstance(feed, dict) and feed.get("rounds_ns"):
        rounds = feed["rounds_ns"]
        items.append(Text(
            f"Distributed dataset: the step fed through the strategy's "
            f"{_us(feed['distributed_ns'])} against {_us(feed['plain_ns'])} fed by the dataset "
            f"itself (both workers at once): +{_us(feed['ns'])} a step (rounds "
            f"{min(rounds) / 1e3:,.1f} … {max(rounds) / 1e3:,.1f} µs), what `model` adds to "
            "each worker's load from a one-worker base"))
    instep = net.info.get("in_step")
    if isinstance(instep, dict) and any(k in instep for k in ("all_reduce", "p2p")):
        items.append(_in_step_table(instep))
    pipe = instep.get("pipeline") if isinstance(instep, dict) else None
    if isinstance(pipe, dict) and pipe.get("settings"):
        items.append(Text(
            f"Pipeline hand-off (two stages, {pipe['microbatches']} micro-batches, the "
            "transfers made while both ranks compute): " + "; ".join(
                f"{_us(r['handoff_ns'])} a hand-off at {_us(r['compute_ns'])} of compute "
                f"per micro-batch (step {_us(r['period_ns'])}, {_us(r['ideal_ns'])} were "
                "hand-offs free)" for r in pipe["settings"])
            + f" — their median, {_us(pipe['handoff_ns'])}, is what `opprof model --mode pp` "
              "from one worker prices each activation and gradient by"))
    return render(*items, *([Text(warning, style="bold yellow")] if warning else []))


def _in_step_table(doc: dict[str, Any]) -> Table:
    """A calibration's in-step calls (:mod:`opprof.model.instep`): per kind and size the
    mean time after the last rank entered, and the wait's fit over the bursts."""
    t = Table(title="In-step calls (after a compute burst, as a training step makes them)",
              title_justify="left")
    for col in ["call", "size", "calls", "after the last rank", "wait for it"]:
        t.add_column(col, justify="right")
    names = {"all_reduce": "gradients / TP all-reduce" if doc.get("p2p") else
             "gradients' collective", "p2p": "send/recv (PP)"}
    for kind in ("all_reduce", "p2p"):
        d = doc.get(kind)
        if not isinstance(d, dict):
            continue
        wait = (f"{_us(d.get('wait_ns'))} + {1e3 * float(d.get('wait_per_burst') or 0):.1f} "
                "µs/ms of burst")
        for i, r in enumerate(d.get("after_ns") or []):
            t.add_row(names[kind] if i == 0 else "", size(r["bytes"]), str(r.get("calls", "")),
                      _us(r["ns"]), wait if i == 0 else "")
    t.caption = ("the mean over calls, bursts and ranks; the wait: the mean rank's for the last "
                 "to enter, fitted over the bursts (what `opprof model --mode tp|pp` from one "
                 "worker prices each collective by; a data-parallel step's gradients pay the "
                 "latency beyond the back-to-back call's)")
    return t


#: How many pieces of advice the report shows (`opprof advise` shows them all).
ADVICE_IN_REPORT = 3


def advice_items(a: Advisory, top: int | None = None, brief: bool = False
                 ) -> list[RenderableType]:
    """The advice as a table, largest saving first (``top``: the first N); ``brief``: the
    report's section (no evidence, a pointer to `opprof advise`)."""
    step = a.step_ns
    if not step:
        why = next(iter(a.not_checked.values()), "no steps")
        return [Text(f"Advice: none ({why})", style="bold")]
    training = [x for x in a.advice if x.kind == "training"]
    notes = [x for x in a.advice if x.kind != "training"]
    items: list[RenderableType] = []
    if not training:
        items.append(Text(f"Advice: healthy — no rule finds a saving of 2% of the step or more "
                          f"({a.bound})", style="bold green"))
    else:
        shown = training if top is None else training[:top]
        t = Table(title=f"Advice, by the time each saves (step {ms(step)} ms)",
                  title_justify="left")
        for c, j in (("#", "right"), ("saves ms/step", "right"), ("share", "right"),
                     ("confidence", "left"), ("finding → action", "left")):
            t.add_column(c, justify=j)  # type: ignore[arg-type]
        for i, x in enumerate(shown, 1):
            body = Text(x.finding)
            body.append(f"\n→ {x.action}", style="bold")
            if not brief:
                body.append(f"\nmodel: {x.model}"
                            + (f"; check it: {x.knob.text}" if x.knob else ""), style="dim")
            t.add_row(str(i), ms(x.saving_ns), pct(x.saving_share), x.confidence, body)
        items.append(t)
        if top is not None and len(training) > top:
            items.append(Text(f"{len(training) - top} more: opprof advise", style="dim"))
    for x in notes:
        items.append(Text(f"⚠ {x.finding}: {x.action}", style="yellow"))
    if not brief:
        if a.minor:
            items.append(Text("minor (under 2% of the step): " + "; ".join(
                f"{x.rule} {ms(x.saving_ns)} ms" for x in a.minor), style="dim"))
        if a.not_checked:
            items.append(Text("not checked: " + "; ".join(
                f"{k} ({v})" for k, v in a.not_checked.items()), style="dim"))
    return items


def verification_table(v: Verification) -> list[RenderableType]:
    """Each applied action's predicted and achieved saving (unprofiled, per sample)."""
    items: list[RenderableType] = []
    if v.actions:
        t = Table(title="Checked: the run recorded again with each action (unprofiled step, "
                        "per sample)", title_justify="left")
        for c in ("action", "predicted ms", "predicted", "base ms", "new ms", "achieved ms",
                  "achieved", "error"):
            t.add_column(c, justify="left" if c == "action" else "right")
        for r in v.actions:
            t.add_row(f"{r.rule}: {r.knob.text}", ms(r.predicted_ns), pct(r.predicted_share),
                      ms(r.base_step_ns), ms(r.new_step_ns), ms(r.achieved_ns),
                      pct(r.achieved_share), f"{r.error * 100:+.1f} pt")
        items.append(t)
    else:
        items.append(Text("Checked: no action could be applied by a record option", style="bold"))
    for line in v.not_applied:
        items.append(Text(f"not applied: {line}", style="dim"))
    if v.load:
        items.append(Text(f"load average while recording: {v.load}", style="dim"))
    return items


def advice(result: AdviseResult) -> str:
    """`opprof advise` for a terminal: the advice, then (--verify) the check."""
    a = result.advisory
    head = Text(f"opprof advise  {a.label}  ·  step {ms(a.step_ns)} ms", style="bold")
    items: list[RenderableType] = [head, *advice_items(a)]
    if result.verification is not None:
        items.extend(verification_table(result.verification))
    return render(*items)


def _check_text(c: GateCheck) -> str:
    """One check in words: the slowdown, the samples, the threshold and the test."""
    what = "step" if c.target == "step" else c.target
    delta = c.delta
    change = (f"{abs(delta):.1%} {'slower' if delta > 0 else 'faster'}" if delta is not None
              else f"{c.delta_ns / 1e6:+,.3f} ms")
    p = "-" if c.p_value is None else f"{c.p_value:.3g}"
    margin = (f"; the runs' noise {c.noise:.0%} sets the margin" if c.noise_bound else "")
    return (f"NEW's {what} is {change} than BASE's (median of {c.new_samples} vs "
            f"{c.base_samples} {c.source}: {ms(c.new_median_ns)} vs {ms(c.base_median_ns)} "
            f"ms; threshold {c.threshold.text}{margin}; p = {p})")


def gate_line(g: Gate) -> str:
    """The gate's one-line verdict."""
    h = g.headline
    if g.verdict == "fail":
        why = f"beyond {h.threshold.text} and the noise (p < {g.alpha:g})"
    elif h.delta_ns <= 0:
        why = "not slower"
    elif not h.exceeded:
        why = (f"within the runs' noise ({h.noise:.0%})" if h.noise_bound
               else f"within {h.threshold.text}")
    else:
        why = f"beyond the margin but not significant (p ≥ {g.alpha:g})"
    more = f" ({len(g.failed)} of {len(g.checks)} checks failed)" if len(g.checks) > 1 else ""
    return f"gate: {g.verdict.upper()}{more} — {_check_text(h)}: {why}"


def gate_lines(g: Gate) -> list[str]:
    """The verdict, then every other check and the notes."""
    lines = [gate_line(g)]
    lines += [f"  {c.verdict}: {_check_text(c)}" for c in g.checks if c is not g.headline]
    lines += [f"  test: {g.test}, alpha {g.alpha:g}"]
    lines += [f"  note: {n}" for n in verdicts.gate_notes(g)]
    return lines


def _colocation_table(c: dict[str, Any]) -> Table:
    """The co-location loop of a calibration: per worker count, the step alone and with k at
    once, s(k) and the rounds' ratios."""
    t = Table(title=f"Co-location ({c.get('model')} training step, batch "
                    f"{c.get('batch_size')}, {c.get('rounds')} interleaved rounds)",
              title_justify="left")
    for col in ["workers at once", "step alone", "step together", "slowdown", "rounds' ratios",
                "CPU time"]:
        t.add_column(col, justify="right")
    for k, s in sorted(c["slowdown"].items(), key=lambda kv: int(kv[0])):
        ratios = sorted(c.get("ratios", {}).get(k, []))
        spread = f"{ratios[0]:.2f} … {ratios[-1]:.2f}" if ratios else "-"
        cpu = c.get("cpu_slowdown", {}).get(k)
        t.add_row(k, f"{c.get('alone_ns', float('nan')) / 1e6:,.1f} ms",
                  f"{c.get('together_ns', {}).get(k, float('nan')) / 1e6:,.1f} ms",
                  f"×{1 + max(0.0, s):.3f}", spread, "-" if cpu is None else f"×{1 + cpu:.3f}")
    t.caption = ("slowdown (what the model applies): the median over rounds of each round's "
                 "median step with k workers at once over its step alone (alone and together "
                 "back to back); CPU time: the same of the steps' CPU time (caches and memory "
                 "without the scheduler's share of the cores); load average "
                 f"{c.get('load_average', '?')} at the end")
    return t
