"""Convergence runs (`record --converge`): the runner's curve, the analysis (time to accuracy,
which run reaches it first) and real recordings of the three frameworks, tiny."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from opprof.analysis.convergence import Hit, compare, reached, summary, time_to_accuracy
from opprof.collectors.runner import Convergence, Curve
from opprof.render.verdicts import convergence_sentence, target_sentence
from opprof.trace import (
    CONVERGENCE_COLUMNS,
    CONVERGENCE_KEY,
    META_KEY,
    TraceFile,
    convergence_frame,
)
from tests.conftest import REPO, run_cli
from tests.procs import needs

# ------------------------------------------------------------------ the runner's curve


def test_curve_reads_losses_after_the_profile_and_evaluates_outside_the_protocol() -> None:
    reads: list[int] = []
    evals: list[int] = []
    rows_seen: list[int] = []

    def accuracy() -> tuple[float, float]:
        evals.append(len(rows_seen))
        return 0.25, 0.5

    def loss(out: int) -> float:
        reads.append(out)
        return out / 10

    curve = Curve(Convergence(steps=8, eval_every=2, loss=loss, accuracy=accuracy))
    # steps 1-2 free, 3-5 profiled (inside the timed protocol), 6-8 free
    for step in range(1, 9):
        rows_seen.append(step)
        profiling, timing = 3 <= step <= 5, 2 <= step <= 5
        curve.add(step, 1_000, step, profiling, timing)
        if profiling:
            assert reads[-1] < 3  # a profiled step's loss is not read while profiling
    rows = curve.finish()
    assert reads == list(range(1, 9))
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert [r["time_ns"] for r in rows] == [1_000 * s for s in range(1, 9)]
    assert [r["loss"] for r in rows] == pytest.approx([s / 10 for s in range(1, 9)])
    # due at 2 and 4 (inside the protocol): one evaluation at step 6; then at 8
    assert evals == [6, 8]
    assert [r["step"] for r in rows if r["test_accuracy"] is not None] == [6, 8]


# ------------------------------------------------------------------ the analysis


def _curve(rank: int, step_ns: int, hits: dict[int, float], steps: int = 40) -> list[dict]:
    return [{"rank": rank, "step": s, "time_ns": s * step_ns, "loss": 2.0 / s,
             "train_accuracy": hits.get(s), "test_accuracy": hits.get(s)}
            for s in range(1, steps + 1)]


def test_time_to_accuracy_waits_for_every_rank() -> None:
    meta = {"convergence": _curve(0, 10, {10: 0.4, 20: 0.6, 30: 0.75})
            + _curve(1, 12, {10: 0.55, 20: 0.72, 30: 0.74})}
    curve = convergence_frame(meta)
    assert list(curve.columns) == list(CONVERGENCE_COLUMNS)
    assert reached(curve, 0.5) == (200, 20)  # rank 1 at 120 ns (step 10), rank 0 at 200 ns
    assert time_to_accuracy(curve) == {"0.5": 200, "0.7": 300}  # 0.9: not reached
    s = summary(meta)
    assert s is not None
    assert s.steps_to_accuracy == {"0.5": 20, "0.7": 30} and s.ranks == 2
    assert s.best_test_accuracy == 0.75 and s.final_test_accuracy == 0.74
    assert s.first_loss == 2.0 and s.final_loss == pytest.approx(
        np.mean([2.0 / k for k in range(31, 41)]))
    assert summary({}) is None and convergence_frame({}).empty


def test_compare_splits_the_gap_into_step_time_and_steps() -> None:
    a = {"convergence": _curve(0, 10, {20: 0.6})}  # 50% at step 20, 10 ns/step: 200 ns
    b = {"convergence": _curve(0, 5, {80: 0.6}, steps=100)}  # at step 80, 5 ns/step: 400 ns
    c = compare(a, b, "A", "B")
    assert c is not None
    first = c.targets[0]
    assert first.target == 0.5 and first.first == "a" == c.first
    assert first.a == Hit(time_ns=200, step=20) and first.b == Hit(time_ns=400, step=80)
    # 400/200 = (80/20 steps) × (5/10 ns per step): log shares 2 and -1 of 1
    assert first.step_time_share == pytest.approx(-1.0)
    assert first.steps_share == pytest.approx(2.0)
    assert convergence_sentence(c).startswith("A reaches 50% test accuracy first")
    assert c.targets[1].first is None
    assert target_sentence(c.targets[1], "A", "B").startswith("Neither run reaches 70%")
    # the same steps needed, only the step time differs: no "-0%" from a rounding error
    at_100 = [[{**r, "time_ns": r["step"] * t // 100}
               for r in _curve(0, 1, {100: 0.6}, steps=100)] for t in (577518151, 604561200)]
    same = compare({"convergence": at_100[0]}, {"convergence": at_100[1]}, "A", "B")
    assert same is not None
    assert convergence_sentence(same).endswith(
        "explains 100% of the difference, the steps needed 0%.")
    only = compare(a, {"convergence": _curve(0, 5, {80: 0.3}, steps=100)}, "A", "B")
    assert only is not None and only.first == "a"
    assert convergence_sentence(only).startswith("Only A reaches 50%")
    assert compare({}, {}, "A", "B") is None
    loss_only = [{**r, "train_accuracy": None, "test_accuracy": None} for r in _curve(0, 5, {})]
    c = compare({"convergence": loss_only}, {}, "A", "B")
    assert c is not None and c.targets == [] and c.first is None
    assert convergence_sentence(c) == (
        "No accuracy was evaluated; final loss (mean of the last 10 "
        f"steps): A {np.mean([2.0 / k for k in range(31, 41)]):.3f}.")


# ------------------------------------------------------------------ real recordings


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """A tiny convergence run per framework: 60 steps of batch 16, evaluated every 20."""
    folder = tmp_path_factory.mktemp("converge")
    out = {}
    for fw in ("torch", "mxnet", "tf"):
        needs({"tf": "tensorflow"}.get(fw, fw))
        trace = folder / f"{fw}.trace"
        res = run_cli("record", "--fw", fw, "--model", "lenet5", "--batch-size", "16",
                      "--steps", "2", "--warmup", "1", "--timing-steps", "1",
                      "--converge", "60", "--eval-every", "20", "-o", str(trace),
                      "--format", "json", cwd=folder)
        assert res.returncode == 0, res.stderr[-2000:]
        out[fw] = (trace, json.loads(res.stdout))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fw", ["torch", "mxnet", "tf"])
def test_record_converge_keeps_a_falling_loss_and_the_accuracy(runs, fw: str) -> None:
    trace, report = runs[fw]
    rows = pd.DataFrame(report["convergence"])
    assert list(rows.columns) == list(CONVERGENCE_COLUMNS)
    assert rows["step"].tolist() == list(range(1, 61)) and (rows["rank"] == 0).all()
    assert rows["time_ns"].is_monotonic_increasing and rows["loss"].notna().all()
    assert rows["loss"].head(10).mean() > rows["loss"].tail(10).mean()  # it learns
    evals = rows.dropna(subset=["test_accuracy"])
    assert evals["step"].tolist() == [20, 40, 60]
    assert evals[["train_accuracy", "test_accuracy"]].apply(lambda c: c.between(0, 1)).all().all()
    assert evals["test_accuracy"].max() > 0.15  # better than chance (10 classes)
    s = report["convergence_summary"]
    assert s["steps"] == 60 and s["final_loss"] < s["first_loss"]
    assert report["time_to_accuracy"] == s["time_to_accuracy"]
    for target, ns in report["time_to_accuracy"].items():  # the first evaluation reaching it
        first = evals[evals["test_accuracy"] >= float(target)].iloc[0]
        assert ns == first["time_ns"]
    assert "convergence" not in report["meta"]  # once, under its own key
    # the .trace holds the same table, under its own Parquet key
    assert convergence_frame(TraceFile(trace).meta).equals(
        rows.astype(CONVERGENCE_COLUMNS))
    assert CONVERGENCE_KEY in pq.read_schema(trace).metadata


@pytest.mark.slow
def test_duckdb_reads_the_table_and_diff_names_the_first(runs) -> None:
    import duckdb
    trace, report = runs["torch"]
    sql = (REPO / "docs" / "convergence.md").read_text().split(
        "-- convergence table\n")[1].split("\n```")[0]
    got = duckdb.sql(sql.replace("run.trace", str(trace))).df()
    assert got["step"].tolist() == list(range(1, 61))
    assert np.allclose(got["loss"], [r["loss"] for r in report["convergence"]])
    res = run_cli("diff", str(runs["torch"][0]), str(runs["mxnet"][0]), "--format", "json")
    assert res.returncode == 0, res.stderr
    c = json.loads(res.stdout)["convergence"]
    assert [t["target"] for t in c["targets"]] == [0.5, 0.7, 0.9]
    assert c["sentence"]


@pytest.mark.slow
def test_a_trace_without_the_table_reads_as_before(runs, tmp_path: Path) -> None:
    table = pq.read_table(runs["torch"][0])
    old = tmp_path / "old.trace"
    pq.write_table(table.replace_schema_metadata(
        {META_KEY: table.schema.metadata[META_KEY]}), old)
    assert convergence_frame(TraceFile(old).meta).empty
    res = run_cli("report", str(old), "--format", "json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["convergence"] == [] and out["time_to_accuracy"] == {}
    assert out["convergence_summary"] is None


@pytest.mark.slow
def test_bench_columns_curves_and_figure(runs, tmp_path: Path) -> None:
    needs("matplotlib")
    from opprof.analysis.matrix import CONVERGENCE_COLUMNS as BENCH_COLUMNS
    from opprof.analysis.matrix import Bench, convergence_columns
    from opprof.render.plotdata import bench_curves

    trace, report = runs["torch"]
    conv = convergence_columns(TraceFile(trace).meta)
    assert conv is not None
    cols = conv.columns()
    s = report["convergence_summary"]
    assert cols["final_loss"] == conv.final_loss == s["final_loss"]
    assert cols["best_test_accuracy"] == conv.best_test_accuracy == s["best_test_accuracy"]
    for t in ("50", "70", "90"):
        ns = s["time_to_accuracy"].get(f"0.{t[0]}")
        assert cols[f"time_to_{t}_s"] == (None if ns is None else ns / 1e9)
    assert list(cols) == list(BENCH_COLUMNS)
    assert conv.curve["step"] == list(range(1, 61))  # under 200 points: all kept
    table = pd.DataFrame([{"fw": "torch", "model": "lenet5", "workers": 1, "mode": "single"}])
    curves = bench_curves(Bench(table, pd.DataFrame(), {}, None,
                                {"lenet5-torch-w1-single": [conv.curve, conv.curve]}))
    assert len(curves) == 120 and curves["repeat"].tolist() == [1] * 60 + [2] * 60
    assert curves["test_accuracy"].notna().sum() == 6
    out = tmp_path / "conv.svg"
    res = run_cli("plot", str(trace), str(runs["mxnet"][0]), "--figure", "convergence",
                  "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "test accuracy" in out.read_text()


USER_SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(512, 16)
y = (x @ torch.randn(16, 4)).argmax(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(30):
    i = torch.arange(step * 16, step * 16 + 16) % 512
    loss = nn.functional.cross_entropy(model(x[i]), y[i])
    opt.zero_grad()
    if step % 2:
        loss.backward()
    else:
        torch.autograd.backward(loss)
    opt.step()
    print("loss", repr(loss.item()))
"""


@pytest.mark.slow
def test_opprof_run_keeps_the_loss_of_each_step(tmp_path: Path) -> None:
    needs("torch")
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    trace = tmp_path / "mine.trace"
    res = run_cli("run", "--steps", "2", "-o", str(trace), "--format", "json", "--",
                  "python", str(script), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    printed = [float(line.split()[1]) for line in res.stderr.splitlines()  # JSON on stdout
               if line.startswith("loss ")]
    report = json.loads(res.stdout)
    rows = report["convergence"]
    assert len(printed) == 30 and [r["step"] for r in rows] == list(range(1, 31))
    assert [r["loss"] for r in rows] == printed  # exactly the scalar backward() ran on
    assert all(r["test_accuracy"] is None for r in rows)
    assert [r["time_ns"] for r in rows] == sorted(r["time_ns"] for r in rows)
    assert report["convergence_summary"]["final_loss"] < report["convergence_summary"][
        "first_loss"]
    off = run_cli("run", "--steps", "2", "-o", str(tmp_path / "off.trace"), "--format", "json",
                  "--", "python", str(script), cwd=tmp_path, env={"OPPROF_LOSS": "0"})
    assert off.returncode == 0, off.stderr[-2000:]
    assert json.loads(off.stdout)["convergence"] == []
