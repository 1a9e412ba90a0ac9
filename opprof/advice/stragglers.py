"""Stragglers: in a synchronous job every rank waits for the slowest at each collective, so a
rank that is slower step after step slows them all. Evidence: per step, the rank with the
largest own time (step minus its wait for others; :mod:`opprof.analysis.ranks`), how often the
same rank is the slowest — more often than chance allows (:data:`CHANCE`), else it is the
machine's noise —, by how much, its host. Action: name the rank and what to look at
(its data shard, its device or host, what else runs there; or balance the work). Saving: per
step, the slowest rank's own time minus the next slowest's (the step is bound by the slowest:
at the others' speed it would be bound by the next), the mean over the steps — the
rank's excess, not a guess; where the trace has a dependency graph, the replay with the rank's
work at the median rank's speed is given beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from opprof.advice.base import Advice

if TYPE_CHECKING:
    from opprof.advice.evidence import Evidence
    from opprof.jsontypes import JSONObject

NAME = "stragglers"
NEEDS: tuple[str, ...] = ("ranks",)
#: How unlikely it must be that one of the ranks is the slowest that often by chance (a
#: binomial tail, each rank equally likely to be the slowest of a step).
CHANCE = 0.1


def advise(ev: Evidence) -> list[Advice]:
    """The straggler advice (see the module docstring)."""
    from opprof.analysis.ranks import synchronous

    per = ev.report.rank_steps
    if per.empty or per["rank"].nunique() < 2 or not synchronous(ev.meta):
        return []
    if ev.pipeline_job:
        return []  # pipeline stages differ by design: the pipeline rule's question
    per = per.dropna(subset=["own_ns"])
    per = per[per.groupby("step")["rank"].transform("nunique") >= 2]
    if per.empty:
        return []
    slowest = per.loc[per.groupby("step")["own_ns"].idxmax()]
    counts = slowest["rank"].value_counts()
    rank = int(counts.index[0])
    steps = int(per["step"].nunique())
    n_ranks = int(per["rank"].nunique())
    chance = _by_chance(int(counts.iloc[0]), steps, n_ranks)
    if chance >= CHANCE:
        return []  # another rank is as likely: the machine's noise, no straggler
    saving = []
    for _, g in per.groupby("step"):
        own = g.set_index("rank")["own_ns"].astype(np.float64)
        if int(own.idxmax()) != rank:
            saving.append(0.0)
            continue
        others = own.drop(rank)
        saving.append(max(0.0, float(own[rank]) - float(others.max())))
    saving_ns = float(np.mean(saving))
    step = ev.step_ns
    mine = per[per["rank"] == rank]
    rest = per[per["rank"] != rank]
    median_other = float(rest.groupby("step")["own_ns"].median().mean())
    own = float(mine["own_ns"].mean())
    hosts = {str(r.get("rank")): r.get("host") for r in (ev.meta.get("per_rank") or [])
             if isinstance(r, dict)}
    evidence: JSONObject = {"rank": rank, "slowest_in_steps": int(counts.iloc[0]), "steps": steps,
                            "chance": chance,
                "own_ns_per_step": own, "others_median_own_ns": median_other,
                "excess_share": own / median_other - 1.0 if median_other > 0 else None,
                "host": hosts.get(str(rank))}
    factor = median_other / own if own > 0 else 1.0
    from opprof.model.knobs import rank_scaled

    replay = rank_scaled(ev.context, rank, factor)
    if replay is not None:
        evidence["replay_saving_ns"] = replay.saving_ns
    where = f" on host {evidence['host']}" if evidence["host"] else ""
    finding = (f"straggler: rank {rank}{where} is the slowest in {counts.iloc[0]} of {steps} "
               f"steps; its own work takes {own / 1e6:,.1f} ms per step against "
               f"{median_other / 1e6:,.1f} ms for the others "
               f"({own / median_other - 1.0:+.0%}), and every rank waits for it")
    action = (f"look at rank {rank}: its share of the data (sizes per sample, a sampler that "
              "splits unevenly), its device or host (other processes, CPU binding, thermal "
              "limits), or give it less work")
    return [Advice(NAME, finding, action, saving_ns, saving_ns / step if step else 0.0,
                   "medium", evidence, "the slowest rank's excess over the next slowest, per "
                                       "step (the synchronous step is bound by the slowest)")]


def _by_chance(k: int, n: int, ranks: int) -> float:
    """The probability that some rank is the slowest in at least ``k`` of ``n`` steps when each
    of ``ranks`` ranks is as likely to be (a union bound over the ranks)."""
    from math import comb

    p = 1.0 / ranks
    tail = sum(comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))
    return min(1.0, ranks * tail)
