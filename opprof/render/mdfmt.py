"""Markdown output: a heading, the chosen table, and for diffs the summary sentence."""

from __future__ import annotations

import pandas as pd

from opprof.analysis.commmodel import Network
from opprof.analysis.diff import Diff
from opprof.analysis.predict import ModelResult
from opprof.analysis.report import Report
from opprof.analysis.whatif import WhatIf
from opprof.render.console import partial_lines, quality_lines
from opprof.render.tables import diff_memory_table, diff_table, report_table


def md_table(df: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (no extra dependency)."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            if v != v:
                return ""
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
        if v is None or v is pd.NA:
            return ""
        return str(v)

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def report(rep: Report, by: str = "phase", top: int | None = None) -> str:
    """The chosen view as markdown."""
    title = " ".join(str(rep.meta.get(k, "")) for k in ("framework", "model")).strip()
    notes = "".join(f"> {line}\n\n" for line in quality_lines(rep.noise)
                    + partial_lines(rep.meta))
    return (f"## opprof report {title} — by {by}\n\n{notes}"
            f"{md_table(report_table(rep, by, top))}\n")


def diff(d: Diff, top: int | None = None) -> str:
    """The diff as markdown."""
    memory = (f"\n### Memory (bytes)\n\n{md_table(diff_memory_table(d))}\n"
              if len(d.memory) else "")
    notes = "".join(f"> {side}: {line}\n\n" for side, noise in (("A", d.a_noise),
                                                                  ("B", d.b_noise))
                    for line in quality_lines(noise))
    out = (f"## opprof diff: {d.a_label} vs {d.b_label}\n\n{d.summary}\n\n{notes}"
           f"{md_table(diff_table(d, top))}\n{memory}")
    if d.whatif is not None:
        rows = d.whatif if top is None else d.whatif.head(top)
        out += f"\n### What if A ran each operator at B's speed\n\n{md_table(rows)}\n"
    return out


def model(result: ModelResult) -> str:
    """`opprof model` as markdown: terms, predictions, and the check."""
    from opprof.render.modeltables import check_table, predictions_table, terms_table

    b, net = result.base, result.network
    out = [f"## opprof model: {b.label} ({b.framework}, {b.workers} worker(s), {b.mode})", "",
           f"Per-worker resources: {b.resources.describe()}.", "",
           "### Terms (ns per step)", "", md_table(terms_table(result)), "",
           f"Network ({net.collective}): α = {net.alpha_ns:,.0f} ns, β = "
           f"{net.beta_ns_per_byte:.4g} ns/B — {result.network_note}.", "",
           f"Pipeline: {result.policy.describe}.", "",
           "### Predictions", "", md_table(predictions_table(result)), ""]
    if result.check is not None:
        c = result.check
        out += [f"### Check against {c.label}", "", md_table(check_table(result)), "",
                f"Predicted {c.predicted_step_ns / 1e6:,.3f} ms vs measured "
                f"{c.measured_step_ns / 1e6:,.3f} ms per step: error {c.error:+.1%}.", ""]
    out += [f"Note: {n}" for n in result.notes]
    return "\n".join(out).rstrip() + "\n"


def whatif(w: WhatIf) -> str:
    """`opprof whatif` as markdown."""
    from opprof.render.modeltables import scenario_table, whatif_table

    return (f"## opprof whatif: {w.label}\n\nStep {w.base_step_ns / 1e6:,.3f} → "
            f"{w.step_ns / 1e6:,.3f} ms ({w.delta_ns / 1e6:+,.3f} ms).\n\n"
            f"{md_table(whatif_table(w))}\n\n### Changes (each alone)\n\n"
            f"{md_table(scenario_table(w))}\n")


def calibration(net: Network) -> str:
    """`opprof calibrate` as markdown."""
    from opprof.render.modeltables import samples_table

    return (f"## opprof calibrate: {net.framework} {net.backend}, {net.workers} workers\n\n"
            f"{net.collective}: α = {net.alpha_ns:,.0f} ns, β = {net.beta_ns_per_byte:.4g} "
            f"ns/B\n\n{md_table(samples_table(net))}\n")
