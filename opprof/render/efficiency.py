"""Words and tables of a report's efficiency (MFU, HFU, the roofline), for every format.

The analysis is :mod:`opprof.analysis.efficiency`; this module only formats it: the headline
lines every text report starts with, the ``--by roofline`` tables, and the JSON keys
(``efficiency`` exactly as DESIGN.md's contract names it, the rest beside it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from opprof.render.units import flop, flops_rate, ms, rate, share, size

if TYPE_CHECKING:
    from opprof.analysis.efficiency import Efficiency, EfficiencyComparison
    from opprof.analysis.report import Report
    from opprof.jsontypes import JSONObject

#: Why a trace has no efficiency figures.
NO_SHAPES = ("efficiency: unknown — no operator in this trace has the shapes its FLOPs need "
             "(torch: record with record_shapes=True, as opprof record and opprof run do; "
             "TensorFlow and MXNet: record with opprof, which keeps the graph's shapes; a .trace "
             "written before opprof counted FLOPs: opprof import its native files again)")


def headline(rep: Report) -> list[str]:
    """The efficiency lines a report starts with: MFU and HFU against the named peak, FLOPs and
    bytes per step, per rank and per step."""
    eff = rep.efficiency
    if eff is None:
        from opprof.analysis.efficiency import NO_FLOPS_MODEL

        fw = str(rep.meta.get("framework") or "")
        if fw in NO_FLOPS_MODEL:
            return [f"efficiency: unknown — opprof counts no FLOPs of {NO_FLOPS_MODEL[fw]} "
                    "traces yet (torch, TensorFlow and MXNet traces have them)"]
        return [NO_SHAPES]
    peak = eff.peak
    if eff.mfu is not None:
        first = (f"efficiency: MFU {share(eff.mfu)}, HFU {share(eff.hfu)} of "
                 f"{flops_rate(peak.flops_per_s)} ({peak.source})")
    else:
        first = f"efficiency: MFU unknown: {peak.why or 'no peak'}"
    basis = ("the unprofiled step" if eff.step_basis == "unprofiled"
             else "the profiled steps' mean")
    second = (f"  {flop(eff.flops_per_step)}/step model ({flop(eff.hardware_flops_per_step)} "
              f"hardware, {size(eff.bytes_per_step)} moved) per worker, "
              f"{flops_rate(eff.achieved_flops_per_s)} on {basis} of {ms(eff.step_ns)} ms")
    if eff.coverage < 0.995:
        second += (f"; FLOPs known for {share(eff.coverage, 0)} of operator time "
                   "(a lower bound)")
    spread = _spread(eff)
    if spread:
        second += f"; {spread}"
    return [first, second + "  (--by roofline for more)"]


def _spread(eff: Efficiency) -> str:
    """Per rank and per step MFU, lowest to highest (where there is a peak)."""
    parts = []
    if eff.peak.flops_per_s and len(eff.ranks) > 1:
        lo = eff.ranks.loc[eff.ranks["mfu"].idxmin()]
        parts.append(f"per rank MFU {share(eff.ranks['mfu'].min())}–"
                     f"{share(eff.ranks['mfu'].max())} (lowest: rank {int(lo['rank'])})")
    if eff.peak.flops_per_s and len(eff.steps) > 1:
        parts.append(f"per step {share(eff.steps['mfu'].min())}–"
                     f"{share(eff.steps['mfu'].max())}")
    return ", ".join(parts)


def _fmt(v: object, how: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    f = float(v)  # type: ignore[arg-type]
    if how in ("flop", "rate"):
        return flop(f, "").strip()
    if how == "bytes":
        return size(f)
    if how == "bps":
        return rate(f)
    if how == "share":
        return share(f)
    if how == "ms":
        return ms(f)
    return f"{f:,.2f}"


ROOFLINE_VIEW = [("op", "op", ""), ("phase", "phase", ""), ("flops", "FLOP/step", "flop"),
                 ("bytes", "bytes/step", "bytes"), ("intensity", "FLOP/B", "num"),
                 ("achieved_flops_per_s", "FLOP/s", "rate"),
                 ("roofline_share", "% roof", "share"), ("bound", "bound", ""),
                 ("time_ns_per_step", "ms/step", "ms")]


def roofline_rows(df: pd.DataFrame, top: int | None, kernel: bool = False
                  ) -> tuple[list[str], list[list[str]]]:
    """(header, rows as text) of a roofline table (per op, or per kernel)."""
    view = ([("kernel", "kernel", "")] if kernel else []) + [
        v for v in ROOFLINE_VIEW if not (kernel and v[0] in ("op", "phase"))]
    df = df if top is None else df.head(top)
    rows = [[(_short(str(r[c])) if c == "kernel" else str(r[c])) if not how
             else _fmt(r[c], how) for c, _, how in view] for r in df.to_dict("records")]
    return [h for _, h, _ in view], rows


def _short(name: str, width: int = 44) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def rank_rows(eff: Efficiency) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of MFU per rank."""
    head = ["rank", "steps", "FLOP/step", "hardware FLOP/step", "ms/step", "achieved FLOP/s",
            "MFU", "HFU"]
    rows = [[str(int(r["rank"])), str(int(r["steps"])), flop(r["flops_per_step"]),
             flop(r["hardware_flops_per_step"]), ms(r["step_ns"]),
             flops_rate(r["achieved_flops_per_s"]), share(r["mfu"]), share(r["hfu"])]
            for r in eff.ranks.to_dict("records")]
    return head, rows


def roofline_table(rep: Report, top: int | None) -> pd.DataFrame:
    """The table `--by roofline` exports (csv, md): per op, then per GPU kernel (``kernel``
    set)."""
    eff = rep.efficiency
    if eff is None:
        return pd.DataFrame(columns=["op", "phase"])
    ops = eff.roofline if top is None else eff.roofline.head(top)
    kernels = eff.kernels if top is None else eff.kernels.head(top)
    frames = [ops.assign(kernel="")]
    if len(kernels):
        frames.append(kernels)
    out = pd.concat(frames, ignore_index=True)
    first = ["kernel", "op", "phase"]
    return out[first + [c for c in out.columns if c not in first]]


def json_dict(rep: Report) -> JSONObject:
    """The report's JSON keys: ``efficiency`` (the contract's seven keys, null where unknown),
    ``efficiency_detail`` (hardware FLOPs, the step time and its basis, precision, bandwidth,
    coverage, per rank, per step), ``roofline`` (per op and phase: op, phase, flops, bytes,
    intensity, achieved_flops_per_s, achieved_bytes_per_s, roofline_share, bound; FLOPs and
    bytes per step) and ``roofline_kernels`` (the same per GPU kernel, with ``kernel``)."""
    from opprof.analysis.roofline import COLUMNS
    from opprof.render.jsonvalues import records

    eff = rep.efficiency
    if eff is None:
        return {"efficiency": {"flops_per_step": None, "bytes_per_step": None,
                               "achieved_flops_per_s": None, "peak_flops_per_s": None,
                               "peak_source": None, "mfu": None, "hfu": None},
                "efficiency_detail": {"why": NO_SHAPES}, "roofline": [], "roofline_kernels": []}
    cols = [*COLUMNS, "time_ns_per_step"]
    return {"efficiency": eff.to_dict(), "efficiency_detail": eff.detail_dict(),
            "roofline": records(eff.roofline[cols]),
            "roofline_kernels": records(eff.kernels[["kernel", *cols]]) if len(eff.kernels)
            else []}


def calibration_text(doc: JSONObject, fmt: str = "rich") -> str:
    """A peak calibration (``opprof calibrate --peak``) as text: one line per thread count;
    the document itself as JSON for ``--format json``."""
    import json

    if fmt == "json":
        return json.dumps(doc, indent=2)
    rows = doc.get("threads") or []
    lines = [f"peak of {doc.get('cpu')} on {doc.get('host')} ({doc.get('created')}):"]
    for r in rows if isinstance(rows, list) else []:
        if not isinstance(r, dict):
            continue
        flops = r.get("flops") or {}
        rates = ", ".join(f"{p} {flops_rate(v)}" for p, v in flops.items()) if isinstance(
            flops, dict) else ""
        lines.append(f"  {r.get('threads')} thread(s): GEMM {rates}; "
                     f"memory {rate(r.get('bandwidth'))}")
    return "\n".join(lines)


def diff_rows(e: EfficiencyComparison, top: int | None) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a diff's efficiency table: per op, A and B achieved FLOP/s and share
    of peak, and its share of the MFU difference."""
    head = ["op", "A FLOP/step", "B FLOP/step", "A FLOP/s", "B FLOP/s", "A % peak",
            "B % peak", "share of gap"]
    df = e.ops if top is None else e.ops.head(top)
    rows = [[str(r["op"]), flop(r["a_flops_per_step"]), flop(r["b_flops_per_step"]),
             flops_rate(r["a_flops_per_s"]), flops_rate(r["b_flops_per_s"]),
             share(r["a_peak_share"]), share(r["b_peak_share"]), share(r["share_of_gap"], 0)]
            for r in df.to_dict("records")]
    return head, rows
