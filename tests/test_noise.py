"""Noisy machines: the unprofiled timing is repeated before and after the profile and its
spread reported; a run whose steps vary, whose speed drifted, or that the profiler slowed
down is flagged in the report, the diff and the bench tables; `bench --repeat K` reports the
median of K recordings and their spread."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from opprof.analysis import noise
from opprof.loader import load
from opprof.trace import save
from tests.conftest import FIXTURES, run_cli
from tests.procs import needs

MS = 1_000_000


def meta_with(before: list[float], after: list[float]) -> dict:
    return {"unprofiled_samples_ns": {"0": {"before": [int(v * MS) for v in before],
                                            "after": [int(v * MS) for v in after]}}}


def steps(*ms: float) -> pd.DataFrame:
    return pd.DataFrame({"dur_ns": [int(v * MS) for v in ms]})


# ------------------------------------------------------------------ the thresholds


@pytest.mark.parametrize("before, after, profiled, flags", [
    ([100, 101, 99], [100, 102, 98], [110, 112], []),          # steady, small overhead
    ([100, 101, 99], [100, 102, 98], [160, 170], ["overhead"]),  # the profiler's cost
    ([100, 101, 99], [150, 151, 149], [150, 152], ["noisy"]),   # the load changed: drift
    ([60, 100, 180], [70, 140, 90], [100, 100], ["noisy"]),    # steps all over the place
    ([100, 100, 100], [300, 300, 300], [320], ["noisy", "overhead"]),
])
def test_flags_follow_the_documented_thresholds(before, after, profiled, flags) -> None:
    got = noise.assess(meta_with(before, after), steps(*profiled))
    assert got is not None
    assert got.flags == flags
    both = before + after
    assert got.samples == len(both)
    assert got.median_ns == pytest.approx(statistics.median(both) * MS)
    assert got.drift == pytest.approx(statistics.median(after) / statistics.median(before)
                                         - 1)
    assert got.overhead == pytest.approx(statistics.median(profiled)
                                            / statistics.median(both))
    assert got.limits == {"spread": noise.NOISE_SPREAD, "drift": noise.NOISE_DRIFT,
                             "overhead": noise.OVERHEAD_LIMIT}


def test_a_trace_without_samples_is_not_assessed() -> None:
    assert noise.assess({}, steps(10)) is None
    assert noise.flags(None) == []


# ------------------------------------------------------------------ a real recording


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    needs("torch")
    tmp = tmp_path_factory.mktemp("noise")
    res = run_cli("record", "--fw", "torch", "--model", "lenet5", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "--timing-steps", "3", "-o",
                  str(tmp / "run.trace"), cwd=tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "run.trace", res


@pytest.mark.slow
def test_record_times_the_unprofiled_steps_before_and_after(recorded) -> None:
    path, _ = recorded
    m = load(path).meta
    samples = m["unprofiled_samples_ns"]["0"]
    assert len(samples["before"]) == 3 and len(samples["after"]) == 3
    assert all(v > 0 for v in samples["before"] + samples["after"])
    assert m["unprofiled_step_ns"] == int(statistics.median(samples["before"]
                                                             + samples["after"]))


@pytest.mark.slow
def test_the_report_shows_the_spread_and_any_flag(recorded) -> None:
    path, res = recorded
    report = json.loads(run_cli("report", str(path), "--format", "json").stdout)
    n = report["noise"]
    assert n["samples"] == 6 and n["q1_ns"] <= n["median_ns"] <= n["q3_ns"]
    assert n["profiled_median_ns"] == pytest.approx(
        statistics.median(s["dur_ns"] for s in report["steps"]))
    assert "(median of 6 timed steps, IQR " in res.stdout
    for flag, words in (("noisy", "⚠ noisy timing"), ("overhead", "⚠ profiler overhead")):
        assert (words in res.stdout) == (flag in n["flags"])


def test_diff_says_when_a_side_is_flagged(tmp_path: Path) -> None:
    trace = load(FIXTURES / "torch" / "lenet5-cpu-2steps.pt.trace.json.gz")
    steady, busy = tmp_path / "steady.trace", tmp_path / "busy.trace"
    ms = statistics.median(b[3] - b[2] for b in trace.meta["step_bounds"]) / MS
    trace.meta.update(meta_with([ms] * 3, [ms] * 3))
    save(trace, steady)
    trace.meta.update(meta_with([ms / 3] * 3, [ms] * 3))  # slower after: the load changed
    save(trace, busy)
    lines = run_cli("diff", str(steady), str(busy)).stdout.splitlines()
    assert any(ln.startswith("B (busy.trace (torch)): ⚠ noisy timing: ") for ln in lines), lines
    assert not any(ln.startswith("A (") for ln in lines), lines  # as fast as its profile
    doc = json.loads(run_cli("diff", str(steady), str(busy), "--format", "json").stdout)
    assert doc["a_noise"]["flags"] == [] and "noisy" in doc["b_noise"]["flags"]
    md = run_cli("diff", str(steady), str(busy), "--format", "md").stdout
    assert "> B: ⚠ noisy timing" in md


# ------------------------------------------------------------------ bench --repeat


@pytest.mark.slow
def test_bench_repeat_reports_the_median_and_spread(tmp_path: Path) -> None:
    needs("torch")
    res = run_cli("bench", "--fw", "torch", "--model", "lenet5", "--batch-size", "8",
                  "--steps", "2", "--warmup", "1", "--timing-steps", "2", "--workers", "1",
                  "--repeat", "3", "-o", str(tmp_path / "b"), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "b"
    assert sorted(p.name for p in out.glob("*.trace")) == [
        f"lenet5-torch-w1-single-r{k}.trace" for k in (1, 2, 3)]
    run = json.loads((out / "bench.json").read_text())["runs"][0]
    each = [load(out / f"lenet5-torch-w1-single-r{k}.trace").meta["samples_per_s"]
            for k in (1, 2, 3)]
    assert run["repeats"] == 3
    assert run["samples_per_s"] == pytest.approx(statistics.median(each))
    assert (run["samples_per_s_min"], run["samples_per_s_max"]) == pytest.approx(
        (min(each), max(each)))
    assert run["repeat_spread"] == pytest.approx((max(each) - min(each))
                                                 / statistics.median(each))
    if run["repeat_spread"] > noise.NOISE_SPREAD:
        assert "noisy" in run["flags"].split(",")
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("│ torch │ lenet5"))
    below = res.stdout.splitlines()[res.stdout.splitlines().index(row) + 1]
    assert f" {run['samples_per_s']:,.1f} │" in row  # the median, its range below it
    assert f" ({min(each):,.1f}–{max(each):,.1f}) │" in below
    # --resume keeps the three recordings
    again = run_cli("bench", "--fw", "torch", "--model", "lenet5", "--batch-size", "8",
                    "--steps", "2", "--warmup", "1", "--timing-steps", "2", "--workers", "1",
                    "--repeat", "3", "-o", str(out), "--resume", timeout=600)
    assert again.returncode == 0 and again.stderr.count("kept ") == 3, again.stderr[-2000:]
