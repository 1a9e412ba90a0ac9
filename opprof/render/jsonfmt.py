"""JSON output for machines: the report and diff schemas documented in the README."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.taxonomy import PHASES


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    if hasattr(v, "item"):
        return _clean(v.item())
    return v


def records(df: pd.DataFrame) -> list[dict]:
    """DataFrame rows as JSON-safe dicts."""
    return [{k: _clean(v) for k, v in row.items()} for row in df.to_dict("records")]


def report_dict(rep: Report, top: int | None = None) -> dict:
    """The report as a plain dict."""
    steps = [
        {"rank": int(r["rank"]), "step": int(r["step"]), "dur_ns": int(r["dur_ns"]),
         "phases": {p: int(r[p]) for p in PHASES},
         "busy": {c[5:]: int(r[c]) for c in rep.steps.columns if c.startswith("busy_")},
         "comm_overlap_ns": int(r["comm_overlap_ns"])}
        for r in rep.steps.to_dict("records")
    ]
    phases = {p: {k: _clean(v) for k, v in row.items()}
              for p, row in rep.phases.to_dict("index").items()}
    ops = rep.ops if top is None else rep.ops.head(top)
    dev = rep.device_ops if top is None else rep.device_ops.head(top)
    return {"meta": rep.meta, "steps": steps, "phases": phases,
            "comm_overlap": _clean(rep.comm_overlap), "ops": records(ops),
            "device_ops": records(dev), "ranks": records(rep.ranks),
            "devices": records(rep.devices), "device_span": rep.device_span,
            "stragglers": records(rep.stragglers), "noise": rep.noise}


def report(rep: Report, by: str = "phase", top: int | None = None) -> str:
    """The whole report as JSON (``by`` does not change the JSON)."""
    return json.dumps(report_dict(rep, top), indent=2, default=str)


def diff(d: Diff, top: int | None = None) -> str:
    """The diff as JSON."""
    ops = d.ops if top is None else d.ops.head(top)
    return json.dumps({
        "a": d.a_label, "b": d.b_label, "a_step_ns": d.a_step_ns, "b_step_ns": d.b_step_ns,
        "step_ratio": _clean(d.step_ratio), "phases": records(d.phases), "ops": records(ops),
        "summary": d.summary, "a_noise": d.a_noise, "b_noise": d.b_noise,
    }, indent=2)
