"""benchmarks/bench_model.py's "where the compute went": per rank and phase, the wall time
split into the union of the phase's operators and the time between them, on the users'-check
recordings in fixtures/colocation (torch DDP and MXNet ps-sync, 2 workers, and their bases)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from opprof.analysis.breakdown import step_breakdown
from opprof.loader import load

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures" / "colocation"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_model",
                                                  ROOT / "benchmarks" / "bench_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_model"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["torch-lenet5-base", "torch-lenet5-ddp2", "mxnet-lenet5-base",
                                  "mxnet-lenet5-ps2"])
def test_split_sums_to_each_phase_of_the_step_breakdown(bench, name):
    path = FIX / f"{name}.trace"
    split = bench.compute_split(path)
    steps = step_breakdown(load(path))
    assert sorted(split) == sorted(str(r) for r in steps["rank"].unique())
    for rank, rows in steps.groupby("rank"):
        for ph in bench.PHASES:
            cell = split[str(rank)][ph]
            wall = float(rows[ph].mean())
            assert cell["wall_ns"] == pytest.approx(wall)
            assert 0.0 <= cell["op_ns"] <= cell["wall_ns"]
            assert cell["op_ns"] + cell["between_ns"] == pytest.approx(wall)
            assert cell["ops"] > 0


def test_ddp_backward_runs_more_operators_than_the_base(bench):
    base = bench.compute_split(FIX / "torch-lenet5-base.trace")["0"]
    ddp = bench.compute_split(FIX / "torch-lenet5-ddp2.trace")
    for rank in ddp.values():  # DDP's reducer hooks run beside every gradient's accumulation
        assert rank["backward"]["ops"] > base["backward"]["ops"]
        assert rank["forward"]["ops"] == base["forward"]["ops"]


def test_ps_worker_update_leaves_the_optimizer_to_the_server(bench):
    base = bench.compute_split(FIX / "mxnet-lenet5-base.trace")["0"]
    ps = bench.compute_split(FIX / "mxnet-lenet5-ps2.trace")
    for rank in ps.values():
        assert rank["update"]["op_ns"] < base["update"]["op_ns"]
