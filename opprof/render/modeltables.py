"""The tables of `opprof model`, `opprof whatif` and `opprof calibrate` as DataFrames, shared by
the csv and markdown renderers (and the JSON one's lists), and the sentences they share."""

from __future__ import annotations

from typing import Any

import pandas as pd

from opprof.model.colocation import Colocation
from opprof.model.commmodel import Network
from opprof.model.predict import ColocationCheck, ModelResult
from opprof.model.terms import PHASE_OF
from opprof.model.whatif import WhatIf
from opprof.taxonomy import PHASES


def terms_table(result: ModelResult) -> pd.DataFrame:
    """The base's terms with their spread (ns per step)."""
    s = result.base.terms.spread.copy()
    s.insert(1, "phase", s["term"].map(PHASE_OF).fillna(""))
    return s


def predictions_table(result: ModelResult) -> pd.DataFrame:
    """One row per predicted worker count, with the predicted terms."""
    rows = []
    for p in result.predictions:
        rows.append({"workers": p.workers, "mode": p.mode, "servers": p.servers,
                     "step_ns": p.step_ns, "speedup": p.speedup, "efficiency": p.efficiency,
                     "exposed_comm_ns": p.exposed_comm_ns, "comm_busy_ns": p.comm_busy_ns,
                     "wait_ns": p.wait_ns, **p.terms()})
    return pd.DataFrame(rows)


def check_table(result: ModelResult) -> pd.DataFrame:
    """Predicted beside measured, term by term (empty without --check)."""
    if result.check is None:
        return pd.DataFrame(columns=["term", "predicted_ns", "measured_ns", "error_ns", "error"])
    return result.check.terms


def whatif_table(w: WhatIf) -> pd.DataFrame:
    """Per phase: measured, what-if, delta; then the step."""
    rows = [{"phase": p, "base_ns": w.base_phases[p], "whatif_ns": w.phases[p],
             "delta_ns": w.phases[p] - w.base_phases[p]} for p in PHASES]
    rows.append({"phase": "step", "base_ns": w.base_step_ns, "whatif_ns": w.step_ns,
                 "delta_ns": w.delta_ns})
    return pd.DataFrame(rows)


def scenario_table(w: WhatIf) -> pd.DataFrame:
    """Each change with its own effect on the step."""
    return pd.DataFrame([c.to_dict() for c in w.scenario],
                        columns=["kind", "target", "value", "factor", "wall_ns", "delta_ns"])


def samples_table(net: Network | list[dict[str, Any]]) -> pd.DataFrame:
    """The measured message sizes of a network fit (or a list of its samples, as FSDP's
    reduce-scatter keeps them in ``info``) with their predicted times."""
    samples = net.samples if isinstance(net, Network) else net
    t = pd.DataFrame(samples, columns=["bytes", "ns", "calls", "predicted_ns"])
    return t.assign(fit_error=(t["predicted_ns"] - t["ns"]) / t["ns"])


def colocation_line(c: Colocation, workers: int) -> str:
    """The co-location of one prediction in words."""
    most = (f", the most crowded host's ×{1 + c.max_slowdown:.2f}"
            if c.max_slowdown > c.slowdown + 1e-9 else "")
    return (f"co-location at {workers} worker{'s' if workers != 1 else ''} "
            f"({c.crowd:g} computing per host, {c.placement or 'placement unknown'}): "
            f"compute ×{1 + c.slowdown:.2f}{most} ({c.source})")


def colocation_verdict(c: ColocationCheck) -> str:
    """How much of a check's error the co-location term explains, in one sentence."""
    moved = c.error_without - c.error
    if abs(c.predicted_ns) < 1 and abs(moved) < 1e-9:
        return (f"co-location: none predicted ({c.colocation.source}); the measured workers' "
                f"compute beyond the base's alone: {c.measured_ns / 1e6:+,.1f} ms")
    return (f"co-location: {c.predicted_ns / 1e6:+,.1f} ms predicted, "
            f"{c.measured_ns / 1e6:+,.1f} ms measured (the workers' compute beyond the "
            f"prediction's alone); without it the step would be "
            f"{c.step_without_ns / 1e6:,.1f} ms (error {c.error_without:+.1%}), with it "
            f"{c.error:+.1%}: it explains {c.explained * 100:+.1f} points of the error")
