"""The analysis commands' pipelines: each returns one complete, immutable result that the
renderers only draw — the critical path inside the report that shows it, the what-if inside
the diff, the check and the noisy runs inside the model's result — and every format says a
result's verdicts in the same words (opprof.render.verdicts)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from opprof.pipeline.diff import DiffOptions, diff
from opprof.pipeline.model import ModelOptions, model
from opprof.pipeline.report import ReportOptions, report
from opprof.pipeline.whatif import WhatIfOptions, whatif
from opprof.render import renderer, verdicts
from tests.conftest import FIXTURES

DDP = FIXTURES / "torch-ddp"
SINGLE = FIXTURES / "memory" / "torch-lenet5"
MXNET = FIXTURES / "mxnet" / "lenet5-ps-sync"


def _frozen(result: object, field: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(result, field, None)


@pytest.mark.parametrize(("by", "fmt", "critical"), [
    ("phase", "json", False), ("critical", "json", True), ("critical", "rich", True),
    ("op", "html", True)])
def test_the_report_holds_the_critical_path_when_its_output_shows_it(
        by: str, fmt: str, critical: bool) -> None:
    o = ReportOptions((DDP,), by=by, fmt=fmt, jobs=1)
    assert o.critical == critical
    result = report(o)
    rep = result.report
    _frozen(rep, "critical")
    _frozen(result, "advice")
    assert (result.advice is not None) == o.advised == (fmt in ("rich", "html") and
                                                       by in ("phase", "op") and
                                                       (fmt == "html" or by == "phase"))
    assert (len(rep.critical) > 0) == critical
    if critical:  # one row per worker rank and step, as the whole trace's critical path
        assert set(rep.critical["rank"]) == set(rep.steps["rank"])
        assert len(rep.critical) == len(rep.steps)


def test_the_critical_report_is_the_plain_one_beside_its_critical_path() -> None:
    plain, crit = (report(ReportOptions((DDP,), by=by, fmt="json", jobs=1)).report
                   for by in ("phase", "critical"))
    text = renderer("json").report
    a, b = json.loads(text(plain)), json.loads(text(crit))
    assert "critical" not in a and b.pop("critical")
    assert a == b


def test_the_advice_and_the_critical_path_share_one_graph() -> None:
    """The HTML page's critical path is the one `--by critical` computes alone, and its
    advice the one `opprof advise` gives, though both come from one graph."""
    page = report(ReportOptions((DDP,), fmt="html", jobs=1))
    alone = report(ReportOptions((DDP,), by="critical", fmt="json", jobs=1, advice=False))
    assert page.report.critical.equals(alone.report.critical)
    from opprof.pipeline.advise import advise_trace

    _, _, advisory = advise_trace([DDP])
    assert page.advice is not None
    assert page.advice.to_dict() == advisory.to_dict()


@pytest.mark.parametrize("with_whatif", [False, True])
def test_the_diff_holds_its_whatif(with_whatif: bool) -> None:
    d = diff(DiffOptions(SINGLE, MXNET, whatif=with_whatif, jobs=1))
    _frozen(d, "whatif")
    assert (d.whatif is not None) == with_whatif
    if with_whatif:
        assert len(d.whatif) and (d.whatif["saving_ns"].diff().dropna() <= 0).all()
    sentence = verdicts.diff_sentence(d)
    for fmt in ("rich", "md"):
        assert sentence in renderer(fmt).diff(d).replace("\n", " ") or fmt == "rich"
    assert json.loads(renderer("json").diff(d))["summary"] == sentence


def test_the_same_file_twice_is_one_report() -> None:
    d = diff(DiffOptions(SINGLE, SINGLE, jobs=1))
    assert d.a_step_ns == d.b_step_ns
    assert verdicts.diff_sentence(d).startswith(f"{d.a_label} and {d.b_label} take the same")


def test_the_model_holds_its_check_and_says_its_verdict_in_every_format() -> None:
    result = model(ModelOptions((SINGLE,), workers=(2,), measured=DDP))
    _frozen(result, "check")
    assert result.check is not None and result.check.spread is not None
    assert 2 in [p.workers for p in result.predictions]
    said = verdicts.check_verdict(result.check.spread)
    doc = json.loads(renderer("json").model(result))
    assert doc["check"]["spread"]["verdict"] == said
    assert doc["notes"] == verdicts.model_notes(result)
    assert f"Measured noise: {said}." in renderer("md").model(result)


def test_a_noisy_run_is_a_fact_of_the_result_and_a_note_in_words() -> None:
    result = model(ModelOptions((SINGLE,), workers=(2,), measured=DDP))
    noisy = dataclasses.replace(result, noisy_runs=("base.trace",))
    notes = verdicts.model_notes(noisy)
    assert notes[-1] == verdicts.noisy_run_note("base.trace")
    assert notes[-1].startswith("base.trace: noisy timing")
    assert json.loads(renderer("json").model(noisy))["notes"] == notes


def test_the_whatif_says_which_operator_does_not_run(tmp_path: Path) -> None:
    w = whatif(WhatIfOptions((SINGLE,), ops=("attention=0.5", f"convolution={DDP}")))
    _frozen(w, "scenario")
    assert w.absent_ops == ["attention"]
    assert [c.target for c in w.scenario] == ["attention", "convolution"]
    notes = json.loads(renderer("json").whatif(w))["notes"]
    assert notes == [f"attention does not run in {w.label}; nothing to scale"]


def test_a_large_job_leaves_its_advice_to_opprof_advise(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Above ADVICE_INLINE_FILES files (or ADVICE_INLINE_BYTES) the report reads the job rank
    by rank, in flat memory, and its advice section says to run `opprof advise` (which reads
    the job whole); the report is the one made without advice."""
    import opprof.pipeline.report as pipeline_report

    monkeypatch.setattr(pipeline_report, "ADVICE_INLINE_FILES", 1)
    o = ReportOptions((DDP,), jobs=1)
    assert o.wants_advice and not o.advised and not o.whole
    result = report(o)
    assert result.advice is not None and result.advice.advice == []
    assert "run opprof advise" in result.advice.not_checked["advice"]
    text = renderer("rich").report(result.report, advice=result.advice)
    assert "Advice: none (the job is " in text and "files" in text
    plain = report(ReportOptions((DDP,), jobs=1, advice=False)).report
    js = renderer("json").report
    assert json.loads(js(plain)) == json.loads(js(result.report))
