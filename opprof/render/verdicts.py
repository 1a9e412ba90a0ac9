"""The sentences the renderers say about results — diff's closing sentence, the runs'
mismatches, the memory verdict, the regression gate's notes, a check's noise verdict, a run's
noisy timing, a poor α–β fit, a what-if's operator that does not run, which run converges
first: the analyses and the
model return the facts, every format says them in the same words from here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from opprof.render.units import mib

if TYPE_CHECKING:
    from opprof.analysis.convergence import AtTarget, Comparison
    from opprof.analysis.diff import Diff
    from opprof.analysis.efficiency import EfficiencyComparison
    from opprof.analysis.gate import Gate
    from opprof.model.commmodel import Network
    from opprof.model.predict import ModelResult, Spread
    from opprof.model.whatif import WhatIf


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.2f} ms"


def diff_sentence(d: Diff) -> str:
    """Diff's closing sentence: which run is slower and by how much (unprofiled when both
    runs have unprofiled step times), the operator and the phase that explain most of the
    gap."""
    la, lb, a_step, b_step = d.a_label, d.b_label, d.a_step_ns, d.b_step_ns
    ua, ub, phases, ops = d.a_unprofiled_ns, d.b_unprofiled_ns, d.phases, d.ops
    if not a_step or not b_step:
        return "One of the traces has no steps, so there is no step-time gap to explain."
    gap = a_step - b_step
    if abs(gap) < 1e-9 * max(a_step, 1):
        return f"{la} and {lb} take the same profiled step time ({_ms(a_step)})."
    slow_is_a = gap > 0
    slower, faster = (la, lb) if slow_is_a else (lb, la)
    s_step, f_step = (a_step, b_step) if slow_is_a else (b_step, a_step)
    if ua and ub:  # the headline: without the profiler, whose overhead differs by framework
        slow_u = ua >= ub
        su, fu = (ua, ub) if slow_u else (ub, ua)
        head = (f"{la if slow_u else lb} takes {su / fu:.2f}x {lb if slow_u else la}'s "
                f"unprofiled step time ({_ms(su)} vs {_ms(fu)} per step; profiled "
                f"{s_step / f_step:.2f}x for {slower}: {_ms(s_step)} vs {_ms(f_step)})")
    else:
        head = (f"{slower} takes {s_step / f_step:.2f}x {faster}'s profiled step time "
                f"({_ms(s_step)} vs {_ms(f_step)} per step)")
    # the profiler's overhead can turn the ranking round: the operators (all profiled)
    # then explain the profiled gap, the other way round from the headline
    turned = ua is not None and ub is not None and bool(ua and ub) and (ua >= ub) != slow_is_a
    if turned:
        head += ("; the profiled steps rank them the other way round, so the operators (all "
                 "timed under the profiler) do not explain the unprofiled gap")
    same_sign = ops[np.sign(ops["delta_ns"]) == np.sign(gap)]
    if same_sign.empty:
        return head + "."
    top = same_sign.iloc[0]
    s_op, f_op = ((top["a_ns_per_step"], top["b_ns_per_step"]) if slow_is_a
                  else (top["b_ns_per_step"], top["a_ns_per_step"]))
    times = f"{s_op / f_op:.2f}x" if f_op else f"only in {slower}"
    what = (f"of the profiled gap ({slower} slower), {top['op']} explains most of it"
            if turned else f"{top['op']} explains most of it")
    text = (f"{head}; {what}: {_ms(s_op)} vs {_ms(f_op)} per step "
            f"({times}), {top['share_of_gap']:.0%} of the {'profiled ' if ua and ub else ''}gap")
    ph = phases[np.sign(phases["delta_ns"]) == np.sign(gap)]
    if not ph.empty:
        text += f"; the {ph.iloc[0]['phase']} phase accounts for {ph.iloc[0]['share_of_gap']:.0%}"
    return text + "."


def _pct(v: float | None) -> str:
    return "no evaluation" if v is None else f"{v:.0%}"


def _s(ns: float) -> str:
    return f"{ns / 1e9:.2f} s"


def target_sentence(t: AtTarget, la: str, lb: str) -> str:
    """Which of runs ``la`` and ``lb`` reaches one target test accuracy first, and how much
    of the difference the step time and the steps needed explain."""
    name = f"{t.target:.0%} test accuracy"
    if t.a is None and t.b is None:
        return (f"Neither run reaches {name} (best: {la} {_pct(t.a_best)}, {lb} "
                f"{_pct(t.b_best)}).")
    if t.a is None or t.b is None:
        who, hit, other, best = ((lb, t.b, la, t.a_best) if t.a is None
                                 else (la, t.a, lb, t.b_best))
        assert hit is not None
        return (f"Only {who} reaches {name} ({_s(hit.time_ns)}, step {hit.step}); "
                f"{other} stops at {_pct(best)}.")
    fast, slow = (la, lb) if t.first == "a" else (lb, la)
    hf, hs = (t.a, t.b) if t.first == "a" else (t.b, t.a)
    sf, ss = hf.time_ns / hf.step, hs.time_ns / hs.step
    text = (f"{fast} reaches {name} first: {_s(hf.time_ns)} vs {_s(hs.time_ns)} for {slow} "
            f"({hs.time_ns / hf.time_ns:.2f}x); steps needed {hf.step} vs {hs.step}, time "
            f"per step {sf / 1e6:.1f} ms vs {ss / 1e6:.1f} ms")
    share = t.step_time_share
    if share is not None:
        # rounded first: a share of 1 - 1e-16 is "0%", not "-0%"
        text += (f": the step time explains {round(share, 2) + 0.0:.0%} of the "
                 f"difference, the steps needed {round(1 - share, 2) + 0.0:.0%}")
    return text + "."


def convergence_sentence(c: Comparison) -> str:
    """Which run converges first: the sentences of the first target (50%) and the highest
    both runs reach; without any accuracy evaluated, each run's final loss."""
    if not c.targets:
        from opprof.analysis.convergence import FINAL_STEPS

        losses = ", ".join(f"{name} {loss:.3f}" for name, loss in c.final_losses)
        return (f"No accuracy was evaluated; final loss (mean of the last {FINAL_STEPS} "
                f"steps): {losses}.")
    return " ".join(target_sentence(t, c.a_label, c.b_label) for t in c.said)


def mismatch_lines(d: Diff) -> list[str]:
    """One ⚠ line naming how the two runs differ in device, framework version, batch size or
    workers (:attr:`Diff.mismatched`); empty when they match."""
    if not d.mismatched:
        return []
    said = ", ".join(f"{name} ({a} vs {b})" for name, a, b in d.mismatched)
    return [f"⚠ the runs differ in {said}: the gap is not the frameworks' alone"]


#: The memory verdict's metrics, in the order tried, and what each is in words.
_MEMORY_METRICS = (
    ("unprofiled_rss", "resident peak before profiling, the profiler's buffers left out"),
    ("peak_rss", "resident peak while profiling, the profiler's buffers included: no "
                 "unprofiled peak in both"))


def memory_verdict(d: Diff) -> str | None:
    """One verdict on memory: the largest worker's resident peak before profiling (the
    profiler's own buffers left out), else while profiling (said so); None without both."""
    for metric, what in _MEMORY_METRICS:
        row = d.memory[d.memory["metric"] == metric] if len(d.memory) else d.memory
        if len(row) and row["ratio"].notna().all():
            r = row.iloc[0]
            more = (f"{d.a_label} uses {r['ratio']:.2f}x {d.b_label}'s memory"
                    if r["ratio"] >= 1 else
                    f"{d.b_label} uses {1 / r['ratio']:.2f}x {d.a_label}'s memory")
            return (f"Memory verdict: {more} ({what}: {mib(r['a_bytes'])} vs "
                    f"{mib(r['b_bytes'])}, largest worker).")
    return None


def gate_notes(g: Gate) -> list[str]:
    """The notes under the regression gate's verdict: each side that ran on a busy machine,
    and the step compared on profiled steps where a side kept no unprofiled timing."""
    notes = []
    for side, spread, drift in g.busy:
        drifted = f", drifted {drift:+.0%}" if drift is not None else ""
        notes.append(f"⚠ {side} ran on a busy machine (its unprofiled steps vary by "
                     f"{spread:.0%}{drifted}): the load may differ between the runs by more "
                     "than either shows, so record both on a quiet machine before trusting "
                     "the verdict")
    if g.profiled_only:
        notes.append("the step is compared on profiled steps: "
                     + " and ".join(g.profiled_only) + " kept no unprofiled timing")
    return notes


def check_verdict(s: Spread) -> str:
    """A check's verdict from the measured run's spread: too noisy to judge (and why),
    within the measured noise, or off beyond it."""
    from opprof.model.predict import NOISY_CV, NOISY_HALF_WIDTH

    e_lo, e_hi = s.error_interval
    if s.noisy:
        why = (f"its {s.steps} step(s) vary by {s.cv:.1%} (cv; limit {NOISY_CV:.0%})"
               if s.steps > 1 and not s.cv <= NOISY_CV else
               f"its mean is known to ±{s.half_width:.1%} only (limit "
               f"±{NOISY_HALF_WIDTH:.0%}; {s.steps} step(s))")
        return f"too noisy to judge: {why}; record more steps on a quieter machine"
    if e_lo <= 0 <= e_hi:
        return f"within the measured noise (error {s.error:+.1%}, interval {e_lo:+.1%} … " \
               f"{e_hi:+.1%})"
    return (f"off by {s.error:+.1%}, beyond the measured noise (interval {e_lo:+.1%} … "
            f"{e_hi:+.1%})")


def noisy_run_note(label: str) -> str:
    """The note on a run whose timing the machine's load changed (a check across it measures
    the load too)."""
    return (f"{label}: noisy timing (the machine was busy while it ran); a check across runs "
            "whose speed the load changed measures the load too")


def fit_warning(net: Network) -> str | None:
    """One ⚠ line when the α–β fit misses a measured size by more than the limit
    (:func:`opprof.model.commmodel.fit_errors`; the model follows the measured times between
    the measured sizes, the line elsewhere and in its scaling to other worker counts); None
    otherwise."""
    from opprof.model.commmodel import FIT_LIMIT, fit_errors
    from opprof.render.units import size

    bad = [(n, e) for n, e in fit_errors(net) if abs(e) > FIT_LIMIT]
    if not bad:
        return None
    where = ", ".join(f"{e:+.0%} at {size(n)}" for n, e in bad)
    return (f"⚠ poor α–β fit: {where} (limit ±{FIT_LIMIT:.0%}); the model follows the measured "
            "times between the measured sizes, but rests on the line below them and when it "
            "scales to other worker counts — calibrate again on a quieter machine, or with more "
            "--repeat")


def model_notes(result: ModelResult) -> list[str]:
    """The notes under a prediction: a poor fit of its network, the model's, then one per
    run with noisy timing."""
    fit = fit_warning(result.network)
    return [*([f"network {fit}"] if fit else []), *result.notes,
            *(noisy_run_note(label) for label in result.noisy_runs)]


def whatif_notes(w: WhatIf) -> list[str]:
    """The notes under a what-if: each operator asked for that does not run in the trace."""
    return [f"{op} does not run in {w.label or 'the trace'}; nothing to scale"
            for op in w.absent_ops]


def efficiency_sentence(c: EfficiencyComparison, la: str = "A", lb: str = "B") -> str:
    """Which of two runs uses its machine better and which operator explains most of it
    (:func:`opprof.analysis.efficiency.compare`), ``la`` and ``lb`` their labels."""
    from opprof.render.units import flops_rate, share

    a, b, better, ops, what, missing = c.a, c.b, c.better, c.ops, c.what, list(c.missing)
    if a is None or b is None:
        return "No efficiency comparison (" + "; ".join(missing) + ")."
    if missing and what == "MFU":
        return (f"{la} achieves {flops_rate(a.achieved_flops_per_s)}, {lb} "
                f"{flops_rate(b.achieved_flops_per_s)} of model FLOPs; no MFU comparison ("
                + "; ".join(missing) + ").")
    if better is None:
        return f"{la} and {lb} use their machines alike (MFU {share(a.mfu)})."
    good, bad = (a, b) if better == "A" else (b, a)
    gl, bl = (la, lb) if better == "A" else (lb, la)
    text = (f"{gl} uses its machine better: MFU {share(good.mfu)} vs {share(bad.mfu)}"
            + (f" ({flops_rate(good.achieved_flops_per_s)} vs "
               f"{flops_rate(bad.achieved_flops_per_s)})" if what != "MFU" else
               " (each against its own peak)"))
    top = ops[ops["share_of_gap"] > 0]
    if len(top):
        r = top.iloc[0]
        g, b_ = (r["a_peak_share"], r["b_peak_share"]) if better == "A" else (
            r["b_peak_share"], r["a_peak_share"])
        text += (f"; {r['op']} explains most of it: {share(g)} vs {share(b_)} of peak, "
                 f"{share(r['share_of_gap'], 0)} of the difference")
    return text + "."
