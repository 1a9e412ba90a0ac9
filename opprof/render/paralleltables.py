"""The console's tables of model parallelism (``--by pipeline``, ``--by experts``) and the
layout line: rich renderables over :mod:`opprof.analysis.pipeline` and
:mod:`opprof.analysis.experts` results; nothing is computed here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from opprof.render.text import render
from opprof.render.units import ab_ratio, size

if TYPE_CHECKING:
    import pandas as pd

    from opprof.analysis.report import Report
    from opprof.meta import MetaMapping
    from opprof.model.fromsingle import SplitResult
    from opprof.model.parallel import ParallelResult


def _ms(ns: Any) -> str:
    return "-" if ns is None or ns != ns else f"{float(ns) / 1e6:,.3f}"


def _pct(x: Any) -> str:
    return "-" if x is None or x != x else f"{100 * float(x):.1f}%"


def layout_line(meta: MetaMapping) -> Text | None:
    """``layout: tp 2 [0,1] · …`` from ``meta.parallelism`` (None without one)."""
    par = meta.get("parallelism")
    if not isinstance(par, dict) or not par:
        return None
    parts = []
    for dim, info in par.items():
        if not isinstance(info, dict):
            continue
        groups = info.get("groups") or []
        shown = " ".join("[" + ",".join(str(r) for r in g) + "]" for g in groups[:4])
        more = f" +{len(groups) - 4} groups" if len(groups) > 4 else ""
        parts.append(f"{dim} {info.get('degree')} {shown}{more}")
    return Text("parallelism: " + "  ·  ".join(parts))


def pipeline_table(rep: Report) -> Table | Text:
    """Per pipeline stage and step: schedule, micro-batches, forward and backward per
    micro-batch, the bubble and its share of the step (beside the schedule's textbook one)."""
    p = rep.pipeline
    if p.empty:
        return Text("no pipeline stage in this trace (no send or receive in its steps)")
    t = Table(title=f"Pipeline ({p['schedule'].iloc[0]}) — per stage and step",
              title_justify="left")
    for col in ["rank", "stage", "step", "micro-batches", "fwd ms/mb", "bwd ms/mb",
                "bubble ms", "bubble", "ideal", "step ms", "order"]:
        t.add_column(col, justify="left" if col == "order" else "right")
    for r in p.to_dict("records"):
        stages = r["stages"] if isinstance(r["stages"], list) else [r["stage"]]
        order = "".join(k[0] for k in str(r["order"]).split())  # F0 F1 B0 B1 → FFBB
        t.add_row(str(r["rank"]), ",".join(str(s) for s in stages), str(r["step"]),
                  str(r["microbatches"]), _ms(r["forward_ns_per_microbatch"]),
                  _ms(r["backward_ns_per_microbatch"]), _ms(r["bubble_ns"]),
                  _pct(r["bubble_share"]), _pct(r["ideal_bubble_share"]), _ms(r["step_ns"]),
                  order if len(order) <= 40 else order[:37] + "…")
    t.caption = ("bubble = time the stage waited on a send or receive with nothing to compute "
                 "(part of the comm phase); ideal = (p−1)/(v·m+p−1) for p stages, m "
                 "micro-batches, v stages per rank; fwd/bwd = compute inside each micro-batch")
    return t


def expert_tables(rep: Report) -> list[Table | Text]:
    """All-to-all bytes per peer per rank and step, and the experts' load per exchange."""
    if rep.experts.empty:
        a2a = rep.collectives[rep.collectives["op"] == "all_to_all"]
        if a2a.empty:
            return [Text("no all-to-all in this trace's steps")]
        return [Text(f"{a2a['calls_per_step'].sum():.1f} all-to-all call(s) per rank and step, "
                     "none with bytes per peer in the trace (an all_to_all_single without split "
                     "sizes sends even shares; torch records split sizes and shapes with "
                     "record_shapes)")]
    t = Table(title="All-to-all per rank and step (bytes per peer, in group order)",
              title_justify="left")
    for col in ["rank", "step", "calls", "sent", "received", "sent per peer",
                "received per peer", "max/mean"]:
        t.add_column(col, justify="left" if "per peer" in col else "right")
    for r in rep.experts.to_dict("records"):
        t.add_row(str(r["rank"]), str(r["step"]), str(r["calls"]), size(r["bytes_sent"]),
                  size(r["bytes_received"]),
                  " ".join(size(x) for x in r["send_bytes_per_peer"]),
                  " ".join(size(x) for x in r["recv_bytes_per_peer"]),
                  "-" if r["peer_imbalance"] is None else f"{r['peer_imbalance']:.2f}")
    out: list[Table | Text] = [t]
    if not rep.expert_load.empty:
        load = Table(title="Experts' load per exchange (bytes each rank received)",
                     title_justify="left")
        for col in ["step", "all-to-all", "received per rank", "max/mean"]:
            load.add_column(col, justify="left" if col == "received per rank" else "right")
        for r in rep.expert_load.to_dict("records"):
            load.add_row(str(r["step"]), str(r["call"]),
                         " ".join(size(x) for x in r["recv_bytes_per_rank"]),
                         "-" if r["imbalance"] is None else f"{r['imbalance']:.2f}")
        load.caption = "max/mean = 1.00 when the tokens went evenly to the ranks' experts"
        out.append(load)
    return out


def comm_diff_table(comm: pd.DataFrame) -> Table:
    """A diff's collective time per step by parallel dimension and collective."""
    t = Table(title="Collectives by parallel dimension (ms/step, profiled)",
              title_justify="left")
    for c in ["dim", "collective", "A", "B", "A/B", "A−B ms"]:
        t.add_column(c, justify="left" if c in ("dim", "collective") else "right")
    for r in comm.to_dict("records"):  # A/B as every diff cell: never 0.00x ("only in B")
        t.add_row(str(r["dim"]), str(r["op"]), _ms(r["a_ns_per_step"]), _ms(r["b_ns_per_step"]),
                  ab_ratio(r["a_ns_per_step"], r["b_ns_per_step"]), _ms(r["delta_ns"]))
    return t


def parallel_model_text(result: ParallelResult, fmt: str) -> str:
    """`opprof model`'s output for a model-parallel trace in ``fmt`` (json: its
    ``to_dict()``; csv: one row per prediction; md and rich: a table and the check)."""
    import json

    from opprof.model.parallel import rows

    table = rows(result)
    if fmt == "json":
        return json.dumps(result.to_dict(), indent=2)
    terms = sorted({k for r in table for k in r} - {"degree", "microbatches", "step_ns",
                                                    "speedup"})
    cols = ["degree", "microbatches", "step_ns", "speedup", *terms]
    if fmt == "csv":
        lines = [",".join(cols)]
        lines += [",".join("" if r.get(c) is None else str(r.get(c)) for c in cols)
                  for r in table]
        return "\n".join(lines) + "\n"
    b = result.base
    head = (f"base: {b.label} — {b.mode}, {b.workers} workers, step {_ms(b.step_ns)} ms"
            + (f", {b.microbatches} micro-batches ({b.schedule})" if b.microbatches else "")
            + f"; network α = {result.network.alpha_ns:,.0f} ns, β = "
            f"{result.network.beta_ns_per_byte:.4g} ns/B ({result.network.source or 'given'})")
    check = None
    if result.check is not None:
        chk = result.check
        check = (f"check ({chk.label}): predicted {_ms(chk.predicted_ns)} ms, measured "
                 f"{_ms(chk.measured_ns)} ms at {result.dimension} "
                 f"{chk.degrees[result.dimension]}"
                 + (f" ({chk.microbatches} micro-batches)" if chk.microbatches else "")
                 + f": error {100 * chk.error:+.1f}%")
    if fmt == "md":
        out = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(_ms(r.get(c)) if c not in ("degree", "microbatches",
                                                               "speedup")
                                  else ("-" if r.get(c) is None else f"{r[c]:.3g}"
                                        if c == "speedup" else str(r[c])) for c in cols)
                + " |" for r in table]
        return "\n".join([*out, "", *(x for x in [check, *result.notes] if x)]) + "\n"
    t = Table(title=f"Predicted step by {result.dimension} degree (ms)", title_justify="left")
    for c in cols:
        t.add_column(c.replace("_ns", "").replace("_", " "), justify="right")
    for r in table:
        t.add_row(*[str(r[c]) if c in ("degree", "microbatches") else
                    ("-" if r.get(c) is None else f"{r[c]:.2f}x") if c == "speedup" else
                    _ms(r.get(c)) for c in cols])
    items: list[Any] = [Text(head), t]
    items += [Text(x, style="bold") for x in [check] if x]
    items += [Text(n) for n in result.notes]
    return render(*items)


#: The terms a one-worker prediction shows, in the step's order.
_SPLIT_TERMS = ("t_io", "t_f", "t_b", "t_u", "t_comm", "t_coloc", "other")


def split_rows(result: SplitResult) -> list[dict[str, Any]]:
    """One row per prediction of a one-worker base: degree, micro-batches, step, speed-up,
    the terms and the model's pieces (what the csv and md renderers show)."""
    return [{"degree": p.degree, "microbatches": p.microbatches, "schedule": p.schedule,
             "step_ns": p.step_ns, "speedup": p.speedup, **p.terms, **p.parts}
            for p in result.predictions]


def split_model_text(result: SplitResult, fmt: str) -> str:
    """`opprof model BASE --mode tp|pp` of a one-worker trace in ``fmt`` (json: its
    ``to_dict()``; csv: one row per prediction, or the check's terms; md and rich: the
    predictions, the pipeline's stages, the check)."""
    import json

    rows = split_rows(result)
    if fmt == "json":
        from opprof.render.verdicts import check_verdict

        doc = result.to_dict()
        checked = doc.get("check")
        if result.check is not None and isinstance(checked, dict):
            checked["spread"] = {**result.check.spread.to_dict(),
                             "verdict": check_verdict(result.check.spread)}
        return json.dumps(doc, indent=2, default=float)
    if fmt == "csv":
        if result.check is not None:
            return str(result.check.terms.to_csv(index=False))
        cols = list(dict.fromkeys(k for r in rows for k in r))
        lines = [",".join(cols)]
        lines += [",".join("" if r.get(c) is None else str(r.get(c)) for c in cols)
                  for r in rows]
        return "\n".join(lines) + "\n"
    b = result.base
    dim = result.dimension
    head = (f"base: {result.label} — {result.meta.get('model') or 'a model'}, batch "
            f"{result.meta.get('batch_size') or '?'}, one worker: step {_ms(b.step_ns)} ms "
            f"over {b.steps} step(s) (its compute ×{b.noise:.2f} its typical operators and "
            f"gaps: the host's noise); network α = "
            f"{result.network.alpha_ns:,.0f} ns, β = {result.network.beta_ns_per_byte:.4g} "
            f"ns/B ({result.network_note})")
    pieces = (["forward_dtensor_ns", "backward_dtensor_ns", "update_dtensor_ns",
               "allreduce_ns", "wait_ns"] if dim == "tp" else
              ["bubble_ns", "transfer_ns", "ideal_bubble_share"])
    cols = ["degree", *(["microbatches"] if dim == "pp" else []), "step_ns", "speedup",
            *_SPLIT_TERMS, *pieces]
    names = {"step_ns": "step", "speedup": "speed-up", "t_io": "load", "t_f": "forward",
             "t_b": "backward", "t_u": "update", "t_comm": "comm", "t_coloc": "co-location",
             "forward_dtensor_ns": "DTensor fwd", "backward_dtensor_ns": "DTensor bwd",
             "update_dtensor_ns": "DTensor upd", "allreduce_ns": "all-reduce",
             "wait_ns": "wait", "bubble_ns": "bubble", "transfer_ns": "transfers",
             "ideal_bubble_share": "ideal bubble"}

    def cell(c: str, r: dict[str, Any]) -> str:
        v = r.get(c)
        if c in ("degree", "microbatches"):
            return str(v)
        if c == "speedup":
            return "-" if v is None or v != v else f"{v:.2f}x"
        if c == "ideal_bubble_share":
            return _pct(v)
        return _ms(v)

    check_lines: list[str] = []
    if result.check is not None:
        chk = result.check
        check_lines.append(
            f"check ({chk.label}): predicted {_ms(chk.predicted_ns)} ms, measured "
            f"{_ms(chk.measured_ns)} ms at {dim} {chk.degree}"
            + (f" ({chk.microbatches} micro-batches, {chk.schedule})" if dim == "pp" else "")
            + f": error {100 * chk.error:+.1f}%")
        from opprof.render.verdicts import check_verdict

        sp = chk.spread
        check_lines.append(f"predicted {_ms(sp.interval_ns[0])} … {_ms(sp.interval_ns[1])} ms "
                           f"(± the measured mean's 95% interval, {sp.steps} rank-steps, cv "
                           f"{sp.cv:.1%}): {check_verdict(sp)}")
        from opprof.render.modeltables import colocation_verdict

        check_lines.append(colocation_verdict(chk.colocation))
        nb, nm = chk.noise.get("base"), chk.noise.get("measured")
        if nb is not None and nm is not None and nm == nm:
            check_lines.append(
                f"the host's noise (compute over its typical operators and gaps): base "
                f"×{nb:.2f}, measured ×{nm:.2f}" + (
                    " — the runs met different loads: the error measures the host too"
                    if abs(nm / nb - 1) > 0.2 else ""))
    notes = [f"assumption: {a}" for a in result.assumptions] + [
        f"note: {n}" for n in result.notes]
    last = result.predictions[-1] if result.predictions else None
    if fmt == "md":
        out = [head, "", "| " + " | ".join(names.get(c, c) for c in cols) + " |",
               "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(cell(c, r) for c in cols) + " |" for r in rows]
        if last is not None and last.stages is not None:
            out += ["", _stages_md(last.stages)]
        if result.check is not None:
            out += ["", "| term | predicted ms | measured ms | error |", "|---|---|---|---|"]
            out += [f"| {r['term']} | {_ms(r['predicted_ns'])} | {_ms(r['measured_ns'])} | "
                    f"{_err(r['error'])} |" for r in result.check.terms.to_dict("records")]
        return "\n".join([*out, "", *check_lines, *notes]) + "\n"
    t = Table(title=f"Predicted step by {dim} degree from one worker (ms)",
              title_justify="left")
    main = [c for c in cols if c not in pieces]
    for c in main:
        t.add_column(names.get(c, c), justify="right")
    for r in rows:
        t.add_row(*[cell(c, r) for c in main])
    pt = Table(title="The model's pieces (ms per step)", title_justify="left")
    for c in ["degree", *pieces]:
        pt.add_column(names.get(c, c), justify="right")
    for r in rows:
        pt.add_row(*[cell(c, r) for c in ["degree", *pieces]])
    pt.caption = ("DTensor: its own dispatch and redistributions inside forward, backward and "
                  "update; all-reduce: the activations' (2 per sharded pair); wait: for the "
                  "slowest rank at them" if dim == "tp" else
                  "bubble: a stage waiting for its neighbours (were hand-offs free); "
                  "transfers: what handing activations and gradients over adds to the wait; "
                  "ideal bubble: (p − 1)/(m + p − 1)")
    t.caption = ("comm: exposed (tp: the blocking all-reduces and the wait for the slowest "
                 "rank; pp: the bubble and the transfers); co-location: compute lost to the "
                 "other ranks on the host (t_coloc), outside forward/backward/update")
    if last is not None:
        from opprof.render.modeltables import colocation_line

        t.caption += "\n" + colocation_line(last.colocation, last.degree)
    items: list[Any] = [Text(head), Text(f"plan: {result.plan}"), t, pt]
    if last is not None and last.stages is not None:
        items.append(_stages_table(last.stages, last.degree, last.microbatches))
    if result.check is not None:
        ct = Table(title=f"Check against {result.check.label} (ms per step)",
                   title_justify="left")
        for col in ["term", "predicted", "measured", "error ms", "error"]:
            ct.add_column(col, justify="left" if col == "term" else "right")
        for r in result.check.terms.to_dict("records"):
            ct.add_row(r["term"], _ms(r["predicted_ns"]), _ms(r["measured_ns"]),
                       _ms(r["error_ns"]), _err(r["error"]))
        items.append(ct)
        items += [Text(line, style="bold" if i == 0 else "") for i, line in
                  enumerate(check_lines)]
    items += [Text(n, style="grey50") for n in notes]
    return render(*items)


def _err(x: Any) -> str:
    return "-" if x is None or x != x or x in (float("inf"), float("-inf")) else f"{x:+.1%}"


def _stages_table(stages: pd.DataFrame, p: int, m: int) -> Table:
    t = Table(title=f"Stages at pp {p}, {m} micro-batch(es) (ms)", title_justify="left")
    for c in ["stage", "fwd ops", "bwd ops", "fwd/mb", "bwd/mb", "update", "comm",
              "transfers", "overlap"]:
        t.add_column(c, justify="right")
    for r in stages.to_dict("records"):
        t.add_row(str(r["stage"]), str(r["forward_ops"]), str(r["backward_ops"]),
                  _ms(r["forward_ns_per_microbatch"]), _ms(r["backward_ns_per_microbatch"]),
                  _ms(r["update_ns"]), _ms(r["comm_ns"]), _ms(r["transfer_ns"]),
                  _pct(r["overlap"]))
    t.caption = ("comm: the stage's wait for its neighbours per step; transfers: what the "
                 "hand-offs add to it; "
                 "overlap: the share of its compute another stage computes beside")
    return t


def _stages_md(stages: pd.DataFrame) -> str:
    lines = ["| stage | fwd/mb ms | bwd/mb ms | update ms | comm ms | overlap |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['stage']} | {_ms(r['forward_ns_per_microbatch'])} | "
              f"{_ms(r['backward_ns_per_microbatch'])} | {_ms(r['update_ns'])} | "
              f"{_ms(r['comm_ns'])} | {_pct(r['overlap'])} |" for r in stages.to_dict("records")]
    return "\n".join(lines)
