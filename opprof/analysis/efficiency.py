"""How well a run uses the machine: FLOPs and bytes per step, MFU and HFU, per rank and step.

Per rank (:func:`efficiency_part`, a small table beside the report's other parts) the costs of
the counted operators (:mod:`opprof.flops`) are summed per step, per (operator, phase) and per
GPU kernel; :func:`combine` turns the parts into an :class:`Efficiency` against the machine's
:class:`~opprof.flops.peaks.Peak`:

* ``flops_per_step``: the model FLOPs of one step of one worker — the matmul-like work the model
  needs (GEMMs, convolutions, attention, recurrent cells), forward and backward, what
  ``torch.utils.flop_counter.FlopCounterMode`` counts; recomputation left out;
* hardware FLOPs: all the FLOPs the operators did, recomputation and vector work included;
* ``bytes_per_step``: what the operators read and wrote in memory;
* ``achieved_flops_per_s`` = model FLOPs per step / step time; ``mfu`` = that / the peak;
  ``hfu`` = hardware FLOPs per step / step time / the peak. The step time is the run's
  unprofiled one where the trace has it (the profiler's own overhead left out), else the
  profiled steps' mean; per rank and per step, the profiled steps' own.

FLOPs are those of the operators whose shapes the trace holds; ``coverage`` is the share of
operator time (communication and data loading aside) whose cost is known, so a figure with
coverage below 1 is a lower bound. No shapes at all: no efficiency (None), never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from opprof.analysis.ops import op_mask
from opprof.analysis.roofline import roofline
from opprof.flops.peaks import Peak, PeakOptions, read_calibration, resolve
from opprof.taxonomy import COLLECTIVES, COMM_OPS, PS_OPS

if TYPE_CHECKING:
    from opprof.jsontypes import JSON, JSONObject
    from opprof.meta import MetaMapping
    from opprof.trace import Trace

#: Operators that do no FLOPs by their nature: not counted against coverage.
NO_FLOPS = frozenset({*COMM_OPS, *COLLECTIVES, *PS_OPS, "data_load", "h2d", "compile", "guard"})
STEP_COLUMNS = ["rank", "step", "flops", "model_flops", "mem_bytes", "known_ns", "op_ns"]
WORK_COLUMNS = ["op", "phase", "flops", "model_flops", "mem_bytes", "time_ns", "count",
                "precision"]


@dataclass
class EfficiencyPart:
    """One rank's (or a few ranks') costs: per (rank, step), per (op, phase) on the host and
    on devices, per device kernel name; model FLOPs per precision."""

    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))
    host: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=WORK_COLUMNS))
    device: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=WORK_COLUMNS))
    kernels: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["kernel", *WORK_COLUMNS]))
    precision: dict[str, float] = field(default_factory=dict)


def _work(sel: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Sums per ``keys`` (FLOPs, bytes, time, count) and the precision of most model FLOPs."""
    if sel.empty:
        return pd.DataFrame(columns=[*keys, *WORK_COLUMNS[2:]])
    g = sel.groupby(keys, observed=True, sort=False)
    out = g[["flops", "model_flops", "mem_bytes"]].sum(min_count=1)
    out["time_ns"] = g["dur"].sum()
    out["count"] = g.size()
    out = out.reset_index()
    weight = sel["model_flops"].fillna(0) * 4 + sel["flops"].fillna(0) * 1e-9
    top = sel.assign(_w=weight.to_numpy()).sort_values("_w", ascending=False,
                                                      kind="stable").drop_duplicates(keys)
    prec = top.set_index(keys)["precision"].astype(object)
    out["precision"] = prec.reindex(pd.MultiIndex.from_frame(out[keys]) if len(keys) > 1
                                    else out[keys[0]]).to_numpy(object)
    for k in keys:
        out[k] = out[k].astype(object)
    return out


def efficiency_part(trace: Trace) -> EfficiencyPart:
    """The per-rank costs of a report (see the module docstring)."""
    ev = trace.events
    if "flops" not in ev or not ev["flops"].notna().any():
        return EfficiencyPart()
    cols = ["rank", "step", "op", "phase", "dur", "flops", "model_flops", "mem_bytes",
            "precision"]
    host = ev.loc[op_mask(ev, "host"), cols]
    host = host[host["op"].notna()]
    counted_op = ~host["op"].astype(object).isin(NO_FLOPS).to_numpy()
    known = host["flops"].notna().to_numpy()
    steps = pd.DataFrame({
        "rank": host["rank"].to_numpy(np.int64), "step": host["step"].to_numpy(np.int64),
        "flops": host["flops"].fillna(0).to_numpy(), "model_flops":
            host["model_flops"].fillna(0).to_numpy(),
        "mem_bytes": host["mem_bytes"].fillna(0).to_numpy(),
        "known_ns": np.where(known & counted_op, host["dur"].to_numpy(np.int64), 0),
        "op_ns": np.where(counted_op, host["dur"].to_numpy(np.int64), 0)})
    steps = steps.groupby(["rank", "step"], sort=True).sum().reset_index()
    device = ev.loc[op_mask(ev, "device"), ["name", *cols]]
    device = device[device["op"].notna()]
    prec = host.loc[host["model_flops"].fillna(0) > 0].groupby(
        host["precision"].astype(object), observed=True)["model_flops"].sum()
    kernels = _work(device.rename(columns={"name": "kernel"}), ["kernel", "op", "phase"])
    return EfficiencyPart(steps, _work(host, ["op", "phase"]), _work(device, ["op", "phase"]),
                          kernels, {str(k): float(v) for k, v in prec.items() if k})


def merge_parts(parts: list[EfficiencyPart]) -> EfficiencyPart:
    """Several ranks' parts as one (sums per key)."""
    def merged(frames: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame:
        full = [f for f in frames if len(f)]
        if not full:
            return frames[0] if frames else pd.DataFrame()
        df = pd.concat(full, ignore_index=True)
        weight = df["model_flops"].fillna(0) * 4 + df["flops"].fillna(0) * 1e-9
        top = df.assign(_w=weight).sort_values("_w", ascending=False, kind="stable")
        prec = top.drop_duplicates(keys).set_index(keys)["precision"]
        g = df.groupby(keys, sort=False)
        out = g[["flops", "model_flops", "mem_bytes"]].sum(min_count=1)
        out[["time_ns", "count"]] = g[["time_ns", "count"]].sum()
        out = out.reset_index()
        out["precision"] = prec.reindex(pd.MultiIndex.from_frame(out[keys])).to_numpy(object)
        return out

    precision: dict[str, float] = {}
    for p in parts:
        for k, v in p.precision.items():
            precision[k] = precision.get(k, 0.0) + v
    steps = [p.steps for p in parts if len(p.steps)]
    return EfficiencyPart(
        pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(columns=STEP_COLUMNS),
        merged([p.host for p in parts], ["op", "phase"]),
        merged([p.device for p in parts], ["op", "phase"]),
        merged([p.kernels for p in parts], ["kernel", "op", "phase"]), precision)


@dataclass
class Efficiency:
    """How well a run uses the machine (see the module docstring). FLOPs and bytes are per
    step of one worker (the mean over workers and steps); None where unknown."""

    flops_per_step: float | None
    hardware_flops_per_step: float | None
    bytes_per_step: float | None
    step_ns: float | None
    step_basis: str
    achieved_flops_per_s: float | None
    peak: Peak
    mfu: float | None
    hfu: float | None
    coverage: float
    precision: str
    #: Per rank: rank, steps, flops_per_step, hardware_flops_per_step, bytes_per_step,
    #: step_ns (profiled mean), achieved_flops_per_s, mfu, hfu.
    ranks: pd.DataFrame
    #: Per (rank, step): flops, hardware_flops, bytes, dur_ns, mfu, hfu.
    steps: pd.DataFrame
    #: The roofline of each (op, phase) (opprof.analysis.roofline), and of each GPU kernel.
    roofline: pd.DataFrame
    kernels: pd.DataFrame
    #: Model FLOPs per step by precision.
    by_precision: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> JSONObject:
        """The contract's ``efficiency`` object (DESIGN.md, Round 4)."""
        return {"flops_per_step": _num(self.flops_per_step),
                "bytes_per_step": _num(self.bytes_per_step),
                "achieved_flops_per_s": _num(self.achieved_flops_per_s),
                "peak_flops_per_s": _num(self.peak.flops_per_s),
                "peak_source": self.peak.source or None,
                "mfu": _num(self.mfu), "hfu": _num(self.hfu)}

    def detail_dict(self) -> JSONObject:
        """What ``efficiency`` does not hold: the hardware FLOPs, the step time and its basis,
        the precision and peak bandwidth, coverage, and the per-rank and per-step figures."""
        def rows(df: pd.DataFrame) -> list[Any]:
            return [{k: _num(v) if isinstance(v, (float, np.floating)) else
                     (int(v) if isinstance(v, (np.integer,)) else v)
                     for k, v in r.items()} for r in df.to_dict("records")]

        return {"hardware_flops_per_step": _num(self.hardware_flops_per_step),
                "step_ns": _num(self.step_ns), "step_basis": self.step_basis,
                "precision": self.precision or None,
                "peak_bytes_per_s": _num(self.peak.bytes_per_s),
                "peak_vector_flops_per_s": _num(self.peak.vector_flops_per_s),
                "peak_device": self.peak.device or None, "no_peak_reason": self.peak.why or None,
                "coverage": _num(self.coverage),
                "model_flops_per_step_by_precision": {k: _num(v) for k, v in
                                                      self.by_precision.items()},
                "ranks": rows(self.ranks), "steps": rows(self.steps)}


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if np.isnan(f) or np.isinf(f) else f


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or np.isnan(a) or np.isnan(b):
        return None
    return a / b


def combine(parts: list[EfficiencyPart], meta: MetaMapping, steps: pd.DataFrame,
            options: PeakOptions | None = None) -> Efficiency | None:
    """The run's :class:`Efficiency` from its ranks' parts, its step breakdown (``steps``:
    rank, step, dur_ns) and the peak (``options``: the user's figures and the CPU calibration
    file, read here); None when no operator of the trace has a known cost."""
    part = merge_parts(parts)
    if part.steps.empty:
        return None
    st = part.steps.merge(steps[["rank", "step", "dur_ns"]], on=["rank", "step"], how="inner")
    if st.empty or not (st["known_ns"] > 0).any():
        return None
    by_prec = dict(sorted(part.precision.items(), key=lambda kv: -kv[1]))
    precision = next(iter(by_prec), "")
    calibration = (read_calibration(options.calibration)
                   if options is not None and options.calibration is not None else None)
    peak = resolve(meta, precision, options, calibration)
    n = len(st)
    model = float(st["model_flops"].sum()) / n
    hw = float(st["flops"].sum()) / n
    nbytes = float(st["mem_bytes"].sum()) / n
    unprofiled = meta.get("unprofiled_step_ns")
    if isinstance(unprofiled, (int, float)) and unprofiled > 0:
        step_ns, basis = float(unprofiled), "unprofiled"
    else:
        step_ns, basis = float(st["dur_ns"].mean()), "profiled"
    achieved = model / (step_ns / 1e9) if step_ns > 0 else None
    peak_f = peak.flops_per_s
    coverage = float(st["known_ns"].sum()) / max(float(st["op_ns"].sum()), 1.0)
    st = st.assign(hardware_flops=st["flops"], flops=st["model_flops"], bytes=st["mem_bytes"])
    secs = st["dur_ns"].to_numpy(np.float64) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        st["mfu"] = st["flops"] / secs / peak_f if peak_f else np.nan
        st["hfu"] = st["hardware_flops"] / secs / peak_f if peak_f else np.nan
    per_step = st[["rank", "step", "flops", "hardware_flops", "bytes", "dur_ns", "mfu", "hfu"]]
    g = st.groupby("rank", sort=True)
    ranks = pd.DataFrame({"steps": g.size(), "flops_per_step": g["flops"].mean(),
                          "hardware_flops_per_step": g["hardware_flops"].mean(),
                          "bytes_per_step": g["bytes"].mean(),
                          "step_ns": g["dur_ns"].mean()}).reset_index()
    ranks["achieved_flops_per_s"] = ranks["flops_per_step"] / (ranks["step_ns"] / 1e9)
    with np.errstate(divide="ignore", invalid="ignore"):
        ranks["mfu"] = ranks["achieved_flops_per_s"] / peak_f if peak_f else np.nan
        ranks["hfu"] = (ranks["hardware_flops_per_step"] / (ranks["step_ns"] / 1e9)
                        / peak_f) if peak_f else np.nan
    on_device = not part.device.empty and float(part.device["time_ns"].sum()) > 0
    work = _roofline_work(part, on_device)
    return Efficiency(
        flops_per_step=model, hardware_flops_per_step=hw, bytes_per_step=nbytes,
        step_ns=step_ns, step_basis=basis, achieved_flops_per_s=achieved, peak=peak,
        mfu=_ratio(achieved, peak_f),
        hfu=_ratio(hw / (step_ns / 1e9) if step_ns > 0 else None, peak_f),
        coverage=coverage, precision=peak.precision or precision,
        ranks=ranks, steps=per_step.reset_index(drop=True),
        roofline=roofline(work, peak, n),
        kernels=roofline(part.kernels, peak, n) if on_device else roofline(
            part.kernels.iloc[0:0], peak, n),
        by_precision={k: v / n for k, v in by_prec.items()})


def _roofline_work(part: EfficiencyPart, on_device: bool) -> pd.DataFrame:
    """Per (op, phase): costs from the host operators, time from their kernels on a GPU
    trace (the host's time otherwise)."""
    host = part.host
    if not on_device:
        return host[host["flops"].notna() | host["mem_bytes"].notna()].reset_index(drop=True)
    dev = part.device.set_index(["op", "phase"])
    h = host.set_index(["op", "phase"])
    keys = dev.index.union(h.index)
    out = pd.DataFrame(index=keys)
    for c in ("flops", "model_flops", "mem_bytes"):
        out[c] = h[c].reindex(keys)
    out["time_ns"] = dev["time_ns"].reindex(keys)
    out["count"] = dev["count"].reindex(keys)
    out["precision"] = h["precision"].reindex(keys).where(
        h["precision"].reindex(keys).notna(), dev["precision"].reindex(keys))
    out = out[out["time_ns"].notna() & (out["flops"].notna() | out["mem_bytes"].notna())]
    return out.reset_index()


@dataclass
class EfficiencyComparison:
    """Which of two runs uses its machine better (the higher MFU, each against its own peak;
    on the same peak, the higher achieved FLOP/s), and which operators explain it."""

    a: Efficiency | None
    b: Efficiency | None
    #: "A", "B", or None (equal, or not comparable: a side without FLOPs or without a peak).
    better: str | None
    #: Per op (matmul-like or not, with FLOPs on either side): a_flops_per_step,
    #: b_flops_per_step, a_flops_per_s, b_flops_per_s (achieved over the op's time),
    #: a_peak_share, b_peak_share (achieved / each side's peak of the op's precision),
    #: share_of_gap (the op's part of the difference in peak share weighted by its FLOPs),
    #: by share_of_gap.
    ops: pd.DataFrame
    #: What ranks the runs: "achieved FLOP/s" (the same peak on both sides) or "MFU".
    what: str = "MFU"
    #: Per side without an MFU: "label: why" (no operator shapes, no peak).
    missing: tuple[str, ...] = ()

    def to_dict(self) -> JSONObject:
        def side(e: Efficiency | None) -> JSON:
            return e.to_dict() if e is not None else None

        ops: list[JSON] = [{k: (None if isinstance(v, float) and np.isnan(v) else v)
                                 for k, v in r.items()} for r in self.ops.to_dict("records")]
        return {"a": side(self.a), "b": side(self.b), "better": self.better, "ops": ops}


#: The frameworks whose traces opprof has no FLOPs model for, by their names.
NO_FLOPS_MODEL = {"jax": "JAX", "chainer": "Chainer"}


def compare(a: Efficiency | None, b: Efficiency | None, la: str = "A",
            lb: str = "B", frameworks: tuple[str, str] = ("", "")) -> EfficiencyComparison:
    """Compare two runs' efficiency (see :class:`EfficiencyComparison`). An op's peak share
    is its achieved FLOP/s over its side's peak of the op's precision; an op explains the gap
    by the difference of its peak shares weighted by its share of the better run's FLOPs."""
    empty = pd.DataFrame(columns=["op", "a_flops_per_step", "b_flops_per_step",
                                  "a_flops_per_s", "b_flops_per_s", "a_peak_share",
                                  "b_peak_share", "share_of_gap"])
    def why(e: Efficiency | None, fw: str) -> str:
        if e is not None:
            return e.peak.why or "no peak"
        if fw in NO_FLOPS_MODEL:
            return f"no FLOPs model for {NO_FLOPS_MODEL[fw]} traces"
        return "no operator shapes"

    missing = [f"{name}: {why(e, fw)}" for name, e, fw in
               ((la, a, frameworks[0]), (lb, b, frameworks[1])) if e is None or e.mfu is None]
    if a is None or b is None:
        return EfficiencyComparison(a, b, None, empty, missing=tuple(missing))

    def per_op(e: Efficiency) -> pd.DataFrame:
        r = e.roofline
        if r.empty:
            return pd.DataFrame(columns=["flops", "rate", "share"])
        g = r.groupby("op", observed=True)
        flops = g["flops"].sum(min_count=1)
        time = (r["time_ns_per_step"] / 1e9).groupby(r["op"]).sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = flops / time
            share = (r["achieved_flops_per_s"] / r["peak_flops_per_s"] * r["flops"]).groupby(
                r["op"]).sum() / flops
        return pd.DataFrame({"flops": flops, "rate": rate, "share": share})

    pa, pb = per_op(a), per_op(b)
    ops = pd.DataFrame({"a_flops_per_step": pa["flops"], "b_flops_per_step": pb["flops"],
                        "a_flops_per_s": pa["rate"], "b_flops_per_s": pb["rate"],
                        "a_peak_share": pa["share"], "b_peak_share": pb["share"]})
    ops = ops[(ops["a_flops_per_step"].fillna(0) > 0) | (ops["b_flops_per_step"].fillna(0) > 0)]
    if a.mfu is not None and b.mfu is not None and a.peak.flops_per_s == b.peak.flops_per_s:
        key_a, key_b, what = a.achieved_flops_per_s, b.achieved_flops_per_s, "achieved FLOP/s"
    else:
        key_a, key_b, what = a.mfu, b.mfu, "MFU"
    better = None
    if key_a is not None and key_b is not None and key_a != key_b:
        better = "A" if key_a > key_b else "B"
    if better is not None and len(ops):
        top = ops["a_flops_per_step" if better == "A" else "b_flops_per_step"].fillna(0)
        weight = top / top.sum() if top.sum() else top
        sign = 1 if better == "A" else -1
        gap = sign * (ops["a_peak_share"] - ops["b_peak_share"]) * weight
        ops["share_of_gap"] = gap / gap[gap > 0].sum() if (gap > 0).any() else np.nan
    else:
        ops["share_of_gap"] = np.nan
    ops = ops.rename_axis("op").reset_index().sort_values(
        "share_of_gap", ascending=False, kind="stable", na_position="last").reset_index(
        drop=True)
    return EfficiencyComparison(a, b, better, ops, what, tuple(missing))
