"""`opprof bench --threads 1,2 --batch-size 4,8`: every value of each sweep is a run (its
trace named after it, recorded with that batch size and thread count), the sweep tables and
the sentence per run of where it stops scaling, bench.json's ``sweeps``, and the threads and
batch figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opprof.analysis.sweeps import MIN_GAIN, plateaus, sweep
from opprof.pipeline.bench import read_bench
from opprof.trace import TraceFile
from tests.conftest import run_cli
from tests.procs import needs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    needs("torch")
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    res = run_cli("bench", "--fw", "torch", "--model", "lenet5", "--threads", "1,2",
                  "--batch-size", "4,8", "--steps", "1", "--warmup", "1", "--timing-steps", "2",
                  "-o", str(out), timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res.stdout


def test_every_point_of_the_sweep_is_a_run_with_its_settings(swept) -> None:
    out, _ = swept
    for b in (4, 8):
        for t in (1, 2):
            meta = TraceFile(out / f"lenet5-torch-w1-single-b{b}-t{t}.trace").meta
            assert meta["batch_size"] == b
            assert meta["threads"] == t
    table = read_bench(out).table
    assert sorted(zip(table["batch_size"], table["threads"], strict=True)) == [
        (4, 1), (4, 2), (8, 1), (8, 2)]


def test_sweep_tables_speedups_and_where_each_stops(swept) -> None:
    out, stdout = swept
    doc = json.loads((out / "bench.json").read_text())
    threads = doc["sweeps"]["threads"]
    assert len(threads) == 4 and len(doc["sweeps"]["batch_size"]) == 4
    by = {(r["batch_size"], r["threads"]): r for r in threads}
    for b in (4, 8):
        one, two = by[(b, 1)], by[(b, 2)]
        assert one["speedup"] == pytest.approx(1.0)
        assert two["speedup"] == pytest.approx(one["step_ns"] / two["step_ns"])
        assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    stops = doc["sweeps"]["stops"]
    assert len(stops) == 4  # per batch size along threads, per thread count along batch
    for s in stops:
        assert s["sentence"] in stdout
        if s["next_value"] is not None:
            assert s["gain"] < 1 + MIN_GAIN
    assert "Time per mini-batch against the threads" in stdout
    assert "Time per mini-batch against the batch size" in stdout
    md = (out / "bench.md").read_text()
    assert "against the threads" in md and "Where each stops scaling" in md


def test_sweep_figures_are_written(swept) -> None:
    out, _ = swept
    for name in ("threads", "batch"):
        for suffix in (".svg", ".png"):
            assert (out / "figures" / f"{name}{suffix}").stat().st_size > 1000


def test_plateau_is_the_first_value_that_gains_under_ten_percent() -> None:
    """On a bench table where 1 → 2 threads halves the step and 2 → 4 gains 5%."""
    import pandas as pd

    rows = [{"fw": "jax", "model": "lenet5", "workers": 1, "mode": "single", "status": "ok",
             "batch_size": 32, "threads": t, "unprofiled_step_ns": ns, "step_ns": ns,
             "samples_per_s": 32e9 / ns} for t, ns in ((1, 100e6), (2, 50e6), (4, 47.6e6))]
    sw = sweep(pd.DataFrame(rows), "threads")
    (p,) = plateaus(sw, "threads")
    assert (p.at, p.next_value) == (2, 4)
    assert p.gain == pytest.approx(50 / 47.6)
    assert "stops scaling at threads 2" in p.sentence()
