"""Markdown output: a heading, the chosen table, and for diffs the summary sentence."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from opprof.analysis.diff import Diff
from opprof.analysis.report import Report
from opprof.model.commmodel import Network
from opprof.model.predict import ModelResult
from opprof.model.whatif import WhatIf
from opprof.render import verdicts
from opprof.render.console import compile_lines, partial_lines, quality_lines, replica_lines
from opprof.render.efficiency import headline as efficiency_headline
from opprof.render.tables import diff_memory_table, diff_table, report_table
from opprof.render.units import ab_ratio, mib, ms, rate, ratio
from opprof.render.views import ALL_VIEWS
from opprof.taxonomy import PHASES

if TYPE_CHECKING:
    from opprof.advice.base import AdviseResult, Advisory

#: The views this format renders (all views) and its file type.
VIEWS = ALL_VIEWS
EXTENSION = ".md"


def md_table(df: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (no extra dependency), in readable units."""
    df = readable(df)

    def cell(v: object) -> str:
        if isinstance(v, float):
            if v != v:
                return ""
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
        if v is None or v is pd.NA:
            return ""
        return str(v).replace("|", "\\|")

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "|".join("---:" if _numeric(df[c]) else "---" for c in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def _numeric(col: pd.Series) -> bool:
    text = col.dropna().astype(str)
    text = text[text != "-"]
    return bool(len(text)) and bool(text.str.match(r"^[-+]?[\d,.]+( ?[%xA-Za-z/]+)?$").all())


#: Columns holding fractions, shown as percentages.
_SHARES = ("share", "share_of_gap", "fit_error", "share_of_phase", "wait_share", "overlap",
           "efficiency", "cv", "saving_share", "excess_share", "error", "scaling_efficiency",
           "profiled_scaling", "predicted_scaling", "prediction_error")


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """Nanoseconds as ms with separators, bytes in binary units, rates in MB/s, fractions as
    percentages and ratios with an x; each column named with its unit."""
    out = {}
    step_table = "dur_ns" in df.columns or "step_ns" in df.columns  # phases in ns
    both = "unprofiled_step_ns" in df.columns
    for c in df.columns:
        col, name = df[c], str(c)
        tokens = name.split("_")
        if name == "step_ns" and both:
            out["profiled step ms"] = col.map(ms)
        elif "ns" in tokens or (step_table and name in PHASES):
            out[" ".join("ms" if t == "ns" else t for t in tokens)
                + ("" if "ns" in tokens else " ms")] = col.map(ms)
        elif "bytes" in tokens:
            out[" ".join("MiB" if t == "bytes" else t for t in tokens)] = col.map(mib)
        elif name.endswith("Bps"):
            out[name.removesuffix("_Bps").replace("_", " ")] = col.map(rate)
        elif name == "ratio" and {"a_ns_per_step", "b_ns_per_step"} <= set(df.columns):
            out["A/B"] = [ab_ratio(a, b) for a, b in zip(df["a_ns_per_step"],
                                                          df["b_ns_per_step"], strict=True)]
        elif name == "overhead":
            out["profiled/unprofiled"] = col.map(lambda v: "-" if pd.isna(v) else ratio(v))
        elif name == "ratio" or name.endswith("_ratio"):
            out[name.replace("_", " ")] = col.map(lambda v: "-" if pd.isna(v) else ratio(v))
        elif name in _SHARES:
            out[name.replace("_", " ")] = col.map(
                lambda v: "-" if v is None or pd.isna(v) else f"{float(v):.1%}")
        else:
            out[name.replace("_", " ")] = col
    return pd.DataFrame(out)


def report(rep: Report, by: str = "phase", top: int | None = None,
           advice: Advisory | None = None) -> str:
    """The chosen view as markdown (``advice``: its table first)."""
    title = " ".join(str(rep.meta.get(k, "")) for k in ("framework", "model")).strip()
    notes = "".join(f"> {line.strip()}\n\n" for line in quality_lines(rep.noise)
                    + partial_lines(rep.meta) + replica_lines(rep) + compile_lines(rep)
                    + efficiency_headline(rep))
    if by == "device" and rep.devices.empty and rep.device_ops.empty:
        body = "No device activity in this trace (no GPU kernels, copies or memsets)."
    else:
        body = md_table(report_table(rep, by, top))
    first = ""
    if advice is not None:
        first = f"### Advice\n\n{_advice_md(advice)}\n"
    return f"## opprof report {title} — by {by}\n\n{notes}{first}{body}\n"


def diff(d: Diff, top: int | None = None) -> str:
    """The diff as markdown."""
    memory = (f"\n### Memory\n\n{md_table(diff_memory_table(d))}\n"
              if len(d.memory) else "")
    notes = "".join(f"> {side}: {line}\n\n" for side, noise in (("A", d.a_noise),
                                                                  ("B", d.b_noise))
                    for line in quality_lines(noise))
    from opprof.render.console import step_lines

    steps = "".join(f"- {line}\n" for line in step_lines(d))
    warn = "".join(f"> {line}\n\n" for line in verdicts.mismatch_lines(d))
    verdict = verdicts.memory_verdict(d)
    notes += f"{verdict}\n\n" if verdict else ""
    out = (f"## opprof diff: {d.a_label} vs {d.b_label}\n\n{verdicts.diff_sentence(d)}\n\n"
           f"{steps}\n{warn}{notes}"
           f"{md_table(diff_table(d, top))}\n{memory}")
    if d.whatif is not None:
        rows = d.whatif if top is None else d.whatif.head(top)
        out += f"\n### What if A ran each operator at B's speed\n\n{md_table(rows)}\n"
    if d.efficiency is not None:
        sentence = verdicts.efficiency_sentence(d.efficiency, d.a_label, d.b_label)
        out += f"\n### Efficiency\n\n{sentence}\n"
    if d.gate is not None:
        from opprof.render.console import gate_lines

        out += "\n### Regression gate\n\n" + "".join(f"- {line.strip()}\n"
                                                       for line in gate_lines(d.gate))
    return out


def model(result: ModelResult) -> str:
    """`opprof model` as markdown: terms, predictions, and the check."""
    from opprof.render.modeltables import check_table, predictions_table, terms_table

    b, net = result.base, result.network
    out = [f"## opprof model: {b.label} ({b.framework}, {b.workers} worker(s), {b.mode})", "",
           f"Per-worker resources: {b.resources.describe()}.", "",
           "### Terms (ms per step)", "", md_table(terms_table(result)), "",
           f"Network ({net.collective}): α = {net.alpha_ns:,.0f} ns, β = "
           f"{net.beta_ns_per_byte:.4g} ns/B — {result.network_note}.", "",
           f"Pipeline: {result.policy.describe}.", "",
           "### Predictions", "", md_table(predictions_table(result)), ""]
    if result.check is not None:
        c = result.check
        out += [f"### Check against {c.label}", "", md_table(check_table(result)), "",
                f"Predicted {c.predicted_step_ns / 1e6:,.3f} ms vs measured "
                f"{c.measured_step_ns / 1e6:,.3f} ms per step: error {c.error:+.1%}.", ""]
        if c.spread is not None:
            out += [f"Measured noise: {verdicts.check_verdict(c.spread)}.", ""]
        if c.colocation is not None:
            from opprof.render.modeltables import colocation_verdict

            out += [f"{colocation_verdict(c.colocation)[0].upper()}"
                    f"{colocation_verdict(c.colocation)[1:]}.", ""]
    out += [f"Note: {n}" for n in verdicts.model_notes(result)]
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
            f"ns/B\n\n{md_table(samples_table(net))}\n"
            + (f"\n> {warning}\n" if (warning := verdicts.fit_warning(net)) else ""))


def _advice_md(a: Advisory) -> str:
    if not any(x.kind == "training" for x in a.advice):
        return f"Healthy: no rule finds a saving of 2% of the step or more ({a.bound}).\n"
    from opprof.advice.base import AdviseResult
    from opprof.render.tables import advice_table

    t = advice_table(AdviseResult(a))
    return md_table(t[t["kind"] == "training"].drop(columns=["kind"])) + "\n"


def advice(result: AdviseResult) -> str:
    """`opprof advise` as markdown."""
    a = result.advisory
    out = f"## opprof advise {a.label}\n\n{_advice_md(a)}"
    notes = [x for x in a.advice if x.kind != "training"]
    out += "".join(f"> {x.finding}: {x.action}\n\n" for x in notes)
    if a.not_checked:
        out += "Not checked: " + "; ".join(f"{k} ({v})" for k, v in a.not_checked.items())
        out += "\n"
    if result.verification is not None:
        from opprof.render.tables import verification_table

        out += f"\n### Checked\n\n{md_table(verification_table(result.verification))}\n"
    return out
