"""`opprof bench`: a real small matrix (torch and a second framework whose collector imports
× lenet5 × workers 1,2), resuming it, a failing run as a row, and the matrix plan."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from opprof.loader import load
from opprof.pipeline.bench import plan, probe
from opprof.taxonomy import CANONICAL_OPS, PHASES
from tests.conftest import run_cli
from tests.procs import needs

TINY = ["--model", "lenet5", "--batch-size", "8", "--steps", "2", "--warmup", "1",
        "--timing-steps", "1"]


def second_framework() -> str | None:
    """mxnet, else tf: the first whose collector module exists and imports."""
    for fw in ("mxnet", "tf"):
        if probe(fw)[0] is not None:
            return fw
    return None


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory):
    needs("torch")
    other = second_framework()
    fws = ["torch"] + ([other] if other else [])
    out = tmp_path_factory.mktemp("bench")
    args = ["bench", "--fw", ",".join(fws), *TINY, "--workers", "1,2",
            "--mode", "allreduce,ps-sync,ps-async", "-o", str(out), "--timeout", "300",
            "--threads", "1"]
    res = run_cli(*args, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    return fws, out, args, res


@pytest.mark.slow
def test_every_valid_combination_is_recorded(matrix) -> None:
    fws, out, _, res = matrix
    doc = json.loads((out / "bench.json").read_text())
    runs = {(r["fw"], r["workers"], r["mode"]): r for r in doc["runs"]}
    assert runs[("torch", 1, "single")]["status"] == "ok"
    assert runs[("torch", 2, "allreduce")]["status"] == "ok"
    assert runs[("torch", 2, "ps-sync")]["status"] == "skipped"
    assert "no ps-sync mode" in runs[("torch", 2, "ps-sync")]["reason"]
    ok = [r for r in doc["runs"] if r["status"] == "ok"]
    for fw in fws:
        assert any(r["fw"] == fw and r["workers"] == 2 for r in ok), fw
        assert runs[(fw, 1, "single")]["status"] == "ok"
    for r in ok:
        trace = load(out / f"lenet5-{r['fw']}-w{r['workers']}-{r['mode']}.trace")
        assert trace.meta["workers"] == r["workers"] and trace.meta["framework"] == r["fw"]
        assert sum(r[p] for p in PHASES) == pytest.approx(r["step_ns"])
        one = runs[(r["fw"], 1, "single")]["samples_per_s"]
        assert r["scaling_efficiency"] == pytest.approx(
            r["samples_per_s"] / (r["workers"] * one))
    # the model's prediction of every multi-worker run from its 1-worker run
    for r in ok:
        if r["workers"] > 1:
            assert r["predicted_step_ns"] > 0, r["prediction_note"]
            assert r["predicted_scaling"] == pytest.approx(
                runs[(r["fw"], 1, "single")]["step_ns"] / r["predicted_step_ns"])
            assert r["prediction_error"] == pytest.approx(
                r["predicted_step_ns"] / r["step_ns"] - 1)
    assert "opprof bench — runs" in res.stdout and "Phase breakdown" in res.stdout
    assert "predicted" in res.stdout
    csv = pd.read_csv(out / "bench.csv")
    assert len(csv) == len(doc["runs"]) and {"samples_per_s", "scaling_efficiency"} <= set(csv)
    assert "### Runs" in (out / "bench.md").read_text()


@pytest.mark.slow
def test_cross_framework_operator_ratios(matrix) -> None:
    fws, out, _, _ = matrix
    assert len(fws) >= 2, f"only {fws} record here: the frameworks' extras are declared"
    ratios = json.loads((out / "bench.json").read_text())["op_ratios"]
    assert ratios and ratios == sorted(ratios, key=lambda r: -r["ratio"])
    for r in ratios:
        assert r["ratio"] >= 1 and r["slower"].split()[0] != r["faster"].split()[0]
        assert r["slower_ns_per_step"] == pytest.approx(r["ratio"] * r["faster_ns_per_step"])
    assert {r["op"] for r in ratios} <= set(CANONICAL_OPS) - {"other"}
    assert {r["workers"] for r in ratios} <= {1, 2} and {r["model"] for r in ratios} == {"lenet5"}


@pytest.mark.slow
def test_resume_continues_a_partial_matrix(matrix) -> None:
    _, out, args, _ = matrix
    before = json.loads((out / "bench.json").read_text())["runs"]
    gone = out / "lenet5-torch-w1-single.trace"
    gone.unlink()
    res = run_cli(*args, "--resume", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    after = {(r["fw"], r["workers"], r["mode"]): r
             for r in json.loads((out / "bench.json").read_text())["runs"]}
    assert after[("torch", 1, "single")]["status"] == "ok" and gone.exists()
    for r in before:
        if r["status"] == "ok" and (r["fw"], r["workers"]) != ("torch", 1):
            kept = after[(r["fw"], r["workers"], r["mode"])]
            assert kept["status"] == "resumed" and kept["step_ns"] == r["step_ns"]
    assert res.stderr.count("recording …") == 1


def test_a_failed_run_is_a_row_with_its_error(tmp_path: Path) -> None:
    needs("torch")
    res = run_cli("bench", "--fw", "torch", *TINY, "--workers", "1", "--dataset",
                  str(tmp_path / "no-such-data"), "-o", str(tmp_path / "b"), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    run = json.loads((tmp_path / "b" / "bench.json").read_text())["runs"][0]
    assert run["status"] == "failed" and "no-such-data" in run["reason"]
    assert "failed" in res.stdout


def test_plan_skips_what_a_framework_cannot_record() -> None:
    support = {"torch": (("single", "allreduce"), ""), "tf": (None, "no collector yet"),
               "mxnet": (("single", "ps-sync", "ps-async"), "")}
    runs = plan(["torch", "mxnet", "tf"], ["lenet5"], [1, 3], ["allreduce", "ps-sync"], support)
    got = {(r.fw, r.workers, r.mode): (r.status, r.reason) for r in runs}
    assert got[("torch", 1, "single")] == ("planned", "")  # one single run per 1 worker
    assert sum(1 for r in runs if r.fw == "torch" and r.workers == 1) == 1
    assert got[("torch", 3, "allreduce")][0] == "planned"
    assert got[("torch", 3, "ps-sync")] == (
        "skipped", "torch has no ps-sync mode (it records single, allreduce)")
    assert got[("mxnet", 3, "allreduce")][0] == "skipped"
    assert got[("mxnet", 3, "ps-sync")][0] == "planned"
    assert all(got[k] == ("skipped", "no collector yet") for k in got if k[0] == "tf")
    assert [r.name for r in runs][:2] == ["lenet5-torch-w1-single", "lenet5-torch-w3-allreduce"]


@pytest.mark.slow
def test_bench_writes_its_html_page_and_figures(matrix) -> None:
    """A real bench's bench.html opens in Chromium with every chart drawn; its figures are
    written as SVG and PNG (scaling: the 2-worker runs beside the 1-worker ones)."""
    from tests import browser

    _, out, _, res = matrix
    assert "bench.html, figures/{phases,ops,scaling,memory}.svg|png" in res.stderr or \
        "bench.html, figures/{phases,scaling,memory}.svg|png" in res.stderr
    for name in ("phases", "scaling", "memory"):
        for suffix in (".svg", ".png"):
            assert (out / "figures" / f"{name}{suffix}").stat().st_size > 5_000
    page = out / "bench.html"
    assert page.read_text().rstrip().endswith("</html>")
    if browser.chromium() is None:
        pytest.skip("Chromium not found: bench.html not opened in a browser")
    dom = browser.dump_dom(page)
    assert 'id="opprof-script-error"' not in dom and 'data-charts="true"' in dom
    assert 'id="scaling"' in dom and "torch allreduce · lenet5 measured" in dom
