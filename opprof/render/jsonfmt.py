"""JSON output for machines: the report and diff schemas documented in docs/json.md."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from opprof.analysis.report import Report
from opprof.render import verdicts
from opprof.render.jsonvalues import clean as _clean
from opprof.render.jsonvalues import records
from opprof.render.views import ALL_VIEWS
from opprof.taxonomy import PHASES
from opprof.trace import convergence_frame

if TYPE_CHECKING:  # only names here: `report --format json` imports no model or diff code
    from opprof.advice.base import AdviseResult, Advisory
    from opprof.analysis.convergence import Comparison
    from opprof.analysis.diff import Diff
    from opprof.jsontypes import JSONObject
    from opprof.model.commmodel import Network
    from opprof.model.predict import ModelResult
    from opprof.model.whatif import WhatIf

#: The views this format renders (all views) and its file type.
VIEWS = ALL_VIEWS
EXTENSION = ".json"


def report_dict(rep: Report, top: int | None = None) -> JSONObject:
    """The report as a plain dict."""
    steps = [
        {"rank": int(r["rank"]), "step": int(r["step"]), "dur_ns": int(r["dur_ns"]),
         "phases": {p: int(r[p]) for p in PHASES},
         "busy": {c[5:]: int(r[c]) for c in rep.steps.columns if c.startswith("busy_")},
         "comm_overlap_ns": int(r["comm_overlap_ns"]),
         "comm_time_ns": int(r.get("comm_time_ns", 0))}
        for r in rep.steps.to_dict("records")
    ]
    phases = {p: {k: _clean(v) for k, v in row.items()}
              for p, row in rep.phases.to_dict("index").items()}
    ops = rep.ops if top is None else rep.ops.head(top)
    dev = rep.device_ops if top is None else rep.device_ops.head(top)
    meta = {k: v for k, v in rep.meta.items() if k != "convergence"}  # its own key below
    return {"meta": meta, "steps": steps, "phases": phases,
            "comm_overlap": _clean(rep.comm_overlap), "ops": records(ops),
            "device_ops": records(dev), "ranks": records(rep.ranks),
            "devices": records(rep.devices), "device_span": rep.device_span,
            "stragglers": records(rep.stragglers),
            "noise": rep.noise.to_dict() if rep.noise else None,
            "collective_kinds": records(rep.collective_kinds),
            "collectives": records(rep.collectives),
            "memory": memory_records(rep),
            "memory_unprofiled": [{"rank": int(r["rank"]), "role": str(r["role"]),
                                   "peak_rss_bytes": _int_or_none(r["unprofiled_rss_bytes"])}
                                  for r in rep.memory.ranks.to_dict("records")],
            "memory_steps": records(rep.memory.steps),
            "compile_steps": records(rep.compile_steps),
            "fused_kernels": records(rep.fused_kernels),
            **convergence_dict(rep), **critical_dict(rep), **parallel_dict(rep),
            **efficiency_json(rep)}


def parallel_dict(rep: Report) -> JSONObject:
    """``pipeline`` (per rank and step of a pipeline stage: opprof.analysis.pipeline's
    columns), ``experts`` (per rank and step: all-to-all bytes per peer) and ``expert_load``
    (per step and all-to-all: bytes received per rank, imbalance): docs/parallelism.md."""
    return {"pipeline": records(rep.pipeline), "experts": records(rep.experts),
            "expert_load": records(rep.expert_load)}


def efficiency_json(rep: Report) -> JSONObject:
    """``efficiency``, ``efficiency_detail``, ``roofline``, ``roofline_kernels``
    (opprof.render.efficiency)."""
    from opprof.render.efficiency import json_dict

    return json_dict(rep)


def critical_dict(rep: Report) -> JSONObject:
    """``critical`` (with `--by critical`): per rank and step, ``step_ns``, ``path_ns``,
    ``replay_ns`` (the unedited graph's replay of the step) and ``bound_by`` ({compute, comm,
    launch, sync, load, idle}: ns, summing to ``step_ns``)."""
    if rep.critical.empty:
        return {}
    from opprof.analysis.critpath import BOUND_BY

    return {"critical": [{"rank": int(r["rank"]), "step": int(r["step"]),
                          "step_ns": int(r["step_ns"]), "path_ns": int(r["path_ns"]),
                          "replay_ns": _clean(r.get("replay_ns")),
                          "bound_by": {k: int(r[k]) for k in BOUND_BY}}
                         for r in rep.critical.to_dict("records")]}


def convergence_dict(rep: Report) -> JSONObject:
    """``convergence`` (one row per rank and step: rank, step, time_ns, loss,
    train_accuracy, test_accuracy; null between evaluations), ``time_to_accuracy``
    ({target: ns} for the targets reached) and ``convergence_summary`` (null: no curve)."""
    summary = rep.convergence
    return {"convergence": records(convergence_frame(rep.meta)),
            "time_to_accuracy": summary.time_to_accuracy if summary else {},
            "convergence_summary": summary.to_dict() if summary else None}


def _int_or_none(v: object) -> int | None:
    clean = _clean(v)
    return None if clean is None else int(clean)


def memory_records(rep: Report) -> list[JSONObject]:
    """The report's ``memory`` list: per rank with memory rows, exactly ``rank``, ``role``,
    ``peak_rss_bytes``, ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``param_bytes``,
    ``peak_step`` (null: none) and ``by_phase`` ({phase: bytes or null})."""
    return [{"rank": int(r["rank"]), "role": str(r["role"]),
             "peak_rss_bytes": _int_or_none(r["peak_rss_bytes"]),
             "peak_allocated_bytes": _int_or_none(r["peak_allocated_bytes"]),
             "peak_reserved_bytes": _int_or_none(r["peak_reserved_bytes"]),
             "param_bytes": _int_or_none(r["param_bytes"]),
             "peak_step": _int_or_none(r["peak_step"]),
             "by_phase": {p: _int_or_none(r[f"peak_{p}_bytes"]) for p in PHASES}}
            for r in rep.memory.ranks.to_dict("records")]


def report(rep: Report, by: str = "phase", top: int | None = None,
           advice: Advisory | None = None) -> str:
    """The whole report as JSON (``by`` does not change the JSON; ``advice``: its
    ``advice`` list and the advisory's other keys under ``advisory``)."""
    out = report_dict(rep, top)
    if advice is not None:
        whole = advice.to_dict()
        out["advice"] = whole.pop("advice")
        out["advisory"] = whole
    return json.dumps(out, indent=2, default=str)


def diff(d: Diff, top: int | None = None) -> str:
    """The diff as JSON."""
    ops = d.ops if top is None else d.ops.head(top)
    return json.dumps({
        "a": d.a_label, "b": d.b_label, "a_step_ns": d.a_step_ns, "b_step_ns": d.b_step_ns,
        "step_ratio": _clean(d.step_ratio), "a_unprofiled_step_ns": d.a_unprofiled_ns,
        "b_unprofiled_step_ns": d.b_unprofiled_ns, "basis": d.basis,
        "headline_ratio": _clean(d.headline_ratio), "mismatches": verdicts.mismatch_lines(d),
        "memory_verdict": verdicts.memory_verdict(d), "phases": records(d.phases),
        "ops": records(ops), "memory": records(d.memory), "comm": records(d.comm),
        "summary": verdicts.diff_sentence(d),
        "a_noise": d.a_noise.to_dict() if d.a_noise else None,
        "b_noise": d.b_noise.to_dict() if d.b_noise else None,
        **({"whatif": records(d.whatif)} if d.whatif is not None else {}),
        "convergence": _convergence(d.convergence) if d.convergence else None,
        "efficiency": {**d.efficiency.to_dict(), "summary": verdicts.efficiency_sentence(
            d.efficiency, d.a_label, d.b_label)} if d.efficiency else None,
        **({"gate": {**d.gate.to_dict(), "notes": verdicts.gate_notes(d.gate)}}
           if d.gate is not None else {}),
    }, indent=2, default=_clean)


def _convergence(c: Comparison) -> JSONObject:
    """The diff's ``convergence``: per target its facts and sentence, then the sentence."""
    doc = c.to_dict()
    targets = [{**t.to_dict(), "sentence": verdicts.target_sentence(t, c.a_label, c.b_label)}
               for t in c.targets]
    return {**doc, "targets": targets, "sentence": verdicts.convergence_sentence(c)}


def model_dict(result: ModelResult) -> JSONObject:
    """`opprof model`'s JSON (docs/json.md)."""
    from opprof.model.simulate import messages
    from opprof.render.modeltables import terms_table

    b = result.base
    preds = [{"workers": p.workers, "mode": p.mode, "servers": p.servers, "step_ns": p.step_ns,
              "speedup": _clean(p.speedup), "efficiency": _clean(p.efficiency),
              "exposed_comm_ns": p.exposed_comm_ns, "comm_busy_ns": p.comm_busy_ns,
              "wait_ns": p.wait_ns, "interference_ns": p.interference_ns,
              "interference": p.interference.to_dict() if p.interference else None,
              "colocation_ns": p.colocation_ns,
              "colocation": p.colocation.to_dict() if p.colocation else None,
              "terms": p.terms()} for p in result.predictions]
    check = None
    if result.check is not None:
        c = result.check
        check = {"label": c.label, "measured_step_ns": c.measured_step_ns,
                 "predicted_step_ns": c.predicted_step_ns, "error": _clean(c.error),
                 "terms": records(c.terms), "resources": c.resources.to_dict(),
                 "spread": {**c.spread.to_dict(), "verdict": verdicts.check_verdict(c.spread)}
                 if c.spread is not None else None,
                 "colocation": c.colocation.to_dict() if c.colocation is not None else None}
    g = b.gradients
    return {
        "base": {"label": b.label, "framework": b.framework, "model": b.meta.model,
                 "mode": b.mode, "workers": b.workers, "servers": b.servers,
                 "step_ns": b.step_ns, "steps": b.terms.steps},
        "terms": b.terms.mean(), "terms_extra": b.terms.extra(),
        "terms_spread": records(terms_table(result)),
        "terms_per_rank": records(b.terms.per_rank),
        "resources": b.resources.to_dict(),
        "gradients": {"source": g.source, "bytes_source": g.bytes_source,
                      "count": int(len(g.layers)), "total_bytes": g.total_bytes,
                      "backward_ns": g.backward_ns, "layers": records(g.layers),
                      "messages": [{"ready_frac": f, "bytes": n} for f, n in messages(
                          g.layers["ready_frac"].to_numpy(), g.layers["bytes"].to_numpy(),
                          result.policy)] if len(g.layers) else [],
                      "trace_collectives": records(g.collectives)},
        "network": {**result.network.to_dict(), "note": result.network_note},
        "policy": {"name": result.policy.name, "describe": result.policy.describe},
        "predictions": preds, "check": check, "notes": verdicts.model_notes(result),
    }


def model(result: ModelResult) -> str:
    """`opprof model` as JSON."""
    return json.dumps(model_dict(result), indent=2, default=_clean)


def whatif(w: WhatIf) -> str:
    """`opprof whatif` as JSON."""
    return json.dumps({"label": w.label, "base_step_ns": w.base_step_ns, "step_ns": w.step_ns,
                       "delta_ns": w.delta_ns, "phases": w.phases,
                       "base_phases": w.base_phases, "workers": w.workers, "mode": w.mode,
                       "scenario": [c.to_dict() for c in w.scenario],
                       "network": w.network_note, "notes": verdicts.whatif_notes(w),
                       "engine": w.engine},
                      indent=2, default=_clean)


def calibration(net: Network) -> str:
    """`opprof calibrate`'s network as JSON (the same as the file it writes)."""
    return json.dumps(net.to_dict(), indent=2, default=_clean)


def advice(result: AdviseResult) -> str:
    """`opprof advise` as JSON: ``advice`` (the contract's list, by saving), ``healthy``,
    ``step_ns``, ``minor``, ``checked``, ``not_checked``, ``bound``; with --verify,
    ``verify``."""
    return json.dumps(result.to_dict(), indent=2, default=_clean)
