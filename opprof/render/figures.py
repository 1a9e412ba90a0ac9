"""Paper figures with matplotlib: the same charts as the HTML report, as SVG, PNG or PDF, with
readable fonts, units on every axis, legends and one colour per phase (opprof.render.palette).

A figure is made from a bench folder's results (:class:`~opprof.analysis.matrix.Bench`) or
from reports of one or more traces; :data:`FIGURES` names them and says which input each
needs. Text stays text in SVG and PDF (fonts embedded as TrueType), so a figure can be edited
and searched. Figures use matplotlib's object API (no pyplot state, no GUI backend).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure

from opprof.analysis.matrix import Bench
from opprof.analysis.report import Report
from opprof.errors import ErrorKind, OpprofError
from opprof.files import write_atomic
from opprof.render import palette, plotdata
from opprof.taxonomy import PHASES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.typing import RcKeyType

    from opprof.arrays import Array

#: Figure name → (what it shows, the inputs it takes: "bench", "traces" or both).
FIGURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "phases": ("wall-time phases per step, stacked: per framework × mode and model (bench), "
               "or one bar per trace", ("bench", "traces")),
    "ops": ("cross-framework operator ratios (bench), or the largest operators of each trace "
            "side by side", ("bench", "traces")),
    "scaling": ("speed-up vs workers, measured and predicted by the model", ("bench",)),
    "memory": ("memory per run (bench) or per rank (trace)", ("bench", "traces")),
    "steps": ("phases of every step of one trace, stacked", ("traces",)),
    "ranks": ("ranks × steps heatmap of own time, stragglers marked; wait vs transfer",
              ("traces",)),
    "devices": ("GPU compute / comm / memcpy / idle per device", ("traces",)),
    "convergence": ("loss and test accuracy against training time and step (runs recorded "
                    "with --converge)", ("bench", "traces")),
    "threads": ("time per mini-batch and speed-up against the compute threads, per framework "
                "(bench --threads 1,2,…)", ("bench",)),
    "batch": ("time per mini-batch and samples/s against the batch size, per framework "
              "(bench --batch-size 16,32,…)", ("bench",)),
    "roofline": ("each operator's arithmetic intensity and achieved FLOP/s under the machine's "
                 "ceilings, one panel per trace", ("traces",)),
}
SUFFIXES = (".svg", ".png", ".pdf")
#: Figures `opprof bench` writes into its figures/ folder.
BENCH_FIGURES = ("phases", "ops", "scaling", "memory")
#: The sweep figures `opprof bench` writes when it swept their dimension (figure → column).
SWEEP_FIGURES = {"threads": "threads", "batch": "batch_size"}
RC: dict[RcKeyType, Any] = {
    "font.family": "DejaVu Sans", "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9,
    "legend.fontsize": 8, "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.spines.top": False,
    "axes.spines.right": False, "axes.grid": True, "grid.color": "#E5E5E5", "grid.linewidth": 0.6,
    "axes.axisbelow": True, "svg.fonttype": "none", "pdf.fonttype": 42, "figure.dpi": 100,
    "savefig.dpi": 200, "savefig.bbox": "tight"}

Traces = list[tuple[str, Report]]


def make(name: str, source: Bench | Traces, top: int = 10) -> Figure:
    """The figure ``name`` from a bench's results or from (label, report) pairs."""
    if name not in FIGURES:
        raise OpprofError(f"no figure {name!r}; choose from {', '.join(FIGURES)}")
    kind = "bench" if isinstance(source, Bench) else "traces"
    if kind not in FIGURES[name][1]:
        need = "a bench folder" if FIGURES[name][1] == ("bench",) else "traces"
        raise OpprofError(f"--figure {name} needs {need} (it shows {FIGURES[name][0]})")
    with rc_context(RC):
        return MAKERS[name, kind](source, top)


def save(fig: Figure, path: Path) -> Path:
    """Write the figure atomically; the format comes from the suffix (.svg, .png, .pdf)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise OpprofError("a figure is written as .svg, .png or .pdf",
                          path=path, kind=ErrorKind.USAGE)
    with rc_context(RC):
        meta = {"Creator": "opprof"} if suffix in (".svg", ".pdf") else {"Software": "opprof"}
        write_atomic(path, lambda tmp: fig.savefig(tmp, format=suffix[1:], metadata=meta))
    return path


def _empty(what: str) -> OpprofError:
    return OpprofError(f"nothing to plot: {what}")


def _figure(w: float, h: float) -> Figure:
    return Figure(figsize=(w, h), layout="constrained")


def _stacked(ax: Axes, df: pd.DataFrame, horizontal: bool = False) -> None:
    """Stacked phase bars of ``df`` (rows: bars, columns: phases, ms)."""
    x = np.arange(len(df))
    bottom = np.zeros(len(df))
    for p in PHASES:
        v = df[p].to_numpy(float) if p in df else np.zeros(len(df))
        if not (v > 0).any():
            continue
        if horizontal:
            ax.barh(x, v, left=bottom, color=palette.PHASE_COLORS[p], label=p, height=0.7)
        else:
            ax.bar(x, v, bottom=bottom, color=palette.PHASE_COLORS[p], label=p, width=0.7)
        bottom += v
    labels = [str(i) for i in df.index]
    if horizontal:
        ax.set_yticks(x, labels)
        ax.invert_yaxis()
        ax.grid(axis="y", visible=False)
    else:
        ax.set_xticks(x, labels, rotation=30 if max(map(len, labels), default=0) > 8 else 0,
                      ha="right" if max(map(len, labels), default=0) > 8 else "center")
        ax.grid(axis="x", visible=False)


def _phase_legend(fig: Figure, axes: Axes | Array) -> None:
    handles, labels = {}, []
    for ax in (axes.flat if isinstance(axes, np.ndarray) else [axes]):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
    labels = [p for p in PHASES if p in handles]
    fig.legend([handles[p] for p in labels], labels, loc="outside upper center",
               ncols=len(labels), frameon=False, title="phase")


def _phases_bench(b: Bench, top: int) -> Figure:
    per_model = plotdata.bench_phases(b)
    if not per_model:
        raise _empty("the bench has no recorded run")
    n = len(per_model)
    width = max(3.2, 0.55 * max(len(df) for df in per_model.values()) + 1.2)
    fig = _figure(min(width * n, 14), 3.6)
    axes = fig.subplots(1, n, squeeze=False)[0]
    for ax, (model, df) in zip(axes, per_model.items(), strict=True):
        _stacked(ax, df)
        ax.set_title(model)
        ax.set_ylabel("ms per step")
    _phase_legend(fig, axes)
    return fig


def _phases_traces(traces: Traces, top: int) -> Figure:
    df = pd.DataFrame({label: plotdata.phase_means(rep) for label, rep in traces}).T
    fig = _figure(max(3.2, 0.9 * len(df) + 1.5), 3.6)
    ax = fig.subplots()
    _stacked(ax, df)
    ax.set_ylabel("ms per step")
    ax.set_title("Step breakdown (wall time)")
    _phase_legend(fig, ax)
    return fig


def _ops_bench(b: Bench, top: int) -> Figure:
    r = plotdata.bench_ratios(b).head(top)
    if r.empty:
        raise _empty("no cross-framework operator ratios (needs two frameworks recorded with "
                     "the same model, batch size and workers)")
    fig = _figure(6.4, 0.32 * len(r) + 1.2)
    ax = fig.subplots()
    y = np.arange(len(r))
    ax.barh(y, r["ratio"], color=palette.SERIES[0], height=0.65, label="slower / faster")
    ax.set_yticks(y, [f"{lab}\n{pair}" for lab, pair in zip(r["label"], r["pair"], strict=True)])
    ax.invert_yaxis()
    ax.axvline(1.0, color="#555555", linewidth=0.8)
    for yi, v in zip(y, r["ratio"], strict=True):
        ax.text(v, yi, f" {v:.2f}x", va="center", fontsize=8)
    ax.set_xlabel("time ratio, slower / faster framework (host ms per step)")
    ax.set_title("Operators with the largest cross-framework ratios")
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, float(r["ratio"].max()) * 1.18)
    return fig


def _ops_traces(traces: Traces, top: int) -> Figure:
    tables = {label: plotdata.op_rows(rep.ops, None).groupby("op")["ms_per_step"].sum()
              for label, rep in traces}
    df = pd.DataFrame(tables).fillna(0.0)
    if df.empty:
        raise _empty("the traces have no host operators")
    df = df.loc[df.max(axis=1).sort_values(ascending=False).index[:top]]
    fig = _figure(6.4, 0.25 * len(df) * max(1, len(traces)) ** 0.5 + 1.4)
    ax = fig.subplots()
    y = np.arange(len(df))
    h = 0.8 / len(df.columns)
    for i, label in enumerate(df.columns):
        ax.barh(y + (i - (len(df.columns) - 1) / 2) * h, df[label], height=h,
                color=palette.series_color(i), label=label)
    ax.set_yticks(y, df.index)
    ax.invert_yaxis()
    ax.set_xlabel("host ms per step")
    ax.set_title(f"Largest operators (top {len(df)})")
    ax.grid(axis="y", visible=False)
    if len(df.columns) > 1:
        ax.legend(loc="lower right", frameon=False)
    return fig


def _scaling_bench(b: Bench, top: int) -> Figure:
    sp = plotdata.bench_speedup(b)
    if sp.empty:
        raise _empty("no multi-worker run with its 1-worker run in the bench")
    fig = _figure(5.2, 3.6)
    ax = fig.subplots()
    nmax = int(sp["workers"].max())
    ax.plot([1, nmax], [1, nmax], color="#999999", linestyle=":", linewidth=1, label="ideal")
    for i, ((fw, model, mode), g) in enumerate(sp.groupby(["fw", "model", "mode"],
                                                          sort=False)):
        c = palette.framework_color(str(fw), i)
        name = f"{fw} {mode} · {model}"
        ax.plot(g["workers"], g["measured"], color=c, marker="o", label=f"{name} measured")
        if g["predicted"].iloc[1:].notna().any():
            ax.plot(g["workers"], g["predicted"], color=c, marker="s", linestyle="--",
                    markerfacecolor="white", label=f"{name} predicted")
    ax.set_xlabel("workers")
    ax.set_ylabel("speed-up  N · step(1) / step(N)")
    ax.set_xticks(sorted(sp["workers"].unique()))
    ax.set_title("Speed-up vs workers (profiled steps)")
    fig.legend(loc="outside right center", frameon=False)
    return fig


def _memory_bars(df: pd.DataFrame, title: str) -> Figure:
    series = [c for c in df.columns if c != "label"]
    fig = _figure(max(4.0, 0.28 * len(df) * len(series) + 2.0), 3.6)
    ax = fig.subplots()
    x = np.arange(len(df))
    w = 0.8 / len(series)
    for i, s in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * w, df[s], width=w, label=s,
               color=palette.MEMORY_COLORS.get(s, palette.series_color(i)))
    long = max(map(len, df["label"]), default=0) > 10
    ax.set_xticks(x, df["label"], rotation=30 if long else 0, ha="right" if long else "center")
    if plotdata.wants_log(df[series]):
        ax.set_yscale("log")
        ax.set_ylabel("MiB (log scale)")
    else:
        ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.grid(axis="x", visible=False)
    fig.legend(loc="outside upper center", ncols=min(len(series), 3), frameon=False)
    return fig


def _memory_bench(b: Bench, top: int) -> Figure:
    df = plotdata.bench_memory(b)
    if df.empty:
        raise _empty("the bench's runs have no memory samples")
    return _memory_bars(df, "Memory per run (largest worker)")


def _memory_traces(traces: Traces, top: int) -> Figure:
    frames = []
    for label, rep in traces:
        df = plotdata.memory_rows(rep)
        if not df.empty:
            if len(traces) > 1:
                df["label"] = [f"{label} · {x}" for x in df["label"]]
            frames.append(df)
    if not frames:
        raise _empty("no memory rows in the trace(s) (recorded by `opprof record` or "
                     "`opprof run`, or an allocator's counters)")
    return _memory_bars(pd.concat(frames, ignore_index=True), "Memory per rank")


def _one(traces: Traces, name: str) -> tuple[str, Report]:
    if len(traces) != 1:
        raise OpprofError(f"--figure {name} shows one trace; give one")
    return traces[0]


def _steps_traces(traces: Traces, top: int) -> Figure:
    label, rep = _one(traces, "steps")
    df = plotdata.step_phases(rep)
    if df.empty:
        raise _empty(f"{label} has no complete step")
    many = int(df["ranks"].max()) > 1
    fig = _figure(max(3.6, 0.45 * len(df) + 1.6), 3.6)
    ax = fig.subplots()
    _stacked(ax, df[list(PHASES)])
    ax.set_xlabel("step")
    ax.set_ylabel("ms" + (" (mean over ranks)" if many else ""))
    ax.set_title(f"Phases per step — {label}")
    _phase_legend(fig, ax)
    return fig


def _ranks_traces(traces: Traces, top: int) -> Figure:
    label, rep = _one(traces, "ranks")
    mat = plotdata.rank_step_matrix(rep)
    if mat.empty or len(mat) < 2:
        raise _empty(f"{label} has fewer than two ranks with steps")
    wt = plotdata.wait_transfer(rep)
    fig = _figure(9.0, max(2.8, 0.3 * len(mat) + 1.6))
    ax, ax2 = fig.subplots(1, 2, width_ratios=[3, 2])
    from matplotlib.colors import LinearSegmentedColormap

    cmap = LinearSegmentedColormap.from_list("opprof", palette.HEAT)
    im = ax.imshow(mat.to_numpy(float), aspect="auto", cmap=cmap, interpolation="nearest")
    ax.set_xticks(range(mat.shape[1]), [str(s) for s in mat.columns])
    ax.set_yticks(range(mat.shape[0]), [str(r) for r in mat.index])
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.grid(False)
    ax.set_title("Own time per rank and step (step − wait)")
    fig.colorbar(im, ax=ax, label="ms")
    st = plotdata.stragglers(rep)
    cols, rows = list(mat.columns), list(mat.index)
    pts = [(cols.index(s), rows.index(r))
           for s, r in zip(st["step"], st["slowest_rank"], strict=True)
           if s in cols and r in rows]
    if pts:
        ax.scatter(*zip(*pts, strict=True), marker="x", color=palette.STRAGGLER, s=40,
                   linewidths=1.6, label="straggler (slowest rank)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    y = np.arange(len(wt))
    left = np.zeros(len(wt))
    for col, name, color in (("own_ms", "own (not in comm)", palette.PHASE_COLORS["forward"]),
                             ("transfer_ms", "transfer", palette.PHASE_COLORS["comm"]),
                             ("wait_ms", "wait for others", "#F0A982")):
        ax2.barh(y, wt[col], left=left, color=color, label=name, height=0.7)
        left += wt[col].to_numpy(float)
    ax2.set_yticks(y, [str(r) for r in wt["rank"]])
    ax2.invert_yaxis()
    ax2.set_xlabel("ms per step")
    ax2.set_ylabel("rank")
    ax2.set_title("Wait vs transfer")
    ax2.grid(axis="y", visible=False)
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=3, frameon=False)
    return fig


def _devices_traces(traces: Traces, top: int) -> Figure:
    label, rep = _one(traces, "devices")
    d = plotdata.device_rows(rep)
    if d.empty:
        raise _empty(f"{label} has no GPU kernels or copies")
    fig = _figure(6.4, 0.4 * len(d) + 1.6)
    ax = fig.subplots()
    y = np.arange(len(d))
    left = np.zeros(len(d))
    for p in plotdata.DEVICE_PARTS:
        v = d[f"{p}_ms"].to_numpy(float)
        ax.barh(y, v, left=left, color=palette.DEVICE_COLORS[p], label=p, height=0.6,
                edgecolor="#BBBBBB" if p == "idle" else "none", linewidth=0.5)
        left += v
    ax.set_yticks(y, d["label"])
    ax.invert_yaxis()
    ax.set_xlabel(f"ms over the {rep.device_span} span")
    ax.set_title("GPU time per device")
    ax.grid(axis="y", visible=False)
    fig.legend(loc="outside upper center", ncols=4, frameon=False)
    return fig


def _convergence(curves: pd.DataFrame) -> Figure:
    if curves.empty:
        raise _empty("convergence curves (record or bench with --converge)")
    fig = _figure(9.0, 6.0)
    axes = fig.subplots(2, 2)
    for i, (lab, g) in enumerate(curves.groupby("label", sort=False)):
        color = palette.series_color(i)
        for k, (_, r) in enumerate(g.groupby("repeat")):
            ev = r.dropna(subset=["test_accuracy"])
            style = {"color": color, "alpha": 1.0 if k == 0 else 0.5, "linewidth": 1.2}
            for col, x in enumerate(("time_s", "step")):
                axes[0][col].plot(r[x], r["loss"], label=lab if col == 0 and k == 0 else None,
                                  **style)
                axes[1][col].plot(ev[x], ev["test_accuracy"], marker="o", markersize=3,
                                  **style)
    for col, xl in enumerate(("training time (s)", "step")):
        axes[1][col].set_xlabel(xl)
        axes[1][col].yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    axes[0][0].set_ylabel("loss")
    axes[1][0].set_ylabel("test accuracy")
    fig.legend(loc="upper center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 1.04))
    return fig


def _convergence_bench(b: Bench, top: int) -> Figure:
    return _convergence(plotdata.bench_curves(b))


def _roofline_figure(traces: Traces, top: int) -> Figure:
    from opprof.render.roofline import figure

    return figure(traces, top)


def _convergence_traces(traces: Traces, top: int) -> Figure:
    return _convergence(plotdata.trace_curves(traces))


#: (figure, input) → the function drawing it: every (name, input) :data:`FIGURES` lists.
MAKERS: dict[tuple[str, str], Callable[[Any, int], Figure]] = {
    ("phases", "bench"): _phases_bench, ("phases", "traces"): _phases_traces,
    ("ops", "bench"): _ops_bench, ("ops", "traces"): _ops_traces,
    ("scaling", "bench"): _scaling_bench,
    ("memory", "bench"): _memory_bench, ("memory", "traces"): _memory_traces,
    ("steps", "traces"): _steps_traces,
    ("ranks", "traces"): _ranks_traces,
    ("devices", "traces"): _devices_traces,
    ("convergence", "bench"): _convergence_bench, ("convergence", "traces"): _convergence_traces,
    ("roofline", "traces"): lambda traces, top: _roofline_figure(traces, top),
}


def _sweep_bench(b: Bench, dim: str, title: str) -> Figure:
    """Two panels along a swept dimension: time per mini-batch (log scale) and speed-up
    (threads) or samples/s (batch size), one line per framework × model × workers × mode
    (and the other dimension's value)."""
    df = b.sweeps.get(dim)
    if df is None or df.empty:
        raise _empty(f"no sweep over {title} in this bench (bench --{dim.replace('_', '-')} "
                     "with two values or more)")
    other = "batch_size" if dim == "threads" else "threads"
    fig = _figure(9.5, 3.6)
    left, right = fig.subplots(1, 2)
    groups = df.groupby(["fw", "model", "workers", "mode", other], dropna=False, sort=False)
    fixed_values = sorted({int(v) for v in df[other].dropna()})
    styles = ("-", "--", "-.", ":")
    for i, (key, g) in enumerate(groups):
        fw, model, workers, mode, fixed = key
        g = g.sort_values(dim)
        label = f"{fw} {model}" + (f" x{workers} {mode}" if workers != 1 else "") + (
            f", {other.replace('_', ' ')} {int(fixed)}" if fixed == fixed and fixed is not None
            else "")
        # one colour per framework (and model), one line style per value of the other sweep
        color = palette.framework_color(str(fw), i) if df["model"].nunique() == 1 \
            else palette.series_color(i)
        style = styles[fixed_values.index(int(fixed)) % len(styles)] \
            if fixed == fixed and fixed is not None else "-"
        x = g[dim].to_numpy(float)
        left.plot(x, g["step_ns"].to_numpy(float) / 1e6, marker="o", color=color,
                  linestyle=style, label=label)
        y = g["speedup"] if dim == "threads" else g["samples_per_s"]
        right.plot(x, pd.to_numeric(y, errors="coerce").to_numpy(float), marker="o",
                   color=color, linestyle=style, label=label)
    xs = sorted(df[dim].dropna().astype(int).unique())
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(v) for v in xs])
        ax.set_xlabel(title)
    left.set_yscale("log")
    left.set_ylabel("time per mini-batch (ms, unprofiled)")
    left.set_title(f"step time against {title}")
    if dim == "threads":
        right.plot(xs, [v / xs[0] for v in xs], color="#999999", linestyle=":", linewidth=2,
                   label="linear")
        right.set_ylabel(f"speed-up over {xs[0]} thread(s)")
        right.set_title("speed-up")
    else:
        right.set_ylabel("samples/s")
        right.set_title(f"throughput against {title}")
    right.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    return fig


def _threads_bench(b: Bench, top: int) -> Figure:
    return _sweep_bench(b, "threads", "threads")


def _batch_bench(b: Bench, top: int) -> Figure:
    return _sweep_bench(b, "batch_size", "batch size")


MAKERS[("threads", "bench")] = _threads_bench
MAKERS[("batch", "bench")] = _batch_bench
