"""The HTML report's work done once (issue #34): the step breakdown handed to the report, the
collectives kept for the next caller, names tested per distinct name — each the same result as
computing it afresh, on real traces."""

from __future__ import annotations

import re
from contextlib import nullcontext

import numpy as np
import pytest

from opprof.analysis import ranks
from opprof.analysis.breakdown import step_breakdown
from opprof.analysis.report import build_report
from opprof.filters import names_where
from opprof.loader import load
from opprof.render.jsonfmt import report as report_json
from opprof.strings import plain_strings
from tests.conftest import FIXTURES, shared_trace

MULTI_RANK = [FIXTURES / "torch-parallel" / "fsdp-tp", FIXTURES / "advise" / "ddp.trace",
              FIXTURES / "colocation" / "mxnet-lenet5-ps2.trace"]


@pytest.mark.parametrize("path", MULTI_RANK, ids=lambda p: p.name)
def test_report_from_the_whole_traces_step_breakdown_is_the_report(path):
    trace = load([path])
    steps = step_breakdown(trace)
    assert steps["rank"].nunique() >= 2  # each rank's rows handed to its own analysis
    given = build_report(trace, steps=steps)
    fresh = build_report(trace)
    for by in ("phase", "op", "rank"):
        assert report_json(given, by) == report_json(fresh, by)


def test_collectives_asked_again_are_the_same_and_a_callers_change_stays_its_own():
    trace = load([shared_trace("nccl-2rank-rank0.json.gz")])
    ranks._FOUND.clear()
    first, pay = ranks.collectives(trace)
    assert len(first) > 0 and len(pay) > 0
    first["ts"] = -1  # a caller writing into what it got
    again, pay_again = ranks.collectives(trace)
    ranks._FOUND.clear()
    fresh, pay_fresh = ranks.collectives(trace)
    assert (again["ts"] >= 0).all()
    assert again.equals(fresh) and pay_again.equals(pay_fresh)


COLLECTIVE_INPUTS = [*MULTI_RANK, FIXTURES / "shared" / "kineto-gpu" / "nccl-2rank-rank0.json.gz",
                     FIXTURES / "gpu-public" / "resnet-checkpoint-ddp-mi300x.json.gz",
                     FIXTURES / "torch-collectives", FIXTURES / "parallel-model" / "pp.trace",
                     FIXTURES / "mxnet" / "lenet5-ps-sync", FIXTURES / "tf" / "lenet5-allreduce-2w"]


@pytest.mark.parametrize("path", COLLECTIVE_INPUTS, ids=lambda p: p.name)
def test_collectives_kept_with_arrow_text_are_what_plain_strings_compute(path):
    """The report asks for the collectives within plain_strings after the model asked for
    them without: the kept tables, their text as Python strings, are what it computes."""
    trace = load([path])
    ranks._FOUND.clear()
    ranks.collectives(trace)
    with plain_strings():
        kept = ranks.collectives(trace)
        ranks._FOUND.clear()
        fresh = ranks.collectives(trace)
    for a, b in zip(kept, fresh, strict=True):
        assert list(a.dtypes) == list(b.dtypes)
        assert a.equals(b)


@pytest.mark.parametrize("plain", [False, True], ids=["strings", "plain-strings"])
@pytest.mark.parametrize("pattern", [r"(?i)(?:cuda|hip)GraphLaunch", r"^Optimizer\.step#",
                                     r"^aten::", r"nan"])
def test_names_tested_per_distinct_name_match_the_per_event_test(pattern, plain):
    ev = load([FIXTURES / "gpu" / "compiled-cudagraphs.pt.trace.json.gz"]).events
    ev = ev.assign(name=ev["name"].cat.add_categories(["unused"]))
    ev.loc[ev.index[:3], "name"] = np.nan  # missing names: whatever astype(str) makes of them
    rx = re.compile(pattern)
    with plain_strings() if plain else nullcontext():
        fast = names_where(ev, lambda name: rx.search(name) is not None)
        slow = ev["name"].astype(str).str.contains(pattern, regex=True).fillna(False)
    assert fast.index.equals(ev.index)
    assert (fast.to_numpy() == slow.to_numpy().astype(bool)).all()
    if pattern != "nan":
        assert fast.any()  # the trace has names of each kind: the test tests something
